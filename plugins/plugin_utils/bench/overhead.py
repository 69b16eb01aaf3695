"""What bench.yml costs beside the work it measures, per measured run, in both modes (pure functions).

overhead per measured run = (the bench's wall time - the heads' own time) / measured runs

The heads' own time: in mode=run, each head process's wall time (every run, warm-ups and retries included, from
the `wall_s` its launcher wrote, which the raw directory keeps); in mode=server, each request's time from sent to
its last byte (sequential requests, warm-ups included, and each concurrency level's wall time), as the load client
on rank 0 measured them. What remains is Ansible's work, starting and stopping ranks, and loading the model: the
part a server that stays up saves. benchmarks/bench_overhead.py runs both modes and writes the figures.
"""

import glob
import json
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

GOAL_S_PER_RUN = 2.0


def read_records(results_path: str, run_id: str) -> List[Dict[str, Any]]:
    """The results.jsonl lines of one bench run."""
    records = []
    with open(results_path) as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            record = json.loads(line)
            if isinstance(record, dict) and record.get("run_id") == run_id:
                records.append(record)
    return records


def measured_runs(records: Iterable[Mapping[str, Any]], mode: str) -> int:
    """mode=run: its records (one per measured run); mode=server: its sequential requests past the warm-ups."""
    if mode == "run":
        return sum(1 for record in records if record.get("mode", "run") == "run")
    return sum(1 for record in records if record.get("mode") == "server" and not record.get("warmup"))


def run_heads_s(raw_dir: str, records: Iterable[Mapping[str, Any]]) -> float:
    """Every head run's own wall time (warm-ups and retries too): raw/<head>/<unit>/<link>/<label>/wall_s."""
    heads = sorted({(str(record["hosts"][0]), str(record["unit"])) for record in records
                    if record.get("mode", "run") == "run"})
    total = 0.0
    for head, unit in heads:
        for path in glob.glob(os.path.join(glob.escape(raw_dir), glob.escape(head), glob.escape(unit), "*", "*", "wall_s")):
            with open(path) as handle:
                total += float(handle.read().strip())
    return total


def server_heads_s(load_results: Iterable[Mapping[str, Any]]) -> float:
    """The server's own time as the client saw it: each sequential request's sent-to-done, each level's wall."""
    total = 0.0
    for result in load_results:
        for request in result.get("sequential") or []:
            if isinstance(request.get("sent"), (int, float)) and isinstance(request.get("done"), (int, float)):
                total += float(request["done"]) - float(request["sent"])
        for level in result.get("levels") or []:
            if isinstance(level.get("wall_s"), (int, float)):
                total += float(level["wall_s"])
    return total


def load_results(raw_dir: str) -> List[Dict[str, Any]]:
    """Every load test's raw result of a mode=server bench: raw/<head>/<serve unit>/<link>/load.json."""
    results = []
    for path in sorted(glob.glob(os.path.join(glob.escape(raw_dir), "*", "serve-*", "*", "load.json"))):
        with open(path) as handle:
            results.append(json.load(handle))
    return results


def overhead(mode: str, wall_s: float, heads_s: float, runs: int, goal_s: float = GOAL_S_PER_RUN) -> Dict[str, Any]:
    """One mode's figures; per_run_s is None without a measured run."""
    per_run = (wall_s - heads_s) / runs if runs > 0 else None
    return {"mode": mode, "wall_s": round(wall_s, 2), "heads_s": round(heads_s, 2), "measured_runs": runs,
            "overhead_s_per_run": round(per_run, 2) if per_run is not None else None, "goal_s_per_run": goal_s,
            "goal_met": per_run is not None and per_run <= goal_s}


def table(figures: Sequence[Mapping[str, Any]]) -> str:
    """The figures as a markdown table."""
    lines = ["| Mode | Bench wall s | Heads' own s | Measured runs | Overhead s per run | Goal <= s |",
             "|---|---|---|---|---|---|"]
    for row in figures:
        per_run = row["overhead_s_per_run"]
        lines.append("| %s | %.1f | %.1f | %d | %s | %.1f%s |" % (
            row["mode"], row["wall_s"], row["heads_s"], row["measured_runs"],
            "n/a" if per_run is None else "%.2f" % per_run, row["goal_s_per_run"],
            "" if row["mode"] != "server" else (" (met)" if row["goal_met"] else " (NOT met)")))
    return "\n".join(lines)


def ratio(figures: Sequence[Mapping[str, Any]]) -> Optional[float]:
    """How many times mode=run's overhead per run is mode=server's."""
    by_mode = {row["mode"]: row["overhead_s_per_run"] for row in figures}
    if by_mode.get("run") is None or not by_mode.get("server"):
        return None
    return round(by_mode["run"] / by_mode["server"], 1)
