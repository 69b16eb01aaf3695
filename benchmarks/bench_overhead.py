"""What bench.yml spends beside the work it measures, per measured run: today's mode (a head process per run)
against -e mode=server (one server per runtime and model, loaded once), on one sandbox.

    python3 benchmarks/bench_overhead.py [--runtime all] [--runs 5] [--model tiny] [--clients 1,2]
                                         [--inventory inventory/sandbox-mapped.yml]

Needs the sandbox up and provisioned (make sandbox-up && ansible-playbook -i inventory/sandbox-mapped.yml
site.yml). It runs bench.yml once in each mode and times it; per mode:

    overhead per measured run = (bench.yml's wall time - the heads' own time) / measured runs

the heads' own time being every head process's wall time in mode=run (warm-ups and retries too, from the raw
`wall_s` files) and every request's time as the client on rank 0 saw it in mode=server (plugins/plugin_utils/
bench_overhead.py). It writes artifacts/bench-overhead.json and bench-overhead.md, with the commands that made
them. The goal for mode=server is 2 s or less per measured run.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict

from ansible.plugins.loader import init_plugin_loader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("ANSIBLE_CONFIG", os.path.join(REPO, "ansible.cfg"))
# The checkout is the collection prima.cluster, linked in under .collections (ansible.cfg's collections path).
init_plugin_loader([os.path.join(REPO, ".collections")])

from ansible_collections.prima.cluster.plugins.plugin_utils.bench import overhead as bench_overhead  # noqa: E402

PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


def bench(mode: str, args: argparse.Namespace, reports: str) -> Dict[str, Any]:
    """One bench.yml in `mode`, timed; its figures."""
    run_id = "overhead-%s-%s" % (mode, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    argv = [PLAYBOOK, "-i", args.inventory, "bench.yml", "-e", "model=%s" % args.model, "-e",
            "runtime=%s" % args.runtime, "-e", "runs=%d" % args.runs, "-e", "mode=%s" % mode]
    if mode == "server":
        argv += ["-e", "clients=%s" % args.clients]
    env = dict(os.environ, PRIMA_BENCH_REPORTS_DIR=reports, PRIMA_BENCH_RUN_ID=run_id)
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    wall_s = time.monotonic() - started
    # The playbook's own output beside its report (the tests read the table it printed).
    with open(os.path.join(reports, "%s.log" % run_id), "w") as handle:
        handle.write(done.stdout)
    if done.returncode != 0:
        sys.exit("%s failed:\n%s" % (" ".join(argv), done.stdout[-4000:]))
    records = bench_overhead.read_records(os.path.join(reports, "results.jsonl"), run_id)
    raw = os.path.join(reports, run_id, "raw")
    if mode == "run":
        heads_s = bench_overhead.run_heads_s(raw, records)
    else:
        heads_s = bench_overhead.server_heads_s(bench_overhead.load_results(raw))
    figures = bench_overhead.overhead(mode, wall_s, heads_s, bench_overhead.measured_runs(records, mode))
    figures.update({"command": " ".join(argv[1:]), "run_id": run_id,
                    "runtimes": sorted({record["runtime"] for record in records})})
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--runtime", default="all")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--clients", default="1,2")
    parser.add_argument("--inventory", default="inventory/sandbox-mapped.yml")
    parser.add_argument("--out", default=os.path.join(REPO, "artifacts"))
    parser.add_argument("--reports", help="the reports directory of both runs (default: a new temporary one)")
    args = parser.parse_args()
    reports = args.reports or tempfile.mkdtemp(prefix="bench-overhead-")
    os.makedirs(reports, exist_ok=True)
    figures = [bench(mode, args, reports) for mode in ("run", "server")]  # type: List[Dict[str, Any]]
    result = {"figures": figures, "run_over_server": bench_overhead.ratio(figures), "reports": reports,
              "how": "python3 benchmarks/bench_overhead.py --runtime %s --runs %d --model %s --clients %s: "
                     "(bench.yml wall time - the heads' own time) / measured runs, per mode"
                     % (args.runtime, args.runs, args.model, args.clients)}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench-overhead.json"), "w") as handle:
        json.dump(result, handle, indent=2, sort_keys=True)
        handle.write("\n")
    text = "%s\n\n%s\n" % (result["how"], bench_overhead.table(figures))
    with open(os.path.join(args.out, "bench-overhead.md"), "w") as handle:
        handle.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
