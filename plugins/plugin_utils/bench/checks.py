"""bench.yml's checks across ranks, and what its runs report (pure functions over hostvars-like mappings).

The readiness suite runs the same checks, so a cluster it passes is one bench.yml accepts.
"""

import json
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from ansible_collections.prima.cluster.plugins.plugin_utils.launch.plan import first_file, model_bytes, weights_path

# Which build (local fact, as the pinned_build role writes it) each runtime runs, and which of its binaries.
RUNTIME_BUILDS = {
    "prima": ("prima", ("llama-cli",)),
    "llama_rpc": ("llama_cpp", ("ggml-rpc-server", "llama-completion")),
    "single": ("llama_cpp", ("llama-completion",)),
}


def _local(hostvars: Mapping[str, Any], host: str) -> Mapping[str, Any]:
    return (hostvars[host].get("ansible_local") or {}) if hasattr(hostvars[host], "get") else {}


def build_commit(plan: Mapping[str, Any], hostvars: Mapping[str, Any]) -> str:
    """The commit the plan's head runs (its first 8 characters), for the report's Build column."""
    fact = _local(hostvars, plan["head"]).get(RUNTIME_BUILDS[plan["runtime"]][0]) or {}
    return str(fact.get("commit") or "")[:8]


def build_problems(plan: Mapping[str, Any], hostvars: Mapping[str, Any]) -> List[str]:
    """Every rank of the plan runs the same commit and the same binary bytes."""
    fact_name, names = RUNTIME_BUILDS[plan["runtime"]]
    seen = {}  # type: Dict[str, Any]
    problems = []
    for host in plan["hosts"]:
        fact = _local(hostvars, host).get(fact_name)
        if not fact:
            problems.append("%s: host %s has no %s build (no /etc/ansible/facts.d/%s.fact): run site.yml on it"
                            % (plan["name"], host, fact_name, fact_name))
            continue
        seen[host] = {"commit": fact.get("commit"),
                      "sha256": {name: (fact.get("binaries") or {}).get(name) for name in names}}
    if len({repr(value) for value in seen.values()}) > 1:
        detail = "; ".join("%s: commit %s, %s" % (host, value["commit"], ", ".join(
            "%s %s" % (name, (digest or "?")[:12]) for name, digest in sorted(value["sha256"].items())))
            for host, value in sorted(seen.items()))
        problems.append("%s: the ranks run different builds (%s): run site.yml so every node builds the same "
                        "commit" % (plan["name"], detail))
    return problems


def weights_problems(plan: Mapping[str, Any], hostvars: Mapping[str, Any], catalog: Mapping[str, Any]) -> List[str]:
    """Every rank has every file of the model, verified, with the same digest."""
    problems = []
    for spec in catalog[plan["model"]]["files"]:
        digests = {}
        for host in plan["hosts"]:
            entry = (_local(hostvars, host).get("models") or {}).get(spec["name"])
            if not entry or not entry.get("sha256"):
                problems.append("%s: host %s has no verified %s: run site.yml -e model=%s"
                                % (plan["name"], host, spec["name"], plan["model"]))
            else:
                digests[host] = entry["sha256"]
        if len(set(digests.values())) > 1:
            problems.append("%s: %s differs between nodes (%s): run site.yml -e model=%s to re-verify"
                            % (plan["name"], spec["name"], ", ".join("%s %s" % (host, digest[:12]) for host, digest
                                                                     in sorted(digests.items())), plan["model"]))
    return problems


def agreement_problems(plans: Sequence[Mapping[str, Any]], hostvars: Mapping[str, Any],
                       catalog: Mapping[str, Any]) -> List[str]:
    problems = []
    for plan in plans:
        problems += build_problems(plan, hostvars) + weights_problems(plan, hostvars, catalog)
        problems += ["%s: %s" % (plan["name"], problem) for problem in plan.get("fit_problems", [])]
    return problems


def probe_spec(plans: Sequence[Mapping[str, Any]], host: str) -> Dict[str, Any]:
    """What this host listens on during the runs, and the peers' ports it connects to."""
    ports, targets = [], []  # type: List[int], List[str]
    bind = ""
    for plan in plans:
        unit = plan["units"].get(host)
        if unit is None:
            continue
        # Through SSH a rank listens on the loopback and reaches each peer port through its own forward.
        addresses = plan.get("connect_addresses") or plan["addresses"]
        bind = addresses[host]
        ports += [port for port in unit["listen"] if port not in ports]
        if plan["runtime"] == "prima":
            hosts = plan["hosts"]
            peer = hosts[(hosts.index(host) + 1) % len(hosts)]
            peers = [peer]
        elif plan["runtime"] == "llama_rpc" and unit["role"] == "head":
            peers = [peer for peer in plan["hosts"] if peer != host]
        else:
            peers = []
        for peer in peers:
            targets += ["%s:%d" % (addresses[peer], port) for port in plan["units"][peer]["listen"]
                        if "%s:%d" % (addresses[peer], port) not in targets]
    return {"bind": bind, "ports": ports, "targets": targets, "expect": 1 if ports else 0}


