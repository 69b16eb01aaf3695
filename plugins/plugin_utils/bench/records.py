"""A bench run's records on disk (standard library, controller side).

Each judged run leaves `judged.json` beside its raw logs: what the judging read (the plan, each rank's state,
the run's metadata), not the figures. The figures are parsed again from the raw logs whenever a report is
made, so the report of any run directory can be made again after a parser fix, or on another machine. The
cluster profile is `profile.json` in the run directory; a run tried again because its log was cut leaves
`lost.json` in the cut attempt's directory.

    <run dir>/profile.json
    <run dir>/raw/<head>/<unit>/<link>/<run label>/judged.json    (mode=run, beside every rank's logs)
    <run dir>/raw/<head>/<unit>/<link>/judged.json                (mode=server, beside load.json)
"""

import datetime
import json
import os
import tempfile
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.report import append_results, render_report
from ansible_collections.prima.cluster.plugins.plugin_utils.bench.run import run_record
from ansible_collections.prima.cluster.plugins.plugin_utils.bench.server import server_records

JUDGED = "judged.json"
LOST = "lost.json"
PROFILE = "profile.json"
LOAD = "load.json"
RUN, SERVER = "run", "server"
# The largest file read back: a judged.json holds a plan and metadata, a load.json a test's requests.
MAX_BYTES = 64 * 1024 * 1024


class RunRecords(NamedTuple):
    records: List[Dict[str, Any]]
    profile: List[Dict[str, Any]]
    repeated: List[Dict[str, Any]]


class RecordsError(ValueError):
    """A run directory whose records cannot be read: the message names the file and what to do."""


def write_json(path: str, data: Any) -> None:
    """`data` as JSON at `path`, whole or not at all (a temporary file renamed into place)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(data, stream, sort_keys=True, allow_nan=False, default=str)
            stream.write("\n")
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def read_json(path: str) -> Any:
    """The JSON at `path`; RecordsError naming the file when it is missing, too big or not JSON."""
    try:
        if os.path.getsize(path) > MAX_BYTES:
            raise RecordsError("%s: larger than %d bytes, not a record this collection wrote" % (path, MAX_BYTES))
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        if isinstance(error, RecordsError):
            raise
        raise RecordsError("%s: cannot be read as a record (%s); it is written by bench.yml, whole or not at all: "
                           "a file damaged since cannot be used" % (path, error)) from error


def judged_files(raw_dir: str) -> List[str]:
    found = []
    for directory, dummy, files in os.walk(raw_dir):
        if JUDGED in files:
            found.append(os.path.join(directory, JUDGED))
    return found


def keep_judged(raw_dir: str, directory: str, kind: str, plan: Mapping[str, Any], meta: Mapping[str, Any],
                ranks: Sequence[Mapping[str, Any]] = (), run_label: str = "") -> str:
    """Write `directory`/judged.json: what one judged run read, numbered after those of the run directory."""
    entry = {"kind": kind, "sequence": len(judged_files(raw_dir)) + 1, "plan": dict(plan), "meta": dict(meta),
             "ranks": [{key: value for key, value in rank.items() if key != "stderr"} for rank in ranks],
             "run_label": run_label}
    path = os.path.join(directory, JUDGED)
    write_json(path, entry)
    return path


def read_text(path: str) -> str:
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def _entry(path: str) -> Dict[str, Any]:
    entry = read_json(path)
    if not (isinstance(entry, dict) and entry.get("kind") in (RUN, SERVER) and isinstance(entry.get("plan"), dict)
            and isinstance(entry.get("meta"), dict) and isinstance(entry.get("sequence"), int)
            and isinstance(entry.get("ranks"), list) and isinstance(entry.get("run_label"), str)):
        raise RecordsError("%s: not a judged run as bench.yml writes it (kind, sequence, plan, meta, ranks, "
                           "run_label)" % path)
    return entry


def _host_name(value: Any, path: str) -> str:
    """A host as a directory name of raw/: one path component, so a record never points outside its run."""
    name = str(value)
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise RecordsError("%s: %r is not a host name this collection writes" % (path, value))
    return name


def entry_records(raw_dir: str, path: str, entry: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The records of one judged run, its figures parsed again from its raw logs."""
    plan, meta = entry["plan"], entry["meta"]
    directory = os.path.dirname(path)
    try:
        if entry["kind"] == SERVER:
            return server_records(plan, read_json(os.path.join(directory, LOAD)), meta)
        # Each rank's logs sit under its own host, at the same place below it as the head's.
        below = os.path.relpath(directory, os.path.join(raw_dir, _host_name(plan["head"], path)))
        if below.startswith(".."):
            raise RecordsError("%s: not below the logs of its head, %s" % (path, plan["head"]))
        ranks = [dict(rank, stderr=read_text(os.path.join(raw_dir, _host_name(rank["host"], path), below, "stderr")))
                 for rank in entry["ranks"]]
        head = [rank for rank in ranks if rank.get("role") == "head"]
        if not head:
            raise RecordsError("%s: no rank of it is the head" % path)
        return [run_record(plan, ranks, head[0]["stderr"], meta)]
    except (KeyError, TypeError, AttributeError) as error:
        raise RecordsError("%s: not a judged run as bench.yml writes it (%s %s)"
                           % (path, type(error).__name__, error)) from error


