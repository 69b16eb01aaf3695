"""Aggregation of measured runs, results.jsonl and the report tables."""

import json

import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.report import (
    aggregate, append_results, derived, markdown_table, profile_table, render_report, results_table, runtimes_table,
    spread, summarize)


def run(runtime, eval_tps, index=1, warmup=False, model="tiny", link="unshaped", eval_ms=1000.0, eval_runs=20,
        prompt_ms=50.0):
    return {"run_id": "r1", "runtime": runtime, "model": model, "link": link, "unit": "%s-%s" % (runtime, model),
            "world": 1 if runtime == "single" else 3, "hosts": ["n0"], "split": "1 node", "build": "0c1e570",
            "run_index": index, "warmup": warmup, "finished": "2026-12-02T12:00:00+00:00", "run_dir": "/tmp/r1",
            "transport": {"mode": "ssh", "reason": "auto: n0 cannot reach 10.0.0.2:9001 (Connection refused)"},
            "perf": {"prompt_tps": 100.0, "prompt_ms": prompt_ms, "prompt_tokens": 5, "eval_tps": eval_tps,
                     "eval_ms": eval_ms, "eval_runs": eval_runs, "total_ms": 1100.0}}


def test_summarize_by_hand():
    # median of 10, 12, 14 is 12; sample variance ((-2)^2 + 0 + 2^2) / 2 = 4 -> stddev 2
    assert summarize([12, 10, 14]) == {"n": 3, "median": 12.0, "min": 10.0, "max": 14.0, "stddev": 2.0}
    assert summarize([5, None, float("inf")]) == {"n": 1, "median": 5.0, "min": 5.0, "max": 5.0, "stddev": 0.0}
    assert summarize([None])["median"] is None


def test_ms_per_token_and_time_to_first_token():
    # 1000 ms over 20 decode runs = 50 ms/token; TTFT = 50 ms prompt + 50 ms one token
    assert derived({"eval_ms": 1000.0, "eval_runs": 20, "prompt_ms": 50.0}) == {"ms_per_token": 50.0, "ttft_ms": 100.0}
    assert derived({"eval_ms": None, "eval_runs": 20, "prompt_ms": 5.0}) == {"ms_per_token": None, "ttft_ms": None}


def test_aggregate_skips_warmups_and_groups_by_runtime_model_link():
    records = [run("single", 99.0, 0, warmup=True), run("single", 10.0), run("single", 14.0, 2),
               run("single", 12.0, 3), run("llama_rpc", 5.0)]
    rows = aggregate(records)
    assert [(row["runtime"], row["runs"]) for row in rows] == [("single", 3), ("llama_rpc", 1)]
    assert rows[0]["eval_tps"]["median"] == 12.0 and rows[0]["eval_tps"]["stddev"] == 2.0
    assert rows[0]["ms_per_token"]["median"] == 50.0


def test_tables():
    rows = aggregate([run("single", 10.0), run("llama_rpc", 5.0, eval_ms=2000.0)])
    table = results_table(rows)
    assert table.splitlines()[0].startswith("| Runtime | Model | Link | Transport | World | Split |")
    assert "| single node | tiny | unshaped | ssh | 1 | 1 node | 0c1e570 | 100.00 ± 0.00 | 10.00 ± 0.00 |" in table
    side = runtimes_table(rows)
    assert side.splitlines()[0] == "| Model | Link | llama.cpp RPC | single node |"
    assert side.splitlines()[2] == "| tiny | unshaped | 100.00 ms (5.00 t/s) | 50.00 ms (10.00 t/s) |"
    assert spread({"median": None}) == "—"
    assert markdown_table(["a"], [["x|y"]]).splitlines()[2] == "| x\\|y |"


def test_profile_table_one_column_per_rank():
    table = profile_table([{"rank": 0, "host": "n0", "gpu": "RTX 4090", "vram_gib": 24.0, "ram_gib": 42.0,
                            "disk_read_gbs": 1.234, "cpu_cores": 10},
                           {"rank": 1, "host": "n1", "gpu": "", "vram_gib": 0, "ram_gib": 23.5,
                            "disk_read_gbs": None, "cpu_cores": 2}])
    lines = table.splitlines()
    assert lines[0] == "| Property | Rank 0 (n0) | Rank 1 (n1) |"
    assert "| GPU | RTX 4090 | — |" in lines and "| Disk read (GB/s) | 1.23 | — |" in lines
    assert "| CPU cores | 10 | 2 |" in lines


def test_results_are_appended_never_rewritten(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"earlier": true}\n')
    assert append_results(str(path), [run("single", 9.0, 0, warmup=True), run("single", 10.0)]) == 1
    lines = path.read_text().splitlines()
    assert lines[0] == '{"earlier": true}'
    assert json.loads(lines[1])["perf"]["eval_tps"] == 10.0 and json.loads(lines[1])["ms_per_token"] == 50.0


def test_report_renders_every_section():
    text, main = render_report([run("single", 10.0), run("llama_rpc", 5.0)],
                               [{"rank": 0, "host": "n0", "gpu": "", "vram_gib": 0, "ram_gib": 1, "disk_read_gbs": 1,
                                 "cpu_cores": 2}])
    assert text.startswith("# Benchmark r1\n")
    for heading in ("## Results", "## Runtimes side by side", "## Cluster profile", "## Every run"):
        assert heading in text
    assert main in text


