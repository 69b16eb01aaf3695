"""Read llama.cpp / prima.cpp perf lines out of captured logs.

    python3 plugins/perflog.py FILE [FILE...]

prints a JSON array, one object per file, with the keys of PERF_KEYS: numbers as the log
printed them, null where the log does not say or says inf/nan. A file without perf lines
makes it exit 1, naming the file. Standard library only (it also runs on the nodes).

Formats: `llama_perf_sampler_print:` / `llama_perf_context_print:` (prima.cpp, llama.cpp of
late 2024), `common_perf_print:` behind a timestamp and level (current llama.cpp), and the
older `llama_print_timings:` (`sample time`, `total time` without a token count). ANSI
colours, CR LF line ends and perf lines glued to generated text are taken in stride.
"""

import json
import re
import sys
from typing import Dict, List, Optional, Union

Number = Union[int, float, None]
PERF_KEYS = ("file", "load_ms", "prompt_ms", "prompt_tokens", "prompt_tps", "eval_ms", "eval_runs", "eval_tps",
             "total_ms", "total_tokens", "sampling_ms", "sampling_runs")

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
MARKER = re.compile(r"(?:llama_perf_\w+_print|llama_print_timings|common_perf_print):\s*(?P<body>.*)$")
NUMBER = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf|nan)"
TIME = re.compile(r"^(?P<what>sampling|sample|load|prompt eval|eval|total) time\s*=\s*" + NUMBER + r"\s*ms"
                  r"(?:\s*/\s*" + NUMBER + r"\s*(?P<unit>runs|tokens))?"
                  r"(?:.*?,\s*" + NUMBER + r"\s*tokens per second)?", re.IGNORECASE)
FIELDS = {
    "sampling": ("sampling_ms", "sampling_runs", None),
    "sample": ("sampling_ms", "sampling_runs", None),
    "load": ("load_ms", None, None),
    "prompt eval": ("prompt_ms", "prompt_tokens", "prompt_tps"),
    "eval": ("eval_ms", "eval_runs", "eval_tps"),
    "total": ("total_ms", "total_tokens", None),
}


def to_number(text: Optional[str]) -> Number:
    """'12.5' -> 12.5, '26' -> 26, 'inf'/'nan'/None -> None."""
    if text is None:
        return None
    lowered = text.lower().lstrip("+-")
    if lowered in ("inf", "nan"):
        return None
    value = float(text)
    return int(value) if re.fullmatch(r"[-+]?\d+", text) else value


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


def main(argv: Optional[List[str]] = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: perflog.py FILE [FILE...]", file=sys.stderr)
        return 2
    results, missing = [], []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                figures = parse_perf(handle.read())
        except OSError as error:
            print("perflog: cannot read %s: %s" % (path, error.strerror), file=sys.stderr)
            return 1
        if figures is None:
            missing.append(path)
            continue
        results.append(dict(file=path, **figures))
    for path in missing:
        print("perflog: %s has no llama.cpp/prima.cpp perf lines (llama_perf_*, common_perf_print, "
              "llama_print_timings); was it rank 0's stderr?" % path, file=sys.stderr)
    if missing:
        return 1
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
