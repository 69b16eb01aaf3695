"""Read what a benchmark run leaves behind: prima.cpp rank logs, llama-bench output, llama-server timings.

Pure functions over text, standard library only and Python 3.8 compatible, so it can run on a node
as well as on the controller.

- parse_prima_rank: one prima.cpp rank's stderr (or stdout + stderr run together): the layer window
  the rank ended up with, whether the allocator dropped it, the HiGHS allocation and the device
  profile table rank 0 prints in automatic mode.
- profile_summary: the few profile rows a report wants, as numbers, one dict per rank.
- parse_llama_bench_json / parse_llama_bench_md: llama-bench `-o json` and `-o md`.
- parse_server_timings: the `timings` object of a llama-server `/completion` answer.

Numbers the programs print as `inf`, `nan` or `-nan` (a phase that ran 0 ms) come back as None: a
float('inf') would poison every mean and JSON dump downstream. So do figures out of range (2**53
and more, or digits past what int() takes): no run prints them, a damaged log can. No input makes
these functions raise.
"""

import json
import math
import re
from typing import Any, Dict, Iterator, List, Optional, Union

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
WINDOW = re.compile(r"Using window size:\s*(\d+),\s*GPU layers:\s*(\d+)")
REMOVED = "No layer is assigned to me, exit."
ALLOCATION = "----- Allocation Strategy (by HiGHS) -----"
# Stripped in code, not by \s* around the groups: those overlap the groups' own spaces, which made a
# long run of blanks take quadratic time.
ALLOCATION_ITEM = re.compile(r"^\s*-(?P<key>[^:=]+)[:=](?P<value>.*)$")
ALLOCATION_KEYS = {"Device Index": "index", "N Layer Window": "window", "N GPU Layers": "gpu_layers"}
PROFILE_HEADER = re.compile(r"\|[ \t]*Property[ \t]*\|")
RULE = re.compile(r"^[^|]*-{10,}\s*$")
SUMMARY_ROWS = (  # key, profile row, type
    ("cpu_cores", "Number of CPU cores", int),
    ("ram_gib", "Physical Mem Total (GiB)", float),
    ("disk_read_gbs", "Disk Read Seq Speed (GB/s)", float),
    ("gpu", "GPU Name", str),
    ("vram_gib", "GPU Mem Total (GiB)", float),
    ("device", "Device Name", str),
)
BENCH_KEYS = ("n_prompt", "n_gen", "avg_ts", "stddev_ts", "samples_ts", "backends", "n_gpu_layers", "model_type")
TIMING_KEYS = ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second")
MD_SEPARATOR = re.compile(r"^:?-+:?$")
RECORD_START = re.compile(r"^[ \t]*\{", re.MULTILINE)

Number = Union[int, float, None]
# No benchmark figure comes near 2**53, where a JSON reader stops keeping whole numbers exact.
MAX_FIGURE = 2 ** 53


# --- numbers -------------------------------------------------------------------------------------

def to_float(value: Any) -> Optional[float]:
    """A finite float below MAX_FIGURE, or None for inf/nan/-nan, blanks, words, booleans and figures
    out of range: a benchmark figure that is not a real number must not be averaged as one."""
    if value is None or isinstance(value, bool):
        return None
    try:
        # float() of a string takes any number of digits (int() refuses 4300 and more)
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float range
        return None
    return number if math.isfinite(number) and abs(number) < MAX_FIGURE else None


def to_int(value: Any) -> Optional[int]:
    """An int from an int or an integral number/string ('2', 2, 2.0); None otherwise."""
    number = to_float(value)
    if number is None or number != int(number):
        return None
    return int(number)


def not_a_number(_literal: str) -> None:
    """json's hook for the NaN / Infinity / -Infinity literals some writers emit: None."""


