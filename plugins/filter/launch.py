"""What each host runs for a benchmark: one unit per host, runtime and model (pure functions).

The launch role renders these into a systemd unit or a launcher script; bench.yml starts
the workers, runs the head and stops them. Layer windows come from ring.layer_window so the
same cluster always gets the same split (prima.cpp's own allocator is not reproducible).
"""

import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence

# Ansible loads filter files one by one, not as a package: reach the sibling ring.py by path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ring import gpu_layers, layer_window, rank_ports, ring_neighbours, window_problems  # noqa: E402

MIB = 1024 ** 2
GIB = 1024 ** 3
RUNTIMES = ("prima", "llama_rpc", "single")


def rank_hosts(ranks: Mapping[str, int], world: Optional[Any] = None) -> List[str]:
    """Hosts in rank order, cut to the first `world` ranks when a world size is asked for."""
    ordered = sorted(ranks, key=lambda host: ranks[host])
    if world not in (None, ""):
        ordered = ordered[:int(world)]
    return ordered


def usable_bytes(facts: Mapping[str, Any], gpu_mem_gib: Optional[Any], reserve_mib: int) -> Dict[str, int]:
    """RAM left after a reserve, and VRAM: `gpu_mem` from the inventory, else what nvidia-smi saw."""
    ram = max(int(facts.get("memtotal_mb") or 0) - int(reserve_mib), 0) * MIB
    if gpu_mem_gib not in (None, ""):
        vram = int(float(gpu_mem_gib) * GIB)
    else:
        vram = sum(int(gpu.get("memory_mib", 0)) for gpu in (facts.get("cuda_gpus") or [])) * MIB
    return {"ram": ram, "vram": vram, "total": ram + vram}


def weights_path(entry: Mapping[str, Any], models_dir: str) -> str:
    """The file llama.cpp opens: the only file, or the first part of a split model."""
    first = sorted(spec["name"] for spec in entry["files"])[0]
    return "%s/%s" % (models_dir.rstrip("/"), first)


def model_bytes(entry: Mapping[str, Any]) -> int:
    return sum(int(spec.get("size") or 0) for spec in entry["files"])


def _window(option: Any, n_layer: int, memory: Sequence[Mapping[str, int]]) -> Optional[List[int]]:
    """`auto`: ours; `prima`: none (prima.cpp's allocator decides); a list: as given."""
    if option in (None, "", "auto"):
        return layer_window(n_layer, [rank["total"] for rank in memory])
    if option == "prima":
        return None
    window = [int(layers) for layers in (option.split(",") if isinstance(option, str) else option)]
    if len(window) != len(memory) or sum(window) != n_layer or min(window) < 1:
        raise ValueError("prima_layer_window %s must give each of the %d ranks at least one layer and sum to "
                         "n_layer %d (or be auto / prima)" % (window, len(memory), n_layer))
    return window


