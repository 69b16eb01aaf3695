"""The cluster lock: the holder's record, the judgement of a lock found (gone, stale, refused, break_lock), the
bench's bound, and the role's lock script itself, run here on a temporary directory (atomic take, compare-and-
replace of a broken lock, release of one's own record only)."""

import concurrent.futures
import json
import os
import subprocess

import pytest
import yaml

from ansible_collections.prima.cluster.plugins.filter import cluster_lock as lock_filters
from ansible_collections.prima.cluster.plugins.plugin_utils.cluster.lock import (
    Answer, bench_bound_s, format_record, judge, parse_answer, parse_record, process_state, stat_start)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOST, PATH = "n0", "/var/lib/prima-bench/bench.lock"
# Where a process runs: machine identity, boot, pid namespace.
SPACE = {"machine": "0123456789abcdef0123456789abcdef", "boot": "b0075e1d-0000-4000-8000-000000000001",
         "pid_ns": "pid:[4026531836]"}
MINE = format_record("site-2", "site.yml", "ctl", 200, "2026-01-01T10:00:00Z", 172800, pid_start=900, **SPACE)
OTHER = format_record("first-1", "bench.yml", "ctl", 100, "2026-01-01T09:00:00Z", 3600, pid_start=800, **SPACE)
ELSEWHERE = format_record("first-1", "bench.yml", "laptop", 100, "2026-01-01T09:00:00Z", 3600, pid_start=800,
                          machine="fedcba9876543210fedcba9876543210", boot=SPACE["boot"], pid_ns=SPACE["pid_ns"])


def held(record, age_s=10):
    return Answer(outcome="held", age_s=age_s, held=record)


def test_the_record_is_one_line_of_json_naming_the_holder():
    assert "\n" not in MINE
    assert json.loads(MINE) == dict({"run_id": "site-2", "playbook": "site.yml", "controller": "ctl", "pid": 200,
                                     "started": "2026-01-01T10:00:00Z", "bound_s": 172800, "pid_start": 900}, **SPACE)
    assert parse_record(MINE) == json.loads(MINE)
    # What is not known of the process is left out, so such a record reads as one from an unknown place.
    assert "machine" not in format_record("r", "site.yml", "ctl", 1, "t", 5, machine="", pid_start=None)


def test_a_lock_of_an_earlier_version_is_its_run_id_alone():
    assert parse_record("20260101T000000Z-abcd") == {"run_id": "20260101T000000Z-abcd"}
    assert parse_record("") == {"run_id": "unknown"}
    assert parse_record('{"run_id": "x", "pid": "nope"}') == {"run_id": "x"}


def test_the_script_answer_is_outcome_age_and_record():
    assert parse_answer("held\n12\n%s\n" % OTHER) == Answer("held", 12, OTHER)
    assert parse_answer("free\n-\n\n") == Answer("free", None, "")
    assert parse_answer("taken\n-\n\n") == Answer("taken", None, "")
    with pytest.raises(ValueError, match="not its outcome"):
        parse_answer("")
    with pytest.raises(ValueError, match="not a number"):
        parse_answer("held\nsoon\nx\n")


@pytest.mark.parametrize("stat, cmdline, state", [
    (None, None, "gone"),  # no such pid
    ("4242 (python3) S 1 4242", "/usr/bin/python3\0/usr/bin/ansible-playbook\0site.yml\0", "running"),
    ("4242 (python3) Z 1 4242", "", "gone"),  # killed, not reaped yet
    ("4242 (sleep) S 1 4242", "sleep\0600\0", "gone"),  # the pid was reused by another program
    ("4242 (a) b) R 1 4242", None, "running"),  # a name with a parenthesis; cmdline unreadable
    ("4242 (sleep) R 1 4242", "", "running"),  # mid-exec: no command line yet, so not provably gone
])
def test_the_holder_process_state(stat, cmdline, state):
    assert process_state(stat, cmdline) == state


