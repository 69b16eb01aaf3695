"""The estimate beside each measurement (pure functions over aggregated rows, standard library).

The model (the arithmetic is in models/estimate.py): decode is latency-bound, so a split model's
time per token is the single node's (every layer once, wherever it runs) plus, per pipeline boundary
crossed, half the measured round trip and the transfer of one token's activations at the link rate.
Prefill moves the whole prompt's activations across each boundary once. The single-node run of the
same model, in the same benchmark, calibrates the compute; the probe before each sweep step gives
the round trip and, on an unshaped link, the throughput.
"""

import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.prima.cluster.plugins.plugin_utils.models.estimate import (
    boundaries_crossed, boundary_bytes_per_token, decode_estimate)

Key = Tuple[str, str, str]


def _median(values: Sequence[Any]) -> Optional[float]:
    numbers = [float(value) for value in values if isinstance(value, (int, float)) and not isinstance(value, bool)]
    return statistics.median(numbers) if numbers else None


def link_gbit(row: Mapping[str, Any]) -> Optional[float]:
    """The rate the step shaped the links to, else the probe's measured throughput."""
    if row.get("link_bits") and (row.get("link_shaping") or {}).get("shaped"):
        return float(row["link_bits"]) / 1e9
    measured = _median([item.get("mbit_s") for item in row.get("network") or []])
    return measured / 1000.0 if measured else None


def round_trip_ms(row: Mapping[str, Any]) -> float:
    """The probe's median round trip (a one-byte ping) on the link as it is (on a shaped link it queues behind
    the other ranks' payloads), plus twice the delay a step added where netem applied it (each way)."""
    base = _median([item.get("rtt_ms") for item in row.get("base_network") or row.get("network") or []]) or 0.0
    shaping = row.get("link_shaping") or {}
    return base + (2 * float(row.get("link_delay_ms") or 0.0) if shaping.get("delay_applied") else 0.0)


def baseline(rows: Sequence[Mapping[str, Any]], model: str, link: str) -> Optional[Mapping[str, Any]]:
    """The single-node row of the model: on the same link step if there is one (same machine load)."""
    singles = [row for row in rows if row["runtime"] == "single" and row["model"] == model
               and row["ms_per_token"]["median"] is not None]
    same = [row for row in singles if row["link"] == link]
    return (same or singles or [None])[0]


def model_of(row: Mapping[str, Any], rate_gbit: Optional[float], rtt_ms: float,
             single: Mapping[str, Any]) -> Dict[str, Optional[float]]:
    """Expected decode and prefill t/s of a split row at a given link rate and round trip."""
    facts = row.get("model_facts") or {}
    boundary = boundary_bytes_per_token(int(facts["n_embd"]), row["runtime"], None)
    hops = boundaries_crossed(row["runtime"], int(row["world"]))
    decode = decode_estimate(single["ms_per_token"]["median"], int(row["world"]), hops, boundary["per_token"],
                             boundary["per_message"], rtt_ms, rate_gbit or 0.0)
    prefill = None
    prompt_ms, prompt_tokens = single.get("prompt_ms", {}).get("median"), single.get("prompt_tokens")
    if prompt_ms and prompt_tokens:
        bits = (prompt_tokens * boundary["per_token"] + boundary["per_message"]) * 8
        transfer_ms = bits / (rate_gbit * 1e9) * 1000 if rate_gbit else 0.0
        prefill = prompt_tokens / (prompt_ms + hops * (rtt_ms / 2 + transfer_ms)) * 1000
    return {"decode_tps": decode["decode_tps"], "prompt_tps": prefill, "network_ms_per_token": decode["network_ms_per_token"]}


def expectations(rows: Sequence[Mapping[str, Any]]) -> Dict[Key, Dict[str, Any]]:
    """Per row: expected decode and prefill t/s and measured/expected, or why there is no estimate."""
    result = {}  # type: Dict[Key, Dict[str, Any]]
    for row in rows:
        key = (row["runtime"], row["model"], row["link"])
        if row["runtime"] == "single":
            result[key] = {"basis": "baseline", "decode_tps": None, "prompt_tps": None}
            continue
        single = baseline(rows, row["model"], row["link"])
        if single is None:
            result[key] = {"basis": "no single-node run of %s to calibrate (add -e runtime=all)" % row["model"],
                           "decode_tps": None, "prompt_tps": None}
            continue
        if not (row.get("model_facts") or {}).get("n_embd"):
            result[key] = {"basis": "no model facts", "decode_tps": None, "prompt_tps": None}
            continue
        expected = model_of(row, link_gbit(row), round_trip_ms(row), single)
        expected["basis"] = "model"
        for metric in ("decode_tps", "prompt_tps"):
            measured = (row["eval_tps"] if metric == "decode_tps" else row["prompt_tps"])["median"]
            expected[metric + "_ratio"] = measured / expected[metric] if measured and expected[metric] else None
        result[key] = expected
    return result