def prima_units(hosts: Sequence[str], addresses: Sequence[str], memory: Sequence[Mapping[str, int]],
                entry: Mapping[str, Any], options: Mapping[str, Any]) -> Dict[str, Any]:
    """prima.cpp's ring: rank 0 gets the prompt and the layer window, every rank its GPU layers."""
    n_layer = int(entry["n_layer"])
    window = _window(options.get("layer_window", "auto"), n_layer, memory)
    layer_bytes = max(model_bytes(entry) // n_layer, 1)
    gpu = gpu_layers(window, [rank["vram"] for rank in memory], layer_bytes) if window else None
    units = {}
    for ring, host in zip(ring_neighbours(addresses), hosts):
        rank = int(ring["rank"])
        ports = rank_ports(rank, options["data_port_base"], options["signal_port_base"])
        argv = [options["prima_cli"], "-m", options["weights"], "--world", str(ring["world"]), "--rank", str(rank),
                "--master", str(ring["master"]), "--next", str(ring["next"]),
                "--data-port", str(options["data_port_base"]), "--signal-port", str(options["signal_port_base"]),
                "-t", str(options["threads"][host])]
        if rank == 0:
            argv += ["-p", options["prompt"], "-n", str(options["n_predict"]), "-c", str(options["ctx_size"]),
                     "--seed", str(options["seed"])]
            if window:
                argv += ["-lw", ",".join(str(layers) for layers in window)]
            argv += list(options.get("head_extra_args", []))
        if gpu and gpu[rank] > 0:
            argv += ["-ngl", str(gpu[rank])]
        if window is None and memory[rank]["vram"] > 0:
            argv += ["--gpu-mem", "%g" % round(memory[rank]["vram"] / GIB, 1)]
        if options.get("prefetch"):
            argv += ["--prefetch"]
        units[host] = {"rank": rank, "role": "head" if rank == 0 else "worker", "argv": argv, "env": {},
                       "listen": [ports["data_port"], ports["signal_port"]]}
    fit = window_problems(window, layer_bytes, [rank["total"] for rank in memory], hosts) if window else []
    return {"units": units, "window": window, "gpu_layers": gpu, "fit_problems": fit,
            "split": ("-lw " + ",".join(map(str, window))) if window else "prima.cpp allocator"}


def completion_argv(options: Mapping[str, Any], host: str, rpc: Sequence[str]) -> List[str]:
    argv = [options["completion"], "-m", options["weights"], "-p", options["prompt"], "-n", str(options["n_predict"]),
            "-c", str(options["ctx_size"]), "--seed", str(options["seed"]), "-no-cnv",
            "-t", str(options["threads"][host]), "-ngl", "999"]
    if rpc:
        argv += ["--rpc", ",".join(rpc)]
    if options.get("tensor_split"):
        argv += ["-ts", str(options["tensor_split"])]
    return argv + list(options.get("head_extra_args", []))


def llama_rpc_units(hosts: Sequence[str], addresses: Sequence[str], options: Mapping[str, Any]) -> Dict[str, Any]:
    """llama.cpp RPC: ggml-rpc-server on every worker, bound to its cluster address; the head offloads to them."""
    port = int(options["rpc_port"])
    endpoints = ["%s:%d" % (address, port) for address in addresses[1:]]
    units = {hosts[0]: {"rank": 0, "role": "head", "argv": completion_argv(options, hosts[0], endpoints), "env": {},
                        "listen": []}}
    for rank, (host, address) in enumerate(zip(hosts[1:], addresses[1:]), start=1):
        argv = [options["rpc_server"], "-H", address, "-p", str(port), "-t", str(options["threads"][host])]
        units[host] = {"rank": rank, "role": "worker", "argv": argv + list(options.get("rpc_server_extra_args", [])),
                       "env": {"LLAMA_CACHE": options["state_dir"] + "/cache"}, "listen": [port]}
    split = ("-ts " + str(options["tensor_split"])) if options.get("tensor_split") else "llama.cpp default (-ngl 999)"
    return {"units": units, "window": None, "gpu_layers": None, "split": split}


def launch_plan(runtime: str, hosts: Sequence[str], addresses: Sequence[str], memory: Sequence[Mapping[str, int]],
                entry: Mapping[str, Any], options: Mapping[str, Any]) -> Dict[str, Any]:
    """Every participating host's unit for `runtime`, plus the split it gives the model."""
    if runtime not in RUNTIMES:
        raise ValueError("runtime %r is not one of %s" % (runtime, ", ".join(RUNTIMES)))
    if not hosts:
        raise ValueError("no ranks to launch")
    if runtime == "single":
        hosts, addresses = hosts[:1], addresses[:1]
        plan = {"units": {hosts[0]: {"rank": 0, "role": "head", "argv": completion_argv(options, hosts[0], []),
                                     "env": {}, "listen": []}},
                "window": None, "gpu_layers": None, "split": "1 node"}
    elif runtime == "prima":
        plan = prima_units(hosts, addresses, memory, entry, options)
    else:
        plan = llama_rpc_units(hosts, addresses, options)
    for unit in plan["units"].values():
        unit["env"] = dict(options.get("rank_env") or {}, **unit["env"])
    plan.update({"runtime": runtime, "world": len(hosts), "hosts": list(hosts), "head": hosts[0]})
    return plan


def cluster_nodes(hosts: Sequence[str], hostvars: Mapping[str, Any], reserve_mib: int) -> List[Dict[str, Any]]:
    """Rank-ordered hosts with what planning needs: address, memory, cores."""
    nodes = []
    for host in hosts:
        facts = dict(hostvars[host].get("ansible_facts") or {})
        facts.setdefault("cuda_gpus", hostvars[host].get("cuda_gpus") or [])
        nodes.append({"host": host, "address": str(hostvars[host]["cluster_ip"]),
                      "memory": usable_bytes(facts, hostvars[host].get("gpu_mem"), reserve_mib),
                      "cores": int(facts.get("processor_nproc") or 1)})
    return nodes


def launch_plans(nodes: Sequence[Mapping[str, Any]], runtimes: Sequence[str], models: Sequence[str],
                 catalog: Mapping[str, Any], options: Mapping[str, Any]) -> Dict[str, Any]:
    """Every unit to render, by name `<runtime>-<model>`."""
    hosts = [node["host"] for node in nodes]
    threads = {node["host"]: int(options.get("threads") or node["cores"]) for node in nodes}
    plans = {}
    for model in models:
        if model not in catalog:
            raise ValueError("model %r is not in the catalog (known: %s)" % (model, ", ".join(sorted(catalog))))
        for runtime in runtimes:
            name = "%s-%s" % (runtime, model)
            unit_options = dict(options, threads=threads, weights=weights_path(catalog[model], options["models_dir"]),
                                state_dir="%s/%s" % (options["state_dir"].rstrip("/"), name))
            plan = launch_plan(runtime, hosts, [node["address"] for node in nodes], [node["memory"] for node in nodes],
                               catalog[model], unit_options)
            plan.update({"name": name, "model": model, "state_dir": unit_options["state_dir"],
                         "addresses": {node["host"]: node["address"] for node in nodes if node["host"] in plan["hosts"]}})
            plans[name] = plan
    return plans


def host_units(plans: Mapping[str, Any], host: str) -> List[Dict[str, Any]]:
    """This host's units, flat, each with its name, runtime, model and state directory."""
    units = []
    for name in sorted(plans):
        plan = plans[name]
        if host in plan["units"]:
            unit = dict(plan["units"][host], name=name, runtime=plan["runtime"], model=plan["model"],
                        world=plan["world"], state_dir=plan["state_dir"])
            units.append(unit)
    return units


class FilterModule:
    def filters(self):
        return {
            "launch_rank_hosts": rank_hosts,
            "launch_usable_bytes": usable_bytes,
            "launch_weights_path": weights_path,
            "launch_plan": launch_plan,
            "launch_cluster_nodes": cluster_nodes,
            "launch_plans": launch_plans,
            "launch_host_units": host_units,
        }