def test_a_free_lock_or_ones_own_is_taken():
    assert judge(Answer("taken", None, ""), MINE, None, 100, False, HOST, PATH)["action"] == "taken"
    assert judge(Answer("free", None, ""), MINE, None, 100, False, HOST, PATH)["action"] == "taken"
    assert judge(held(MINE), MINE, "running", 100, False, HOST, PATH)["action"] == "taken"


def test_a_running_holder_is_refused_naming_run_controller_pid_start_and_the_fix():
    verdict = judge(held(OTHER, 10), MINE, "running", 172800, False, HOST, PATH)
    assert verdict["action"] == "refuse"
    message = verdict["message"]
    assert message.startswith("another bench.yml is running on this cluster: n0 holds %s for run first-1 (" % PATH)
    for text in ("controller ctl", "pid 100", "started 2026-01-01T09:00:00Z", "10 s ago", "bound 3600 s",
                 "still running here", "-e break_lock=true", "ssh into n0 and rm %s" % PATH):
        assert text in message, (text, message)


def test_a_holder_gone_from_this_controller_is_broken_with_a_notice():
    verdict = judge(held(OTHER), MINE, "gone", 172800, False, HOST, PATH)
    assert verdict["action"] == "break"
    assert verdict["message"] == (
        "n0: broke the cluster lock %s held by run first-1 (bench.yml, controller ctl, pid 100, started "
        "2026-01-01T09:00:00Z, 10 s ago, bound 3600 s): its ansible-playbook (pid 100 on ctl) is not running any more"
        % PATH)


def test_another_controllers_holder_is_only_judged_by_its_age():
    # Its pid means nothing here, whatever runs under that number on this controller.
    assert judge(held(ELSEWHERE, 3600), MINE, None, 172800, False, HOST, PATH)["action"] == "refuse"
    assert "another controller" in judge(held(ELSEWHERE), MINE, None, 172800, False, HOST, PATH)["message"]
    old = judge(held(ELSEWHERE, 3601), MINE, None, 172800, False, HOST, PATH)
    assert old["action"] == "break" and "3601 s old, older than the 3600 s bound of its run" in old["reason"]


def test_a_lock_without_a_holder_is_aged_by_the_default_bound():
    assert judge(held("run-7", 99), MINE, None, 100, False, HOST, PATH)["action"] == "refuse"
    assert "no holder is recorded" in judge(held("run-7", 99), MINE, None, 100, False, HOST, PATH)["message"]
    assert judge(held("run-7", 101), MINE, None, 100, False, HOST, PATH)["action"] == "break"


def test_break_lock_breaks_any_lock():
    verdict = judge(held(OTHER, 1), MINE, "running", 172800, True, HOST, PATH)
    assert verdict["action"] == "break" and verdict["reason"] == "break_lock=true"


def test_the_bench_bound_is_every_attempt_to_its_timeouts():
    # 1 step, 1 unit, 1 warm-up + 3 runs, each tried 3 times: 12 attempts of 600 + 1800 + 2 * 10 + 60 s.
    assert bench_bound_s(1, 1, 1, 3, 2, 600, 1800, 10) == 1800 + 12 * 2480
    assert bench_bound_s(0, 0, 0, 1, 0, 10, 20, 1, overhead_s=0, run_overhead_s=0) == 32
    assert lock_filters.bench_bound({"steps": "2", "plans": 3, "warmup_runs": 1, "runs": 1, "retries": 0,
                                     "listen_timeout_s": 1, "run_timeout_s": 1, "stop_grace_s": 0}) == 1800 + 12 * 62


def test_the_filter_records_this_controller_and_the_ansible_playbook_process():
    record = json.loads(lock_filters.record("", "site.yml", "3600"))
    assert record["pid"] == os.getpid() and record["controller"] and record["bound_s"] == 3600
    assert record["run_id"].endswith("Z-" + record["run_id"][-4:]) and record["started"].endswith("Z")
    assert json.loads(lock_filters.record("bench-1", "bench.yml", 5))["run_id"] == "bench-1"
    # Where and since when the process runs: what tells it from a namesake controller and from a reused pid.
    with open("/proc/sys/kernel/random/boot_id") as handle:
        assert record["boot"] == handle.read().strip()
    assert record["machine"] and record["pid_ns"] == os.readlink("/proc/self/ns/pid")
    with open("/proc/self/stat") as handle:
        assert record["pid_start"] == int(handle.read().rsplit(")", 1)[1].split()[19])


