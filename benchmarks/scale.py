"""Cost growth with the cluster's size: site.yml's second run, bench.yml's overhead per measured run and the time to
weights on every node, at N = 3 and 6 nodes (and any other N), with what each node added costs.

    .venv/bin/python benchmarks/scale.py [--nodes 3,6] [--runs 3] [--model tiny] [--hub-rate 200mbit] [--keep]

Needs the sandbox up and its cluster a provisioned (make sandbox-up && make site-sandbox). The nodes measured are
copies of n0's provisioned root (tools/sandbox_scale.py: s0..s<N-1>, shaped like Glows, beside cluster a), so every
N starts from copies of the same node (the N = 6 run reuses the three that N = 3 ran on). Per N, on its first N copies:

1. site.yml once to settle (the copies' transport and launch units depend on their peers), then again: the second
   run's wall time and its changed count (0 is what provisioning promises);
2. benchmarks/bench_overhead.py's measure, both modes: (bench.yml's wall time - the heads' own time) / measured runs;
3. the model's files removed from the N nodes, the hub's link shaped (tc tbf), playbooks/models.yml timed: hub
   download and fan-out to every node, with the bytes the hub served.

The per-node marginal cost is (figure at the largest N - figure at the smallest) / (the difference in N). Writes
artifacts/scale.json and scale.md. The copies are removed afterwards (tools/sandbox_scale.py down) unless --keep;
the hub's link is unshaped, also when a run fails.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, Mapping, Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))

import bench_overhead  # noqa: E402
import sandbox_scale  # noqa: E402
from figures import write_figures  # noqa: E402
from models_fanout import hub_records, model_files, remove_from_every_node, shape_hub  # noqa: E402

REPO = sandbox_scale.REPO
PLAYBOOK = sandbox_scale.PLAYBOOK
RECAP_LINE = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
# Each figure: (key, what it is, unit); the markdown's rows in this order.
FIGURES = (("site_second_s", "site.yml, second run (changed=0 expected)", "s"),
           ("bench_run_overhead_s", "bench.yml overhead per measured run, mode=run", "s"),
           ("bench_server_overhead_s", "bench.yml overhead per measured run, mode=server", "s"),
           ("weights_s", "weights on every node (models.yml: hub download and fan-out)", "s"))


def recap_changed(output: str) -> Dict[str, int]:
    """host -> changed, from ansible-playbook's PLAY RECAP."""
    return {match.group(1): int(match.group(3)) for match in RECAP_LINE.finditer(output)}


def marginal(by_nodes: Mapping[int, Mapping[str, float]], keys: Sequence[str]) -> Dict[str, float]:
    """Per figure, what one more node costs: the slope between the smallest and the largest N measured."""
    sizes = sorted(by_nodes)
    if len(sizes) < 2:
        return {}
    low, high = sizes[0], sizes[-1]
    return {key: round((by_nodes[high][key] - by_nodes[low][key]) / (high - low), 2)
            for key in keys if key in by_nodes[low] and key in by_nodes[high]}


def growth(by_nodes: Mapping[int, Mapping[str, float]], keys: Sequence[str]) -> Dict[str, float]:
    """Per figure, the largest N's over the smallest N's."""
    sizes = sorted(by_nodes)
    if len(sizes) < 2:
        return {}
    low, high = sizes[0], sizes[-1]
    return {key: round(by_nodes[high][key] / by_nodes[low][key], 2)
            for key in keys if by_nodes[low].get(key) and key in by_nodes[high]}


def markdown(result: Mapping[str, Any]) -> str:
    sizes = sorted(int(n) for n in result["by_nodes"])
    low, high = sizes[0], sizes[-1]
    head = "| Figure | " + " | ".join("N = %d" % n for n in sizes)
    lines = ["# Cost growth with the cluster's size, on the sandbox", "", "Made by: `%s`" % result["command"], "",
             head + " | N = %d / N = %d | Per node added |" % (high, low),
             "|---|" + "---|" * len(sizes) + "---|---|"]
    for key, what, unit in FIGURES:
        cells = ["%.2f %s" % (result["by_nodes"][str(n)][key], unit) for n in sizes]
        lines.append("| %s | %s | %s | %s %s |" % (what, " | ".join(cells), result["growth"].get(key, "-"),
                                                   result["marginal"].get(key, "-"), unit))
    lines += ["", "site.yml's second run changed %s (per N); hub bytes per model copy for the weights: %s." % (
        ", ".join("%d at N = %d" % (result["by_nodes"][str(n)]["site_second_changed"], n) for n in sizes),
        ", ".join("%.3f at N = %d" % (result["by_nodes"][str(n)]["hub_bytes_per_model"], n) for n in sizes)),
        "", "The nodes are copies of one provisioned node (tools/sandbox_scale.py), mapped like Glows (every "
        "connection between nodes through SSH). bench.yml: model %s, runtime %s, %d measured runs per mode "
        "(clients %s in mode=server). Weights: model %s (%d bytes), the hub's link shaped to %s with tc tbf, the "
        "nodes' links unshaped; wall time of models.yml's whole run. The controller is this machine (2 cores): "
        "Ansible's own work per task and host is part of every figure." % (
            result["model"], result["runtime"], result["runs"], result["clients"], result["model"],
            result["model_bytes"], result["hub_rate"] or "nothing"), ""]
    return "\n".join(lines)


