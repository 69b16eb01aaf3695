"""Helpers for the tests that run the playbooks for real, through ansible-runner."""

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import ansible_runner
import pytest
import testinfra
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The suite runs on the sandbox shaped like Glows (an access gateway, nodes that cannot reach each other), on one of
# its clusters: `a` (inventory/sandbox-mapped.yml, n0-n2, brought up by the session) by default; `b`
# (inventory/sandbox-mapped-b.yml, n3-n5: copies of a's nodes once provisioned, see second_cluster) when
# PRIMA_TEST_CLUSTER=b, as tools/run_tests.sh runs part of the suite beside the rest.
# FLAT_INVENTORY is cluster a on a flat network (flat_topology() switches the running sandbox).
CLUSTER = os.environ.get("PRIMA_TEST_CLUSTER", "a")
CLUSTER_INVENTORIES = {"a": "sandbox-mapped.yml", "b": "sandbox-mapped-b.yml"}
if CLUSTER not in CLUSTER_INVENTORIES:
    raise pytest.UsageError("PRIMA_TEST_CLUSTER is %r; use a (the default) or b" % CLUSTER)
SANDBOX_INVENTORY = os.path.join(REPO, "inventory", CLUSTER_INVENTORIES[CLUSTER])
FLAT_INVENTORY = os.path.join(REPO, "inventory", "sandbox.yml")
ACCESS_ADDRESS = "10.77.0.3"


def _inventory_hosts(path: str) -> Dict[str, Dict[str, Any]]:
    with open(path) as handle:
        return yaml.safe_load(handle)["all"]["children"]["sandbox"]["children"]["cluster"]["hosts"]


# The cluster's nodes in rank order, as the inventory lists them (n0, n1, n2 on cluster a), their gateway ports and
# cluster addresses (one read of the inventory).
_CLUSTER_HOSTS = _inventory_hosts(SANDBOX_INVENTORY)
SSH_PORTS = {name: host["ansible_port"] for name, host in _CLUSTER_HOSTS.items()}
CLUSTER_IPS = {name: host["cluster_ip"] for name, host in _CLUSTER_HOSTS.items()}
NODES = list(SSH_PORTS)
N0, N1, N2 = NODES
ARTIFACTS = os.path.join(REPO, "artifacts")
VENV_BIN = os.path.join(REPO, ".venv", "bin")
# The session's second site.yml is the README's own command for it ("Sandbox, step by step"), run through bash as
# typed: test_readme_run_as_typed takes that run's result instead of running the same no-op again.
SITE_AS_TYPED = "make site-sandbox"
# A local prima.cpp mirror may hold the pinned tree under another commit (a snapshot
# without GitHub's large files, say): PRIMA_CPP_VERSION names the commit to build then.
PRIMA_EXTRAVARS = {"prima_version": os.environ["PRIMA_CPP_VERSION"]} if os.environ.get("PRIMA_CPP_VERSION") else {}
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


def sandbox_var(name: str) -> Any:
    """A setting of every sandbox cluster (inventory/group_vars/sandbox.yml), as the inventory gives it."""
    with open(os.path.join(REPO, "inventory", "group_vars", "sandbox.yml")) as handle:
        return yaml.safe_load(handle)[name]


def role_default(role: str, name: str) -> Any:
    """A pin or default as the role itself defines it (roles/<role>/defaults/main.yml), so tests never repeat one."""
    with open(os.path.join(REPO, "roles", role, "defaults", "main.yml")) as handle:
        return yaml.safe_load(handle)[name]