def test_the_start_is_field_22_of_proc_stat():
    assert stat_start("4242 (a) b) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 123456 999 1") == 123456
    assert stat_start(None) is None and stat_start("4242 (x) S 1") is None


@pytest.mark.parametrize("stat, start, state", [
    ("4242 (python3) S 1 4242 4242 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 800 1 1", 800, "running"),
    ("4242 (python3) S 1 4242 4242 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 801 1 1", 800, "gone"),  # the pid was reused
    ("4242 (python3) Z 1 4242 4242 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 800 1 1", 800, "gone"),
    (None, 800, "gone"),
])
def test_with_its_start_known_the_holder_is_its_pid_and_its_start(stat, start, state):
    # The command line no longer decides: the holder is whatever runs with its pid since its start.
    assert process_state(stat, "sleep\0600\0", start) == state


def test_a_holder_of_the_same_host_name_on_another_machine_is_never_gone():
    """Two controllers named alike: the other's pid means nothing here, whatever runs under it on this machine."""
    other_machine = {**SPACE, "machine": "fedcba9876543210fedcba9876543210"}
    container = {**SPACE, "pid_ns": "pid:[4026532000]"}
    rebooted = {**SPACE, "boot": "b0075e1d-0000-4000-8000-000000000002"}  # a clone, or rebooted
    namesake = format_record("first-1", "bench.yml", "ctl", 4242, "2026-01-01T09:00:00Z", 3600, pid_start=800,
                             **other_machine)
    for other in (namesake, format_record("first-1", "bench.yml", "ctl", 4242, "t", 3600, pid_start=800, **container),
                  format_record("first-1", "bench.yml", "ctl", 4242, "t", 3600, pid_start=800, **rebooted)):
        verdict = judge(held(other, 10), MINE, "gone", 172800, False, HOST, PATH)
        assert verdict["action"] == "refuse", verdict
        assert "same host name ctl" in verdict["message"] and "not running any more" not in verdict["message"]
    assert judge(held(namesake, 3601), MINE, "gone", 172800, False, HOST, PATH)["action"] == "break"  # by age


def test_a_record_of_the_earlier_format_is_never_gone_by_its_host_name():
    """controller and pid but no machine, boot or pid namespace: refused, or broken by age, as before."""
    earlier = json.dumps({"run_id": "first-1", "playbook": "bench.yml", "controller": "ctl", "pid": 4242,
                          "started": "2026-01-01T09:00:00Z", "bound_s": 3600})
    verdict = judge(held(earlier, 10), MINE, "gone", 172800, False, HOST, PATH)
    assert verdict["action"] == "refuse" and "a lock of an earlier version" in verdict["message"], verdict
    assert judge(held(earlier, 3601), MINE, "gone", 172800, False, HOST, PATH)["action"] == "break"
    assert judge(held(earlier, 1), MINE, None, 172800, True, HOST, PATH)["action"] == "break"


