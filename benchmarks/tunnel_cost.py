"""What the SSH transport costs: the same bench.yml through SSH forwards against direct, on one sandbox.

    python3 benchmarks/tunnel_cost.py [--runs 5] [--runtime llama_rpc[,prima]] [--model tiny|large]
                                      [--restore mapped|flat]

Needs the sandbox up and provisioned (make sandbox-up && ansible-playbook -i inventory/sandbox-mapped.yml
site.yml). It makes the sandbox's network flat (so that direct works), runs bench.yml on the model (tiny by
default) with -e cluster_network=direct, then with -e cluster_network=ssh, and writes to artifacts/tunnel-cost.json
and tunnel-cost.md (tunnel-cost-MODEL.* for another model): decode and prompt t/s (medians over the measured runs),
the milliseconds the tunnel adds to each token, in all and per worker link, and the probe's handshake time and
throughput, through each transport, with the command that made them. Then it puts the network back (--restore,
mapped by default). The large model (about 10x the tiny one's token time) must be on the nodes first:
benchmarks/rpc_cache.py puts it there.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

from figures import write_figures

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
INVENTORIES = {"flat": "inventory/sandbox.yml", "mapped": "inventory/sandbox-mapped.yml"}


def playbook(inventory: str, *args: str, env: Dict[str, str] = None) -> None:
    argv = [PLAYBOOK, "-i", INVENTORIES[inventory]] + list(args)
    run = subprocess.run(argv, cwd=REPO, env=dict(os.environ, **(env or {})), capture_output=True, text=True,
                         check=False)
    if run.returncode != 0:
        sys.exit("%s failed:\n%s" % (" ".join(argv), run.stdout[-3000:]))


def median(values: List[float]) -> float:
    return round(statistics.median(values), 2) if values else float("nan")


def measure(network: str, runtimes: str, runs: int, reports: str, model: str) -> Dict[str, Any]:
    started = time.monotonic()
    playbook("flat", "bench.yml", "-e", "model=%s" % model, "-e", "runtime=%s" % runtimes, "-e", "runs=%d" % runs,
             "-e", "cluster_network=%s" % network,
             env={"PRIMA_BENCH_REPORTS_DIR": reports, "PRIMA_BENCH_RUN_ID": "tunnel-cost-" + network})
    with open(os.path.join(reports, "results.jsonl")) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    figures = {"bench_wall_s": round(time.monotonic() - started, 1), "runtimes": {}}
    for runtime in sorted({record["runtime"] for record in records}):
        mine = [record for record in records if record["runtime"] == runtime]
        network_rows = mine[0].get("network") or []
        figures["runtimes"][runtime] = {
            "runs": len(mine),
            "decode_tps": median([record["perf"]["eval_tps"] for record in mine]),
            "prompt_tps": median([record["perf"]["prompt_tps"] for record in mine]),
            "probe_rtt_ms": median([row["rtt_ms"] for row in network_rows if row.get("rtt_ms")]),
            "probe_mbit_s": median([row["mbit_s"] for row in network_rows if row.get("mbit_s")]),
            "transport": mine[0]["transport"]["mode"],
            "world": mine[0]["world"],
        }
    return figures


def markdown(result: Dict[str, Any]) -> str:
    lines = ["# The SSH transport against direct, on the sandbox", "", "Made by: `%s`" % result["command"], "",
             "| Runtime | Decode t/s direct | Decode t/s ssh | ssh/direct | Added ms/token | Added ms/token per worker "
             "link | Prompt t/s direct | Prompt t/s ssh | ssh/direct | Probe handshake ms direct / ssh | "
             "Probe Mbit/s direct / ssh |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for runtime, ratio in sorted(result["ratios"].items()):
        direct, ssh = result["direct"]["runtimes"][runtime], result["ssh"]["runtimes"][runtime]
        lines.append("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.3f / %.3f | %.0f / %.0f |" % (
            runtime, direct["decode_tps"], ssh["decode_tps"], ratio["decode"], ratio["added_ms_per_token"],
            ratio["added_ms_per_token_per_link"], direct["prompt_tps"],
            ssh["prompt_tps"], ratio["prompt"], direct["probe_rtt_ms"], ssh["probe_rtt_ms"], direct["probe_mbit_s"],
            ssh["probe_mbit_s"]))
    lines += ["", "Goal: decode through ssh at 0.90 or more of direct. %d measured runs each, model %s, "
              "3 sandbox nodes on one machine (2 cores): the tunnel's cost is SSH's encryption and one more hop "
              "through sshd on each side, on loopback-speed links. Added ms/token: 1000/ssh - 1000/direct decode; "
              "per worker link: that over the world's workers (the head waits on each in turn every token)."
              % (result["runs"], result["model"]), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--runtime", default="llama_rpc", help="llama_rpc, or llama_rpc,prima with a prima.cpp mirror")
    parser.add_argument("--model", default="tiny", help="tiny, or large (on the nodes: benchmarks/rpc_cache.py)")
    parser.add_argument("--restore", choices=sorted(INVENTORIES), default="mapped")
    args = parser.parse_args()
    result = {"command": " ".join(["python3", "benchmarks/tunnel_cost.py"] + sys.argv[1:]), "runs": args.runs,
              "model": args.model}
    playbook("flat", "playbooks/sandbox.yml", "-e", "sandbox_state=topology")
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for network in ("direct", "ssh"):
                reports = os.path.join(scratch, network)
                os.makedirs(reports)
                result[network] = measure(network, args.runtime, args.runs, reports, args.model)
    finally:
        playbook(args.restore, "playbooks/sandbox.yml", "-e", "sandbox_state=topology")
    result["ratios"] = {}
    for runtime, direct in result["direct"]["runtimes"].items():
        ssh = result["ssh"]["runtimes"][runtime]
        added_ms = 1000.0 / ssh["decode_tps"] - 1000.0 / direct["decode_tps"]
        result["ratios"][runtime] = {"decode": round(ssh["decode_tps"] / direct["decode_tps"], 3),
                                     "prompt": round(ssh["prompt_tps"] / direct["prompt_tps"], 3),
                                     "added_ms_per_token": round(added_ms, 3),
                                     "added_ms_per_token_per_link": round(added_ms / max(direct["world"] - 1, 1), 3)}
    name = "tunnel-cost" if args.model == "tiny" else "tunnel-cost-" + args.model
    write_figures(name, result, markdown(result))


if __name__ == "__main__":
    main()