class PlaybookRun:
    def __init__(self, runner, seconds: float, log_path: str):
        self.status = runner.status
        self.rc = runner.rc
        self.stats = runner.stats or {}
        self.seconds = seconds
        self.log_path = log_path
        with open(log_path) as handle:
            self.stdout = handle.read()
        # What debug tasks said, unwrapped (stdout wraps long lines): serve.yml's tunnel and curl, say.
        self.messages = []  # type: List[str]
        # What failed tasks said, unwrapped.
        self.failure_messages = []  # type: List[str]
        for event in runner.events:
            result = (event.get("event_data") or {}).get("res")
            if event.get("event") in ("runner_on_ok", "runner_item_on_ok", "runner_on_failed") \
                    and isinstance(result, dict) and "msg" in result:
                message = result["msg"]
                lines = [str(line) for line in message] if isinstance(message, list) else [str(message)]
                if event.get("event") == "runner_on_failed":
                    self.failure_messages += lines
                else:
                    self.messages += lines

    def count(self, kind: str) -> Dict[str, int]:
        return dict(self.stats.get(kind, {}))

    @property
    def hosts(self) -> List[str]:
        seen = set()  # type: set
        for kind in ("ok", "changed", "failures", "dark", "skipped"):
            seen.update(self.stats.get(kind, {}))
        return sorted(seen)

    def failures(self) -> List[str]:
        """Every task failure in the log, with its message: the tail alone can miss the first cause."""
        blocks = []  # type: List[str]
        lines = self.stdout.splitlines()
        for index, line in enumerate(lines):
            if line.startswith(("fatal: [", "failed: [")) or (line.startswith("[ERROR]: ") and index + 1 < len(lines)):
                end = index + 1
                while end < len(lines) and lines[end].strip() and not lines[end].startswith(("TASK [", "PLAY ")):
                    end += 1
                blocks.append("\n".join(lines[index:min(end, index + 25)]))
        return blocks

    def describe(self) -> str:
        failures = "\n".join(self.failures())[:8000]
        return "status=%s rc=%s stats=%s\n(log: %s)\nfailures:\n%s\n\nlast lines:\n%s" % (
            self.status, self.rc, json.dumps(self.stats), self.log_path, failures, self.stdout[-4000:])


# A PLAY RECAP line of ansible-playbook's default output; its counts under ansible-runner's names for them.
RECAP_LINE = re.compile(r"^(\S+)\s*: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)"
                        r"\s+rescued=(\d+)\s+ignored=(\d+)", re.M)
RECAP_KEYS = ("ok", "changed", "dark", "failures", "skipped", "rescued", "ignored")


def recap_stats(stdout: str) -> Dict[str, Dict[str, int]]:
    """The last PLAY RECAP, as ansible-runner's stats: kind -> host -> count, hosts with a count of 0 left out."""
    stats = {kind: {} for kind in RECAP_KEYS}  # type: Dict[str, Dict[str, int]]
    for match in RECAP_LINE.finditer(stdout):
        for kind, count in zip(RECAP_KEYS, match.groups()[1:]):
            if int(count):
                stats[kind][match.group(1)] = int(count)
            else:
                stats[kind].pop(match.group(1), None)
    return stats


class TypedRun(PlaybookRun):
    """A command that runs a playbook, through bash as a person types it in the checkout (the venv's bin first on
    PATH); its output read back into a PlaybookRun's fields (no events: messages and failure_messages are empty)."""

    def __init__(self, text: str, label: str, **env: str):
        os.makedirs(ARTIFACTS, exist_ok=True)
        environment = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""), **env)
        started = time.monotonic()
        done = subprocess.run(["bash", "-c", text], cwd=REPO, env=environment, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=3600,
                              check=False)
        self.text = text
        self.seconds = time.monotonic() - started
        self.rc = done.returncode
        self.status = "successful" if done.returncode == 0 else "failed"
        self.stdout = done.stdout
        self.stats = recap_stats(done.stdout)
        self.messages = []  # type: List[str]
        self.failure_messages = []  # type: List[str]
        self.log_path = os.path.join(ARTIFACTS, "%s.log" % label)
        with open(self.log_path, "w") as handle:
            handle.write("$ %s\n%s" % (text, done.stdout))
        with open(PLAYBOOK_SECONDS, "a") as handle:
            handle.write(json.dumps({"label": label, "seconds": round(self.seconds, 1), "status": self.status,
                                     "test": os.environ.get("PYTEST_CURRENT_TEST", "")}) + "\n")


