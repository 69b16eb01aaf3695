"""What each host runs for a benchmark: one unit per host, runtime and model (pure functions).

The launch role renders these into a systemd unit or a launcher script; bench.yml starts
the workers, runs the head and stops them. Layer windows come from ring.layer_window so the
same cluster always gets the same split (prima.cpp's own allocator is not reproducible).
"""

import dataclasses
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ansible_collections.prima.cluster.plugins.plugin_utils.launch.ring import (gpu_layers, layer_window, rank_ports,
                                                                                ring_neighbours, window_problems)
from ansible_collections.prima.cluster.plugins.plugin_utils.models.catalog import file_name_problem, model_key_problem
from ansible_collections.prima.cluster.plugins.plugin_utils.transport.connections import LOOPBACK, rpc_port

MIB = 1024 ** 2
GIB = 1024 ** 3
RUNTIMES = ("prima", "llama_rpc", "single")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # fullmatch: `$` would let a trailing newline through
# Names that change how a shell runs rather than what a program does: the rank's environment reaches the rank alone
# (not the launcher script), but a rank's own tooling may be a shell script (wrappers, `sh -c`). PATH and LD_* stay
# allowed: pointing a rank at its CUDA libraries and tools is what launch_rank_env is for, and it reaches only the
# rank's process, which the inventory already names (argv[0]); the launcher's own commands never see them.
SHELL_CONTROL_NAMES = frozenset(("IFS", "ENV", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "PS4", "CDPATH", "GLOBIGNORE"))
# launch_stall_s: above a healthy rank's longest stretch without output or traffic. prima.cpp (pinned commit)
# prints nothing while it loads its mmap'd weights, but pages them in (read_bytes); llama.cpp prints a dot per
# 1 % loaded; once the head runs, every rank of the ring moves bytes for every token. What stays silent is a
# worker waiting for the head to start, seconds in bench.yml, which starts the head as soon as the workers listen.
DEFAULT_STALL_S = 120
# The variables behind them: the option of each, for the messages.
STALL_OPTIONS = {"stall_s": "launch_stall_s", "server_stall_s": "launch_server_stall_s"}


def stall_problem(value: Any, variable: str = "launch_stall_s") -> str:
    """Why a value of launch_stall_s (or launch_server_stall_s) is refused; "" for whole seconds >= 0."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # what the argument spec's int makes of 2.0
    if isinstance(value, bool) or not re.fullmatch(r"\s*\d+\s*", str(value)):
        return ("%s %r is not a whole number of seconds >= 0; pass -e %s=%d (0 turns the stall watchdog off)"
                % (variable, value, variable, DEFAULT_STALL_S if variable == "launch_stall_s" else 0))
    return ""


def unit_stall_s(options: "LaunchOptions") -> int:
    """The watchdog's seconds for the units of these options: a server's own, else the benchmark's."""
    return options.server_stall_s if options.server else options.stall_s


