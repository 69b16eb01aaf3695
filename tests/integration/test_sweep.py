"""Link sweeps on the sandbox: each step shapes every node's cluster interface with tc, the report
gets one row per step with the estimate beside it, and no qdisc is left, also after an interrupt."""

import json
import os
import signal
import subprocess
import time

from conftest import (N0, N1, NODE_ROOT, NODES, PRIMA, abandoned_on_failure, ansible_playbook_of,
                      assert_clean_failure, bench, head_generating, rank_processes, wait_for, write_figures)


def shaping():
    """Every tbf/netem qdisc on the nodes' cluster interfaces, by node."""
    found = {}
    for node in NODES:
        out = subprocess.run(["ip", "netns", "exec", "psb-%s" % node, "tc", "qdisc", "show"], capture_output=True,
                             text=True, check=True).stdout
        found[node] = [line for line in out.splitlines() if " tbf " in line or " netem " in line]
    return found


def test_sweep_of_two_rates(provisioned, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    # One measured run per step and no warm-up: the rows, the probe and the plot need no more.
    result = bench(reports, "sweep-1", "bench-sweep", runtime="all", runs=1, bench_warmup_runs=0,
                   links="1gbit,20mbit:1ms")
    assert result.status == "successful", result.describe()
    assert shaping() == {node: [] for node in NODES}
    # This kernel has no netem: the delay is refused and said so, the rate is shaped all the same.
    assert "this kernel has no netem qdisc" in result.stdout
    runs = [json.loads(line) for line in (reports / "results.jsonl").read_text().splitlines()]
    split = ["prima", "llama_rpc"] if PRIMA else ["llama_rpc"]
    assert sorted({(run["runtime"], run["link"]) for run in runs}) == sorted(
        (runtime, link) for runtime in split + ["single"] for link in ("1gbit", "20mbit:1ms"))
    for run in runs:
        assert run["link_shaping"]["shaped"] is True and run["model_facts"]["n_embd"] == 512
    # The probe measured each step's link as shaped: the head's throughput to a worker.
    throughput = {run["link"]: max(row["mbit_s"] for row in run["network"]) for run in runs}
    assert throughput["20mbit:1ms"] < 25 < 200 < throughput["1gbit"], throughput
    report = (reports / "sweep-1" / "report.md").read_text()
    assert "## Link sweep: measured, with the estimate beside it" in report
    for link in ("1gbit", "20mbit:1ms"):
        assert "| llama.cpp RPC | tiny | %s | " % link in report
    assert "![llama.cpp RPC, tiny](sweep-llama_rpc-tiny.png)" in report
    assert (reports / "sweep-1" / "sweep-llama_rpc-tiny.png").read_bytes().startswith(b"\x89PNG")
    # The figure for the closing note: estimated against measured decode, per step.
    rows = [line for line in report.splitlines() if line.startswith(("| prima.cpp | tiny |", "| llama.cpp RPC | tiny |"))]
    write_figures("sweep-figures.json", {"command": "bench.yml -e model=tiny -e runtime=all -e runs=1 "
                                                    "-e bench_warmup_runs=0 -e links=1gbit,20mbit:1ms", "rows": rows})


def test_a_worker_that_never_starts_fails_the_step_and_its_shaping_is_taken_off(provisioned, tmp_path):
    """Also bench.yml's failure case of a worker that never starts (the others: test_bench_failures.py)."""
    reports = tmp_path / "reports"
    reports.mkdir()
    result = bench(reports, "sweep-fail", "bench-sweep-fails", runtime="llama_rpc", runs=1, links="100mbit,50mbit",
                   launch_rpc_server_extra_args=["--no-such-flag"])
    assert_clean_failure(result, reports, None, "rank 1 (%s, llama_rpc worker) did not start" % N1,
                         "exited with status 0 before listening", "last lines of its stderr")
    assert shaping() == {node: [] for node in NODES}


def test_interrupted_sweep_leaves_no_shaping(provisioned, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    # No warm-up: the guard would take the shaping off in a gap between warm-up and measured run longer than its
    # quiet time (20 s here against the default 300, so the test ends soon after the head does).
    started = time.time()
    run = bench(reports, "sweep-int", "bench-sweep-interrupted", background=True, runtime="llama_rpc", runs=1,
                bench_warmup_runs=0, links="50mbit", link_guard_quiet_s=20, transport_guard_quiet_s=30,
                launch_n_predict=100000, launch_ctx_size=2048, launch_timeout_s=30)
    with abandoned_on_failure(run, "sweep-int"):
        wait_for(lambda: head_generating("llama_rpc-tiny", started), 180, "the head to generate on the shaped link")
        assert all(shaping().values()), shaping()
        # Ctrl-C: SIGINT to ansible-playbook's process group; its `always` cleanup does not run.
        os.killpg(os.getpgid(ansible_playbook_of("sweep-int")), signal.SIGINT)
    result = run.finish()
    assert result.status != "successful", result.describe()
    # The guard on each node: once no rank runs (the head ends by its 30 s timeout) and nothing has
    # changed for 20 s, the shaping goes.
    wait_for(lambda: shaping() == {node: [] for node in NODES}, 120, "the guards to remove the shaping")
    # The SSH forwarders too: no rank and nothing changed for 30 s (5 s would cut bench.yml's own quiet
    # moments before the first run), and they stop.
    wait_for(lambda: rank_processes() == [], 120, "the ranks and the SSH forwarders to end")
    for node in NODES:
        assert not os.path.exists(os.path.join(NODE_ROOT % node, "var/lib/prima-bench/link.shaped"))
    # An interrupted bench.yml leaves its lock, and the next one says how to clear it.
    lock = os.path.join(NODE_ROOT % N0, "var/lib/prima-bench/bench.lock")
    holder = json.loads(os.readlink(lock))
    assert (holder["run_id"], holder["playbook"]) == ("sweep-int", "bench.yml"), holder
    os.remove(lock)
    assert not (reports / "results.jsonl").exists()