def _runner_args(playbook: str, inventory: str, extravars: Optional[Dict[str, Any]], limit: Optional[str],
                 cmdline: Optional[str], envvars: Optional[Dict[str, str]]) -> Dict[str, Any]:
    return dict(
        private_data_dir=tempfile.mkdtemp(prefix="runner-"),
        project_dir=REPO,
        playbook=playbook,
        inventory=inventory,
        extravars=dict(PRIMA_EXTRAVARS if inventory in (SANDBOX_INVENTORY, FLAT_INVENTORY) else {}, **(extravars or {})),
        limit=limit,
        cmdline=cmdline,
        envvars=dict({"ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}, **(envvars or {})),
        quiet=True,
        timeout=3600,
    )


# One line per playbook run of the suite (label, seconds, the test that ran it): where make test's time goes.
PLAYBOOK_SECONDS = os.path.join(ARTIFACTS, "playbook-seconds.jsonl" if CLUSTER == "a" else
                                "playbook-seconds-%s.jsonl" % CLUSTER)


def pytest_sessionstart(session) -> None:
    if os.path.exists(PLAYBOOK_SECONDS):
        os.remove(PLAYBOOK_SECONDS)


def _finish(runner, started: float, label: str) -> PlaybookRun:
    seconds = time.monotonic() - started
    log_path = os.path.join(ARTIFACTS, "%s.log" % label)
    with open(log_path, "w") as handle:
        handle.write(runner.stdout.read())
    with open(PLAYBOOK_SECONDS, "a") as handle:
        handle.write(json.dumps({"label": label, "seconds": round(seconds, 1), "status": runner.status,
                                 "test": os.environ.get("PYTEST_CURRENT_TEST", "")}) + "\n")
    run = PlaybookRun(runner, seconds, log_path)
    # Read whole by now: its events and artifacts (megabytes per run) would otherwise stay in /tmp for good.
    if runner.status not in ("unstarted", "starting", "running"):  # a finish() that timed out leaves it be
        shutil.rmtree(runner.config.private_data_dir, ignore_errors=True)
    return run


def run_playbook(playbook: str, inventory: str = SANDBOX_INVENTORY, extravars: Optional[Dict[str, Any]] = None,
                 limit: Optional[str] = None, cmdline: Optional[str] = None, label: str = "run",
                 envvars: Optional[Dict[str, str]] = None) -> PlaybookRun:
    os.makedirs(ARTIFACTS, exist_ok=True)
    started = time.monotonic()
    runner = ansible_runner.run(**_runner_args(playbook, inventory, extravars, limit, cmdline, envvars))
    return _finish(runner, started, label)


class BackgroundRun:
    """A playbook running in a thread; finish() waits for it and returns its PlaybookRun."""

    def __init__(self, playbook: str, label: str, **kwargs: Any):
        os.makedirs(ARTIFACTS, exist_ok=True)
        self.label = label
        self.started = time.monotonic()
        args = _runner_args(playbook, kwargs.get("inventory", SANDBOX_INVENTORY), kwargs.get("extravars"),
                            kwargs.get("limit"), kwargs.get("cmdline"), kwargs.get("envvars"))
        self.thread, self.runner = ansible_runner.run_async(**args)

    def running(self) -> bool:
        return self.thread.is_alive()

    def finish(self, timeout: float = 1800) -> PlaybookRun:
        self.thread.join(timeout)
        return _finish(self.runner, self.started, self.label)


# A copy of cluster a's rank 0 root as site_runs provisioned it (SNAPSHOT_ROOT), taken once the session's site.yml
# runs are over: cluster b's nodes start from it, and the rental test rents its instances from it. The file
# SNAPSHOT/complete says the copy is whole. Under the sandbox's state directory, so sandbox-down removes it.
SNAPSHOT = "/var/lib/prima-sandbox/snapshots/provisioned"
# The copy of cluster a's rank 0 (whichever cluster this session runs on).
SNAPSHOT_NODE = list(_inventory_hosts(os.path.join(REPO, "inventory", CLUSTER_INVENTORIES["a"])))[0]
SNAPSHOT_ROOT = os.path.join(SNAPSHOT, SNAPSHOT_NODE, "root")


def snapshot_provisioned() -> None:
    from ansible_collections.prima.cluster.plugins.module_utils.sandbox_node import copy_root

    assert CLUSTER == "a", "the snapshot is of cluster a's rank 0"
    if os.path.exists(SNAPSHOT):
        shutil.rmtree(SNAPSHOT)
    home = os.path.dirname(SNAPSHOT_ROOT)
    os.makedirs(home)
    copy_root(NODE_ROOT % N0, SNAPSHOT_ROOT, os.path.join(home, "staging"))
    with open(os.path.join(SNAPSHOT, "complete"), "w") as handle:
        handle.write("%d\n" % time.time())


def _mark(variable: str, text: str) -> None:
    """Tell tools/run_tests.sh that a step of this session is over (it starts another pytest then)."""
    mark = os.environ.get(variable)
    if mark:
        with open(mark, "w") as handle:
            handle.write(text + "\n")


def snapshot_done(copied: bool) -> None:
    """Tell tools/run_tests.sh whether cluster b can start: `copied`, or `none` (it says why it did not, then)."""
    _mark("PRIMA_TEST_SNAPSHOT_DONE", "copied" if copied else "none")


@pytest.fixture(scope="session")
def sandbox():
    """The sandbox cluster, up for the whole session and down afterwards. On cluster b: its nodes added to the
    running sandbox as copies of the provisioned snapshot (second_cluster), and removed at the end with
    sandbox_state=remove, which leaves cluster a's nodes to its own session (remove_second_cluster)."""
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root (network namespaces, mounts, debootstrap)")
    if CLUSTER != "a":
        yield second_cluster()
        remove_second_cluster()
        return
    if os.environ.get("PRIMA_SANDBOX_REUSE") == "1":
        # For iterating on tests: use the sandbox as it is, and leave it up.
        yield None
        return
    up = run_playbook("playbooks/sandbox.yml", extravars={"sandbox_state": "up"}, label="sandbox-up")
    assert up.status == "successful", up.describe()
    try:
        yield up
    finally:
        # tools/run_tests.sh runs a pytest on cluster b beside this one: its nodes go down with the sandbox, so
        # wait until it has ended (PRIMA_TEST_WAIT_BEFORE_DOWN names the file it leaves then).
        wait_file = os.environ.get("PRIMA_TEST_WAIT_BEFORE_DOWN")
        # A session that took no copy (site_runs not selected) lets cluster b's pytest know it will not start.
        snapshot_mark = os.environ.get("PRIMA_TEST_SNAPSHOT_DONE")
        if snapshot_mark and not os.path.exists(snapshot_mark):
            snapshot_done(False)
        deadline = time.monotonic() + 3600
        while wait_file and not os.path.exists(wait_file) and time.monotonic() < deadline:
            time.sleep(2)
        down = run_playbook("playbooks/sandbox.yml", extravars={"sandbox_state": "down"}, label="sandbox-down")
        assert down.status == "successful", down.describe()


def second_cluster() -> PlaybookRun:
    """This cluster's nodes (b) added to the running sandbox as copies of the provisioned snapshot."""
    if not os.path.exists(os.path.join(SNAPSHOT, "complete")):
        pytest.fail("cluster %s starts from the snapshot of cluster a's provisioned nodes (%s), which is not there: "
                    "run the suite on cluster a first (tools/run_tests.sh does both)" % (CLUSTER, SNAPSHOT))
    copied = run_playbook("playbooks/sandbox.yml", extravars={"sandbox_state": "copy", "sandbox_copy_dir": SNAPSHOT},
                          label="sandbox-copy-%s" % CLUSTER)
    assert copied.status == "successful", copied.describe()
    return copied


def cluster_public_key(name: str) -> str:
    """The node's cluster public key (role transport), without its comment."""
    with open(os.path.join(NODE_ROOT % name, "etc/prima-bench/transport/id_ed25519.pub")) as handle:
        return " ".join(handle.read().split()[:2])


def gateway_tables() -> List[str]:
    listed = subprocess.run(["ip", "netns", "exec", "psb-access", "nft", "list", "tables"], capture_output=True,
                            text=True, check=True).stdout
    return [line.split()[-1] for line in listed.splitlines() if line.strip()]


def remove_second_cluster() -> None:
    """This cluster's nodes and gateway table removed (sandbox_state=remove), cluster a's left running."""
    table = "prima_access_%s" % CLUSTER
    namespaces = ["psb-%s" % name for name in NODES]
    cluster_a = ["psb-%s" % name for name in _inventory_hosts(os.path.join(REPO, "inventory", CLUSTER_INVENTORIES["a"]))]
    assert table in gateway_tables() and set(namespaces + cluster_a) <= set(sandbox_namespaces()), \
        "before removal: %s, %s" % (gateway_tables(), sandbox_namespaces())
    removed = run_playbook("playbooks/sandbox.yml", extravars={"sandbox_state": "remove"},
                           label="sandbox-remove-%s" % CLUSTER)
    assert removed.status == "successful", removed.describe()
    assert [name for name in NODES if os.path.exists(NODE_ROOT % name)] == [], "a node of cluster %s is left" % CLUSTER
    assert not set(namespaces) & set(sandbox_namespaces()), sandbox_namespaces()
    assert table not in gateway_tables() and "prima_access" in gateway_tables(), gateway_tables()
    # Cluster a's nodes still up, and its sshd still reached through the gateway's map.
    assert set(cluster_a) <= set(sandbox_namespaces()), "sandbox_state=remove took cluster a's nodes too"
    with socket.create_connection(("10.77.0.3", 2210), timeout=5) as connection:
        assert connection.recv(4).startswith(b"SSH-")


def sandbox_namespaces() -> List[str]:
    return [line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                                       check=True).stdout.splitlines() if line.strip()]


@contextlib.contextmanager
def flat_topology():
    """The running sandbox's network made flat (every node reaches every other), then shaped like Glows again."""
    assert CLUSTER == "a", "flat_topology() switches cluster a (FLAT_INVENTORY), not cluster %s" % CLUSTER
    flat = run_playbook("playbooks/sandbox.yml", inventory=FLAT_INVENTORY,
                        extravars={"sandbox_state": "topology"}, label="sandbox-flat")
    assert flat.status == "successful", flat.describe()
    try:
        yield
    finally:
        mapped = run_playbook("playbooks/sandbox.yml", extravars={"sandbox_state": "topology"}, label="sandbox-mapped")
        assert mapped.status == "successful", mapped.describe()


def write_figures(name: str, figures: Dict[str, Any]) -> None:
    os.makedirs(ARTIFACTS, exist_ok=True)
    with open(os.path.join(ARTIFACTS, name), "w") as handle:
        json.dump(figures, handle, indent=2, sort_keys=True)
        handle.write("\n")


# The cluster lock on rank 0's node (roles/cluster_lock), and the sandbox hub's log of every response it serves.
NODE_ROOT = "/var/lib/prima-sandbox/nodes/%s/root"
LOCK_ON_NODE = "/var/lib/prima-bench/bench.lock"
LOCK = os.path.join(NODE_ROOT % N0, LOCK_ON_NODE.lstrip("/"))
HUB_LOG = "/var/lib/prima-sandbox/hub-requests.log"
STALE_LOCK_RUN_ID = "stale-site"


def hub_records() -> List[Dict[str, Any]]:
    if not os.path.exists(HUB_LOG):
        return []
    with open(HUB_LOG) as handle:
        return [json.loads(line) for line in handle]


@contextlib.contextmanager
def planted_lock(run_id, playbook="bench.yml", bound_s=86400, controller=None):
    """A lock held by a live ansible-playbook of this controller (or of `controller`), removed afterwards.

    The holder is a sleep under the name ansible-playbook, so that no test holds the cluster for longer than its
    own run."""
    from ansible_collections.prima.cluster.plugins.filter.cluster_lock import process_identity

    holder = subprocess.Popen(["ansible-playbook", "900"], executable="sleep")
    # Where the holder runs, as the role records it (machine, boot, pid namespace, start): judged live, not gone.
    record = json.dumps(dict({"run_id": run_id, "playbook": playbook, "controller": controller or socket.gethostname(),
                              "pid": holder.pid, "started": "2026-01-01T00:00:00Z", "bound_s": bound_s},
                             **process_identity(holder.pid)))
    try:
        assert not os.path.lexists(LOCK), "a lock was left on %s: %s" % (N0, os.readlink(LOCK))
        os.symlink(record, LOCK)
        yield record
    finally:
        holder.kill()
        holder.wait()
        if os.path.lexists(LOCK) and os.readlink(LOCK) == record:
            os.unlink(LOCK)


def age(path, seconds):
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def units() -> Dict[str, Any]:
    """Every launcher script on every node, with its content and modification time."""
    found = {}
    for name in NODES:
        for path in glob.glob(os.path.join(NODE_ROOT % name, "etc/prima-bench", "**"), recursive=True):
            if not os.path.isfile(path):
                continue
            with open(path, "rb") as handle:
                found[path] = (os.stat(path).st_mtime_ns, handle.read())
    return found


def unit_contents() -> Dict[str, bytes]:
    return {path: content for path, (dummy, content) in units().items()}


def cold_build_done() -> None:
    """Tell tools/run_tests.sh that the cold site.yml is over: it holds the suite without the sandbox until then,
    because the cold build keeps both cores busy compiling and that suite beside it only slowed the build down."""
    _mark("PRIMA_TEST_COLD_BUILD_DONE", "%d" % time.time())


SITE_UNITS = {}  # type: Dict[str, bytes]
SITE_UNIT_MODES = {}  # type: Dict[str, int]


@pytest.fixture(scope="session")
def site_runs(sandbox):
    """site.yml run twice on the fresh sandbox: (cold, second), the second as the README types it (SITE_AS_TYPED,
    a TypedRun).

    The second run also finds the cluster lock held by a live ansible-playbook whose bound has passed (run id
    STALE_LOCK_RUN_ID, bound 600 s, 2 h old), which it breaks with a NOTICE: test_site checks that on this run, and
    that it changes nothing. second.hub_requests is what the sandbox hub served during it (test_models: a second
    run downloads nothing). Between the two, rank 0 is copied (snapshot_provisioned), for cluster b and the
    rental test.

    On cluster b: one site.yml on the copies, as (run, run); no test there reads it."""
    if CLUSTER != "a":
        # Copies of provisioned nodes: site.yml makes them this cluster's (addresses, transport, units).
        run = run_playbook("site.yml", label="site-%s" % CLUSTER)
        assert run.status == "successful", run.describe()
        # Each copy started with n0's cluster key pair: all but the first made their own (the peers tell the nodes
        # apart by key).
        keys = [cluster_public_key(name) for name in NODES]
        assert len(set(keys)) == len(NODES) and keys[0] == cluster_public_key(SNAPSHOT_NODE), keys
        SITE_UNITS.update(unit_contents())
        SITE_UNIT_MODES.update({path: os.stat(path).st_mode & 0o7777 for path in SITE_UNITS})
        return run, run
    # An earlier session's copy is not this one's: cluster b must not start from it.
    shutil.rmtree(SNAPSHOT, ignore_errors=True)
    copied = False
    try:
        try:
            cold = run_playbook("site.yml", label="site-cold")
        finally:
            cold_build_done()
        assert cold.status == "successful", cold.describe()
        # Before the second run: cluster b's copies start (and run site.yml, which downloads nothing either)
        # beside it.
        snapshot_provisioned()
        copied = True
    finally:
        snapshot_done(copied)
    mark = len(hub_records())
    with planted_lock(STALE_LOCK_RUN_ID, bound_s=600):
        age(LOCK, 7200)
        second = TypedRun(SITE_AS_TYPED, "site-second")
    second.hub_requests = hub_records()[mark:]
    SITE_UNITS.update(unit_contents())
    SITE_UNIT_MODES.update({path: os.stat(path).st_mode & 0o7777 for path in SITE_UNITS})
    return cold, second


def node(name: str):
    return testinfra.get_host("ansible://%s?ansible_inventory=%s" % (name, SANDBOX_INVENTORY))


def local_fact(host, name: str) -> Dict[str, Any]:
    return json.loads(host.file("/etc/ansible/facts.d/%s.fact" % name).content_string)


# Shared by the bench.yml tests (test_bench.py, test_bench_failures.py, test_sweep.py, test_locks.py).
STATE = NODE_ROOT + "/var/lib/prima-bench/%s"
RANK_BINARIES = re.compile(r"ggml-rpc-server|llama-completion|llama-cli|llama-server|serve_supervisor|prima-bench/")  # forwarders too
PRIMA = bool(os.environ.get("PRIMA_CPP_MIRROR"))


@pytest.fixture(scope="module")
def provisioned(site_runs):
    yield site_runs
    # Tests here render the units with other parameters (-e launch_*), as a user may; the
    # units keep the last parameters applied. Put back what site.yml renders, when one of those differs from it
    # (files site.yml does not render, a server's units say, stay as they are: launch.yml would not remove them).
    # The files are put back as site.yml wrote them (their bytes and mode), directly in the nodes' roots: launch.yml
    # would render the same bytes, in 20 s of Ansible per module; test_site's no-op site.yml checks that they are.
    now = unit_contents()
    for path, content in SITE_UNITS.items():
        if now.get(path) != content:
            mode = SITE_UNIT_MODES[path]
            with open(path, "wb") as handle:
                handle.write(content)
            os.chmod(path, mode)


def bench(reports, run_id, label, background=False, **extravars):
    args = dict(extravars={"model": "tiny", **extravars}, label=label,
                envvars={"PRIMA_BENCH_REPORTS_DIR": str(reports), "PRIMA_BENCH_RUN_ID": run_id})
    if background:
        return BackgroundRun("bench.yml", **args)
    return run_playbook("bench.yml", **args)


def assert_clean_failure(result, reports, results_before, *expected):
    """A failed bench.yml that said `expected`, left no rank and no lock, kept the raw logs, and left
    results.jsonl as it was (None: absent)."""
    assert result.status == "failed", result.describe()
    for text in expected:
        assert text in result.stdout, "%r not in the output\n%s" % (text, result.describe())
    assert rank_processes() == []
    assert not os.path.lexists(LOCK)
    results = reports / "results.jsonl"
    assert (results.read_text() if results.exists() else None) == results_before
    assert glob.glob(str(reports / "*" / "raw" / "*" / "*" / "*" / "*" / "stderr")), "raw logs were not kept"


def sandbox_net_namespaces() -> set:
    """The network namespaces of this cluster's nodes: /run/netns/psb-<node>."""
    return {os.stat(path).st_ino for path in ("/run/netns/psb-%s" % name for name in NODES) if os.path.exists(path)}


def rank_processes():
    """Every rank process on any node of this cluster: a process inside one of its nodes' network namespaces whose
    command line names a rank binary or a launcher. The unit suite (make test runs it beside this one) starts
    launchers and supervisors of its own on the host, and the other cluster its own ranks; those are not these
    nodes'."""
    namespaces = sandbox_net_namespaces()
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=False).stdout
    found = []
    for line in out.splitlines():
        if not RANK_BINARIES.search(line) or "ps -eo" in line:
            continue
        try:
            namespace = os.stat("/proc/%s/ns/net" % line.split()[0]).st_ino
        except OSError:
            continue  # gone since ps listed it
        if namespace in namespaces:
            found.append(line.strip())
    return found


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("timed out waiting for " + what)


