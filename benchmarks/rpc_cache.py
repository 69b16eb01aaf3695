"""Model loads over llama.cpp RPC with the workers' tensor cache (ggml-rpc-server -c, launch_rpc_cache) and without
it: the head's load time on each run, with every node's link shaped, on the sandbox's large model.

    python3 benchmarks/rpc_cache.py [--links 200mbit] [--runs 3]

Needs the sandbox up and provisioned (make sandbox-up && make site-sandbox). It makes the hub serve the large model
(playbooks/sandbox.yml -e sandbox_state=models with sandbox_hub_large), fetches it onto every node (playbooks/
models.yml), then for the cache on and off: empties every worker's cache, and runs bench.yml -e model=large
-e runtime=llama_rpc with no warm-up, so the first run loads with an empty cache. The load time is the head's own
(llama.cpp's "load time" line, parsed into results.jsonl). Writes artifacts/rpc-cache.json and rpc-cache.md, with
the command that made them: per run the load time, the ratio of the later runs' loads to the first, and each
worker's cache in bytes against the bound (the model's size).
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Dict, Sequence

from figures import write_figures
from models_fanout import model_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
INVENTORY = "inventory/sandbox-mapped.yml"
NODE_ROOTS = "/var/lib/prima-sandbox/nodes/%s/root"
MODEL = "large"
# The bound of each worker's cache: the size inventory/group_vars/sandbox.yml's catalog gives the model.
MODEL_BYTES = sum(model_files(MODEL).values())
UNIT = "llama_rpc-" + MODEL
CACHE = "var/lib/prima-bench/%s/cache/rpc" % UNIT


def playbook(*argv: str) -> str:
    done = subprocess.run([PLAYBOOK, "-i", INVENTORY] + list(argv), cwd=REPO, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        sys.exit("ansible-playbook %s failed:\n%s" % (" ".join(argv), done.stdout[-4000:]))
    return done.stdout


def cache_bytes(node: str) -> int:
    directory = os.path.join(NODE_ROOTS % node, CACHE)
    return sum(os.path.getsize(path) for path in glob.glob(os.path.join(directory, "[0-9a-f]" * 16)))


def empty_caches(nodes: Sequence[str]) -> None:
    for node in nodes:
        directory = os.path.join(NODE_ROOTS % node, CACHE)
        for path in glob.glob(os.path.join(directory, "*")) + glob.glob(os.path.join(directory, ".unconfirmed")):
            os.remove(path)


def load_ratios(loads_ms: Sequence[float]) -> Dict[str, Any]:
    """The first run's load (empty cache) and the later runs' mean against it."""
    later = list(loads_ms[1:])
    mean_later = statistics.mean(later) if later else None
    return {"first_ms": loads_ms[0], "later_mean_ms": mean_later,
            "later_to_first": round(mean_later / loads_ms[0], 3) if later and loads_ms[0] else None}


def measure(cache: bool, links: str, runs: int, workers: Sequence[str]) -> Dict[str, Any]:
    empty_caches(workers)
    with tempfile.TemporaryDirectory(prefix="rpc-cache-") as reports:
        playbook("bench.yml", "-e", "model=%s" % MODEL, "-e", "runtime=llama_rpc", "-e", "runs=%d" % runs,
                 "-e", "links=%s" % links, "-e", json.dumps({"bench_warmup_runs": 0, "launch_rpc_cache": cache,
                                                              "cluster_reports_dir": reports}))
        with open(os.path.join(reports, "results.jsonl")) as handle:
            records = sorted((json.loads(line) for line in handle if line.strip()), key=lambda run: run["run_index"])
    loads = [float(record["perf"]["load_ms"]) for record in records]
    result = {"cache": cache, "load_ms": loads, "decode_tps": [record["perf"]["eval_tps"] for record in records]}
    result.update(load_ratios(loads))
    result["cache_bytes"] = {node: cache_bytes(node) for node in workers}
    return result


def markdown(result: Dict[str, Any]) -> str:
    lines = ["# Model loads over llama.cpp RPC, with the workers' tensor cache and without", "",
             "Made by: `%s`" % result["command"], "",
             "| Cache | Load ms, run by run | Later runs / first | Decode t/s | Cached bytes per worker |",
             "|---|---|---|---|---|"]
    for row in result["cases"]:
        lines.append("| %s | %s | %s | %s | %s |" % (
            "on" if row["cache"] else "off", ", ".join("%.0f" % load for load in row["load_ms"]),
            "%.3f" % row["later_to_first"] if row["later_to_first"] is not None else "-",
            ", ".join("%.2f" % rate for rate in row["decode_tps"]),
            ", ".join("%s %d" % item for item in sorted(row["cache_bytes"].items()))))
    lines += ["", "Model %s: %d bytes, the bound of each worker's cache. Every node's link shaped to %s (tc tbf); "
              "the runs of one case follow each other with no warm-up, so the first loads with an empty cache; "
              "the workers are started again before every run." % (MODEL, MODEL_BYTES, result["links"]), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--links", default="200mbit", help="every node's link, as bench.yml -e links (200mbit)")
    parser.add_argument("--runs", type=int, default=3, help="runs per case, the first with an empty cache (3)")
    args = parser.parse_args()
    if args.runs < 2:
        sys.exit("--runs %d: give at least 2, the first run fills the cache and the others read it" % args.runs)
    playbook("playbooks/sandbox.yml", "-e", "sandbox_state=models", "-e", json.dumps({"sandbox_hub_large": True}))
    playbook("playbooks/models.yml", "-e", "model=%s" % MODEL)
    workers = ["n1", "n2"]
    result = {"command": " ".join(["python3", "benchmarks/rpc_cache.py"] + sys.argv[1:]), "links": args.links,
              "model": MODEL, "model_bytes": MODEL_BYTES,
              "cases": [measure(cache, args.links, args.runs, workers) for cache in (True, False)]}
    over = {node: size for node, size in result["cases"][0]["cache_bytes"].items() if size > MODEL_BYTES}
    if over:
        sys.exit("a worker's cache is over its bound (%d bytes): %s" % (MODEL_BYTES, over))
    write_figures("rpc-cache", result, markdown(result))


if __name__ == "__main__":
    main()
