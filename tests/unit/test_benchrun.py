"""Judging a run from its ranks, and the figures a run record carries."""

import os

import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.run import (exit_meaning, log_was_cut, rank_problems,
                                                                              run_record, tail)

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")


def fixture(*parts):
    with open(os.path.join(FIXTURES, *parts), encoding="utf-8") as handle:
        return handle.read()


def rank(number, role, exit=None, stderr="", **extra):
    values = {"rank": number, "host": "n%d" % number, "role": role, "exit": exit, "stderr": stderr,
              "listen_error": "", "left_running": False}
    values.update(extra)
    return values


@pytest.mark.parametrize("status, meaning", [
    (None, "still running"), (0, "ok"), (124, "hang: killed by its timeout"),
    (134, "abort (SIGABRT): an assert, or a lost RPC peer"),
    (139, "segfault (SIGSEGV)"), (141, "broken pipe (SIGPIPE): its peer went away"), (137, "killed (SIGKILL), by kill -9 or the OOM killer"),
    (130, "killed by SIGINT"), (2, "error"),
])
def test_exit_meaning(status, meaning):
    assert exit_meaning(status) == meaning


def test_tail_keeps_the_last_non_blank_lines():
    assert tail("a\r\nb\n\nc\n", 2) == "b\nc"
    assert tail("a\n", 0) == ""


def test_a_clean_rpc_run_has_no_problem():
    ranks = [rank(0, "head", 0), rank(1, "worker", None), rank(2, "worker", None)]
    assert rank_problems("llama_rpc", ranks) == []


def test_worker_that_never_listened_is_named_first():
    ranks = [rank(0, "head", None),
             rank(1, "worker", 0, "error: unknown argument: --bogus", listen_error="exited with status 0 before listening")]
    problems = rank_problems("llama_rpc", ranks)
    assert len(problems) == 1
    assert problems[0].startswith("rank 1 (n1, llama_rpc worker) did not start: exited with status 0 before listening")
    assert "error: unknown argument: --bogus" in problems[0]


def test_rpc_worker_killed_mid_run_then_head_abort():
    ranks = [rank(0, "head", 134, "GGML_ASSERT(...) failed\nAborted", ended=12.0),
             rank(1, "worker", 137, "accepted client", ended=11.5)]
    problems = rank_problems("llama_rpc", ranks)
    assert problems[0].startswith("rank 1 (n1, llama_rpc worker) exited 137 during the run: killed (SIGKILL)")
    assert problems[1].startswith("rank 0 (n0, llama_rpc head) exited 134: abort (SIGABRT)")
    assert "    Aborted" in problems[1]


def test_the_first_rank_to_end_comes_first():
    ranks = [rank(0, "head", 137, "", ended=100.0), rank(1, "worker", 141, "", ended=100.5),
             rank(2, "worker", None)]
    problems = rank_problems("llama_rpc", ranks)
    assert problems[0].startswith("rank 0 (n0, llama_rpc head) exited 137: killed (SIGKILL)")
    assert problems[1].startswith("rank 1 (n1, llama_rpc worker) exited 141 during the run: broken pipe")


def test_a_consequence_stamped_before_its_cause_still_comes_second():
    # Seen in CI: the killed worker's wrapper noted its end 0.1 s after the head it took down.
    ranks = [rank(0, "head", 134, "Remote RPC server crashed or returned malformed response", ended=11.4),
             rank(1, "worker", 137, "accepted client", ended=11.5)]
    problems = rank_problems("llama_rpc", ranks)
    assert problems[0].startswith("rank 1 (n1, llama_rpc worker) exited 137 during the run: killed (SIGKILL)")
    assert problems[1].startswith("rank 0 (n0, llama_rpc head) exited 134: abort (SIGABRT)")
    # Among consequences, and among causes, the clock decides.
    both = [rank(0, "head", 124, "", ended=50.0), rank(1, "worker", 141, "", ended=49.0)]
    assert rank_problems("llama_rpc", both)[0].startswith("rank 1 (n1, llama_rpc worker) exited 141")


def test_prima_workers_exit_0_after_the_head_and_removed_ranks_are_fine():
    removed = fixture("benchlog", "prima-b_world3-rank1.stderr")
    ranks = [rank(0, "head", 0), rank(1, "worker", 0, removed), rank(2, "worker", None)]
    assert rank_problems("prima", ranks) == []


def test_prima_head_hang_after_a_killed_worker():
    ranks = [rank(0, "head", 124, "", ended=70.0), rank(1, "worker", 137, "a\nb", ended=10.0), rank(2, "worker", None)]
    problems = rank_problems("prima", ranks, tail_lines=1)
    assert problems[0] == "rank 1 (n1, prima worker) exited 137 during the run: killed (SIGKILL), by kill -9 or the " \
                          "OOM killer\n" \
                          "  last lines of its stderr:\n    b"
    assert problems[1] == "rank 0 (n0, prima head) exited 124: hang: killed by its timeout\n  (its stderr is empty)"


def test_a_rank_that_survived_sigkill_is_reported():
    problems = rank_problems("single", [rank(0, "head", 0, left_running=True, pid=42)])
    assert problems == ["rank 0 (n0, single head) is still running after SIGKILL (pid 42): stop it by hand"]