def running_child(node, unit):
    """The pid of the binary the unit runs (the child of its timeout process), once it is up."""
    try:
        with open(os.path.join(STATE % (node, unit), "child.pid")) as handle:
            timeout_pid = handle.read().strip()
        with open("/proc/%s/task/%s/children" % (timeout_pid, timeout_pid)) as handle:
            children = handle.read().split()
    except (OSError, ValueError):
        return None
    return int(children[0]) if children else None


def head_generating(unit, since, node=N0):
    """Rank 0 of `unit` (on `node`) runs and has written to its stdout since `since` (a time.time()). The time
    matters: an earlier run's stdout (a warm-up's, another test's) stays until the next run truncates it."""
    try:
        out = os.stat(os.path.join(STATE % (node, unit), "stdout"))
    except OSError:
        return False
    return running_child(node, unit) is not None and out.st_size > 0 and out.st_mtime >= since


@contextlib.contextmanager
def abandoned_on_failure(run, run_id):
    """Around what a test does while its bench.yml runs in the background: if that fails, Ctrl-C the playbook, end
    the ranks it started and take its lock, so the tests after this one start from a clean cluster instead of
    failing on what this one left."""
    try:
        yield
    except BaseException:
        pid = ansible_playbook_of(run_id)
        if pid:
            try:
                os.killpg(os.getpgid(pid), signal.SIGINT)
            except ProcessLookupError:
                pass
        run.finish(timeout=120)
        # Each one's whole process group: a forwarder's ssh (its command line names no rank) is in its supervisor's
        # group, and killed alone the supervisor would leave it holding the rank ports for the tests after this one.
        deadline = time.monotonic() + 30
        while rank_processes() and time.monotonic() < deadline:
            for line in rank_processes():
                try:
                    os.killpg(os.getpgid(int(line.split()[0])), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            time.sleep(0.5)
        try:
            if json.loads(os.readlink(LOCK)).get("run_id") == run_id:
                os.remove(LOCK)
        except (OSError, ValueError):
            pass
        raise


def ansible_playbook_of(run_id):
    """The ansible-playbook process running PRIMA_BENCH_RUN_ID=run_id."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as handle:
                argv = handle.read().split(b"\0")
            with open("/proc/%s/environ" % pid, "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(b"ansible-playbook") for arg in argv[:2]) and \
                ("PRIMA_BENCH_RUN_ID=%s" % run_id).encode() in environ:
            return int(pid)
    return None


# The suite's bench of both modes: every runtime, two measured runs each (a median and a spread). benchmarks/bench_overhead.py makes its
# figures (five runs) with `make figures`; here the same script runs as the test of both modes' reports.
BOTH_MODES_RUNS = 2


@pytest.fixture(scope="session")
def both_modes_bench(site_runs, tmp_path_factory):
    """benchmarks/bench_overhead.py once on the provisioned sandbox (every runtime, BOTH_MODES_RUNS measured runs,
    mode=run then mode=server): its figures and both runs' reports and output, which the tests of each mode read
    (test_bench.py, test_bench_server.py, test_installed_bench.py) instead of running bench.yml again. Its figures
    go to a directory of the test's own (artifacts/bench-overhead.* are `make figures`'s, from five runs).
    results.jsonl starts with an earlier line, which both runs must leave as it is."""
    reports = tmp_path_factory.mktemp("both-modes") / "reports"
    reports.mkdir()
    out = reports.parent / "figures"
    (reports / "results.jsonl").write_text('{"earlier": "line"}\n')
    done = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_overhead.py"), "--runtime", "all",
                           "--runs", str(BOTH_MODES_RUNS), "--reports", str(reports), "--out", str(out),
                           "--inventory", os.path.relpath(SANDBOX_INVENTORY, REPO)],
                          cwd=REPO, capture_output=True, text=True, timeout=3600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(str(out / "bench-overhead.json")) as handle:
        result = json.load(handle)
    run_ids = {row["mode"]: row["run_id"] for row in result["figures"]}
    logs = {mode: (reports / ("%s.log" % run_id)).read_text() for mode, run_id in run_ids.items()}
    return {"result": result, "reports": reports, "stdout": done.stdout, "run_ids": run_ids, "logs": logs}
