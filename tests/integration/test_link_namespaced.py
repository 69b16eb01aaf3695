"""tc in network namespaces of the test's own (each named for this test process, removed afterwards):
this kernel's tbf and netem, and the link guard, which takes bench.yml's shaping off once no rank runs
and nothing changed for its quiet time, and not before."""

import itertools
import os
import shlex
import shutil
import signal
import subprocess
import time

import jinja2
import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.launch.node_shell import ranks_at_work_function
from ansible_collections.prima.cluster.plugins.plugin_utils.link.shaping import shaping_commands, tc_notice

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERIAL = itertools.count()

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("tc"), reason="needs root and tc (iproute2)")


@pytest.fixture()
def namespace():
    """A network namespace named for this test process, with lo up; removed afterwards."""
    name = "psbt-%d-%d" % (os.getpid(), next(SERIAL))
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def test_this_kernel_shapes_with_tbf_and_says_whether_it_has_netem(namespace):
    """tbf shapes; netem either works or is reported as missing, never silently ignored."""
    def tc(argv):
        return subprocess.run(["ip", "netns", "exec", namespace] + argv, capture_output=True, text=True, check=False)

    shaped = tc(shaping_commands("lo", 10 ** 9)[0])
    assert shaped.returncode == 0, shaped.stderr
    assert "tbf" in tc(["tc", "qdisc", "show", "dev", "lo"]).stdout
    netem = tc(shaping_commands("lo", 10 ** 9, delay_ms=1, netem=True)[0])
    assert netem.returncode == 0 or "no netem qdisc" in tc_notice(netem.stderr)
    assert tc(["tc", "qdisc", "del", "dev", "lo", "root"]).returncode == 0
    assert "tbf" not in tc(["tc", "qdisc", "show", "dev", "lo"]).stdout


@pytest.fixture()
def node(tmp_path, namespace):
    """A namespace whose lo is shaped as bench.yml shapes a step, the guard rendered for it."""
    state, launch = tmp_path / "state", tmp_path / "launch"
    state.mkdir()
    launch.mkdir()
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(ROOT, "roles", "link", "templates")),
                             undefined=jinja2.StrictUndefined)
    env.filters["quote"] = shlex.quote
    env.filters["prima.cluster.launch_ranks_at_work_function"] = ranks_at_work_function
    guard = tmp_path / "guard"
    guard.write_text(env.get_template("guard.sh.j2").render(
        link_guard_script=str(guard), link_marker=str(state / "link.shaped"), cluster_state_dir=str(state),
        cluster_launch_dir=str(launch), link_guard_quiet_s=300, ansible_managed="test"))
    guard.chmod(0o755)

    def run(*argv):
        return subprocess.run(["ip", "netns", "exec", namespace] + [str(arg) for arg in argv], capture_output=True,
                              text=True, timeout=30, check=False)

    assert run(*shaping_commands("lo", 10 ** 8)[0]).returncode == 0
    (state / "link.shaped").write_text("lo\n")
    try:
        yield {"run": run, "guard": guard, "state": state, "launch": launch}
    finally:
        stop_guard(state / "link-guard.pid")


def stop_guard(pidfile):
    """The guard's watcher runs in its own session (setsid): end that process group, by the pid it wrote."""
    try:
        pid = int(pidfile.read_text().strip())
        os.killpg(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


def shaped(node):
    return "tbf" in node["run"]("tc", "qdisc", "show", "dev", "lo").stdout


def wait_until(predicate, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.25)
    return False


def test_remove_takes_the_shaping_off_once(node):
    first = node["run"](node["guard"], "remove")
    assert first.returncode == 0 and "removed the shaping of lo" in first.stdout
    assert not shaped(node) and not (node["state"] / "link.shaped").exists()
    again = node["run"](node["guard"], "remove")
    assert again.returncode == 0 and again.stdout == ""


def test_the_guard_waits_for_a_running_rank_then_removes(node):
    # A process with a launcher script in its argv, as a rank's launcher has.
    rank = subprocess.Popen(["bash", "-c", "sleep 30; true", str(node["launch"] / "tiny.sh")])
    try:
        started = node["run"](node["guard"], "start", 2)
        assert started.returncode == 0 and "started" in started.stdout
        assert "already watching" in node["run"](node["guard"], "start", 2).stdout
        time.sleep(5)  # quiet time over, but a rank runs: still shaped
        assert shaped(node)
    finally:
        rank.kill()
        rank.wait()
    assert wait_until(lambda: not shaped(node), 15), "the guard left the shaping after the rank ended"
    assert "bench.yml is gone" in (node["state"] / "link-guard.log").read_text()
    assert wait_until(lambda: not (node["state"] / "link-guard.pid").exists(), 5)


def test_the_guard_waits_while_the_benchmark_writes(node):
    node["run"](node["guard"], "start", 3)
    for dummy in range(6):  # 6 s of a benchmark's activity under the state directory
        (node["state"] / "activity").write_text(str(time.time()))
        time.sleep(1)
    assert shaped(node)
    assert wait_until(lambda: not shaped(node), 15)
