"""Shaping a node's cluster link for bench.yml's link sweeps (pure functions; the tc calls are built here).

The rate comes from tbf, which every kernel here has. Added delay needs netem, which some
kernels lack (this machine's) and containers without NET_ADMIN cannot use at all: tc's own
error says which, and `tc_notice` turns it into a sentence for the report.
"""

import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

UNITS = {"bit": 1, "kbit": 10 ** 3, "mbit": 10 ** 6, "gbit": 10 ** 9, "tbit": 10 ** 12}


def parse_rate(text: str) -> int:
    """'2.5gbit' -> 2500000000 bits per second (decimal units, as tc reads them)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit)\s*", str(text).lower())
    if not match:
        raise ValueError("link rate %r: write it like 1gbit, 2.5gbit or 100mbit" % (text,))
    return int(round(float(match.group(1)) * UNITS[match.group(2)]))


def tc_rate(bits_per_second: int) -> str:
    """A rate tc reads exactly: 2500000000 -> '2500mbit'."""
    for unit in ("gbit", "mbit", "kbit"):
        if bits_per_second % UNITS[unit] == 0:
            return "%d%s" % (bits_per_second // UNITS[unit], unit)
    return "%dbit" % bits_per_second


def tbf_burst_bytes(bits_per_second: int, hz: int = 250, mtu: int = 1514) -> int:
    """tbf needs a bucket of at least one timer tick's worth of bytes (rate / HZ), and a few frames."""
    return max(int(math.ceil(bits_per_second / 8.0 / hz)), 10 * mtu)


def shaping_commands(device: str, bits_per_second: int, delay_ms: float = 0.0, netem: bool = False,
                     latency_ms: int = 50) -> List[List[str]]:
    """tc argv to shape `device`: tbf alone, or netem (delay) with tbf under it."""
    tbf = ["tbf", "rate", tc_rate(bits_per_second), "burst", str(tbf_burst_bytes(bits_per_second)),
           "latency", "%dms" % latency_ms]
    if delay_ms and netem:
        return [["tc", "qdisc", "replace", "dev", device, "root", "handle", "1:", "netem", "delay", "%gms" % delay_ms],
                ["tc", "qdisc", "replace", "dev", device, "parent", "1:1", "handle", "10:"] + tbf]
    return [["tc", "qdisc", "replace", "dev", device, "root"] + tbf]


def tc_notice(stderr: str, what: str = "netem") -> Optional[str]:
    """Why tc refused, as a sentence for the report; None when the error is not one of the known ones."""
    if "Specified qdisc kind is unknown" in stderr or "Unknown qdisc" in stderr:
        return ("this kernel has no %s qdisc (module sch_%s): added delay cannot be emulated here, links are "
                "shaped by rate only (tbf)" % (what, what))
    if "Operation not permitted" in stderr:
        return ("tc is not permitted on this host (a container without NET_ADMIN): its link cannot be shaped; "
                "run the sweep on hosts that allow tc")
    if "Cannot find device" in stderr:
        return "tc cannot find the cluster interface: %s" % stderr.strip()
    return None


def parse_delay(text: str) -> float:
    """'2ms' -> 2.0, '500us' -> 0.5 (milliseconds)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|us)\s*", str(text).lower())
    if not match:
        raise ValueError("added delay %r: write it like 2ms or 500us" % (text,))
    return float(match.group(1)) / (1000.0 if match.group(2) == "us" else 1.0)


def parse_links(value: Union[str, Sequence[str], None]) -> List[Dict[str, Any]]:
    """`-e links=1gbit,2.5gbit:2ms` -> one sweep step per entry: rate, optional added delay.

    No value: one step, the network as it is ("unshaped")."""
    if value is None or value == "" or value == []:
        return [{"label": "unshaped", "bits": 0, "delay_ms": 0.0}]
    entries = [part.strip() for part in value.split(",")] if isinstance(value, str) else [str(part).strip() for part in value]
    steps, problems = [], []  # type: List[Dict[str, Any]], List[str]
    for entry in entries:
        rate, dummy, delay = entry.partition(":")
        try:
            step = {"label": entry.lower(), "bits": parse_rate(rate), "delay_ms": parse_delay(delay) if delay else 0.0}
        except ValueError as error:
            problems.append("links: %s" % error)
            continue
        if step["bits"] < 10 ** 5:
            problems.append("links: %s is below 100kbit, too slow to move a model's activations" % entry)
        elif any(earlier["label"] == step["label"] for earlier in steps):
            problems.append("links: %s is given twice" % entry)
        else:
            steps.append(step)
    if problems:
        raise ValueError("; ".join(problems) + " (write -e links=1gbit,2.5gbit,10gbit; RATE:DELAY adds a delay, "
                         "like 1gbit:2ms)")
    return steps


def links_problems(value: Union[str, Sequence[str], None]) -> List[str]:
    """Why -e links=... is not a sweep (parse_links's error), or none."""
    try:
        parse_links(value)
    except ValueError as error:
        return [str(error)]
    return []


def interface_with(address: str, ip_output: str) -> Optional[str]:
    """The device holding `address`, from `ip -o -4 addr show` ("2: eth0    inet 10.0.0.1/24 ...")."""
    for line in ip_output.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "inet" and fields[3].split("/")[0] == address:
            return fields[1].split("@")[0]
    return None


def step_commands(device: str, step: Mapping[str, Any], with_delay: bool) -> List[List[str]]:
    """tc argv for a sweep step: with its added delay (netem over tbf) or the rate alone."""
    delay = float(step.get("delay_ms") or 0.0) if with_delay else 0.0
    return shaping_commands(device, int(step["bits"]), delay_ms=delay, netem=delay > 0)


def _first_refusal(results: Sequence[Mapping[str, Any]]) -> Optional[str]:
    for result in results:
        if result.get("rc", 0) != 0:
            return (result.get("stderr") or result.get("msg") or "tc failed").strip()
    return None


def shaping_result(results: Sequence[Mapping[str, Any]], rate_only: Sequence[Mapping[str, Any]],
                   step: Mapping[str, Any]) -> Dict[str, Any]:
    """What the tc calls of a step achieved: shaped or not, delay or not, a notice for the report, or an error."""
    wants_delay = float(step.get("delay_ms") or 0.0) > 0
    outcome = {"label": step["label"], "shaped": True, "delay_applied": wants_delay, "notice": "", "error": ""}
    refusal = _first_refusal(results)
    if refusal is None:
        return outcome
    outcome["delay_applied"] = False
    if wants_delay and rate_only and _first_refusal(rate_only) is None:
        outcome["notice"] = tc_notice(refusal) or "tc refused the added delay (%s): links are shaped by rate only" % refusal
        return outcome
    refusal = _first_refusal(rate_only) if wants_delay and rate_only else refusal
    outcome["shaped"] = False
    if refusal and "Operation not permitted" in refusal:
        outcome["notice"] = tc_notice(refusal) or refusal
    else:
        outcome["error"] = refusal or "tc failed"
    return outcome


def route_source(ip_route_get: str) -> str:
    """The source address in `ip -o route get ADDRESS` output ("... dev eth0 src 10.77.0.10 uid 0"), or ""."""
    words = ip_route_get.split()
    return words[words.index("src") + 1] if "src" in words[:-1] else ""
