"""Inventory checks run on the controller before any node is contacted.

Each function returns a list of problems, each a sentence that names the host and the
variable and says how to fix it; an empty list means the input is good.
"""

import ipaddress
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.prima.cluster.plugins.plugin_utils.launch.plan import (ENV_NAME, STALL_OPTIONS,
                                                                                shell_control_name, stall_problem,
                                                                                window_option)

HOSTNAME_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# fullmatch: `$` alone would let a trailing newline through.
HOSTNAME_PATTERN = re.compile(r"(?=.{1,253}$)%s(\.%s)*" % (HOSTNAME_LABEL, HOSTNAME_LABEL))
SSH_PORT_VARIABLES = (("ansible_port", "Ansible reaches the node's sshd on"),
                      ("cluster_ssh_port", "the other nodes reach the node's sshd on"))
# Why a cluster_ip cannot be where the fan-out server and ggml-rpc-server listen, with cluster_network direct.
LOCAL_ADDRESSES = {
    "unspecified": ("the unspecified address", "they would listen on every interface of %(host)s, public ones "
                                               "included, and no peer can connect to that address"),
    "loopback": ("a loopback address", "only %(host)s itself could reach them, and the other ranks would connect to "
                                       "their own loopback, not to %(host)s"),
}


def _is_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return bool(HOSTNAME_PATTERN.fullmatch(value)) and not re.fullmatch(r"[\d.]+", value)


def _local_address(value: str) -> Optional[str]:
    """What makes an address useless for peers to reach a node on: 'unspecified' or 'loopback', else None."""
    if value.lower() == "localhost" or value.lower().endswith(".localhost"):
        return "loopback"
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    address = mapped or address
    if address.is_unspecified:
        return "unspecified"
    return "loopback" if address.is_loopback else None


def _hosts_label(hosts: Sequence[str]) -> str:
    return ("host %s" if len(hosts) == 1 else "hosts %s") % ", ".join(hosts)


def _is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    return isinstance(value, str) and re.fullmatch(r"\d+", value.strip()) is not None


def cluster_ranks(hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]]) -> Dict[str, int]:
    """Rank of each host: its `rank` where every host gives one, else its place in the group."""
    given = {host: hostvars[host].get("rank") for host in hosts}
    if hosts and all(rank is not None and _is_int(rank) for rank in given.values()):
        return {host: int(rank) for host, rank in given.items()}
    return {host: index for index, host in enumerate(hosts)}


def cluster_problems(hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]],
                     world: Optional[Any] = None, group: str = "cluster") -> List[str]:
    """Problems with the cluster's addresses, ranks and requested world size."""
    if not hosts:
        return ["the inventory has no hosts in group '%s': list the nodes there "
                "(see inventory/glows.yml)" % group]
    problems = []  # type: List[str]
    problems += _address_problems(hosts, hostvars)
    problems += _ssh_port_problems(hosts, hostvars)
    problems += _rank_problems(hosts, hostvars)
    problems += _world_problems(hosts, world, group)
    return problems


def _address_problems(hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]]) -> List[str]:
    problems = []  # type: List[str]
    owners = {}  # type: Dict[str, List[str]]
    for host in hosts:
        address = hostvars[host].get("cluster_ip")
        if (address is None or str(address).strip() == "") and hostvars[host].get("cluster_network", "auto") != "direct":
            continue  # the SSH transport needs no cluster address (auto picks ssh without one)
        if address is None or str(address).strip() == "":
            problems.append(
                "host %s: cluster_ip is not set, and cluster_network is direct. Set it to the address the other "
                "ranks reach %s on (the node's address on the cluster network, not its SSH access address), or "
                "use cluster_network auto or ssh" % (host, host))
            continue
        address = str(address).strip()
        if not _is_address(address):
            problems.append("host %s: cluster_ip %r is not an IP address or host name; "
                            "set cluster_ip to the node's address on the cluster network" % (host, address))
            continue
        # With auto the probe tries the address (and picks ssh when no peer gets through); ssh needs none.
        local = _local_address(address) if hostvars[host].get("cluster_network", "auto") == "direct" else None
        if local:
            kind, why = LOCAL_ADDRESSES[local]
            problems.append("host %s: cluster_ip %s is %s, and cluster_network is direct: the fan-out server and "
                            "ggml-rpc-server -H bind to cluster_ip, so %s. Set cluster_ip to the node's own address "
                            "on the cluster network, or use cluster_network auto or ssh"
                            % (host, address, kind, why % {"host": host}))
            continue
        owners.setdefault(address, []).append(host)
    for address, owner_hosts in owners.items():
        if len(owner_hosts) > 1:
            problems.append("hosts %s: they share cluster_ip %s; give each host its own cluster_ip"
                            % (", ".join(owner_hosts), address))
    return problems


