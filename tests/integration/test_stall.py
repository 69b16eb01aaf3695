"""The launcher's stall watchdog on the sandbox: a rank SIGSTOPped mid-run (what a cut network or a stuck GPU looks like
from outside: no output, no bytes moved) fails the bench within launch_stall_s + 30 s, not at launch_timeout_s,
named, with nothing left running and results.jsonl untouched."""

import os
import signal
import time

from conftest import (N1, abandoned_on_failure, assert_clean_failure, bench, head_generating, running_child,
                      wait_for, write_figures)

STALL_S = 10


def test_a_sigstopped_rank_fails_the_bench_within_the_stall_bound(provisioned, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "results.jsonl").write_text("untouched\n")
    # A long generation, so the run is mid-way when the worker stops; the launch timeout far beyond the bound.
    started = time.time()
    run = bench(reports, "stall", "bench-stall", background=True, runtime="llama_rpc", runs=1,
                launch_n_predict=100000, launch_ctx_size=2048, launch_timeout_s=900, launch_stall_s=STALL_S)
    with abandoned_on_failure(run, "stall"):
        wait_for(lambda: head_generating("llama_rpc-tiny", started) and running_child(N1, "llama_rpc-tiny"), 180,
                 "the head to generate")
        worker = running_child(N1, "llama_rpc-tiny")
        os.kill(worker, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        result = run.finish(timeout=STALL_S + 300)
    finally:
        try:
            os.kill(worker, signal.SIGCONT)
        except ProcessLookupError:
            pass
    # finish() returns once the playbook has cleaned up and failed; the bound is on that, from the stop.
    failed_after_s = time.monotonic() - stopped_at
    write_figures("stall-figures.json", {
        "how": "tests/integration/test_stall.py: bench.yml -e model=tiny -e runtime=llama_rpc -e runs=1 with "
               "launch_stall_s=%d on the mapped sandbox; rank 1's ggml-rpc-server SIGSTOPped mid-generation" % STALL_S,
        "launch_stall_s": STALL_S, "failed_after_s": round(failed_after_s, 1)})
    assert_clean_failure(result, reports, "untouched\n",
                         "rank 1 (%s, llama_rpc worker) exited 119 during the run: stalled: no output and no traffic "
                         "for %d s" % (N1, STALL_S))
    assert failed_after_s < STALL_S + 30, "the bench failed %.1f s after the stop" % failed_after_s
    # The cause is kept with the rank's raw logs.
    stalled = list(reports.glob("*/raw/%s/llama_rpc-tiny/*/*/stalled" % N1))
    assert stalled and stalled[0].read_text().split()[0] == str(STALL_S), stalled