def expected_curve(rows: Sequence[Mapping[str, Any]], runtime: str, model: str,
                   rates_gbit: Sequence[float]) -> List[Dict[str, Optional[float]]]:
    """The estimate along a range of link rates, with the sweep's median round trip: the plot's line."""
    steps = [row for row in rows if row["runtime"] == runtime and row["model"] == model]
    single = baseline(rows, model, steps[0]["link"]) if steps else None
    if not steps or single is None or not (steps[0].get("model_facts") or {}).get("n_embd"):
        return []
    rtt = _median([round_trip_ms(row) for row in steps]) or 0.0
    return [dict(model_of(steps[0], rate, rtt, single), rate_gbit=rate) for rate in rates_gbit]


def transfer_ms(row: Mapping[str, Any], rate_gbit: Optional[float]) -> float:
    """One token's message across one boundary at the rate."""
    boundary = boundary_bytes_per_token(int((row.get("model_facts") or {})["n_embd"]), row["runtime"], None)
    return (boundary["per_token"] + boundary["per_message"]) * 8 / (rate_gbit * 1e9) * 1000 if rate_gbit else 0.0


def boundary_costs(rows: Sequence[Mapping[str, Any]]) -> Dict[Key, Dict[str, Any]]:
    """What each boundary really cost per token, measured ((split - single ms/token) / boundaries),
    against the model's (half the round trip and the transfer); and, along a sweep, the decode
    predicted with the cost beyond the transfer fitted at the fastest step (the others are out of sample)."""
    costs = {}  # type: Dict[Key, Dict[str, Any]]
    for series in sweep_series(rows):
        fastest = series["rows"][-1]
        single = baseline(rows, series["model"], fastest["link"])
        if single is None or not (fastest.get("model_facts") or {}).get("n_embd"):
            continue
        hops = boundaries_crossed(series["runtime"], int(fastest["world"]))
        if not hops or fastest["ms_per_token"]["median"] is None:
            continue
        single_ms = single["ms_per_token"]["median"]
        fixed = (fastest["ms_per_token"]["median"] - single_ms) / hops - transfer_ms(fastest, link_gbit(fastest))
        for row in series["rows"]:
            rate = link_gbit(row)
            measured_ms = row["ms_per_token"]["median"]
            fitted_ms = single_ms + hops * (fixed + transfer_ms(row, rate))
            fitted = 1000.0 / fitted_ms if fitted_ms > 0 else None
            costs[(row["runtime"], row["model"], row["link"])] = {
                "measured_ms": (measured_ms - single_ms) / hops if measured_ms is not None else None,
                "expected_ms": round_trip_ms(row) / 2 + transfer_ms(row, rate),
                "fitted_decode_tps": fitted, "fitted_at": fastest["link"], "is_fit": row is fastest,
                "fitted_ratio": row["eval_tps"]["median"] / fitted if fitted and row["eval_tps"]["median"] else None,
            }
    return costs


def sweep_series(rows: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Each split runtime x model measured on shaped links: its steps, in rate order."""
    groups = {}  # type: Dict[Tuple[str, str], List[Mapping[str, Any]]]
    for row in rows:
        if row["runtime"] != "single" and row.get("link_bits"):
            groups.setdefault((row["runtime"], row["model"]), []).append(row)
    return [{"runtime": runtime, "model": model, "rows": sorted(steps, key=lambda row: row["link_bits"])}
            for (runtime, model), steps in groups.items()]


def ratio_text(value: Optional[float]) -> str:
    return "—" if value is None else "%.2f" % value


def expected_cell(expected: Mapping[str, Any], metric: str) -> str:
    if expected.get("basis") == "baseline":
        return "baseline"
    value = expected.get(metric)
    return "—" if value is None else "%.2f" % value


def curve_rates(rows: Sequence[Mapping[str, Any]], points: int = 40) -> List[float]:
    """Log-spaced rates from a bit below the slowest step to a bit above the fastest."""
    rates = [row["link_bits"] / 1e9 for row in rows if row.get("link_bits")]
    low, high = min(rates) * 0.8, max(rates) * 1.25
    return [low * (high / low) ** (index / (points - 1)) for index in range(points)]