def _ssh_port_problems(hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]]) -> List[str]:
    problems = []  # type: List[str]
    for host in hosts:
        for variable, use in SSH_PORT_VARIABLES:
            value = hostvars[host].get(variable)
            if value is None or (isinstance(value, str) and not value.strip()):
                continue
            if not (_is_int(value) and 1 <= int(value) <= 65535):
                problems.append("host %s: %s %r is not a port number (1-65535); set %s to the port %s (on Glows, "
                                "the node's mapped SSH port), or remove it for 22"
                                % (host, variable, value, variable, use))
    return problems


def _rank_problems(hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]]) -> List[str]:
    given = {host: hostvars[host].get("rank") for host in hosts}
    with_rank = [host for host in hosts if given[host] is not None]
    if not with_rank:
        return []
    problems = []  # type: List[str]
    for host in with_rank:
        if not _is_int(given[host]):
            problems.append("host %s: rank '%s' is not a whole number >= 0; set rank to 0..%d or "
                            "remove it to rank hosts by their order" % (host, given[host], len(hosts) - 1))
    if problems:
        return problems
    without_rank = [host for host in hosts if given[host] is None]
    if without_rank:
        return ["hosts %s: no rank while %s have one; give every host a rank or none "
                "(then rank = order in the group)" % (", ".join(without_rank), ", ".join(with_rank))]
    by_rank = {}  # type: Dict[int, List[str]]
    for host in hosts:
        by_rank.setdefault(int(given[host]), []).append(host)
    for rank, rank_hosts in sorted(by_rank.items()):
        if len(rank_hosts) > 1:
            problems.append("hosts %s: duplicate rank %d; each host needs its own rank"
                            % (", ".join(rank_hosts), rank))
    expected = set(range(len(hosts)))
    if not problems and set(by_rank) != expected:
        problems.append("ranks %s: ranks must be 0..%d, one per host; renumber the hosts' rank"
                        % (", ".join("%s=%s" % (host, given[host]) for host in hosts), len(hosts) - 1))
    return problems


def _world_problems(hosts: Sequence[str], world: Optional[Any], group: str) -> List[str]:
    if world is None or world == "":
        return []
    if not _is_int(world) or int(world) < 1:
        return ["world '%s' is not a whole number >= 1; pass -e world=N with N from 1 to %d"
                % (world, len(hosts))]
    if int(world) > len(hosts):
        return ["world=%d asks for more ranks than the %d host(s) in group '%s' (%s); add hosts "
                "to the inventory or pass -e world=%d"
                % (int(world), len(hosts), group, ", ".join(hosts), len(hosts))]
    return []


def role_input_problems(hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]],
                        role_specs: Mapping[str, Mapping[str, Any]]) -> List[str]:
    """Check each host's values for the roles' inputs against the roles' argument_specs.

    role_specs maps a role name to its `argument_specs.main.options`. Only variables the
    inventory or the command line set are checked; role defaults are the roles' own.
    """
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    problems = []  # type: List[str]
    for role, options in role_specs.items():
        validator = ArgumentSpecValidator(_without_defaults(options))
        for host in hosts:
            provided = {name: hostvars[host][name] for name in options if name in hostvars[host]}
            if not provided:
                continue
            result = validator.validate(provided)
            for error in result.error_messages:
                problems.append("host %s, role %s: %s; fix that variable in the inventory or "
                                "-e (see roles/%s/meta/argument_specs.yml)" % (host, role, error, role))
    return problems


