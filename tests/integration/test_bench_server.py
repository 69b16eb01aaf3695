"""bench.yml -e mode=server on the sandbox with the tiny model: llama.cpp RPC behind llama-server, loaded from
rank 0 over the loopback; the records, the raw requests, the report's load table, and nothing left running."""

import json
import os
import re

from conftest import NODE_ROOT, bench, rank_processes, write_figures


def test_bench_server_mode_records_sequential_and_load_levels(provisioned, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    result = bench(reports, "server-1", "bench-server", runtime="llama_rpc", mode="server", clients="1,2", runs=2)
    assert result.status == "successful", result.describe()
    assert rank_processes() == []
    assert not os.path.lexists(os.path.join(NODE_ROOT % "n0", "var/lib/prima-bench/bench.lock"))
    # The API key went to the server and the client, never to the log.
    with open("/var/lib/prima-sandbox/serve-api-key") as handle:
        key = handle.read().strip()
    assert key and key not in result.stdout

    lines = [json.loads(line) for line in (reports / "results.jsonl").read_text().splitlines()]
    sequential = [line for line in lines if line["mode"] == "server"]
    levels = [line for line in lines if line["mode"] == "server-load"]
    assert len(sequential) == 2 and len(levels) == 2 and len(lines) == 4
    for line in lines:
        assert line["run_id"] == "server-1" and line["runtime"] == "llama_rpc" and line["model"] == "tiny"
        assert line["unit"] == "serve-llama_rpc-tiny" and line["world"] == 3 and line["hosts"] == ["n0", "n1", "n2"]
        assert line["transport"]["mode"] == "ssh" and line["link"] and line["build"]
        assert line["bench_started"] and "n0" in line["price_cent_per_hour"]
        assert line["clients_where"] == "clients on rank 0 (n0) over loopback (127.0.0.1:8080)"
    for line in sequential:
        # The server's own timings, under the keys of a mode=run run, and the figures derived from them.
        assert not line["warmup"] and line["request"]["status"] == 200
        # Every request evaluates the whole prompt (cache_prompt off), not the one token a cached prompt leaves.
        assert line["perf"]["eval_tps"] > 0 and line["perf"]["prompt_tokens"] > 1 and line["perf"]["eval_runs"] > 0
        assert line["ms_per_token"] > 0 and line["ttft_ms"] > 0
    assert [level["clients"] for level in levels] == [1, 2]
    for level in levels:
        assert level["errors"] == 0 and level["requests"] == 2 * level["clients"]
        assert level["tokens"] > 0 and level["aggregate_tps"] > 0
        assert 0 < level["ttft_p50_ms"] <= level["ttft_p95_ms"] <= level["ttft_p99_ms"]
        assert 0 <= level["itl_p50_ms"] <= level["itl_p95_ms"] <= level["itl_p99_ms"]

    raw = json.loads((reports / "server-1" / "raw" / "n0" / "serve-llama_rpc-tiny" / levels[0]["link"]
                      / "load.json").read_text())
    assert len(raw["sequential"]) == 3 and raw["sequential"][0]["warmup"]  # one warm-up, two measured
    assert [len(level["requests"]) for level in raw["levels"]] == [2, 4]
    assert all(request["arrivals"] for level in raw["levels"] for request in level["requests"])

    report = (reports / "server-1" / "report.md").read_text()
    assert "come from the server's own `timings`" in report
    assert re.search(r"\| llama\.cpp RPC \| tiny \| unshaped \| ssh \| 3 \| ", report), report
    assert "Clients on rank 0 (n0) over loopback (127.0.0.1:8080)" in report
    assert "| Clients | Requests | TTFT ms p50 / p95 / p99 | ITL ms p50 / p95 / p99 | Aggregate t/s | Errors |" in report
    rows = re.findall(r"^\| (\d+) \| (\d+) \| [0-9.]+ / [0-9.]+ / [0-9.]+ \| [0-9.]+ / [0-9.]+ / [0-9.]+ "
                      r"\| [0-9.]+ \| (\d+) \|$", report, re.M)
    assert rows == [("1", "2", "0"), ("2", "4", "0")], report
    table = report[report.index("| Clients | Requests"):].split("\n\n")[0]
    write_figures("bench-server.json", {"seconds": result.seconds, "load_table": table,
                                        "levels": [{key: level[key] for key in ("clients", "requests", "errors",
                                                                                  "aggregate_tps", "ttft_p50_ms",
                                                                                  "itl_p50_ms")}
                                                   for level in levels]})
