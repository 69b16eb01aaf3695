"""Read llama.cpp / prima.cpp perf lines out of captured logs, and llama-server answers.

    python3 plugins/perflog.py FILE [FILE...]

prints a JSON array, one object per file, with the keys of PERF_KEYS: numbers as the log
printed them, null where the log does not say, says inf/nan, or prints a figure out of range
(past float range, or 2**53 and more). A file without perf lines makes it exit 1, naming the
file. Standard library only (it also runs on the nodes).

A FILE that is a llama-server answer (the JSON of /completion or /v1/chat/completions) gives
the figures of its `timings` under the same keys (parse_server_timings), null for what the
answer does not give (load, total and sampling figures).

Formats: `llama_perf_sampler_print:` / `llama_perf_context_print:` (prima.cpp, llama.cpp of
late 2024), `common_perf_print:` behind a timestamp and level (current llama.cpp), and the
older `llama_print_timings:` (`sample time`, `total time` without a token count). ANSI
colours, CR LF line ends and perf lines glued to generated text are taken in stride.
"""

import json
import math
import re
import sys
from typing import Any, Dict, List, Optional, Union

Number = Union[int, float, None]
PERF_KEYS = ("file", "load_ms", "prompt_ms", "prompt_tokens", "prompt_tps", "eval_ms", "eval_runs", "eval_tps",
             "total_ms", "total_tokens", "sampling_ms", "sampling_runs")

# Figures at or past 2**53 are null: no time, count or rate comes near, and it is where a JSON
# reader stops keeping whole numbers exact.
MAX_FIGURE = 2 ** 53

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# [a-z]+, not \w+: \w would run over the rest of a line of `llama_perf_` repeats at every one of them.
MARKER = re.compile(r"(?:llama_perf_[a-z]+_print|llama_print_timings|common_perf_print):\s*(?P<body>.*)$")
NUMBER = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf|nan)"
INTEGER = re.compile(r"[-+]?\d+", re.ASCII)
# re.ASCII: with Unicode case folding, U+017F (long s) matches "s" and the phase is not in FIELDS.
TIME = re.compile(r"^(?P<what>sampling|sample|load|prompt eval|eval|total) time\s*=\s*" + NUMBER + r"\s*ms"
                  r"(?:\s*/\s*" + NUMBER + r"\s*(?P<unit>runs|tokens))?"
                  r"(?:.*?,\s*" + NUMBER + r"\s*tokens per second)?", re.IGNORECASE | re.ASCII)
FIELDS = {
    "sampling": ("sampling_ms", "sampling_runs", None),
    "sample": ("sampling_ms", "sampling_runs", None),
    "load": ("load_ms", None, None),
    "prompt eval": ("prompt_ms", "prompt_tokens", "prompt_tps"),
    "eval": ("eval_ms", "eval_runs", "eval_tps"),
    "total": ("total_ms", "total_tokens", None),
}
# Where a llama-server answer's `timings` go: its names -> PERF_KEYS.
SERVER_TIMINGS = (("prompt_n", "prompt_tokens"), ("prompt_ms", "prompt_ms"), ("prompt_per_second", "prompt_tps"),
                  ("predicted_n", "eval_runs"), ("predicted_ms", "eval_ms"), ("predicted_per_second", "eval_tps"))


def in_range(value: float) -> bool:
    return math.isfinite(value) and abs(value) < MAX_FIGURE


def to_number(text: Optional[str]) -> Number:
    """'12.5' -> 12.5, '26' -> 26; None for None, 'inf', 'nan' and figures out of range."""
    if text is None:
        return None
    try:
        # float() first: it takes any number of digits (int() refuses 4300 and more) and
        # overflows to inf, which in_range turns away.
        value = float(text)
    except ValueError:
        return None
    if not in_range(value):
        return None
    return int(value) if INTEGER.fullmatch(text) else value