def read_run_dir(run_dir: str) -> RunRecords:
    """Every record of a run directory in the order its runs were judged, its profile and its cut logs."""
    raw_dir = os.path.join(run_dir, "raw")
    if not os.path.isdir(raw_dir):
        raise RecordsError("%s: no raw/ here; -e run_dir names the directory of one bench.yml run, like reports/RUN_ID"
                           % run_dir)
    entries = sorted(((path, _entry(path)) for path in judged_files(raw_dir)), key=lambda item: item[1]["sequence"])
    records = []  # type: List[Dict[str, Any]]
    for path, entry in entries:
        records.extend(entry_records(raw_dir, path, entry))
    profile_path = os.path.join(run_dir, PROFILE)
    profile = read_json(profile_path) if os.path.exists(profile_path) else []
    if not isinstance(profile, list):
        raise RecordsError("%s: not a cluster profile (a list of nodes)" % profile_path)
    repeated = []
    for directory, dummy, files in sorted(os.walk(raw_dir)):
        if LOST in files:
            lost = read_json(os.path.join(directory, LOST))
            if isinstance(lost, dict):
                repeated.append(lost)
    return RunRecords(records, profile, repeated)


def newest_run_dir(reports_dir: str) -> str:
    """The run directory under `reports_dir` that bench.yml made last (the newest with a raw/ in it)."""
    try:
        names = os.listdir(reports_dir)
    except OSError as error:
        raise RecordsError("%s: no reports here (%s); give -e run_dir=PATH, or the reports directory in "
                           "PRIMA_BENCH_REPORTS_DIR" % (reports_dir, error.strerror)) from error
    runs = [os.path.join(reports_dir, name) for name in names if os.path.isdir(os.path.join(reports_dir, name, "raw"))]
    if not runs:
        raise RecordsError("%s holds no bench.yml run (no <run id>/raw/); give -e run_dir=PATH, or the reports "
                           "directory in PRIMA_BENCH_REPORTS_DIR" % reports_dir)
    return max(runs, key=lambda path: (os.stat(path).st_mtime, path))


def again_name(now: Optional[datetime.datetime] = None) -> str:
    """The name of a report made again: beside the first one, never over it, named by when it was made."""
    moment = now or datetime.datetime.now(datetime.timezone.utc)
    return moment.strftime("report-again-%Y%m%dT%H%M%SZ.md")


def report_problems(run_dir: str, report: str, records: Optional[Sequence[Mapping[str, Any]]] = None) -> List[str]:
    """Why no report can be written for `run_dir` at `report` (empty when it can)."""
    problems = []
    if os.path.lexists(report):
        problems.append("%s exists already and is kept as it is: give another path (-e report_file=PATH) or move "
                        "it away" % report)
    if records is not None and not records:
        problems.append("%s holds no judged run: bench.yml writes judged.json beside each run's raw logs once the "
                        "run is judged" % run_dir)
    return problems


class Written(NamedTuple):
    report: str
    results: Optional[str]
    appended: int
    main_table: str


def write_report(run_dir: str, report: str, results: Optional[str] = None, plots: bool = True) -> Written:
    """report.md of `run_dir` made from its records on disk (never over an existing file), then, with `results`,
    its measured runs appended there. RecordsError, before anything is written, when either cannot be done."""
    found = read_run_dir(run_dir)
    problems = report_problems(run_dir, report, found.records)
    if problems:
        raise RecordsError("; ".join(problems))
    # The report first: if it cannot be made, results.jsonl stays as it was.
    # The first report's plots sit beside it; a report made again gets its own, never over the first's.
    report_dir, name = os.path.split(report)
    plot_dir = report_dir if name == "report.md" else os.path.join(report_dir, os.path.splitext(name)[0] + "-plots")
    try:
        text, main_table = render_report(found.records, found.profile, found.repeated,
                                         plot_dir=plot_dir if plots else None, report_dir=report_dir)
        with open(report, "x", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as error:
        raise RecordsError("%s: cannot be written (%s)" % (error.filename or report, error.strerror)) from error
    try:
        appended = append_results(results, found.records) if results else 0
    except OSError as error:
        # A report without its lines in results.jsonl would be kept as if it had them: neither is kept.
        os.unlink(report)
        raise RecordsError("%s: cannot be appended to (%s); the report was not kept either"
                           % (results, error.strerror)) from error
    return Written(report, results, appended, main_table)