def test_the_filter_probes_the_holders_process_when_it_ran_in_this_process_space():
    here = lock_filters.socket.gethostname()
    mine = format_record("site-2", "site.yml", here, os.getpid(), "2026-01-01T10:00:00Z", 172800,
                         **lock_filters.process_identity(os.getpid()))
    dead = subprocess.Popen(["true"])
    dead_identity = lock_filters.process_identity(dead.pid)
    dead.wait()
    alive = subprocess.Popen(["ansible-playbook", "30"], executable="sleep")
    try:
        def action(pid, identity, **changed):
            fields = dict(identity, **changed)
            holder = format_record("old-1", "site.yml", here, pid, "2026-01-01T09:00:00Z", 172800, **fields)
            return lock_filters.verdict("held\n5\n%s\n" % holder, mine, 100, False, HOST, PATH)["action"]

        alive_identity = lock_filters.process_identity(alive.pid)
        assert alive_identity["pid_start"] is not None and dead_identity["pid_start"] is not None
        assert action(dead.pid, dead_identity) == "break"
        assert action(alive.pid, alive_identity) == "refuse"
        # Its pid, another process: reused.
        assert action(alive.pid, alive_identity, pid_start=alive_identity["pid_start"] + 1) == "break"
        # A dead pid, but recorded by a namesake controller (another machine): never judged here.
        assert action(dead.pid, dead_identity, machine="another-machine") == "refuse"
        # A record of the earlier format, this host name and a dead pid: not gone on the host name alone.
        earlier = json.dumps({"run_id": "old-1", "playbook": "site.yml", "controller": here, "pid": dead.pid,
                              "started": "2026-01-01T09:00:00Z", "bound_s": 172800})
        assert lock_filters.verdict("held\n5\n%s\n" % earlier, mine, 100, False, HOST, PATH)["action"] == "refuse"
    finally:
        alive.kill()
        alive.wait()


# The role's script, run as the role runs it (sh -c SCRIPT cluster_lock OP LOCK RECORD REPLACE WAIT).
with open(os.path.join(REPO, "roles", "cluster_lock", "vars", "main.yml")) as _handle:
    SCRIPT = yaml.safe_load(_handle)["cluster_lock_script"]


def script(op, lock, record, replace="", wait_s=10):
    done = subprocess.run(["sh", "-c", SCRIPT, "cluster_lock", op, str(lock), record, replace, str(wait_s)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return parse_answer(done.stdout)


def test_the_script_takes_a_free_lock_and_refuses_a_held_one(tmp_path):
    lock = tmp_path / "state" / "bench.lock"
    assert script("read", lock, MINE) == Answer("free", None, "")
    assert not (tmp_path / "state").exists(), "reading made the state directory"
    assert script("take", lock, OTHER).outcome == "taken"
    assert os.readlink(lock) == OTHER
    found = script("take", lock, MINE)
    assert found.outcome == "held" and found.held == OTHER and found.age_s is not None and found.age_s <= 5
    assert script("read", lock, MINE).outcome == "held" and os.readlink(lock) == OTHER


def test_the_script_replaces_exactly_the_record_judged_breakable(tmp_path):
    lock = tmp_path / "bench.lock"
    script("take", lock, OTHER)
    assert script("take", lock, MINE, replace=ELSEWHERE).outcome == "held"
    assert os.readlink(lock) == OTHER
    taken = script("take", lock, MINE, replace=OTHER)
    assert taken.outcome == "taken" and taken.held == OTHER and os.readlink(lock) == MINE


def test_the_script_releases_its_own_record_only(tmp_path):
    lock = tmp_path / "bench.lock"
    script("take", lock, OTHER)
    assert script("release", lock, MINE).outcome == "kept" and os.readlink(lock) == OTHER
    assert script("release", lock, OTHER).outcome == "released" and not os.path.lexists(lock)
    assert script("release", lock, OTHER).outcome == "absent"


def test_the_script_sees_a_lock_of_an_earlier_version(tmp_path):
    lock = tmp_path / "bench.lock"
    os.symlink("20260101T000000Z-abcd", lock)
    found = script("take", lock, MINE)
    assert found.outcome == "held" and parse_record(found.held) == {"run_id": "20260101T000000Z-abcd"}


@pytest.mark.parametrize("replace", ["", OTHER])
def test_of_many_takes_at_once_exactly_one_wins(tmp_path, replace):
    """Sixteen runs started together, on a free lock or all breaking the same gone holder."""
    lock = tmp_path / "bench.lock"
    if replace:
        os.symlink(replace, lock)
    records = [format_record("run-%d" % index, "bench.yml", "ctl", 1000 + index, "t", 60) for index in range(16)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda record: script("take", lock, record, replace=replace), records))
    winners = [record for record, answer in zip(records, answers) if answer.outcome == "taken"]
    assert len(winners) == 1, answers
    assert os.readlink(lock) == winners[0]
