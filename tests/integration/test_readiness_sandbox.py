"""The readiness suite on the provisioned sandbox: it passes, then fails naming the node and the
check for each thing broken (three at once where none hides another, a stopped sshd alone), and passes again once everything is repaired (one run after the
last repair, test_passes_again_once_everything_is_repaired: each test repairs what it broke)."""

import os
import shutil
import socket
import subprocess
import sys
import time
from xml.etree import ElementTree

import pytest

from conftest import ACCESS_ADDRESS, ARTIFACTS, N0, N1, N2, NODE_ROOT, REPO, SANDBOX_INVENTORY, SSH_PORTS


def readiness(label):
    """Run tests/readiness on the sandbox; {(check, node): 'pass' | 'fail' | 'skip'} from its JUnit XML."""
    xml = os.path.join(ARTIFACTS, "readiness-%s.xml" % label)
    argv = [sys.executable, "-m", "pytest", os.path.join(REPO, "tests", "readiness"), "--hosts=ansible://all",
            "--ansible-inventory=%s" % SANDBOX_INVENTORY, "--junitxml=%s" % xml, "-p", "no:cacheprovider", "-q"]
    if os.environ.get("PRIMA_CPP_VERSION"):
        argv.append("--readiness-var=prima_version=%s" % os.environ["PRIMA_CPP_VERSION"])
    run = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=900,
                         env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg")), check=False)
    with open(os.path.join(ARTIFACTS, "readiness-%s.log" % label), "w") as handle:
        handle.write(run.stdout + run.stderr)
    outcomes = {}
    for case in ElementTree.parse(xml).iter("testcase"):
        name = case.get("name")
        check = name.split("[")[0].replace("test_", "", 1)
        node = name.split("ansible://")[1].rstrip("]") if "ansible://" in name else "cluster"
        failed = case.find("failure") is not None or case.find("error") is not None
        outcomes[(check, node)] = "fail" if failed else ("skip" if case.find("skipped") is not None else "pass")
    return run, outcomes


def failures(outcomes):
    return sorted(key for key, outcome in outcomes.items() if outcome == "fail")


@pytest.fixture(scope="module")
def ready(site_runs):
    run, outcomes = readiness("baseline")
    assert failures(outcomes) == [], run.stdout[-4000:]
    assert outcomes[("weights", N1)] == "pass" and outcomes[("ranks_reach_each_other", "cluster")] == "pass"
    assert "readiness at a glance" in run.stdout
    return outcomes


REPAIRED = []


def broken_then_repaired(label, breakages, expected):
    """Break what each (break_it, repair) pair breaks, run the suite, repair all (also when an assertion failed);
    the run's outcomes, after checking that it failed, named each key of `expected` and printed its summary."""
    repairs = []
    try:
        for break_it, repair in breakages:
            break_it()
            repairs.append(repair)
        run, outcomes = readiness(label)
        assert run.returncode != 0
        for key in expected:
            assert outcomes.get(key) == "fail", "%s did not fail:\n%s" % (key, run.stdout[-4000:])
        assert "readiness at a glance" in run.stdout
        return outcomes
    finally:
        for repair in reversed(repairs):
            repair()
        REPAIRED.append(label)


def missing_weights():
    weights = os.path.join(NODE_ROOT % N1, "opt/models/tiny.gguf")
    return lambda: os.rename(weights, weights + ".away"), lambda: os.rename(weights + ".away", weights)


def changed_binary():
    current = os.path.join(NODE_ROOT % N2, "opt/llama.cpp/current")
    target = os.readlink(current)
    build = (os.path.join(NODE_ROOT % N2, target.lstrip("/")) if os.path.isabs(target)
             else os.path.join(os.path.dirname(current), target))
    binary = os.path.join(build, "bin", "llama-cli")
    saved = binary + ".saved"

    def flip():
        shutil.copy2(binary, saved)
        with open(binary, "r+b") as handle:
            handle.seek(1000)
            byte = handle.read(1)
            handle.seek(1000)
            handle.write(bytes([byte[0] ^ 0xFF]))

    return flip, lambda: os.replace(saved, binary)


def occupied_rank_port():
    holders = []

    def occupy():
        holders.append(subprocess.Popen(["ip", "netns", "exec", "psb-" + N1, sys.executable, "-c",
                                         "import socket, time\ns = socket.socket()\n"
                                         "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                                         "s.bind(('0.0.0.0', 50052))\ns.listen(1)\ntime.sleep(3600)"]))
        time.sleep(1)

    def release():
        for holder in holders:
            holder.kill()
            holder.wait()

    return occupy, release


# Three breakages that do not hide one another (a node's weights, another node's binary, a port), broken together
# and judged in one run: each is named on its own node and check. A stopped sshd hides every check of its node, so
# it gets a run of its own.
TOGETHER = {"weights": ("weights", N1), "binary": ("llama_cpp_build", N2), "port": ("rank_ports_free", N1)}


@pytest.fixture(scope="module")
def broken_together(ready):
    return broken_then_repaired("weights-binary-port", [missing_weights(), changed_binary(), occupied_rank_port()],
                                list(TOGETHER.values()) + [("ranks_reach_each_other", "cluster")])


def test_missing_weights(broken_together):
    assert broken_together[TOGETHER["weights"]] == "fail"
    # n1's other checks stand: a missing file is named alone.
    assert broken_together[("compiler", N1)] == "pass"


def test_changed_binary(broken_together):
    assert broken_together[TOGETHER["binary"]] == "fail"
    assert broken_together[("llama_cpp_build", N0)] == "pass"


def test_occupied_rank_port(broken_together):
    assert broken_together[TOGETHER["port"]] == "fail"
    assert broken_together[("ranks_reach_each_other", "cluster")] == "fail"
    assert broken_together[("rank_ports_free", N0)] == "pass"


def sshd_pids(node):
    """sshd of the node and its sessions (SSH connection sharing would keep a dead sshd's sessions usable)."""
    pids = subprocess.run(["ip", "netns", "pids", "psb-%s" % node], capture_output=True, text=True, check=False).stdout.split()
    found = []
    for pid in pids:
        try:
            with open("/proc/%s/comm" % pid) as handle:
                if handle.read().strip() == "sshd":
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_stopped_sshd(ready):
    def stop():
        for pid in sshd_pids(N1):
            os.kill(pid, 15)
        time.sleep(1)

    def start():
        subprocess.run(["ip", "netns", "exec", "psb-" + N1, "chroot", NODE_ROOT % N1, "/usr/sbin/sshd"], check=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((ACCESS_ADDRESS, SSH_PORTS[N1]), timeout=1):
                    return
            except OSError:
                time.sleep(0.3)

    broken_then_repaired("stopped-sshd", [(stop, start)], [("compiler", N1), ("weights", N1),
                                                          ("ranks_reach_each_other", "cluster")])


def test_passes_again_once_everything_is_repaired(ready):
    """After the tests above, each of which repaired what it broke: one run for all the repairs."""
    run, outcomes = readiness("repaired")
    assert failures(outcomes) == [], "after repairing %s:\n%s" % (", ".join(REPAIRED), run.stdout[-4000:])
