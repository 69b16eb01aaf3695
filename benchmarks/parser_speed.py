"""How long the log parsers take on a long log (not a test: the figures depend on the machine).

    python3 benchmarks/parser_speed.py [--lines N]

builds a log of N lines (100000 by default) by repeating the lines of a real prima.cpp rank-0
stderr (tests/fixtures/benchlog/prima-b_world3-rank0.stderr: device profile table, two HiGHS
allocation blocks, perf lines), times perflog.parse_perf and bench/log.py's parse_prima_rank on it, best
of 3 with time.perf_counter, and prints one JSON object. A rank that runs for hours with verbose
logging writes logs this long, and the controller parses every rank's log after each run.
"""

import argparse
import json
import os
import runpy
import sys
import time
import types
from typing import Callable, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(relative: str) -> types.SimpleNamespace:
    """A standard-library parser under plugins/plugin_utils (like "bench/log.py"), loaded from its file (no collection
    path needed)."""
    return types.SimpleNamespace(**runpy.run_path(os.path.join(REPO, "plugins", "plugin_utils", relative)))


bench_log = load("bench/log.py")
perflog = load("bench/perflog.py")

FIXTURE = os.path.join(REPO, "tests", "fixtures", "benchlog", "prima-b_world3-rank0.stderr")
ROUNDS = 3


def build_log(lines: int, path: str = FIXTURE) -> str:
    """`lines` lines of the fixture, repeated from its top as often as needed."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        source = handle.read().splitlines()
    repeats = -(-lines // len(source))
    return "\n".join((source * repeats)[:lines]) + "\n"


def best_time(parse: Callable[[str], object], text: str, rounds: int = ROUNDS) -> float:
    """The fastest of `rounds` runs of parse(text), in seconds (the least disturbed by the rest
    of the machine)."""
    best = float("inf")
    for dummy in range(rounds):
        start = time.perf_counter()
        parse(text)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Time the log parsers on a long prima.cpp log.")
    parser.add_argument("--lines", type=int, default=100000, help="lines in the log (default 100000)")
    args = parser.parse_args(argv)
    if args.lines < 1:
        parser.error("--lines must be at least 1")
    text = build_log(args.lines)
    print(json.dumps({
        "lines": args.lines,
        "bytes": len(text.encode("utf-8")),
        "parse_perf_s": round(best_time(perflog.parse_perf, text), 6),
        "parse_prima_rank_s": round(best_time(bench_log.parse_prima_rank, text), 6),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
