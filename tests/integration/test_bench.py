"""bench.yml on the sandbox with the tiny model: reports that match the raw logs (the session's bench of both
modes). Its failure cases are in test_bench_failures.py."""

import json
import os
import re
import statistics
import subprocess
import sys

from conftest import BOTH_MODES_RUNS, CLUSTER_IPS, N0, N1, N2, NODE_ROOT, PRIMA, REPO, rank_processes


def perflog(path):
    out = subprocess.run([sys.executable, os.path.join(REPO, "plugins", "perflog.py"), path], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)[0]


def test_bench_report_matches_the_raw_logs(provisioned, both_modes_bench):
    # The mode=run bench of conftest.both_modes_bench: every runtime, BOTH_MODES_RUNS measured runs.
    reports = both_modes_bench["reports"]
    run_id = both_modes_bench["run_ids"]["run"]
    stdout = both_modes_bench["logs"]["run"]
    lines = (reports / "results.jsonl").read_text().splitlines()
    assert lines[0] == '{"earlier": "line"}'
    runs = [record for record in map(json.loads, lines[1:]) if record["run_id"] == run_id]
    assert all(run["mode"] == "run" for run in runs)
    runtimes = ["prima", "llama_rpc", "single"] if PRIMA else ["llama_rpc", "single"]
    assert sorted(run["runtime"] for run in runs) == sorted(runtimes * BOTH_MODES_RUNS)
    for run in runs:
        head = run["hosts"][0]
        # A head whose log was cut at exit is run again (bench_log_cut_retries): the record is its last attempt's
        # (roles/bench/vars/main.yml names the directories).
        label = "unshaped/run%d%s" % (run["run_index"], "-retry%d" % run["attempt"] if run["attempt"] else "")
        raw = perflog(str(reports / run_id / "raw" / head / run["unit"] / label / "stderr"))
        for key in ("prompt_ms", "prompt_tokens", "prompt_tps", "eval_ms", "eval_runs", "eval_tps", "total_ms"):
            assert run["perf"][key] == raw[key], (run["unit"], label, key)
        assert run["world"] == (1 if run["runtime"] == "single" else 3)
        command = (reports / run_id / "raw" / head / run["unit"] / label / "command.txt").read_text()
        assert "-m /opt/models/tiny.gguf" in command
        if run["runtime"] == "llama_rpc":
            # launch_rpc_cache: every worker caches what it is sent (the tiny model's tensors are all under
            # ggml-rpc-server's 10 MiB, so nothing lands there: benchmarks/rpc_cache.py measures the large one).
            for worker in run["hosts"][1:]:
                assert " -c " in (reports / run_id / "raw" / worker / run["unit"] / label / "command.txt").read_text()
    # Every head passed, so it vouched for its workers' caches (the run's finish, the server's confirm-cache):
    # the next start keeps what they hold.
    for unit in ("llama_rpc-tiny", "serve-llama_rpc-tiny"):
        for worker in (N1, N2):
            cache = os.path.join(NODE_ROOT % worker, "var/lib/prima-bench", unit, "cache/rpc")
            assert os.path.isdir(cache) and not os.path.exists(os.path.join(cache, ".unconfirmed")), cache
    report = (reports / run_id / "report.md").read_text()
    median = statistics.median(run["perf"]["eval_tps"] for run in runs if run["runtime"] == "llama_rpc")
    # The mapped sandbox: auto found the direct path closed, and SSH forwards carried every run.
    assert re.search(r"\| llama\.cpp RPC \| tiny \| unshaped \| ssh \| 3 \| .* \| %.2f ± " % median, report), report
    assert all(run["transport"]["mode"] == "ssh"
               and "auto: %s cannot reach %s:" % (N0, CLUSTER_IPS[N1]) in run["transport"]["reason"] for run in runs)
    assert "Transport (how the ranks reached each other; cluster_network): ssh: auto: " in report
    assert "| Rank 0 (%s) | Rank 1 (%s) | Rank 2 (%s) |" % (N0, N1, N2) in report
    # site.yml set the transport up with the same inputs and recorded it: bench.yml wrote none of its files.
    assert "Set up this node's transport (skipped where the record says" in stdout
    assert "transport/tasks/write.yml" not in stdout
    # The probe before the runs: the head reaches both RPC workers through its forwards (worker rank R on
    # 50052 + R - 1), with a handshake time and a throughput.
    network = {(row["host"], row["target"]): row for row in runs[0]["network"]}
    for worker, target in ((N1, "127.0.0.1:50052"), (N2, "127.0.0.1:50053")):
        assert network[(N0, target)]["rtt_ms"] > 0 and network[(N0, target)]["mbit_s"] > 0
        assert network[(N0, target)]["peer"] == worker and network[(N0, target)]["via"] == "ssh"
        assert re.search(r"\| %s \| %s:%s via ssh \(%s\) \| [0-9.]+ \| [0-9.]+ \|"
                         % (N0, worker, target.split(":")[1], re.escape(target)), report)
    assert "| Results" not in stdout and "| Runtime | Model | Link |" in stdout
    assert rank_processes() == []
    assert not os.path.lexists(os.path.join(NODE_ROOT % N0, "var/lib/prima-bench/bench.lock"))
    # With its default parameters, bench.yml runs exactly the units site.yml rendered.
    rendered = re.search(r"TASK \[prima\.cluster\.launch : Render this host's launcher scripts\].*?\n\n", stdout, re.S)
    assert rendered and "changed:" not in rendered.group(0), rendered.group(0) if rendered else stdout
