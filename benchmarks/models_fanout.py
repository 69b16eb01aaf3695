"""Weights to every node: the fan-out (one hub download, peers copy from the node that has it) against every node
downloading from the hub, on the sandbox with the hub's link shaped.

    python3 benchmarks/models_fanout.py [--hub-rate 20mbit] [--model tiny]

Needs the sandbox up and provisioned (make sandbox-up && ansible-playbook -i inventory/sandbox-mapped.yml
site.yml). For each way it removes the model's files from every node, shapes the hub's link with tc tbf
(the nodes' links are left as they are), runs playbooks/models.yml, and counts the bytes the hub served (its
request log). Writes artifacts/models-fanout.json and models-fanout.md: wall time and hub bytes per way, and
the ratio of the two wall times, with the command that made them. The hub's link is unshaped afterwards,
also when a run fails.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

import yaml

from figures import write_figures

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
INVENTORY = "inventory/sandbox-mapped.yml"
NODE_ROOT = "/var/lib/prima-sandbox/nodes/%s/root"
HUB_LOG = "/var/lib/prima-sandbox/hub-requests.log"
WAYS = {"fanout": True, "every_node": False}


def shape_hub(rate: str) -> None:
    """tbf on the hub's link (rate), or none (empty rate)."""
    argv = ["ip", "netns", "exec", "psb-hub", "tc", "qdisc"]
    if rate:
        subprocess.run(argv + ["replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "32kb",
                               "latency", "400ms"], check=True)
    else:
        subprocess.run(argv + ["del", "dev", "eth0", "root"], check=False, stderr=subprocess.DEVNULL)


def hub_records() -> List[Dict[str, Any]]:
    if not os.path.exists(HUB_LOG):
        return []
    with open(HUB_LOG) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def model_files(model: str) -> Dict[str, int]:
    """{file name: size} of one of the sandbox's models (inventory/group_vars/sandbox.yml's catalog)."""
    with open(os.path.join(REPO, "inventory", "group_vars", "sandbox.yml")) as handle:
        catalog = yaml.safe_load(handle)["models_extra_catalog"]
    if model not in catalog:
        sys.exit("--model %s: not one of the sandbox's models (%s, in inventory/group_vars/sandbox.yml)"
                 % (model, ", ".join(sorted(catalog))))
    return {entry["name"]: int(entry["size"]) for entry in catalog[model]["files"]}


def inventory_nodes() -> List[str]:
    """The nodes of INVENTORY (cluster a), not every node of the sandbox: a second cluster or scaled copies may be up."""
    with open(os.path.join(REPO, INVENTORY)) as handle:
        return list(yaml.safe_load(handle)["all"]["children"]["sandbox"]["children"]["cluster"]["hosts"])


def remove_from_every_node(names: Mapping[str, int], nodes: Optional[Sequence[str]] = None) -> None:
    """The files, their partial downloads and stamps, gone from each node (INVENTORY's unless `nodes` are named)."""
    for root in (NODE_ROOT % node for node in (inventory_nodes() if nodes is None else nodes)):
        for name in names:
            for suffix in ("", ".partial", ".verified"):
                path = os.path.join(root, "opt/models", name + suffix)
                if os.path.lexists(path):
                    os.remove(path)


def measure(way: str, model: str, names: Dict[str, int], hub_rate: str) -> Dict[str, Any]:
    remove_from_every_node(names)
    mark = len(hub_records())
    shape_hub(hub_rate)
    started = time.monotonic()
    try:
        done = subprocess.run([PLAYBOOK, "-i", INVENTORY, "playbooks/models.yml", "-e", "model=%s" % model,
                               "-e", json.dumps({"models_fanout": WAYS[way]})], cwd=REPO, capture_output=True, text=True,
                              check=False)
    finally:
        shape_hub("")
    seconds = time.monotonic() - started
    if done.returncode != 0:
        sys.exit("models.yml (%s) failed:\n%s" % (way, done.stdout[-3000:]))
    served = sum(record["bytes"] for record in hub_records()[mark:]
                 if record["path"].startswith("/cdn/") and record["path"].rsplit("/", 1)[-1] in names)
    return {"seconds": round(seconds, 1), "hub_bytes": served}


def markdown(result: Dict[str, Any]) -> str:
    lines = ["# Weights to every node: fan-out against every node downloading, on the sandbox", "",
             "Made by: `%s`" % result["command"], "",
             "| Way | Wall s | Hub bytes | Hub bytes per model |", "|---|---|---|---|"]
    for way in WAYS:
        row = result[way]
        lines.append("| %s | %.1f | %d | %.3f |" % (way, row["seconds"], row["hub_bytes"], row["hub_bytes_per_model"]))
    lines += ["", "Fan-out wall time / every node downloading: %.3f. Model %s (%d bytes), %d nodes, hub link "
              "shaped to %s with tc tbf, the nodes' links unshaped; each way's wall time is models.yml's whole "
              "run (its checks and SSH round trips included)."
              % (result["fanout_to_every_node_time"], result["model"], result["model_bytes"], result["nodes"],
                 result["hub_rate"]), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hub-rate", default="20mbit", help="tc tbf rate of the hub's link (20mbit)")
    parser.add_argument("--model", default="tiny", help="a catalog entry (tiny)")
    args = parser.parse_args()
    names = model_files(args.model)
    result = {"command": "python3 benchmarks/models_fanout.py " + " ".join(sys.argv[1:]), "model": args.model,
              "hub_rate": args.hub_rate, "nodes": len(inventory_nodes())}
    for way in WAYS:
        result[way] = measure(way, args.model, names, args.hub_rate)
    model_bytes = sum(names.values())
    for way in WAYS:
        result[way]["hub_bytes_per_model"] = round(result[way]["hub_bytes"] / model_bytes, 3) if model_bytes else 0
    result["model_bytes"] = model_bytes
    result["fanout_to_every_node_time"] = round(result["fanout"]["seconds"] / result["every_node"]["seconds"], 3)
    write_figures("models-fanout", result, markdown(result))


if __name__ == "__main__":
    main()