def playbook(inventory: str, playbook_name: str, extra: Sequence[str] = ()) -> Dict[str, Any]:
    argv = [PLAYBOOK, "-i", inventory, playbook_name] + list(extra)
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        sys.exit("%s failed:\n%s" % (" ".join(argv), done.stdout[-4000:]))
    return {"seconds": round(seconds, 1), "changed": sum(recap_changed(done.stdout).values())}


def measure(nodes: int, args: argparse.Namespace, names: Mapping[str, int], reports: str) -> Dict[str, Any]:
    inventory = sandbox_scale.write_inventory(nodes, args.copy_of)
    settle = playbook(inventory, "site.yml")
    second = playbook(inventory, "site.yml")
    overhead = argparse.Namespace(inventory=inventory, model=args.model, runtime=args.runtime, runs=args.runs,
                                  clients=args.clients)
    bench = {mode: bench_overhead.bench(mode, overhead, reports) for mode in ("run", "server")}
    remove_from_every_node(names, sandbox_scale.node_names(nodes))
    mark = len(hub_records())
    shape_hub(args.hub_rate)
    try:
        weights = playbook(inventory, "playbooks/models.yml", ["-e", "model=%s" % args.model])
    finally:
        shape_hub("")
    hub_bytes = sum(record["bytes"] for record in hub_records()[mark:]
                    if record["path"].startswith("/cdn/") and record["path"].rsplit("/", 1)[-1] in names)
    model_bytes = sum(names.values())
    return {"site_settle_s": settle["seconds"], "site_settle_changed": settle["changed"],
            "site_second_s": second["seconds"], "site_second_changed": second["changed"],
            "bench_run_overhead_s": bench["run"]["overhead_s_per_run"],
            "bench_server_overhead_s": bench["server"]["overhead_s_per_run"],
            "bench": bench, "weights_s": weights["seconds"], "hub_bytes": hub_bytes,
            "hub_bytes_per_model": round(hub_bytes / model_bytes, 3) if model_bytes else 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="3,6", help="cluster sizes, comma-separated (3,6)")
    parser.add_argument("--runs", type=int, default=3, help="measured runs per bench.yml mode (3)")
    parser.add_argument("--model", default="tiny", help="a catalog entry of the sandbox (tiny)")
    parser.add_argument("--runtime", default="llama_rpc", help="bench.yml's runtime (llama_rpc)")
    parser.add_argument("--clients", default="1", help="bench.yml's clients in mode=server (1)")
    parser.add_argument("--hub-rate", default="200mbit", help="tc tbf rate of the hub's link for the weights (200mbit)")
    parser.add_argument("--from", dest="copy_of", default="n0", help="the provisioned node copied (n0)")
    parser.add_argument("--keep", action="store_true", help="leave the copies up afterwards")
    args = parser.parse_args()
    try:
        sizes = sorted({int(text) for text in args.nodes.split(",")})
        for size in sizes:
            sandbox_scale.node_names(size)
    except ValueError as error:
        parser.error("--nodes %s: %s" % (args.nodes, error))
    names = model_files(args.model)
    reports = tempfile.mkdtemp(prefix="scale-")
    result = {"command": " ".join(["python3 benchmarks/scale.py"] + sys.argv[1:]), "model": args.model,
              "model_bytes": sum(names.values()), "runtime": args.runtime, "runs": args.runs, "clients": args.clients,
              "hub_rate": args.hub_rate, "reports": reports}  # type: Dict[str, Any]
    by_nodes = {}  # type: Dict[int, Dict[str, Any]]
    started = time.monotonic()
    # The copies are this run's until it ends: another up or down waits for the lock, or is refused.
    with sandbox_scale.scaled_lock():
        try:
            sandbox_scale.start_copies(max(sizes), args.copy_of)
            for size in sizes:
                by_nodes[size] = measure(size, args, names, reports)
        finally:
            if not args.keep:
                sandbox_scale.remove_scaled()
    keys = [figure[0] for figure in FIGURES]
    result.update({"by_nodes": {str(size): figures for size, figures in by_nodes.items()},
                   "marginal": marginal(by_nodes, keys), "growth": growth(by_nodes, keys),
                   "seconds": round(time.monotonic() - started)})
    write_figures("scale", result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
