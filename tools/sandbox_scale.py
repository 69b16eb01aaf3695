"""A sandbox cluster of N nodes for the price of one provisioning: copies of a provisioned node's root.

    .venv/bin/python tools/sandbox_scale.py up --nodes 6 [--from n0]   # prints the inventory of the N nodes
    .venv/bin/python tools/sandbox_scale.py inventory --nodes 3        # the inventory of the first 3 of them
    .venv/bin/python tools/sandbox_scale.py down                       # the copies gone, the rest of the sandbox stays

Needs the sandbox up (make sandbox-up) and --from provisioned by site.yml (make site-sandbox). `up` copies
that node's root once (a snapshot, under the sandbox's state directory) and starts nodes s0..s<N-1> from it,
shaped like Glows as cluster a is (the access gateway maps port 2220+i to node si, its own gateway table;
nodes reach each other only through it): the sandbox's `sandbox_state=copy`, as cluster b of make test. Each
copy is a whole node: the builds, the weights and the launch units of the node it was copied from (so a first
site.yml on the copies only rewrites what depends on the peers: the transport and the launch units).

The inventories are written beside a link to this repository's inventory/group_vars (the sandbox's settings
and catalog), under /var/lib/prima-sandbox/scaled/: sandbox-scaled-<N>.yml. sandbox-down removes them all.
"""

import argparse
import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATE_DIR = "/var/lib/prima-sandbox"
SCALED_DIR = os.path.join(STATE_DIR, "scaled")
SNAPSHOT_DIR = os.path.join(STATE_DIR, "snapshots", "scaled")
NODE_ROOT = os.path.join(STATE_DIR, "nodes", "%s", "root")
# The ansible-playbook beside this Python (the checkout's .venv), else the checkout's, else the PATH's: the README's
# `python3 tools/sandbox_scale.py` may run under a Python without Ansible.
PLAYBOOK = next((path for path in (os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
                                   os.path.join(REPO, ".venv", "bin", "ansible-playbook"))
                 if os.access(path, os.X_OK)), shutil.which("ansible-playbook") or "ansible-playbook")
ACCESS_ADDRESS = "10.77.0.3"
# Cluster a holds .10-.12 and ports 2210-2212, cluster b .13-.15 and 2213-2215; the hub is .2, the gateway .3.
FIRST_ADDRESS = 20
FIRST_PORT = 2220
MAX_NODES = 16
TABLE = "prima_access_scaled"
NAME_PREFIX = "s"
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,9}$")
# A file the node's provisioning leaves (role local_fact): a copy of a node without it would be provisioned cold.
PROVISIONED_MARK = "etc/ansible/facts.d/llama_cpp.fact"
LOCK = os.path.join(STATE_DIR, "scaled.lock")
INVENTORY_NAME = re.compile(r"^sandbox-scaled-(\d{1,2})\.yml$")


def node_names(nodes: int) -> List[str]:
    if not 2 <= nodes <= MAX_NODES:
        raise ValueError("--nodes %d: a scaled cluster has 2 to %d nodes (addresses 10.77.0.%d-%d, ports %d-%d)"
                         % (nodes, MAX_NODES, FIRST_ADDRESS, FIRST_ADDRESS + MAX_NODES - 1, FIRST_PORT,
                            FIRST_PORT + MAX_NODES - 1))
    return ["%s%d" % (NAME_PREFIX, index) for index in range(nodes)]


def scaled_inventory(nodes: int, copy_of: str) -> Dict[str, Any]:
    """The inventory of nodes s0..s<nodes-1>, shaped like inventory/sandbox-mapped.yml, each a copy of `copy_of`."""
    hosts = {}
    for index, name in enumerate(node_names(nodes)):
        hosts[name] = {"ansible_host": ACCESS_ADDRESS, "ansible_port": FIRST_PORT + index,
                       "cluster_ip": "10.77.0.%d" % (FIRST_ADDRESS + index), "sandbox_copy_of": copy_of}
    return {"all": {"children": {"sandbox": {
        "vars": {"sandbox_topology": "mapped", "sandbox_access_table": TABLE},
        "children": {"cluster": {"hosts": hosts}}}}}}


def inventory_path(nodes: int) -> str:
    return os.path.join(SCALED_DIR, "sandbox-scaled-%d.yml" % nodes)


def write_inventory(nodes: int, copy_of: str) -> str:
    """The inventory file of the first `nodes` copies, beside the repository's group_vars (Ansible reads an
    inventory's group_vars from its own directory)."""
    os.makedirs(SCALED_DIR, exist_ok=True)
    group_vars = os.path.join(SCALED_DIR, "group_vars")
    if not os.path.islink(group_vars):
        os.symlink(os.path.join(REPO, "inventory", "group_vars"), group_vars)
    path = inventory_path(nodes)
    header = ("# Written by tools/sandbox_scale.py: %d copies of %s's provisioned root, mapped like Glows.\n"
              % (nodes, copy_of))
    partial = path + ".partial"
    with open(partial, "w") as handle:
        handle.write("---\n" + header)
        yaml.safe_dump(scaled_inventory(nodes, copy_of), handle, default_flow_style=False, sort_keys=False)
    os.replace(partial, path)
    return path