def test_report_shows_the_network():
    record = run("single", 10.0)
    record["network"] = [{"host": "n0", "target": "10.0.0.1:50052", "rtt_ms": 0.123, "mbit_s": 940.54}]
    text, dummy = render_report([record], [])
    assert "## Network, measured before the runs" in text
    assert "| n0 | 10.0.0.1:50052 | 0.123 | 940.5 |" in text
    assert "## Network" not in render_report([run("single", 10.0)], [])[0]


def test_report_shows_prima_device_profile_when_its_allocator_ran():
    record = run("prima", 10.0)
    record["device_profile"] = [{"rank": 0, "host": "n0", "gpu": "", "vram_gib": 0.0, "ram_gib": 23.54,
                                 "disk_read_gbs": 0.42, "cpu_cores": 2}]
    text, dummy = render_report([record], [])
    assert "## prima.cpp's device profile" in text and "| Disk read (GB/s) | 0.42 |" in text


@pytest.mark.parametrize("profile", [[], None])
def test_report_without_profile(profile):
    text, dummy = render_report([run("single", 10.0)], profile or [])
    assert "## Cluster profile" not in text


def test_report_lists_the_runs_repeated_after_a_cut_log():
    lost = [{"unit": "llama_rpc-tiny", "run": "warmup0", "stderr": "/r/raw/n0/llama_rpc-tiny/warmup0/stderr"}]
    text, dummy = render_report([run("llama_rpc", 10.0)], [], lost)
    assert "- llama_rpc-tiny warmup0: `/r/raw/n0/llama_rpc-tiny/warmup0/stderr`" in text
    assert "Repeated because" not in render_report([run("llama_rpc", 10.0)], [])[0]


def priced(record, prices, started="2026-12-02T11:56:18+00:00"):
    """A run on hosts n0, n1, n2 with these prices (cents per hour), the benchmark started at `started`."""
    return dict(record, hosts=["n0", "n1", "n2"], price_cent_per_hour=prices, bench_started=started)


PROFILE = [{"rank": rank, "host": "n%d" % rank, "gpu": "RTX 4090", "vram_gib": 24.0, "ram_gib": 42.0,
            "disk_read_gbs": 1.0, "cpu_cores": 10, "price_cent_per_hour": 65} for rank in range(3)]


def test_each_row_and_results_line_carries_its_cost_per_million_generated_tokens(tmp_path):
    # 3 x 65 cents = $1.95/h; 50 ms per generated token: 1.95 / 3600 x 0.05 x 1e6 = $27.08 per million
    rows = aggregate([priced(run("llama_rpc", 20.0), {"n0": 65, "n1": 65, "n2": 65}),
                      priced(run("prima", 20.0), {"n0": 65, "n1": None, "n2": 65})])
    assert rows[0]["usd_per_mtok"] == pytest.approx(27.0833333) and rows[1]["usd_per_mtok"] is None
    table = results_table(rows).splitlines()
    assert "| ms/token | TTFT ms | $/Mtok | Runs |" in table[0]
    assert "| 50.00 ± 0.00 | 100.0 ± 0.0 | $27.08 | 1 |" in table[2]
    assert "| 50.00 ± 0.00 | 100.0 ± 0.0 | unknown | 1 |" in table[3]
    path = tmp_path / "results.jsonl"
    append_results(str(path), [priced(run("llama_rpc", 20.0), {"n0": 65, "n1": 65, "n2": 65}), run("single", 10.0)])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["price_cent_per_hour"] == {"n0": 65, "n1": 65, "n2": 65}
    assert lines[0]["usd_per_mtok"] == pytest.approx(27.0833333)
    assert lines[0]["bench_started"] == "2026-12-02T11:56:18+00:00"
    assert lines[1]["usd_per_mtok"] is None  # no price for n0


def test_the_row_counts_its_own_nodes_only():
    # single node: rank 0 alone, $0.65/h at 50 ms per token = $9.03 per million
    rows = aggregate([dict(run("single", 10.0), price_cent_per_hour={"n0": 65, "n1": 65, "n2": 65})])
    assert rows[0]["price_cent_per_hour"] == {"n0": 65} and "| $9.03 |" in results_table(rows)


def test_profile_carries_each_nodes_price_and_the_report_the_runs_cost():
    profile = [dict(PROFILE[0]), dict(PROFILE[1], price_cent_per_hour=80.5), dict(PROFILE[2])]
    assert "| Price ($/h) | 0.65 | 0.805 | 0.65 |" in profile_table(profile, price=True).splitlines()
    assert "Price" not in profile_table(profile)  # prima.cpp's device profile has no price
    # $2.105/h for 3 min 42 s (11:56:18 to 12:00:00, the last run's end) = $0.13
    text, dummy = render_report([priced(run("prima", 10.0), {"n0": 65, "n1": 80.5, "n2": 65})], profile)
    assert "Cost of this run: $0.13 (3 nodes, $2.11/h together, 3 min 42 s of wall time).\n" in text
    assert "prompt tokens are not counted" in text and "../shared" not in text and "http" not in text


def test_without_prices_the_report_says_unknown_and_which_nodes():
    profile = [dict(node, price_cent_per_hour=None) for node in PROFILE]
    text, dummy = render_report([priced(run("prima", 10.0), {"n0": None, "n1": None, "n2": None})], profile)
    assert ("Cost of this run: unknown (no price for n0, n1, n2: the inventory gives none; Glows inventories "
            "carry glows_price_cent).") in text
    assert "| Price ($/h) | unknown | unknown | unknown |" in text
    assert "| 100.0 ± 0.0 | unknown | 1 |" in text
    # Records from before the cost (no price, no start): unknown too, the report still renders.
    assert "Cost of this run: unknown (no price for n0:" in render_report([run("single", 10.0)], [])[0]
