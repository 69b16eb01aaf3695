import os

import pytest

from ansible_collections.prima.cluster.plugins.filter.cuda import (cuda_lowest_arch, cuda_parse_gpus,
                                                                   cuda_parse_nvcc_version)
from ansible_collections.prima.cluster.plugins.filter.timing import duration_seconds

SMI_TWO_GPUS = """NVIDIA GeForce RTX 4090, 24564, 8.9, 535.104.05
NVIDIA GeForce RTX 3090, 24576, 8.6, 535.104.05
"""

NVCC_12_2 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2023 NVIDIA Corporation
Built on Tue_Aug_15_22:02:13_PDT_2023
Cuda compilation tools, release 12.2, V12.2.140
Build cuda_12.2.r12.2/compiler.33191640_0
"""


def test_parse_gpus():
    gpus = cuda_parse_gpus(SMI_TWO_GPUS)
    assert gpus[0] == {"name": "NVIDIA GeForce RTX 4090", "memory_mib": 24564, "compute_cap": "8.9",
                       "arch": "89", "driver": "535.104.05"}
    assert [gpu["arch"] for gpu in gpus] == ["89", "86"]


def test_parse_no_gpus():
    assert cuda_parse_gpus("") == []
    assert cuda_lowest_arch([]) == ""


def test_parse_gpus_rejects_garbage():
    with pytest.raises(ValueError):
        cuda_parse_gpus("NVIDIA A100, [N/A], 8.0, 535")


def test_lowest_arch_compares_numerically():
    gpus = [{"compute_cap": "10.0", "arch": "100"}, {"compute_cap": "9.0", "arch": "90"}]
    assert cuda_lowest_arch(gpus) == "90"
    assert cuda_lowest_arch(cuda_parse_gpus(SMI_TWO_GPUS)) == "86"


def test_nvcc_version():
    assert cuda_parse_nvcc_version(NVCC_12_2) == "12.2"
    assert cuda_parse_nvcc_version("Build cuda_13.0.r13.0/compiler.36424714_0\nrelease 13.0, V13.0.48") == "13.0"
    assert cuda_parse_nvcc_version("command not found") == ""


@pytest.mark.parametrize("delta, seconds", [
    ("0:04:12.123456", 252.1),
    ("0:00:00.049000", 0.0),
    ("1:00:01", 3601.0),
    ("2 days, 0:00:01.5", 172801.5),
])
def test_duration_seconds(delta, seconds):
    assert duration_seconds(delta) == seconds


def test_duration_seconds_rejects_garbage():
    with pytest.raises(ValueError):
        duration_seconds("soon")


def test_collection_paths_stay_inside_the_collection():
    from ansible_collections.prima.cluster.plugins.plugin_utils.cluster.paths import COLLECTION_ROOT, collection_path

    assert collection_path("roles/bench/templates/report.md.j2") == os.path.join(
        COLLECTION_ROOT, "roles", "bench", "templates", "report.md.j2")
    assert os.path.exists(collection_path("roles/launch/templates/rank.sh.j2"))
    for outside in ("../shared", "/etc/passwd", "templates/../../x"):
        with pytest.raises(ValueError, match="not a path inside the collection"):
            collection_path(outside)


def test_the_lookup_names_what_is_missing():
    from ansible.errors import AnsibleLookupError
    from ansible.plugins.loader import lookup_loader

    lookup = lookup_loader.get("prima.cluster.collection_path")
    assert lookup.run(["roles"]) == [os.path.join(lookup.run(["."])[0], "roles")]
    with pytest.raises(AnsibleLookupError, match="nothing.txt is not in the prima.cluster collection"):
        lookup.run(["nothing.txt"])
