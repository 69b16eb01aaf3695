"""Filters that read what nvidia-smi and nvcc print."""

import re
from typing import Dict, List, Union

GpuInfo = Dict[str, Union[str, int]]


def cuda_parse_gpus(smi_csv: str) -> List[GpuInfo]:
    """Parse `nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version
    --format=csv,noheader,nounits` into one dict per GPU."""
    gpus = []  # type: List[GpuInfo]
    for line in smi_csv.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 4 or not fields[0]:
            continue
        name, memory, compute_cap, driver = fields[0], fields[1], fields[2], fields[3]
        if not re.fullmatch(r"\d+", memory) or not re.fullmatch(r"\d+\.\d+", compute_cap):
            raise ValueError("unexpected nvidia-smi line: %r" % line)
        gpus.append({
            "name": name,
            "memory_mib": int(memory),
            "compute_cap": compute_cap,
            "arch": compute_cap.replace(".", ""),
            "driver": driver,
        })
    return gpus


def cuda_parse_nvcc_version(nvcc_output: str) -> str:
    """'Cuda compilation tools, release 12.2, V12.2.140' -> '12.2'; '' when absent."""
    match = re.search(r"release (\d+\.\d+)", nvcc_output)
    return match.group(1) if match else ""


def cuda_lowest_arch(gpus: List[GpuInfo]) -> str:
    """The compute capability every GPU of the node can run, like '86'; '' for none."""
    if not gpus:
        return ""
    lowest = min(gpus, key=lambda gpu: tuple(int(part) for part in str(gpu["compute_cap"]).split(".")))
    return str(lowest["arch"])


class FilterModule:
    def filters(self):
        return {
            "cuda_parse_gpus": cuda_parse_gpus,
            "cuda_parse_nvcc_version": cuda_parse_nvcc_version,
            "cuda_lowest_arch": cuda_lowest_arch,
        }