def json_number(value: Any) -> Number:
    """A JSON figure as the server sent it (int stays int), None where it is missing or not finite."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if abs(value) < MAX_FIGURE else None
    return to_float(value)


# --- prima.cpp rank logs -------------------------------------------------------------------------

def clean(text: str) -> str:
    """Log text without ANSI colours and with \\n line ends only (a log piped through a terminal
    or written on Windows must read the same as a plain one)."""
    if "\x1b" in text:
        text = ANSI.sub("", text)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def lines_from(text: str, start: int) -> Iterator[str]:
    """The lines of `text` from offset `start` on, lazily: the tables sit near the end of a log
    that may be megabytes long, so they are walked without splitting the whole text."""
    while start < len(text):
        end = text.find("\n", start)
        if end < 0:
            end = len(text)
        yield text[start:end]
        start = end + 1


def parse_window(text: str) -> Dict[str, Optional[int]]:
    """The last `Using window size: N, GPU layers: M` (a restarted allocation prints it again)."""
    last = last_match(WINDOW, text)
    if last is None:
        return {"window": None, "gpu_layers": None}
    return {"window": to_int(last.group(1)), "gpu_layers": to_int(last.group(2))}


def allocation_items(text: str, start: int) -> Iterator[Dict[str, str]]:
    """The device sections of one allocation block as {"device": name, <item>: value, ...}; stops at
    the first line that is neither blank, a `name:` header nor a `  - item : value` line."""
    section = None  # type: Optional[Dict[str, str]]
    for line in lines_from(text, start):
        item = ALLOCATION_ITEM.match(line)
        stripped = line.strip()
        if item and section is not None:
            section[item.group("key").strip()] = item.group("value").strip()
        elif item or not stripped or stripped == "Parameters:":
            continue
        elif stripped.endswith(":"):
            if section is not None:
                yield section
            section = {"device": stripped[:-1].strip()}
        else:
            break
    if section is not None:
        yield section


def parse_allocation(text: str) -> Optional[List[Dict[str, Any]]]:
    """The last HiGHS allocation block, device by device in printed order; None without one.
    prima.cpp prints a block per solver round, and only the last is what the ranks ran with."""
    start = text.rfind(ALLOCATION)
    if start < 0:
        return None
    devices = []
    for section in allocation_items(text, start + len(ALLOCATION)):
        if "Device Index" not in section:
            continue  # a stray `word:` line, not a device
        entry = {"device": section["device"]}  # type: Dict[str, Any]
        for label, key in ALLOCATION_KEYS.items():
            entry[key] = to_int(section.get(label))
        devices.append(entry)
    return devices


def table_cells(line: str, closed: bool) -> List[str]:
    """The cells of a `| name | a | b ` row from its first `|` on (a log prefix before it is
    ignored), stripped. `closed`: the table ends its rows with `|` (prima.cpp does not); it comes
    from the header, since a row whose last cell is blank would otherwise lose that cell."""
    body = line[line.index("|") + 1:].rstrip()
    if closed and body.endswith("|"):
        body = body[:-1]
    return [cell.strip() for cell in body.split("|")]


def last_match(pattern: "re.Pattern[str]", text: str) -> "Optional[re.Match[str]]":
    """The last match of `pattern` in `text`, or None (the last table is the one that counts)."""
    last = None
    for last in pattern.finditer(text):
        pass
    return last


def profile_rows(text: str, start: int, width: int, closed: bool) -> Dict[str, List[str]]:
    """The rows of `width` cells (name included) from offset `start`, the header's next line, to
    the rule that closes the table."""
    rows = {}  # type: Dict[str, List[str]]
    for line in lines_from(text, start):
        if "|" not in line:
            if RULE.match(line) and not rows:
                continue  # the rule under the header
            break
        cells = table_cells(line, closed)
        if len(cells) == width:
            rows[cells[0]] = cells[1:]
    return rows


def parse_profile(text: str) -> Optional[Dict[str, Any]]:
    """The last device profile table: {"ranks": [...], "rows": {property: [cell per rank]}}.
    Rows with another cell count (the model's flops and sizes, one column) are left out."""
    header = last_match(PROFILE_HEADER, text)
    if header is None:
        return None
    line_end = text.find("\n", header.end())
    line_end = len(text) if line_end < 0 else line_end
    line = text[header.start():line_end]
    closed = line.rstrip().endswith("|")
    cells = table_cells(line, closed)
    rows = profile_rows(text, line_end + 1, len(cells), closed)
    return {"ranks": cells[1:], "rows": rows}


def parse_prima_rank(text: str) -> Dict[str, Any]:
    """What one prima.cpp rank's log says about its place in the ring: window, gpu_layers (None
    when it never got that far), removed (the allocator dropped it), allocation and profile
    (rank 0 in automatic mode; None elsewhere)."""
    text = clean(text)
    result = parse_window(text)  # type: Dict[str, Any]
    result["removed"] = REMOVED in text
    result["allocation"] = parse_allocation(text)
    result["profile"] = parse_profile(text)
    return result


def profile_summary(profile: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One dict per rank with cpu_cores, ram_gib, disk_read_gbs, gpu, vram_gib and device; None for
    a row the table lacks (profile layouts differ between prima.cpp builds) or a cell that is not
    a number. An empty GPU Name (no GPU) stays ""."""
    if not profile:
        return []
    rows = profile.get("rows") or {}
    summary = []
    for index in range(len(profile.get("ranks") or [])):
        entry = {}  # type: Dict[str, Any]
        for key, row, kind in SUMMARY_ROWS:
            cells = rows.get(row)
            cell = cells[index] if cells is not None and index < len(cells) else None
            entry[key] = summary_value(cell, kind)
        summary.append(entry)
    return summary


def summary_value(cell: Optional[str], kind: type) -> Any:
    """A profile cell as `kind` (int, float or str); None when absent or not a number."""
    if cell is None:
        return None
    if kind is int:
        return to_int(cell)
    if kind is float:
        return to_float(cell)
    return cell


# --- llama-bench ---------------------------------------------------------------------------------

def bench_test_name(n_prompt: int, n_gen: int, n_depth: int = 0) -> str:
    """llama-bench's own test label: pp512, tg128, pp512+tg128, with ` @ d1024` for a depth."""
    if n_prompt > 0 and n_gen == 0:
        name = "pp%d" % n_prompt
    elif n_gen > 0 and n_prompt == 0:
        name = "tg%d" % n_gen
    else:
        name = "pp%d+tg%d" % (n_prompt, n_gen)
    return name + (" @ d%d" % n_depth if n_depth > 0 else "")


def bench_records(text: str) -> List[Dict[str, Any]]:
    """The test objects of llama-bench `-o json` (an array, one object per test) or `-o jsonl`,
    read object by object: a run killed mid-way leaves an unclosed array whose finished tests
    still count, and log lines around them are skipped. NaN/Infinity literals load as None."""
    decoder = json.JSONDecoder(parse_constant=not_a_number)
    records, done = [], 0
    for start in RECORD_START.finditer(text):
        if start.start() < done:
            continue  # inside an object already read
        try:
            record, done = decoder.raw_decode(text, start.end() - 1)
        except (ValueError, RecursionError):
            continue  # cut off, not JSON, or nested deeper than the decoder goes
        if isinstance(record, dict):
            records.append(record)
    return records


def bench_result(record: Dict[str, Any]) -> Dict[str, Any]:
    """One llama-bench JSON test reduced to BENCH_KEYS plus its `test` label."""
    n_prompt, n_gen = to_int(record.get("n_prompt")) or 0, to_int(record.get("n_gen")) or 0
    result = {"test": bench_test_name(n_prompt, n_gen, to_int(record.get("n_depth")) or 0)}  # type: Dict[str, Any]
    for key in BENCH_KEYS:
        result[key] = record.get(key)
    for key in ("n_prompt", "n_gen", "n_gpu_layers"):
        result[key] = to_int(result[key])
    for key in ("avg_ts", "stddev_ts"):
        result[key] = to_float(result[key])
    samples = record.get("samples_ts")
    result["samples_ts"] = [to_float(sample) for sample in samples] if isinstance(samples, list) else []
    return result


def parse_llama_bench_json(text: str) -> List[Dict[str, Any]]:
    """llama-bench `-o json`: one dict per test with test, n_prompt, n_gen, avg_ts, stddev_ts,
    samples_ts, backends, n_gpu_layers and model_type."""
    return [bench_result(record) for record in bench_records(text)]


def split_ts(cell: str) -> Dict[str, Optional[float]]:
    """`123.45 ± 6.78` -> avg_ts 123.45, stddev_ts 6.78 (also `+/-`, and a lone figure)."""
    avg, dummy, stddev = cell.replace("+/-", "\u00b1").partition("\u00b1")
    return {"avg_ts": to_float(first_word(avg)), "stddev_ts": to_float(first_word(stddev))}


def first_word(text: str) -> Optional[str]:
    """The first whitespace-separated word, None for a blank (a mis-decoded `Â` before `±` is
    the second word, so it drops out)."""
    words = text.split()
    return words[0] if words else None


def md_row(line: str) -> Optional[List[str]]:
    """The cells of a markdown table line `| a | b |`, None for any other line."""
    stripped = line.strip()
    if not (stripped.startswith("|") and stripped.endswith("|") and len(stripped) > 1):
        return None
    return [cell.strip() for cell in stripped[1:-1].split("|")]


def is_md_rule(cells: Optional[List[str]], above: Optional[List[str]]) -> bool:
    """Whether `cells` is the `| --- | ---: |` rule under the header row `above`."""
    return bool(cells and above and len(cells) == len(above) and all(MD_SEPARATOR.match(c) for c in cells))


def md_tables(text: str) -> Iterator[List[Dict[str, str]]]:
    """Every markdown table in `text` as rows keyed by lowercased header: a header row, then a
    rule, then rows until the first line that is not one. Rows of another width are skipped."""
    header = None  # type: Optional[List[str]]
    rows = []  # type: List[Dict[str, str]]
    previous = None  # type: Optional[List[str]]
    for line in clean(text).split("\n"):
        cells = md_row(line)
        if header is not None and cells is not None:
            if len(cells) == len(header):
                rows.append(dict(zip(header, cells)))
            continue
        if header is not None:
            yield rows
            header, rows = None, []
        if is_md_rule(cells, previous):
            header = [name.lower() for name in previous or []]
        previous = cells
    if header is not None:
        yield rows


def parse_llama_bench_md(text: str) -> List[Dict[str, Any]]:
    """llama-bench `-o md`: one dict per row, keyed by the lowercased header (the columns change
    with the backend and with every swept flag, so never by position), plus test, avg_ts and
    stddev_ts from the `t/s` column. Only tables with a `t/s` column count."""
    results = []
    for rows in md_tables(text):
        for row in rows:
            if "t/s" not in row:
                break
            result = dict(row)  # type: Dict[str, Any]
            result.setdefault("test", None)
            result.update(split_ts(row["t/s"]))
            results.append(result)
    return results


# --- llama-server ---------------------------------------------------------------------------------

def parse_server_timings(text: str) -> Dict[str, Number]:
    """TIMING_KEYS from the `timings` of a llama-server /completion (or chat) answer; all None for
    an answer without them (a 503 `Loading model`, an empty or cut-off body), so a failed request
    reads as "no figures" rather than as an exception in the report."""
    timings = {}  # type: Dict[str, Any]
    try:
        answer = json.loads(text, parse_constant=not_a_number)
    except (ValueError, RecursionError):  # not JSON, digits past int()'s limit, nested too deep
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("timings"), dict):
        timings = answer["timings"]
    return {key: json_number(timings.get(key)) for key in TIMING_KEYS}
