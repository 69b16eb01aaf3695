"""Shaping a node's cluster link for issue 6's sweeps (pure functions; the tc calls are built here).

The rate comes from tbf, which every kernel here has. Added delay needs netem, which some
kernels lack (this machine's) and containers without NET_ADMIN cannot use at all: tc's own
error says which, and `tc_notice` turns it into a sentence for the report.
"""

import math
import re
from typing import List, Optional

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


def removal_command(device: str) -> List[str]:
    return ["tc", "qdisc", "del", "dev", device, "root"]


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
