"""bench.yml -e mode=server, as pure functions: its input (the client counts), the server's context, the cluster
lock's bound, and the records made of one load test (the module prima.cluster.load_test's result).

One server per runtime x model x link step; its sequential requests become records of mode "server" with the
same `perf` keys as a mode=run run (from the server's own `timings`), so the main table and the medians take
them as they are; each concurrency level becomes one record of mode "server-load".
"""

import json
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.load_test import level_summary, request_figures
from ansible_collections.prima.cluster.plugins.plugin_utils.bench.perflog import (
    json_figure, not_a_number, parse_server_timings)

MODES = ("run", "server")
DEFAULT_CLIENTS = (1, 2, 4)
# Addresses a server listens on that a client on the same node reaches through the loopback.
ANY_ADDRESS = ("", "0.0.0.0", "::", "[::]")
# The token counts of a sequential request's answer (the load client's `usage`).
USAGE_KEYS = ("prompt_tokens", "completion_tokens")
# What a level record keeps of level_summary (the rest of the record is the run's meta).
LEVEL_KEYS = ("clients", "requests", "errors", "error_samples", "tokens", "wall_s", "aggregate_tps",
              "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p95_ms", "itl_p99_ms")


def _parts(value: Any) -> List[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(part).strip() for part in value]
    return [part.strip() for part in str(value).split(",")]


def clients_problems(value: Any, variable: str = "clients") -> List[str]:
    """The concurrency sweep: a comma list (or a list) of whole numbers >= 1, like 1,2,4."""
    parts = _parts(value)
    if parts and all(re.fullmatch(r"\d+", part) and int(part) >= 1 for part in parts):
        return []
    return ["%s '%s' is not a comma list of whole numbers >= 1; pass -e %s=%s"
            % (variable, value, variable, ",".join(str(count) for count in DEFAULT_CLIENTS))]


def parse_clients(value: Any) -> List[int]:
    """The client counts in the order given, each once; DEFAULT_CLIENTS when none is given."""
    if value is None or value == "" or value == []:
        return list(DEFAULT_CLIENTS)
    if clients_problems(value):
        raise ValueError(clients_problems(value)[0])
    counts = []  # type: List[int]
    for part in _parts(value):
        if int(part) not in counts:
            counts.append(int(part))
    return counts


def ctx_size(parallel: int, prompt: str, max_tokens: int) -> int:
    """llama-server's whole context (-c): each of its `parallel` slots gets ctx / parallel tokens and must hold
    the chat template, the prompt (a token per character at worst) and the answer; at least 2048."""
    per_slot = max(512, int(max_tokens) + len(prompt) + 128)
    return max(2048, max(1, int(parallel)) * per_slot)


def server_bound_s(steps: int, plans: int, warmup_runs: int, runs: int, clients: Sequence[int],
                   requests_per_client: int, request_timeout_s: int, listen_timeout_s: int, load_timeout_s: int,
                   stop_grace_s: int, overhead_s: int = 1800, unit_overhead_s: int = 120) -> int:
    """The longest a bench.yml -e mode=server may take, for the cluster lock: per runtime x model x link step,
    the server comes up (its workers listen, the head loads the model), every sequential request and every
    client's requests of each level (the clients of a level run at once) run to their timeout, and the server
    stops (twice the grace); plus per-unit and fixed overheads (forwarders, probes, profile)."""
    requests = int(warmup_runs) + int(runs) + len(clients) * int(requests_per_client)
    per_unit = (int(listen_timeout_s) + int(load_timeout_s) + requests * int(request_timeout_s)
                + 2 * int(stop_grace_s) + int(unit_overhead_s))
    return int(overhead_s) + max(1, int(steps)) * max(1, int(plans)) * per_unit


def client_address(bind: str) -> str:
    """Where a client on the server's own node reaches it."""
    return "127.0.0.1" if str(bind) in ANY_ADDRESS else str(bind)


