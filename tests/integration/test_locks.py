"""The cluster lock on the sandbox: bench.yml and site.yml take it before any node changes, a lock whose holder
is gone (killed here, or older than its bound) is broken with a NOTICE, and -e break_lock=true breaks any.

A live holder is planted by hand (conftest.planted_lock): a record naming this controller and a process here whose
command line names ansible-playbook (a sleep under that name), so that no test holds the cluster for longer than its
own run. Runs on either cluster of the sandbox (make test: the second). site.yml refused by a live lock, and its
second run breaking one older than its bound: test_site.py."""

import json
import os
import signal
import socket

import pytest

from conftest import LOCK, LOCK_ON_NODE, N0, bench, planted_lock, rank_processes, units, wait_for


def test_bench_is_refused_before_it_rewrites_the_units_and_break_lock_breaks_any(provisioned, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    before = units()
    assert before, "no launcher scripts on the nodes"
    with planted_lock("running-1") as record:
        # Other parameters than the holder's: they would render other units.
        refused = bench(reports, "refused-1", "lock-bench-refused", runtime="single", runs=1, launch_ctx_size=640)
        assert refused.status == "failed", refused.describe()
        assert units() == before, "the refused bench.yml rewrote the running bench's units"
        assert "Render this host's launcher scripts" not in refused.stdout
        assert "another bench.yml is running on this cluster: %s holds %s for run running-1 (" % (N0, LOCK_ON_NODE) \
            in " ".join(refused.stdout.split()), refused.describe()
        for text in ("controller %s" % socket.gethostname(), "still running here", "-e break_lock=true"):
            assert text in " ".join(refused.stdout.split()), text
        assert os.readlink(LOCK) == record

        broken = bench(reports, "break-1", "lock-bench-break-lock", runtime="single", runs=1, break_lock=True)
        assert broken.status == "successful", broken.describe()
        text = " ".join(broken.stdout.split())
        assert "NOTICE: %s: broke the cluster lock %s held by run running-1 (bench.yml, controller %s, pid" \
            % (N0, LOCK_ON_NODE, socket.gethostname()) in text, broken.describe()
        assert "): break_lock=true" in text
        assert not os.path.lexists(LOCK)
    assert rank_processes() == []


def test_a_killed_bench_leaves_its_lock_the_next_run_breaks_it_and_refuses_a_second(provisioned, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    killed = bench(reports, "killed-1", "lock-bench-killed", background=True, runtime="single", runs=1)
    try:
        wait_for(lambda: os.path.lexists(LOCK), 120, "bench.yml to take the lock")
        holder = json.loads(os.readlink(LOCK))
        assert holder["run_id"] == "killed-1" and holder["playbook"] == "bench.yml", holder
        assert holder["controller"] == socket.gethostname() and holder["bound_s"] > 0, holder
        with open("/proc/%d/cmdline" % holder["pid"], "rb") as handle:
            assert b"ansible-playbook" in handle.read(), "the lock does not name the ansible-playbook process"
        os.kill(holder["pid"], signal.SIGKILL)
    finally:
        result = killed.finish()
    assert result.status != "successful", result.describe()
    assert os.path.lexists(LOCK), "the killed run's lock is gone: nothing left to break"

    # The next bench.yml breaks the killed run's lock and holds the cluster in its turn (3 runs, long enough):
    # a second bench.yml started meanwhile is refused, and the first goes on to the end.
    first_reports = tmp_path / "first"
    first_reports.mkdir()
    after = bench(first_reports, "after-kill-1", "lock-bench-after-kill", background=True, runtime="single", runs=3)
    try:
        wait_for(lambda: os.path.lexists(LOCK) and json.loads(os.readlink(LOCK))["run_id"] == "after-kill-1", 120,
                 "the next bench.yml to break the lock and take it")
        second = bench(reports, "second-1", "bench-second", runtime="single", runs=1)
    finally:
        after_result = after.finish()
    assert second.status == "failed", second.describe()
    assert "another bench.yml is running on this cluster: %s holds" % N0 in second.stdout
    assert "for run after-kill-1" in second.stdout

    assert after_result.status == "successful", after_result.describe()
    text = " ".join(after_result.stdout.split())
    assert ("NOTICE: %s: broke the cluster lock %s held by run killed-1 (bench.yml, controller %s, pid %d, started %s"
            % (N0, LOCK_ON_NODE, socket.gethostname(), holder["pid"], holder["started"])) in text, after_result.describe()
    assert "its ansible-playbook (pid %d on %s) is not running any more" % (holder["pid"], socket.gethostname()) in text
    assert len((first_reports / "results.jsonl").read_text().splitlines()) == 3
    assert not os.path.lexists(LOCK)
    assert rank_processes() == []


@pytest.fixture(autouse=True)
def no_lock_left():
    """Each test ends with the cluster free; one that does not is named, and the lock removed for the next."""
    yield
    if os.path.lexists(LOCK):
        left = os.readlink(LOCK)
        os.unlink(LOCK)
        pytest.fail("a lock was left on %s: %s" % (N0, left))