def sandbox_playbook(inventory: str, state: str, extra: Dict[str, str]) -> None:
    argv = [PLAYBOOK, "-i", inventory, "playbooks/sandbox.yml", "-e", "sandbox_state=%s" % state]
    for key, value in extra.items():
        argv += ["-e", "%s=%s" % (key, value)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit("%s failed:\n%s" % (" ".join(argv), done.stdout[-4000:]))


def source_problem(copy_of: str, node_root: str = NODE_ROOT) -> str:
    """Why `copy_of` cannot be copied ('' when it can): a plain node name, of a node that is there and provisioned."""
    if not NODE_NAME.fullmatch(copy_of):
        return "--from %r: not a sandbox node name (letters, digits, _ and -)" % copy_of
    source = node_root % copy_of
    if not os.path.isdir(source):
        return "--from %s: no such sandbox node (%s): make sandbox-up && make site-sandbox first" % (copy_of, source)
    if not os.path.exists(os.path.join(source, PROVISIONED_MARK)):
        return ("--from %s: the node is not provisioned (no /%s): make site-sandbox first, or every copy would be "
                "provisioned from cold" % (copy_of, PROVISIONED_MARK))
    return ""


@contextlib.contextmanager
def scaled_lock():
    """One up or down at a time: a second one would remove the first one's snapshot or nodes under it."""
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(LOCK, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            sys.exit("another tools/sandbox_scale.py up or down is running (%s is locked): let it end first" % LOCK)
        yield


def take_snapshot(copy_of: str) -> None:
    """A copy of the provisioned node's root, taken while it runs (copy_root binds its root read-only first)."""
    sys.path.insert(0, REPO)
    from plugins.module_utils.sandbox_node import copy_root  # the sandbox's own copier

    problem = source_problem(copy_of)
    if problem:
        sys.exit(problem)
    source = NODE_ROOT % copy_of
    if os.path.exists(SNAPSHOT_DIR):
        shutil.rmtree(SNAPSHOT_DIR)
    home = os.path.join(SNAPSHOT_DIR, copy_of)
    os.makedirs(home)
    copy_root(source, os.path.join(home, "root"), os.path.join(home, "staging"))


def up(nodes: int, copy_of: str) -> str:
    with scaled_lock():
        return start_copies(nodes, copy_of)


def start_copies(nodes: int, copy_of: str) -> str:
    """The nodes started afresh from a new snapshot (copies left by an earlier `up` are removed first). The caller
    holds scaled_lock()."""
    problem = source_problem(copy_of)
    if problem:
        sys.exit(problem)
    started = time.monotonic()
    remove_scaled()
    take_snapshot(copy_of)
    path = write_inventory(nodes, copy_of)
    try:
        sandbox_playbook(path, "copy", {"sandbox_copy_dir": SNAPSHOT_DIR})
    finally:
        # Every node has its own copy now, or none will.
        shutil.rmtree(SNAPSHOT_DIR, ignore_errors=True)
    sys.stderr.write("%d nodes up as copies of %s in %.0f s\n" % (nodes, copy_of, time.monotonic() - started))
    return path


def down() -> None:
    with scaled_lock():
        remove_scaled()


def remove_scaled() -> None:
    """Every scaled node, whatever N the last `up` had (the largest inventory written names them all)."""
    names = os.listdir(SCALED_DIR) if os.path.isdir(SCALED_DIR) else []
    written = sorted((int(match.group(1)) for match in map(INVENTORY_NAME.match, names) if match), reverse=True)
    if written:
        sandbox_playbook(inventory_path(written[0]), "remove", {})
    shutil.rmtree(SCALED_DIR, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "inventory", "down"])
    parser.add_argument("--nodes", type=int, default=6, help="how many nodes (6)")
    parser.add_argument("--from", dest="copy_of", default="n0", help="the provisioned node copied (n0)")
    args = parser.parse_args()
    if args.action == "down":
        down()
        return 0
    try:
        node_names(args.nodes)
    except ValueError as error:
        parser.error(str(error))
    if not NODE_NAME.fullmatch(args.copy_of):
        parser.error("--from %r: not a sandbox node name (letters, digits, _ and -)" % args.copy_of)
    path = up(args.nodes, args.copy_of) if args.action == "up" else write_inventory(args.nodes, args.copy_of)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
