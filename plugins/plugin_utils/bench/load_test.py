"""The server load test's figures, as pure functions: a streamed chat completion's events become time to first
token and inter-token latencies; a concurrency level's requests become percentiles, aggregate t/s and errors.

The client on rank 0 (module_utils) records, per request, when it was sent and when each server-sent event
arrived, and keeps the events as they came; everything computed from them is here, on the controller.
"""

import json
import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.prima.cluster.plugins.module_utils.load_client import DIGEST_KEY, delta_text
from ansible_collections.prima.cluster.plugins.plugin_utils.bench.perflog import json_figure, parse_server_timings

PERCENTILES = (50, 95, 99)
Number = Optional[float]


def sse_data(lines: Iterable[str]) -> List[Any]:
    """The `data:` payloads of a server-sent event stream, decoded, up to `[DONE]`. A payload that is not JSON is
    kept as the string it was, so a caller can report what the server really sent."""
    events = []  # type: List[Any]
    for line in lines:
        if not line.startswith("data:"):
            continue  # comments (":"), event names, ids and blank separators carry no payload here
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        try:
            events.append(json.loads(payload))
        except (ValueError, RecursionError):
            events.append(payload)
    return events


def content_length(event: Any) -> int:
    """The characters of content an event adds: a chunk's as the server sent it, or the load client's digest of
    one (kept in its place once a request's events passed the client's byte budget)."""
    if isinstance(event, dict) and DIGEST_KEY in event:
        length = json_figure(event[DIGEST_KEY])
        return int(length) if length and length > 0 else 0
    return len(delta_text(event))


def stream_figures(sent: float, arrivals: Sequence[Tuple[float, Any]]) -> Dict[str, Any]:
    """One streamed request: `sent` and each event's arrival in seconds on one clock, the events decoded.
    Time to first token is the first chunk with content; inter-token latencies are the gaps between
    successive content chunks (llama-server sends one token per chunk); the server's own `timings`, when it
    sends them in the last chunk, under perflog's keys."""
    content_times = [when for when, event in arrivals if content_length(event)]
    timings = next((event for dummy, event in reversed(arrivals) if isinstance(event, dict) and "timings" in event),
                   None)
    errors = [event.get("error") for dummy, event in arrivals if isinstance(event, dict) and event.get("error")]
    figures = {
        "ttft_ms": (content_times[0] - sent) * 1000.0 if content_times else None,
        "itl_ms": [(later - earlier) * 1000.0 for earlier, later in zip(content_times, content_times[1:])],
        "tokens": len(content_times),
        "server": parse_server_timings(timings) if timings is not None else None,
        "error": None,
    }  # type: Dict[str, Any]
    if errors:
        figures["error"] = "the server sent an error event: %s" % json.dumps(errors[0], sort_keys=True)[:300]
    elif not content_times:
        figures["error"] = "no content in %d events" % len(arrivals)
    return figures


def request_figures(record: Mapping[str, Any]) -> Dict[str, Any]:
    """A load client's record of one request (sent, arrivals, status, error) as figures; the client's error
    (HTTP status, a stream cut before [DONE], a timeout) wins over what the events alone would say."""
    sent = record.get("sent")
    arrivals = record.get("arrivals") if isinstance(record.get("arrivals"), list) else []
    pairs = [(float(item[0]), item[1]) for item in arrivals
             if isinstance(item, (list, tuple)) and len(item) == 2 and json_figure(item[0]) is not None]
    if json_figure(sent) is None:
        return {"ttft_ms": None, "itl_ms": [], "tokens": 0, "server": None,
                "error": str(record.get("error") or "the request was never sent")}
    figures = stream_figures(float(sent), pairs)
    if record.get("error"):
        figures["error"] = str(record["error"])
    return figures


def percentile(values: Sequence[Any], q: float) -> Number:
    """The q-th percentile, linear between the closest ranks (numpy's default); None when there is no number."""
    numbers = sorted(float(value) for value in values if isinstance(value, (int, float))
                     and not isinstance(value, bool) and math.isfinite(value))
    if not numbers:
        return None
    position = (len(numbers) - 1) * q / 100.0
    lower = int(math.floor(position))
    upper = min(lower + 1, len(numbers) - 1)
    return numbers[lower] + (numbers[upper] - numbers[lower]) * (position - lower)


def level_summary(clients: int, requests: Sequence[Mapping[str, Any]], wall_s: Number) -> Dict[str, Any]:
    """One concurrency level: `requests` are stream_figures() results (or {"error": ...} for a request that got
    no stream). Latencies come from the requests that succeeded; aggregate t/s is every generated token of
    the level over its wall time (first request sent to last one done)."""
    good = [request for request in requests if not request.get("error")]
    itl = [gap for request in good for gap in request.get("itl_ms") or []]
    tokens = sum(int(request.get("tokens") or 0) for request in good)
    wall_s = json_figure(wall_s)
    summary = {"clients": clients, "requests": len(requests), "errors": len(requests) - len(good),
               "tokens": tokens, "wall_s": wall_s,
               "aggregate_tps": tokens / wall_s if wall_s and wall_s > 0 and good else None,
               "error_samples": sorted({str(request.get("error")) for request in requests
                                        if request.get("error")})[:3]}  # type: Dict[str, Any]
    for q in PERCENTILES:
        summary["ttft_p%d_ms" % q] = percentile([request.get("ttft_ms") for request in good], q)
        summary["itl_p%d_ms" % q] = percentile(itl, q)
    return summary


def _cell(value: Number, digits: int = 1) -> str:
    return "—" if value is None else "%.*f" % (digits, value)


def load_table(levels: Sequence[Mapping[str, Any]]) -> str:
    """clients | requests | TTFT p50/p95/p99 | ITL p50/p95/p99 | aggregate t/s | errors."""
    headers = ["Clients", "Requests", "TTFT ms p50 / p95 / p99", "ITL ms p50 / p95 / p99", "Aggregate t/s", "Errors"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for dummy in headers) + "|"]
    for level in levels:
        ttft = " / ".join(_cell(level.get("ttft_p%d_ms" % q)) for q in PERCENTILES)
        itl = " / ".join(_cell(level.get("itl_p%d_ms" % q), 2) for q in PERCENTILES)
        cells = (level["clients"], level["requests"], ttft, itl, _cell(level.get("aggregate_tps"), 2), level["errors"])
        lines.append("| %s | %s | %s | %s | %s | %s |" % cells)
    return "\n".join(lines)