def role_argument_specs(roles_dir: str) -> Dict[str, Any]:
    """The options of every role in `roles_dir`, from its meta/argument_specs.yml (all entry points together)."""
    import os

    import yaml

    specs = {}  # type: Dict[str, Any]
    for role in sorted(os.listdir(roles_dir)):
        path = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
        if not os.path.exists(path):
            continue
        with open(path) as handle:
            entry_points = yaml.safe_load(handle)["argument_specs"]
        specs[role] = {}
        for entry_point in entry_points.values():
            specs[role].update(entry_point.get("options") or {})
    return specs


def _without_defaults(options: Mapping[str, Any]) -> Dict[str, Any]:
    """Role defaults are templates evaluated on the node, and required inputs come from the plays: leave
    both out of this check."""
    return {name: {key: value for key, value in spec.items() if key not in ("default", "description", "required")}
            for name, spec in options.items()}


def choice_problems(value: Any, choices: Iterable[str], variable: str) -> List[str]:
    """A value outside its choices."""
    allowed = list(choices)
    if str(value) in allowed:
        return []
    return ["%s '%s' is not one of: %s; pass -e %s=%s" % (variable, value, ", ".join(allowed), variable, allowed[0])]


RUNTIMES = ("prima", "llama_rpc", "single")


def runtime_words(value: Any) -> List[str]:
    """-e runtime=llama_rpc,single (or a list) as its words."""
    words = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [str(word).strip() for word in words]


def runtimes_problems(value: Any, variable: str = "runtime") -> List[str]:
    """`all`, or a comma-separated list of runtimes without repeats."""
    words = runtime_words(value)
    if words == ["all"]:
        return []
    fix = ",".join(RUNTIMES[1:])
    problems = ["%s '%s' is not one of: %s, or all; pass -e %s=%s" % (variable, word, ", ".join(RUNTIMES), variable, fix)
                for word in words if word not in RUNTIMES + ("all",)]
    if "all" in words:
        problems.append("%s: all means every runtime built and stands alone; pass -e %s=all" % (variable, variable))
    repeated = sorted({word for word in words if words.count(word) > 1})
    if repeated:
        problems.append("%s names %s twice; each runtime runs once" % (variable, ", ".join(repeated)))
    return problems


def runtimes_selection(value: Any, prima_built: bool) -> List[str]:
    """The runtimes a bench runs, in the order given; `all` is every runtime built (prima.cpp first)."""
    words = runtime_words(value)
    if words == ["all"]:
        return [runtime for runtime in RUNTIMES if prima_built or runtime != "prima"]
    return list(dict.fromkeys(words))


def positive_int_problems(value: Any, variable: str) -> List[str]:
    """A count that must be a whole number >= 1."""
    if _is_int(value) and int(value) >= 1:
        return []
    return ["%s '%s' is not a whole number >= 1; pass -e %s=N" % (variable, value, variable)]


def _keys(value: Any) -> List[str]:
    if value in (None, ""):
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return [str(part) for part in value]


def _world_size(hosts: Sequence[str], world: Optional[Any]) -> Tuple[int, str]:
    """The ranks of a run and where that number comes from: -e world=N (when valid), else every host."""
    if world not in (None, "") and _is_int(world) and 1 <= int(world) <= len(hosts):
        return int(world), "-e world=%d" % int(world)
    return len(hosts), "every host in group cluster"