def rank_reports(plan: Mapping[str, Any], hostvars: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """What each rank's host registered during one run (listening, then `finish`), for the run's judgement."""
    reports = []
    for host in plan["hosts"]:
        unit = plan["units"][host]
        listen = hostvars[host].get("bench_listen") or {}
        finish = json.loads((hostvars[host].get("bench_finish") or {}).get("stdout") or "{}")
        before = finish.get("before") or {}
        reports.append({
            "host": host, "rank": unit["rank"], "role": unit["role"],
            "listen_error": (listen.get("stderr") or "failed") if listen.get("rc") not in (None, 0) else "",
            "exit": before.get("exit"), "pid": before.get("pid"), "ended": before.get("ended"),
            "left_running": bool(finish.get("left_running")),
            "stalled": before.get("stalled"),  # launch_stall_s when the rank's watchdog stopped it
        })
    return reports


def network(plans: Sequence[Mapping[str, Any]], hostvars: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Each rank's measured handshake time and throughput to every peer address:port it connects to."""
    rows = []
    hosts = []  # type: List[str]
    for plan in plans:
        hosts += [host for host in plan["hosts"] if host not in hosts]
    peers = {}  # type: Dict[Tuple[str, str], Tuple[str, str]]
    for plan in plans:
        addresses = plan.get("connect_addresses") or plan["addresses"]
        for host in plan["hosts"]:
            for peer in plan["hosts"]:
                for port in plan["units"][peer]["listen"]:
                    peers[(host, "%s:%d" % (addresses[peer], port))] = (peer, plan.get("transport") or "direct")
    for host in hosts:
        probe = hostvars[host].get("bench_probe_result") or {}
        throughput = probe.get("throughput_mbit_s") or {}
        for target, rtt in sorted((probe.get("rtt_ms") or {}).items()):
            peer, via = peers.get((host, target), ("", "direct"))
            rows.append({"host": host, "target": target, "rtt_ms": rtt, "mbit_s": throughput.get(target),
                         "peer": peer, "via": via})
    return rows


def probe_payload_bytes(link_bits: int, payload_mib: int, seconds: float = 0.5) -> int:
    """The probe's payload: bench_probe_payload_mib, or half a second's worth of a slower shaped link."""
    payload = int(payload_mib) * 1048576
    return min(payload, int(int(link_bits) / 8 * seconds)) if int(link_bits) > 0 else payload


def link_shaping(host_vars: Sequence[Mapping[str, Any]], step: Mapping[str, Any]) -> Dict[str, Any]:
    """How a sweep step went on the plan's hosts: shaped on all of them or not, delay or not, and why."""
    if not int(step.get("bits") or 0):
        return {"shaped": False, "delay_applied": False, "notices": []}
    results = [dict(variables.get("link_result") or {}) for variables in host_vars]
    notices = sorted({result["notice"] for result in results if result.get("notice")})
    return {"shaped": bool(results) and all(result.get("shaped") for result in results),
            "delay_applied": bool(results) and all(result.get("delay_applied") for result in results),
            "notices": notices}


def model_files(plans: Sequence[Mapping[str, Any]], catalog: Mapping[str, Any], models_dir: str) -> Dict[str, Any]:
    """Per model of the plans: the file llama.cpp opens (the first part), its size and the whole model's."""
    models = {}
    for plan in plans:
        entry = catalog[plan["model"]]
        models[plan["model"]] = {"path": weights_path(entry, models_dir), "size": int(first_file(entry).get("size") or 0),
                                 "total": model_bytes(entry)}
    return models


def tunnel_drops(hosts: Sequence[str], hostvars: Mapping[str, Any]) -> Dict[str, List[Dict[str, Any]]]:
    """Each host's SSH forwarder drops since the run started (its forwarders script's `drops`), by host."""
    drops = {}  # type: Dict[str, List[Dict[str, Any]]]
    for host in hosts:
        registered = hostvars[host].get("bench_tunnel_drops") or {}
        try:
            found = json.loads(registered.get("stdout") or "[]")
        except ValueError:
            found = [{"peer": "?", "ports": [], "exit": "unreadable drops: %s" % registered.get("stdout", "")[:80]}]
        if found:
            drops[host] = found
    return drops