def perf_lines(text: str) -> List[str]:
    """The body of every perf line (after its marker), in order."""
    bodies = []
    for raw in ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        match = MARKER.search(raw)
        if match:
            bodies.append(match.group("body").strip())
    return bodies


def parse_perf(text: str) -> Optional[Dict[str, Number]]:
    """The figures of the last perf block in `text`; None when it has no perf line."""
    bodies = perf_lines(text)
    if not bodies:
        return None
    figures = {key: None for key in PERF_KEYS if key != "file"}  # type: Dict[str, Number]
    for body in bodies:
        match = TIME.match(body)
        if not match:
            continue
        ms_key, count_key, tps_key = FIELDS[match.group("what").lower()]
        figures[ms_key] = to_number(match.group(2))
        if count_key:
            figures[count_key] = to_number(match.group(3))
        if tps_key:
            figures[tps_key] = to_number(match.group(5))
    return figures


def json_figure(value: Any) -> Number:
    """A figure of a JSON answer: an int stays an int; None for what is not a number (booleans and
    strings included) or is out of range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return value if abs(value) < MAX_FIGURE else None
    return value if in_range(value) else None


def parse_server_timings(answer: Any) -> Dict[str, Number]:
    """The figures of a llama-server answer (its decoded JSON, /completion or
    /v1/chat/completions) or of its `timings` object alone, under the keys parse_perf gives:
    prompt_n -> prompt_tokens, prompt_ms, prompt_per_second -> prompt_tps, predicted_n ->
    eval_runs, predicted_ms -> eval_ms, predicted_per_second -> eval_tps. Every other key, and
    what the answer lacks or gives as no usable number, is None."""
    timings = answer.get("timings", answer) if isinstance(answer, dict) else {}
    if not isinstance(timings, dict):
        timings = {}
    figures = {key: None for key in PERF_KEYS if key != "file"}  # type: Dict[str, Number]
    for server_key, key in SERVER_TIMINGS:
        figures[key] = json_figure(timings.get(server_key))
    return figures


def not_a_number(_literal: str) -> None:
    """json's hook for the NaN / Infinity literals some writers emit: None."""


def json_object(text: str) -> Optional[Dict[str, Any]]:
    """`text` decoded when it is one JSON object (a server answer, not a log); None otherwise."""
    stripped = text.strip()
    if not stripped.startswith("{"):
        return None
    try:
        decoded = json.loads(stripped, parse_constant=not_a_number)
    except (ValueError, RecursionError):  # not JSON, digits past int()'s limit, nested too deep
        return None
    return decoded if isinstance(decoded, dict) else None


def file_figures(text: str) -> Union[Dict[str, Number], str]:
    """The figures of a log or of a llama-server answer, or what the file lacks (a phrase)."""
    answer = json_object(text)
    if answer is None:
        figures = parse_perf(text)
        if figures is None:
            return ("has no llama.cpp/prima.cpp perf lines (llama_perf_*, common_perf_print, llama_print_timings); "
                    "was it rank 0's stderr?")
        return figures
    if not isinstance(answer.get("timings"), dict):
        return ("is JSON with no timings object: not a llama-server /completion or /v1/chat/completions answer "
                "(prima.cpp's chat answers have none; ask /completion)")
    return parse_server_timings(answer)


def main(argv: Optional[List[str]] = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: perflog.py FILE [FILE...]", file=sys.stderr)
        return 2
    results, lacking = [], []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                figures = file_figures(handle.read())
        except OSError as error:
            print("perflog: cannot read %s: %s" % (path, error.strerror or error), file=sys.stderr)
            return 1
        if isinstance(figures, str):
            lacking.append("perflog: %s %s" % (path, figures))
            continue
        results.append(dict(file=path, **figures))
    for line in lacking:
        print(line, file=sys.stderr)
    if lacking:
        return 1
    # allow_nan=False: Infinity and NaN are not JSON; every figure was checked, this makes sure.
    print(json.dumps(results, indent=2, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