def layer_window_problems(hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]],
                          world: Optional[Any] = None, models: Any = None,
                          catalog: Optional[Mapping[str, Any]] = None) -> List[str]:
    """prima_layer_window of every host: auto, prima, or one layer count per rank of the run (-e world=N takes the
    first N ranks), summing to the n_layer of each model the run uses (`models`: -e model, else models_enabled)."""
    ranks, source = _world_size(hosts, world)
    by_value = {}  # type: Dict[str, Tuple[Any, List[str]]]
    for host in hosts:
        if hostvars[host].get("prima_layer_window") is not None:
            value = hostvars[host]["prima_layer_window"]
            by_value.setdefault(repr(value), (value, []))[1].append(host)
    problems = []  # type: List[str]
    for value, owners in by_value.values():
        who = _hosts_label(owners)
        try:
            window = window_option(value)
        except ValueError:
            problems.append("%s: prima_layer_window %r is not auto, prima, or the layers of each rank as whole "
                            "numbers >= 1; set it to auto, prima or a list like [3, 3, 2]" % (who, value))
            continue
        if isinstance(window, str):
            continue
        if len(window) != ranks:
            problems.append("%s: prima_layer_window %s gives layers to %d rank(s), but the run has %d (%s); give one "
                            "layer count per rank, or set prima_layer_window to auto"
                            % (who, window, len(window), ranks, source))
            continue
        for key in _keys(models):
            entry = (catalog or {}).get(key)
            layers = entry.get("n_layer") if isinstance(entry, Mapping) else None
            if isinstance(layers, int) and not isinstance(layers, bool) and sum(window) != layers:
                problems.append("%s: prima_layer_window %s sums to %d layers, but model %s has n_layer %d; make the "
                                "counts sum to %d, pick the model it is for with -e model=KEY, or set "
                                "prima_layer_window to auto" % (who, window, sum(window), key, layers, layers))
    return problems


def rank_env_problems(hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]]) -> List[str]:
    """launch_rank_env of every host: only environment variable names, and none that steers a shell."""
    by_bad = {}  # type: Dict[Tuple[str, ...], List[str]]
    by_control = {}  # type: Dict[Tuple[str, ...], List[str]]
    for host in hosts:
        env = hostvars[host].get("launch_rank_env")
        if not isinstance(env, Mapping):
            continue  # not a mapping: role_input_problems says so (roles/launch/meta/argument_specs.yml)
        bad = tuple(sorted(repr(name) for name in env if not (isinstance(name, str) and ENV_NAME.fullmatch(name))))
        if bad:
            by_bad.setdefault(bad, []).append(host)
        control = tuple(sorted(repr(name) for name in env
                               if isinstance(name, str) and ENV_NAME.fullmatch(name) and shell_control_name(name)))
        if control:
            by_control.setdefault(control, []).append(host)
    problems = ["%s: launch_rank_env has %s, not an environment variable name (letters, digits and _, not starting "
                "with a digit): the rank's environment is passed as NAME=value words; rename or remove %s"
                % (_hosts_label(owners), ", ".join(bad), "it" if len(bad) == 1 else "them")
                for bad, owners in by_bad.items()]
    problems += ["%s: launch_rank_env has %s, %s: it would change how any shell the rank starts runs (word "
                 "splitting, startup files, options), not what the rank does; remove %s"
                 % (_hosts_label(owners), ", ".join(control),
                    "a shell control variable" if len(control) == 1 else "each a shell control variable",
                    "it" if len(control) == 1 else "them")
                 for control, owners in by_control.items()]
    return problems


def stall_problems(hosts: Sequence[str], hostvars: Mapping[str, Mapping[str, Any]]) -> List[str]:
    """launch_stall_s and launch_server_stall_s of every host: whole seconds >= 0 (the argument spec's int takes
    -5 too, and the launcher would read text as 0, no watchdog)."""
    problems = []  # type: List[str]
    for variable in sorted(STALL_OPTIONS.values()):
        by_value = {}  # type: Dict[str, Tuple[Any, List[str]]]
        for host in hosts:
            if variable in hostvars[host]:
                by_value.setdefault(repr(hostvars[host][variable]), (hostvars[host][variable], []))[1].append(host)
        for value, owners in by_value.values():
            problem = stall_problem(value, variable)
            if problem:
                problems.append("%s: %s" % (_hosts_label(owners), problem))
    return problems
