"""The launcher's rank is `timeout` and its process group: when `timeout` itself is killed, the rank it ran must not
live on as an orphan holding its ports (roles/launch/templates/rank.sh.j2, run in bash)."""

import os
import signal
import time

from test_launch import launcher, sh


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_timeout_takes_its_rank_with_it(tmp_path):
    script, state = launcher(tmp_path, ["sh", "-c", "sleep 300 & echo $! >rank.pid; wait"])
    assert sh(script, "start").returncode == 0
    deadline = time.time() + 10
    while not (state / "rank.pid").exists() or not (state / "rank.pid").read_text().strip():
        assert time.time() < deadline, "the rank did not start"
        time.sleep(0.05)
    rank = int((state / "rank.pid").read_text())
    timeout = int((state / "child.pid").read_text())
    os.kill(timeout, signal.SIGKILL)
    deadline = time.time() + 10
    while alive(rank) and time.time() < deadline:
        time.sleep(0.05)
    assert not alive(rank), "pid %d (sleep 300) outlived its timeout" % rank
    # The launcher writes the exit file once it has killed what was left of the group: just after the rank died.
    while not (state / "exit").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert (state / "exit").read_text() == "137\n"
    assert '"running": false' in sh(script, "status").stdout
