"""bench.yml -e mode=server on the sandbox with the tiny model, every runtime (the server run of
conftest.both_modes_bench): llama-server loaded from rank 0 over the loopback; the records, the raw requests, the
report's load table per runtime, and nothing left running."""

import json
import os
import re

from conftest import BOTH_MODES_RUNS, N0, NODE_ROOT, PRIMA, rank_processes, write_figures


def test_bench_server_mode_records_sequential_and_load_levels(both_modes_bench):
    reports = both_modes_bench["reports"]
    run_id = both_modes_bench["run_ids"]["server"]
    stdout = both_modes_bench["logs"]["server"]
    assert rank_processes() == []
    assert not os.path.lexists(os.path.join(NODE_ROOT % N0, "var/lib/prima-bench/bench.lock"))
    # The API key went to the server and the client, never to the log.
    with open("/var/lib/prima-sandbox/serve-api-key") as handle:
        key = handle.read().strip()
    assert key and key not in stdout

    runtimes = (["prima"] if PRIMA else []) + ["llama_rpc", "single"]
    lines = [json.loads(line) for line in (reports / "results.jsonl").read_text().splitlines()[1:]]
    lines = [line for line in lines if line["run_id"] == run_id]
    sequential = [line for line in lines if line["mode"] == "server"]
    levels = [line for line in lines if line["mode"] == "server-load"]
    assert len(sequential) == BOTH_MODES_RUNS * len(runtimes) and len(levels) == 2 * len(runtimes)
    assert len(lines) == len(sequential) + len(levels)
    for line in lines:
        assert line["runtime"] in runtimes and line["model"] == "tiny"
        assert line["unit"] == "serve-%s-tiny" % line["runtime"]
        assert line["world"] == (1 if line["runtime"] == "single" else 3)
        assert line["transport"]["mode"] == "ssh" and line["link"] and line["build"]
        assert line["bench_started"] and N0 in line["price_cent_per_hour"]
        # Each unit's server on a port of its own, from 8080 in the order of the plans.
        port = 8080 + runtimes.index(line["runtime"])
        assert line["clients_where"] == "clients on rank 0 (%s) over loopback (127.0.0.1:%d)" % (N0, port)
    for line in sequential:
        # The server's own timings (llama-server's /completion), under the keys of a mode=run run.
        assert not line["warmup"] and line["request"]["status"] == 200, line
        # Every request evaluates the whole prompt (cache_prompt off), not the one token a cached prompt leaves.
        assert line["perf"]["eval_tps"] > 0 and line["perf"]["prompt_tokens"] > 1 and line["perf"]["eval_runs"] > 0
        assert line["ms_per_token"] > 0 and line["ttft_ms"] > 0
    for runtime in runtimes:
        mine = [level for level in levels if level["runtime"] == runtime]
        assert [level["clients"] for level in mine] == [1, 2]
        for level in mine:
            assert level["errors"] == 0 and level["requests"] == 2 * level["clients"], level
            assert level["tokens"] > 0 and level["aggregate_tps"] > 0
            assert 0 < level["ttft_p50_ms"] <= level["ttft_p95_ms"] <= level["ttft_p99_ms"]
            assert 0 <= level["itl_p50_ms"] <= level["itl_p95_ms"] <= level["itl_p99_ms"]

    raw = json.loads((reports / run_id / "raw" / N0 / "serve-llama_rpc-tiny" / levels[0]["link"]
                      / "load.json").read_text())
    # One warm-up, then the measured requests.
    assert len(raw["sequential"]) == BOTH_MODES_RUNS + 1 and raw["sequential"][0]["warmup"]
    assert [len(level["requests"]) for level in raw["levels"]] == [2, 4]
    assert all(request["arrivals"] for level in raw["levels"] for request in level["requests"])

    report = (reports / run_id / "report.md").read_text()
    assert "come from the server's own `timings`" in report
    assert re.search(r"\| llama\.cpp RPC \| tiny \| unshaped \| ssh \| 3 \| ", report), report
    assert "Clients on rank 0 (%s) over loopback (127.0.0.1:%d)" % (N0, 8080 + runtimes.index("llama_rpc")) in report
    assert "| Clients | Requests | TTFT ms p50 / p95 / p99 | ITL ms p50 / p95 / p99 | Aggregate t/s | Errors |" in report
    rows = re.findall(r"^\| (\d+) \| (\d+) \| [0-9.]+ / [0-9.]+ / [0-9.]+ \| [0-9.]+ / [0-9.]+ / [0-9.]+ "
                      r"\| [0-9.]+ \| (\d+) \|$", report, re.M)
    assert rows == [("1", "2", "0"), ("2", "4", "0")] * len(runtimes), report
    table = report[report.index("| Clients | Requests"):].split("\n\n")[0]
    wall_s = next(row["wall_s"] for row in both_modes_bench["result"]["figures"] if row["mode"] == "server")
    kept = ("runtime", "clients", "requests", "errors", "aggregate_tps", "ttft_p50_ms", "itl_p50_ms")
    write_figures("bench-server.json", {"seconds": wall_s, "load_table": table, "runtimes": runtimes,
                                        "levels": [{key: level[key] for key in kept} for level in levels]})
