"""bench.yml's failure cases on the sandbox with the tiny model: a head whose log is always cut, a rank killed
mid-run. Each fails naming the first rank that failed and why, leaves no rank and no lock, keeps the raw logs and
leaves results.jsonl as it was. Runs on either cluster of the sandbox (make test: the second).

Elsewhere: a worker that never starts (test_sweep.py, in a sweep step: also its shaping taken off), a stalled rank
(test_stall.py), a second bench.yml refused while one runs (test_locks.py, while the run after a killed one holds
the cluster)."""

import glob
import os
import signal
import time

import pytest

from conftest import (N0, NODE_ROOT, NODES, PRIMA, abandoned_on_failure, assert_clean_failure, bench,
                      head_generating, running_child, wait_for)


def test_a_head_whose_log_is_always_cut_is_tried_again_then_named(provisioned, tmp_path):
    # --log-disable stops llama.cpp's logger: the head exits 0 with no perf lines, as when its
    # logger thread loses the tail at exit; bench.yml runs it again, then gives up naming why.
    reports = tmp_path / "reports"
    reports.mkdir()
    result = bench(reports, "cut-1", "bench-log-cut", runtime="single", runs=1, bench_log_cut_retries=1,
                   launch_head_extra_args=["--log-disable"])
    assert_clean_failure(result, reports, None, "single-tiny unshaped/warmup0: the head exited 0 but its log stops",
                         "single-tiny: the head's stderr has no perf lines", "was cut at exit every time")
    tried = reports / "cut-1" / "raw" / N0 / "single-tiny" / "unshaped"
    runs = sorted(os.path.basename(path) for path in glob.glob(str(tried / "*")))
    assert runs == ["warmup0", "warmup0-retry1"]
    assert not os.path.exists(reports / "cut-1" / "report.md")


@pytest.mark.parametrize("runtime, rank, expected", [
    ("llama_rpc", 1, "rank 1 ({node}, llama_rpc worker) exited 137 during the run: killed (SIGKILL)"),
    ("llama_rpc", 0, "rank 0 ({node}, llama_rpc head) exited 137: killed (SIGKILL)"),
    pytest.param("prima", 1, "rank 1 ({node}, prima worker) exited 137 during the run: killed (SIGKILL)",
                 marks=pytest.mark.skipif(not PRIMA, reason="prima.cpp is built only with PRIMA_CPP_MIRROR")),
])
def test_rank_killed_mid_run(provisioned, tmp_path, runtime, rank, expected):
    victim = NODES[rank]
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "results.jsonl").write_text("untouched\n")
    unit = "%s-tiny" % runtime
    # prima.cpp has no timeout: its head hangs once a worker is gone, until the rank's own timeout.
    started = time.time()
    run = bench(reports, "kill-%s-%s" % (runtime, victim), "bench-kill-%s-%s" % (runtime, victim), background=True,
                runtime=runtime, runs=1, launch_n_predict=100000, launch_ctx_size=2048, launch_timeout_s=45)
    # The head decodes for a while: kill the victim once the head has produced output.
    with abandoned_on_failure(run, "kill-%s-%s" % (runtime, victim)):
        wait_for(lambda: head_generating(unit, started), 120, "the head to generate")
        os.kill(running_child(victim, unit), signal.SIGKILL)
    result = run.finish()
    # The rank that died first is named first: the cause, before what it took down with it.
    assert_clean_failure(result, reports, "untouched\n", "%s failed:\n%s" % (unit, expected.format(node=victim)))
    if runtime == "prima":
        assert "rank 0 (%s, prima head) exited 124: hang: killed by its timeout" % N0 in result.stdout
    else:
        # No head that loaded every tensor vouched for this run: the next start deletes what its workers cached.
        for worker in NODES[1:]:
            assert os.path.exists(os.path.join(NODE_ROOT % worker, "var/lib/prima-bench", unit, "cache/rpc",
                                               ".unconfirmed")), worker