def shell_control_name(name: str) -> bool:
    """True for IFS, BASH_ENV, ENV, SHELLOPTS, BASHOPTS, PS4, CDPATH, GLOBIGNORE and every BASH_* (BASH_FUNC_ too)."""
    return name in SHELL_CONTROL_NAMES or name.startswith("BASH_")


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """Everything a plan takes besides the nodes and the model: typed once, from the launch role's variables."""

    models_dir: str
    state_dir: str
    prima_cli: str
    llama_cpp_bin: str
    data_port_base: int
    signal_port_base: int
    rpc_port: int
    layer_window: Any  # "auto", "prima", or layers per rank (a tuple)
    prefetch: bool
    threads: int  # 0: every core of each node
    prompt: str
    n_predict: int
    ctx_size: int
    seed: int
    tensor_split: str = ""
    rpc_server_extra_args: Tuple[str, ...] = ()
    # ggml-rpc-server -c: each worker keeps the tensors it was sent (over 10 MiB each, llama.cpp's threshold) in
    # its unit's state directory, so the next load of the same weights reads them from its own disk.
    rpc_cache: bool = True
    head_extra_args: Tuple[str, ...] = ()
    rank_env: Tuple[Tuple[str, str], ...] = ()
    # direct: ranks reach each other's cluster_ip; ssh: every cross-node port is a forward on the loopback.
    transport: str = "direct"
    # serve.yml (and bench.yml -e mode=server): rank 0 runs llama-server instead of the one-shot generator,
    # the units are named serve-<runtime>-<model>, and the prompt and token count come with each request.
    server: bool = False
    server_bind: str = "127.0.0.1"
    # No default of its own: the launch role passes cluster_server_port (roles/cluster), the one definition.
    server_port: int = 0
    server_parallel: int = 1
    # The key is read by llama-server from this file (mode 0600), never from argv: argv is in `ps` for anyone.
    server_api_key_file: str = ""
    # The rank launcher's watchdog: no output and no traffic for this long stops a rank (0: never). A server idles
    # between requests without a byte moving, indistinguishable from a hung one, so server units have their own.
    stall_s: int = DEFAULT_STALL_S
    server_stall_s: int = 0

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "LaunchOptions":
        """The options from plain values (strings from Jinja included); ValueError naming each bad or missing one."""
        fields = {field.name: field for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        missing = sorted(name for name, field in fields.items()
                         if name not in values and field.default is dataclasses.MISSING)
        problems = ["unknown launch option %s" % name for name in unknown]
        problems += ["launch option %s is missing" % name for name in missing]
        typed = {}  # type: Dict[str, Any]
        for name, value in values.items():
            if name not in fields:
                continue
            try:
                typed[name] = _typed(name, fields[name].type, value)
            except (TypeError, ValueError) as error:
                problems.append("launch option %s: %s" % (name, error))
        if typed.get("server") and not 1 <= typed.get("server_port", 0) <= 65535:
            problems.append("launch option server_port: %r is not a port (1-65535), and a server listens on one"
                            % (values.get("server_port"),))
        if problems:
            raise ValueError("; ".join(problems))
        return cls(**typed)


def _typed(name: str, kind: Any, value: Any) -> Any:
    if name in STALL_OPTIONS:
        problem = stall_problem(value, STALL_OPTIONS[name])
        if problem:
            raise ValueError(problem)
        return int(float(value)) if isinstance(value, float) else int(str(value).strip())
    if kind in ("int", int):
        if isinstance(value, bool):
            raise ValueError("%r is not a whole number" % (value,))
        return int(value)
    if kind in ("bool", bool):
        if isinstance(value, str):
            if value.strip().lower() not in ("true", "false", "yes", "no", "1", "0"):
                raise ValueError("%r is not true or false" % value)
            return value.strip().lower() in ("true", "yes", "1")
        return bool(value)
    if name == "transport":
        if value not in ("direct", "ssh"):
            raise ValueError("%r is not direct or ssh" % (value,))
        return value
    if kind in ("str", str):
        return "" if value is None else str(value)
    if name == "layer_window":
        option = window_option(value)
        return option if isinstance(option, str) else tuple(option)
    if name == "rank_env":
        if not isinstance(value, Mapping):
            raise ValueError("%r is not a mapping of environment variables" % (value,))
        bad = sorted(str(key) for key in value if not ENV_NAME.fullmatch(str(key)))
        if bad:
            # The launcher script exports each name as it is: only a shell variable name may pass.
            raise ValueError("%s: not an environment variable name (letters, digits, _)" % ", ".join(map(repr, bad)))
        control = sorted(str(key) for key in value if shell_control_name(str(key)))
        if control:
            raise ValueError("%s: a shell control variable, it would change how the rank's shell tooling runs "
                             "(splitting, startup files, options); remove it" % ", ".join(map(repr, control)))
        return tuple(sorted((str(key), str(item)) for key, item in value.items()))
    if name in ("rpc_server_extra_args", "head_extra_args"):
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise ValueError("%r is not a list of arguments" % (value,))
        return tuple(str(item) for item in value)
    return value


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


def first_file(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    """The file llama.cpp opens: the only file, or the first part of a split model."""
    return sorted(entry["files"], key=lambda spec: spec["name"])[0]


def weights_path(entry: Mapping[str, Any], models_dir: str) -> str:
    """Where that file is on every node."""
    return "%s/%s" % (models_dir.rstrip("/"), first_file(entry)["name"])


def model_bytes(entry: Mapping[str, Any]) -> int:
    return sum(int(spec.get("size") or 0) for spec in entry["files"])


def window_option(option: Any) -> Union[str, List[int]]:
    """prima_layer_window as given: `auto` (also when empty), `prima`, or the layers of each rank, from a list or
    a string like "3,3,2" or "[3, 3, 2]" (what -e prima_layer_window=... gives). ValueError when it is none of them."""
    if isinstance(option, str) and option.strip() in ("", "auto", "prima"):
        return option.strip() or "auto"
    if option is None:
        return "auto"
    items = option.strip().strip("[]").split(",") if isinstance(option, str) else option
    window = []  # type: List[int]
    if isinstance(items, (bytes, Mapping)) or not isinstance(items, Sequence) or not items:
        items = [None]
    for item in items:
        if isinstance(item, bool) or not re.fullmatch(r"\s*\d+\s*", str(item)) or int(item) < 1:
            raise ValueError("%r is not auto, prima, or the layers of each rank as whole numbers >= 1 (like [3, 3, 2])"
                             % (option,))
        window.append(int(item))
    return window


def _window(option: Any, n_layer: int, memory: Sequence[Mapping[str, int]]) -> Optional[List[int]]:
    """`auto`: ours; `prima`: none (prima.cpp's allocator decides); a list: as given."""
    option = window_option(option)
    if option == "auto":
        return layer_window(n_layer, [rank["total"] for rank in memory])
    if option == "prima":
        return None
    window = list(option)
    if len(window) != len(memory) or sum(window) != n_layer:
        raise ValueError("prima_layer_window %s must give each of the %d ranks at least one layer and sum to "
                         "n_layer %d (or be auto / prima)" % (window, len(memory), n_layer))
    return window


@dataclasses.dataclass(frozen=True)
class UnitContext:
    """What the ranks of one unit (a runtime and a model) share: the options, the weights, the state directory."""

    options: LaunchOptions
    weights: str
    state_dir: str
    threads: Mapping[str, int]
    # The catalog key: the name a server gives the model (/v1/models), so a client asks for "70b".
    model: str = ""


def prima_units(hosts: Sequence[str], addresses: Sequence[str], memory: Sequence[Mapping[str, int]],
                entry: Mapping[str, Any], unit: UnitContext) -> Dict[str, Any]:
    """prima.cpp's ring: rank 0 gets the prompt and the layer window, every rank its GPU layers."""
    options = unit.options
    n_layer = int(entry["n_layer"])
    window = _window(options.layer_window, n_layer, memory)
    layer_bytes = max(model_bytes(entry) // n_layer, 1)
    gpu = gpu_layers(window, [rank["vram"] for rank in memory], layer_bytes) if window else None
    units = {}
    # Through SSH, every port a rank connects to is a forward on its own loopback (transport/connections.py).
    ring_addresses = [LOOPBACK] * len(addresses) if options.transport == "ssh" else addresses
    for ring, host in zip(ring_neighbours(ring_addresses), hosts):
        rank = int(ring["rank"])
        ports = rank_ports(rank, options.data_port_base, options.signal_port_base)
        argv = [options.prima_cli, "-m", unit.weights, "--world", str(ring["world"]), "--rank", str(rank),
                "--master", str(ring["master"]), "--next", str(ring["next"]),
                "--data-port", str(options.data_port_base), "--signal-port", str(options.signal_port_base),
                "-t", str(unit.threads[host])]
        if rank == 0 and options.server:
            argv[0] = sibling(options.prima_cli, "llama-server")
            argv += ["-c", str(options.ctx_size)] + server_args(options, unit.model)
            if window:
                argv += ["-lw", ",".join(str(layers) for layers in window)]
            argv += list(options.head_extra_args)
        elif rank == 0:
            argv += ["-p", options.prompt, "-n", str(options.n_predict), "-c", str(options.ctx_size),
                     "--seed", str(options.seed)]
            if window:
                argv += ["-lw", ",".join(str(layers) for layers in window)]
            argv += list(options.head_extra_args)
        if gpu and gpu[rank] > 0:
            argv += ["-ngl", str(gpu[rank])]
        if window is None and memory[rank]["vram"] > 0:
            argv += ["--gpu-mem", "%g" % round(memory[rank]["vram"] / GIB, 1)]
        if options.prefetch:
            argv += ["--prefetch"]
        listen = [ports["data_port"], ports["signal_port"]]
        if rank == 0 and options.server:
            listen.append(options.server_port)
        units[host] = {"rank": rank, "role": "head" if rank == 0 else "worker", "argv": argv, "env": {},
                       "listen": listen}
    fit = window_problems(window, layer_bytes, [rank["total"] for rank in memory], hosts) if window else []
    return {"units": units, "window": window, "gpu_layers": gpu, "fit_problems": fit,
            "split": ("-lw " + ",".join(map(str, window))) if window else "prima.cpp allocator"}


def sibling(path: str, name: str) -> str:
    """`name` in the directory of the program `path` (llama-server beside prima.cpp's llama-cli)."""
    return path.rsplit("/", 1)[0] + "/" + name if "/" in path else name


def server_args(options: LaunchOptions, model: str = "") -> List[str]:
    """llama-server's own: where it listens, its slots (-np) with continuous batching, /metrics, the key file,
    and the catalog key as the model's name (without --alias, /v1/models would name the weights' path)."""
    argv = ["--host", options.server_bind, "--port", str(options.server_port), "-np", str(options.server_parallel),
            "--cont-batching", "--metrics"]
    if model:
        argv += ["--alias", model]
    if options.server_api_key_file:
        argv += ["--api-key-file", options.server_api_key_file]
    return argv


def server_argv(unit: UnitContext, host: str, rpc: Sequence[str]) -> List[str]:
    """llama.cpp's llama-server over the RPC workers (or alone): requests bring their prompt and length."""
    options = unit.options
    argv = [options.llama_cpp_bin.rstrip("/") + "/llama-server", "-m", unit.weights, "-c", str(options.ctx_size),
            "-t", str(unit.threads[host]), "-ngl", "999"] + server_args(options, unit.model)
    if rpc:
        argv += ["--rpc", ",".join(rpc)]
    if options.tensor_split:
        argv += ["-ts", options.tensor_split]
    return argv + list(options.head_extra_args)


def head_unit(unit: UnitContext, host: str, rpc: Sequence[str]) -> Dict[str, Any]:
    """llama.cpp's head, rank 0: the one-shot generator for a benchmark run, llama-server to serve."""
    if unit.options.server:
        return {"rank": 0, "role": "head", "argv": server_argv(unit, host, rpc), "env": {},
                "listen": [unit.options.server_port]}
    return {"rank": 0, "role": "head", "argv": completion_argv(unit, host, rpc), "env": {}, "listen": []}


def completion_argv(unit: UnitContext, host: str, rpc: Sequence[str]) -> List[str]:
    options = unit.options
    argv = [options.llama_cpp_bin.rstrip("/") + "/llama-completion", "-m", unit.weights, "-p", options.prompt,
            "-n", str(options.n_predict), "-c", str(options.ctx_size), "--seed", str(options.seed), "-no-cnv",
            "-t", str(unit.threads[host]), "-ngl", "999"]
    if rpc:
        argv += ["--rpc", ",".join(rpc)]
    if options.tensor_split:
        argv += ["-ts", options.tensor_split]
    return argv + list(options.head_extra_args)


def llama_rpc_units(hosts: Sequence[str], addresses: Sequence[str], entry: Mapping[str, Any],
                    unit: UnitContext) -> Dict[str, Any]:
    """llama.cpp RPC: ggml-rpc-server on every worker, bound to its cluster address (the loopback through SSH,
    where the head's forward ends); the head offloads to them. Worker rank R listens on rpc_port + R - 1.

    With options.rpc_cache, each worker caches the tensors it receives in <state_dir>/cache/rpc (LLAMA_CACHE/rpc):
    `rpc_cache` gives the launcher that directory and its bound, the model's size from the catalog (a worker holds
    part of one model, and its tensors are the same whatever the split)."""
    options = unit.options
    binds = [LOOPBACK] * len(addresses) if options.transport == "ssh" else list(addresses)
    # A catalog entry without sizes gives no bound: no cache then (llama.cpp's own grows without one).
    cache_bytes = model_bytes(entry) if options.rpc_cache else 0
    endpoints = ["%s:%d" % (address, rpc_port(options.rpc_port, rank))
                 for rank, address in enumerate(binds[1:], start=1)]
    units = {hosts[0]: head_unit(unit, hosts[0], endpoints)}
    for rank, (host, address) in enumerate(zip(hosts[1:], binds[1:]), start=1):
        port = rpc_port(options.rpc_port, rank)
        argv = [options.llama_cpp_bin.rstrip("/") + "/ggml-rpc-server", "-H", address, "-p", str(port),
                "-t", str(unit.threads[host])] + (["-c"] if cache_bytes else [])
        units[host] = {"rank": rank, "role": "worker", "argv": argv + list(options.rpc_server_extra_args),
                       "env": {"LLAMA_CACHE": unit.state_dir + "/cache"}, "listen": [port]}
        if cache_bytes:
            units[host]["rpc_cache"] = {"dir": unit.state_dir + "/cache/rpc", "max_bytes": cache_bytes}
    split = ("-ts " + options.tensor_split) if options.tensor_split else "llama.cpp default (-ngl 999)"
    return {"units": units, "window": None, "gpu_layers": None, "split": split}


def launch_plan(runtime: str, hosts: Sequence[str], addresses: Sequence[str], memory: Sequence[Mapping[str, int]],
                entry: Mapping[str, Any], unit: UnitContext) -> Dict[str, Any]:
    """Every participating host's unit for `runtime`, plus the split it gives the model."""
    if runtime not in RUNTIMES:
        raise ValueError("runtime %r is not one of %s" % (runtime, ", ".join(RUNTIMES)))
    if not hosts:
        raise ValueError("no ranks to launch")
    if runtime == "single":
        hosts, addresses = hosts[:1], addresses[:1]
        plan = {"units": {hosts[0]: head_unit(unit, hosts[0], [])},
                "window": None, "gpu_layers": None, "split": "1 node"}
    elif runtime == "prima":
        plan = prima_units(hosts, addresses, memory, entry, unit)
    else:
        plan = llama_rpc_units(hosts, addresses, entry, unit)
    for rank_unit in plan["units"].values():
        rank_unit["env"] = dict(dict(unit.options.rank_env), **rank_unit["env"])
        rank_unit["stall_s"] = unit_stall_s(unit.options)
    plan.update({"runtime": runtime, "world": len(hosts), "hosts": list(hosts), "head": hosts[0]})
    return plan


def cluster_nodes(hosts: Sequence[str], hostvars: Mapping[str, Any], reserve_mib: int) -> List[Dict[str, Any]]:
    """Rank-ordered hosts with what planning needs: address, memory, cores."""
    nodes = []
    for host in hosts:
        facts = dict(hostvars[host].get("ansible_facts") or {})
        facts.setdefault("cuda_gpus", hostvars[host].get("cuda_gpus") or [])
        nodes.append({"host": host, "address": str(hostvars[host].get("cluster_ip") or LOOPBACK),
                      "memory": usable_bytes(facts, hostvars[host].get("gpu_mem"), reserve_mib),
                      "cores": int(facts.get("processor_nproc") or 1)})
    return nodes


def plan_name(runtime: str, model: str, server: bool = False) -> str:
    """A unit's name, which is also its launcher script's and its state directory's: `<runtime>-<model>`, a server's
    `serve-<runtime>-<model>`. bench.yml and serve.yml find their units by it (filter launch_plan_names)."""
    return "%s%s-%s" % ("serve-" if server else "", runtime, model)


def plan_names(runtimes: Sequence[str], models: Sequence[str], server: bool = False) -> List[str]:
    """Every unit's name, runtime by runtime (each model in turn): the order bench.yml runs them in."""
    return [plan_name(runtime, model, server) for runtime in runtimes for model in models]


def launch_plans(nodes: Sequence[Mapping[str, Any]], runtimes: Sequence[str], models: Sequence[str],
                 catalog: Mapping[str, Any], options: LaunchOptions) -> Dict[str, Any]:
    """Every unit to render, by name `<runtime>-<model>`."""
    hosts = [node["host"] for node in nodes]
    threads = {node["host"]: options.threads or int(node["cores"]) for node in nodes}
    plans = {}
    for model in models:
        if model not in catalog:
            raise ValueError("model %r is not in the catalog (known: %s)" % (model, ", ".join(sorted(catalog))))
        # The preflight refuses these; playbooks/launch.yml alone has no preflight. The key names files and units.
        unsafe = [problem for problem in [model_key_problem(model)] + [
            file_name_problem(spec.get("name")) for spec in catalog[model]["files"]] if problem]
        if unsafe:
            raise ValueError("model %r: %s" % (model, "; ".join(unsafe)))
        for runtime in runtimes:
            name = plan_name(runtime, model, options.server)
            unit = UnitContext(options=options, weights=weights_path(catalog[model], options.models_dir),
                               state_dir="%s/%s" % (options.state_dir.rstrip("/"), name), threads=threads,
                               model=model)
            plan = launch_plan(runtime, hosts, [node["address"] for node in nodes], [node["memory"] for node in nodes],
                               catalog[model], unit)
            addresses = {node["host"]: node["address"] for node in nodes if node["host"] in plan["hosts"]}
            plan.update({"name": name, "model": model, "state_dir": unit.state_dir, "addresses": addresses,
                         "transport": options.transport,
                         "server": {"bind": options.server_bind, "port": options.server_port,
                                    "parallel": options.server_parallel} if options.server else None,
                         # Where a rank listens, and where its peers reach it: the loopback through SSH.
                         "connect_addresses": {host: LOOPBACK for host in addresses} if options.transport == "ssh"
                         else addresses})
            plans[name] = plan
    return plans


def host_units(plans: Mapping[str, Any], host: str) -> List[Dict[str, Any]]:
    """This host's units, flat, each with its name, runtime, model and state directory."""
    units = []
    for name in sorted(plans):
        plan = plans[name]
        if host in plan["units"]:
            units.append(dict(plan["units"][host], name=name, runtime=plan["runtime"], model=plan["model"],
                              world=plan["world"], state_dir=plan["state_dir"]))
    return units


def listen_ports(plans: Mapping[str, Any], host: str) -> List[int]:
    """Every port this host's ranks listen on, over all the plans: what must be free outside a run."""
    ports = []  # type: List[int]
    for unit in host_units(plans, host):
        ports += [port for port in unit["listen"] if port not in ports]
    return sorted(ports)