def clients_where(head: str, address: str, port: Any) -> str:
    """The sentence of the report that says where the load came from."""
    via = "over loopback" if address.startswith("127.") or address in ("::1", "localhost") else "over the network"
    return "clients on rank 0 (%s) %s (%s:%s)" % (head, via, address, port)


def sequential_problems(plan: Mapping[str, Any], result: Mapping[str, Any]) -> List[str]:
    """The measured sequential requests that failed: without them there is no figure for the main table."""
    problems = []  # type: List[str]
    for index, request in enumerate(result.get("sequential") or []):
        if request.get("warmup"):
            continue
        if request.get("error"):
            problems.append("%s request %d: %s" % (plan["name"], index, request["error"]))
    if not any(not request.get("warmup") for request in result.get("sequential") or []):
        problems.append("%s: no measured request in the load test's result" % plan["name"])
    return problems


def _base(plan: Mapping[str, Any], meta: Mapping[str, Any], mode: str) -> Dict[str, Any]:
    record = dict(meta)
    record.update({"mode": mode, "runtime": plan["runtime"], "model": plan["model"], "unit": plan["name"],
                   "world": plan["world"], "hosts": list(plan["hosts"]), "split": plan["split"]})
    return record


def _ms(start: Any, end: Any) -> Optional[float]:
    if json_figure(start) is not None and json_figure(end) is not None:
        return json_figure((float(end) - float(start)) * 1000.0)
    return None


def usage_figures(usage: Any) -> Optional[Dict[str, Any]]:
    """The token counts of an answer, each a figure or None (the server's word, checked as a log's figures are)."""
    if not isinstance(usage, dict):
        return None
    return {key: json_figure(usage[key]) for key in USAGE_KEYS if key in usage}


def sequential_records(plan: Mapping[str, Any], result: Mapping[str, Any],
                       meta: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """One record per sequential request, warm-ups included (marked, as mode=run's warm-up runs are): its `perf`
    is the server's `timings` under parse_perf's keys, run_index counts from 0 over warm-ups and runs."""
    records = []
    for index, request in enumerate(result.get("sequential") or []):
        record = _base(plan, meta, "server")
        record.update({"run_index": index, "warmup": bool(request.get("warmup")),
                       "perf": parse_server_timings(request.get("timings") or {}),
                       "request": {"status": request.get("status"),
                                   "wall_ms": _ms(request.get("sent"), request.get("done")),
                                   "usage": usage_figures(request.get("usage")), "error": request.get("error")}})
        records.append(record)
    return records


def level_records(plan: Mapping[str, Any], result: Mapping[str, Any],
                  meta: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """One record per concurrency level: its request count, errors, TTFT and ITL percentiles, aggregate t/s."""
    records = []
    for level in result.get("levels") or []:
        requests = level.get("requests") or []
        summary = level_summary(int(level["clients"]), [request_figures(request) for request in requests],
                                level.get("wall_s"))
        record = _base(plan, meta, "server-load")
        record.update({key: summary.get(key) for key in LEVEL_KEYS})
        record["dropped_events"] = sum(int(request.get("dropped") or 0) for request in requests)
        records.append(record)
    return records


def server_records(plan: Mapping[str, Any], result: Mapping[str, Any],
                   meta: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Every record of one load test: the sequential requests', then one per concurrency level."""
    return sequential_records(plan, result, meta) + level_records(plan, result, meta)


def raw_result(result: Mapping[str, Any]) -> Dict[str, Any]:
    """What the load test measured, as kept under raw/: its requests, without Ansible's own keys, and as JSON
    can hold it: a NaN or an infinity the server sent is null, as perflog reads those in an answer."""
    raw = {"sequential": list(result.get("sequential") or []), "levels": list(result.get("levels") or [])}
    # json.dumps writes them as NaN/Infinity literals, which perflog's hook turns into None on the way back.
    return json.loads(json.dumps(raw), parse_constant=not_a_number)