def test_run_record_reads_the_head_and_every_prima_rank():
    plan = {"runtime": "prima", "model": "tiny", "name": "prima-tiny", "world": 3, "hosts": ["n0", "n1", "n2"],
            "split": "-lw 3,3,2", "window": [3, 3, 2]}
    stderr = [fixture("benchlog", "prima-c_world3_lw332-rank%d.stderr" % number) for number in range(3)]
    ranks = [rank(number, "head" if number == 0 else "worker", 0, stderr[number]) for number in range(3)]
    record = run_record(plan, ranks, stderr[0], {"run_id": "r1", "warmup": False})
    assert record["run_id"] == "r1" and record["split"] == "-lw 3,3,2"
    assert [(item["window"], item["removed"]) for item in record["ranks"]] == [(3, False), (3, False), (2, False)]
    assert record["perf"]["eval_tps"] is not None and record["perf"]["prompt_tokens"] is not None


def test_run_record_names_the_allocators_split():
    plan = {"runtime": "prima", "model": "tiny", "name": "prima-tiny", "world": 3, "hosts": ["n0", "n1", "n2"],
            "split": "prima.cpp allocator", "window": None}
    stderr = [fixture("benchlog", "prima-b_world3-rank%d.stderr" % number) for number in range(3)]
    ranks = [rank(number, "head" if number == 0 else "worker", 0, stderr[number]) for number in range(3)]
    record = run_record(plan, ranks, stderr[0], {})
    assert record["split"] == "prima.cpp allocator: n0=8"
    # rank 0's profile table: cores, RAM and disk read per rank, as prima.cpp measured them
    profile = record["device_profile"]
    assert [(item["rank"], item["host"], item["cpu_cores"]) for item in profile] == [
        (0, "n0", 2), (1, "n1", 2), (2, "n2", 2)]
    assert [item["disk_read_gbs"] for item in profile] == [0.42, 0.13, 0.44]
    assert profile[0]["ram_gib"] == 23.54


def test_a_head_log_cut_at_exit_is_told_from_a_failed_head():
    # Captured on the sandbox: llama-completion exited 0 after generating, but its logger thread
    # had written nothing past "generate:" (no perf lines) when the process ended.
    plan = {"runtime": "llama_rpc", "model": "tiny", "name": "llama_rpc-tiny", "world": 3,
            "hosts": ["n0", "n1", "n2"], "split": "rpc"}
    cut = fixture("benchlog", "llama-completion-rpc-log-cut.stderr")
    ranks = [rank(0, "head", 0, cut), rank(1, "worker", None), rank(2, "worker", None)]
    assert rank_problems("llama_rpc", ranks) == []
    record = run_record(plan, ranks, cut, {})
    assert not any(value is not None for value in record["perf"].values())
    assert log_was_cut(ranks, record)
    # A head that failed is a failure, not a cut log; a log with perf lines is not cut.
    assert not log_was_cut([rank(0, "head", 1, cut)], record)
    whole = fixture("benchlog", "prima-c_world3_lw332-rank0.stderr")
    assert not log_was_cut([rank(0, "head", 0, whole)], run_record(plan, [rank(0, "head", 0, whole)], whole, {}))


def test_a_stalled_rank_is_named_with_its_silence_and_listed_with_the_consequences():
    """119: the launcher's watchdog stopped the rank (no output and no traffic for launch_stall_s). A ring
    waiting on a dead or stalled peer falls quiet too, so a stall is listed after a rank that ended on its own
    account, and the first to stall before the others."""
    assert exit_meaning(119, 120) == "stalled: no output and no traffic for 120 s"
    assert exit_meaning(119) == "stalled: no output and no traffic for its launch_stall_s"
    ranks = [rank(0, "head", 119, "llama_perf_context_print: load time", ended=20.0, stalled=120),
             rank(1, "worker", 119, "", ended=14.0, stalled=120),
             rank(2, "worker", 139, "Segmentation fault", ended=16.0)]
    problems = rank_problems("prima", ranks)
    assert [problem.split(":")[0] for problem in problems] == [
        "rank 2 (n2, prima worker) exited 139 during the run", "rank 1 (n1, prima worker) exited 119 during the run",
        "rank 0 (n0, prima head) exited 119"]
    assert problems[1].startswith("rank 1 (n1, prima worker) exited 119 during the run: stalled: no output and no "
                                  "traffic for 120 s\n  (its stderr is empty)")
    assert problems[2].startswith("rank 0 (n0, prima head) exited 119: stalled: no output and no traffic for 120 s")


def test_the_stall_reaches_the_judgement_from_the_ranks_finish():
    """What rank.sh's `finish` printed (its status before the stop) carries the watchdog's seconds."""
    import json

    from ansible_collections.prima.cluster.plugins.plugin_utils.bench.checks import rank_reports

    plan = {"hosts": ["n0", "n1"], "units": {"n0": {"rank": 0, "role": "head"}, "n1": {"rank": 1, "role": "worker"}}}
    before = {"n0": {"running": False, "pid": 5, "exit": 119, "ended": 3.0, "stalled": 120},
              "n1": {"running": False, "pid": 6, "exit": 0, "ended": 4.0, "stalled": None}}
    hostvars = {host: {"bench_finish": {"stdout": json.dumps({"before": status, "left_running": False})}}
                for host, status in before.items()}
    reports = rank_reports(plan, hostvars)
    assert [report["stalled"] for report in reports] == [120, None]
    [problem] = rank_problems("prima", reports)
    assert problem.startswith("rank 0 (n0, prima head) exited 119: stalled: no output and no traffic for 120 s")
