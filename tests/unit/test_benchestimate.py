"""The estimate beside each measured row, the sweep table and its plot (arithmetic by hand)."""

import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.bench.estimate import (
    expectations, expected_curve, link_gbit, sweep_series)
from ansible_collections.prima.cluster.plugins.plugin_utils.bench.report import (
    aggregate, render_report, results_table, sweep_table)

NETWORK = [{"host": "n0", "target": "10.77.0.11:9001", "rtt_ms": 0.2, "mbit_s": 900.0},
           {"host": "n1", "target": "10.77.0.12:9002", "rtt_ms": 0.2, "mbit_s": 1100.0}]
FACTS = {"n_embd": 512, "n_layer": 8}


def record(runtime, eval_tps, link="1gbit", bits=10 ** 9, shaped=True, prompt_tps=80.0, index=1):
    return {"run_id": "r1", "runtime": runtime, "model": "tiny", "unit": "%s-tiny" % runtime, "link": link,
            "link_bits": bits, "link_shaping": {"shaped": shaped, "delay_applied": False, "notices": []},
            "network": NETWORK, "model_facts": FACTS, "world": 1 if runtime == "single" else 3,
            "hosts": ["n0", "n1", "n2"], "split": "-lw 3,3,2", "build": "bdf9d8e7", "run_index": index,
            "warmup": False, "finished": "2026-12-02T12:00:00Z", "run_dir": "/tmp/r1",
            # 20 decode runs at eval_tps (single at 20 t/s: 1000 ms, 50 ms/token); 5 prompt tokens in 50 ms
            "perf": {"prompt_tps": prompt_tps, "prompt_ms": 50.0, "prompt_tokens": 5, "eval_tps": eval_tps,
                     "eval_ms": 20 * 1000.0 / eval_tps, "eval_runs": 20, "total_ms": 1100.0}}


def test_prima_row_against_the_single_node_by_hand():
    rows = aggregate([record("single", 20.0), record("prima", 10.0)])
    expected = expectations(rows)
    assert expected[("single", "tiny", "1gbit")]["basis"] == "baseline"
    prima = expected[("prima", "tiny", "1gbit")]
    # 512 x 4 + 4 = 2052 bytes a token, 69 a message; 3 ring hops at 1 Gbit/s, RTT 0.2 ms:
    # transfer (2052 + 69) x 8 / 1e9 s = 0.016968 ms; per token 50 + 3 x (0.1 + 0.016968) = 50.350904 ms
    assert prima["decode_tps"] == pytest.approx(1000 / 50.350904)
    assert prima["decode_tps_ratio"] == pytest.approx(10.0 / (1000 / 50.350904))
    # prefill: (5 x 2052 + 69) x 8 bits = 0.082632 ms a hop; 50 + 3 x (0.1 + 0.082632) = 50.547896 ms for 5 tokens
    assert prima["prompt_tps"] == pytest.approx(5 / 50.547896 * 1000)


def test_llama_rpc_crosses_two_boundaries_per_worker_and_unshaped_uses_the_probe():
    rows = aggregate([record("single", 20.0, link="unshaped", bits=0, shaped=False),
                      record("llama_rpc", 12.0, link="unshaped", bits=0, shaped=False)])
    # the probe's median throughput: (900 + 1100) / 2 = 1000 Mbit/s = 1 Gbit/s
    assert link_gbit(rows[1]) == pytest.approx(1.0)
    rpc = expectations(rows)[("llama_rpc", "tiny", "unshaped")]
    # f32, no position: 2048 bytes, 4 boundaries (to and from 2 workers): 50 + 4 x (0.1 + 0.016384) ms
    assert rpc["decode_tps"] == pytest.approx(1000 / (50 + 4 * (0.1 + 0.016384)))


def test_no_estimate_without_a_single_node_run_or_model_facts():
    rows = aggregate([record("prima", 10.0)])
    assert "no single-node run of tiny" in expectations(rows)[("prima", "tiny", "1gbit")]["basis"]
    bare = record("prima", 10.0)
    bare["model_facts"] = {}
    rows = aggregate([record("single", 20.0), bare])
    assert expectations(rows)[("prima", "tiny", "1gbit")]["decode_tps"] is None
    assert "| Measured/expected |" in results_table(rows).splitlines()[0]


def test_sweep_table_and_curve():
    records = [record("single", 20.0, link=link, bits=bits) for link, bits in (("1gbit", 10 ** 9), ("10mbit", 10 ** 7))]
    records += [record("prima", 10.0, link="1gbit", bits=10 ** 9), record("prima", 9.0, link="10mbit", bits=10 ** 7),
                record("llama_rpc", 8.0, link="10mbit", bits=10 ** 7, shaped=False)]
    rows = aggregate(records)
    series = sweep_series(rows)
    assert [(item["runtime"], [row["link"] for row in item["rows"]]) for item in series] == [
        ("prima", ["10mbit", "1gbit"]), ("llama_rpc", ["10mbit"])]
    table = sweep_table(rows, expectations(rows))
    lines = table.splitlines()
    assert lines[0].startswith("| Runtime | Model | Link | Decode (t/s) | Prefill (t/s) | Expected decode "
                               "| Measured/expected | Expected prefill | Measured/expected |")
    # 10 Mbit/s: transfer 2121 x 8 / 1e7 s = 1.6968 ms a hop; 50 + 3 x (0.1 + 1.6968) = 55.3904 ms a token
    assert lines[2].startswith("| prima.cpp | tiny | 10mbit | 9.00 ± 0.00 | 80.00 ± 0.00 | %.2f | %.2f |"
                               % (1000 / 55.3904, 9.0 / (1000 / 55.3904)))
    assert "| llama.cpp RPC | tiny | 10mbit (not shaped) |" in table
    # Fitted at 1gbit (the fastest): prima 100 ms/token, single 50, 3 boundaries: (100 - 50) / 3 = 16.666667 ms a
    # boundary, 0.016968 of it transfer -> 16.649699 ms fixed. At 10 Mbit/s: 50 + 3 x (16.649699 + 1.6968)
    # = 105.039497 ms -> 9.52023 t/s, measured 9 (111.111 ms: (111.111 - 50) / 3 = 20.370 ms a boundary,
    # expected 0.1 + 1.6968 = 1.797 ms).
    assert lines[2].endswith("| 20.370 / 1.797 | 9.52 | %.2f |" % (9.0 / (1000 / 105.039497)))
    assert lines[3].endswith("| 16.667 / 0.117 | 10.00 (fit) | 1.00 |")
    curve = expected_curve(rows, "prima", "tiny", [0.01, 1.0])
    assert curve[0]["decode_tps"] == pytest.approx(1000 / 55.3904) and curve[1]["rate_gbit"] == 1.0


def test_report_draws_the_sweep(tmp_path):
    records = [record("single", 20.0, link=link, bits=bits) for link, bits in (("1gbit", 10 ** 9), ("10mbit", 10 ** 7))]
    records += [record("prima", 10.0, link="1gbit", bits=10 ** 9), record("prima", 9.0, link="10mbit", bits=10 ** 7)]
    text, dummy = render_report(records, [], plot_dir=str(tmp_path))
    assert "## Link sweep: measured, with the estimate beside it" in text
    assert "![prima.cpp, tiny](sweep-prima-tiny.png)" in text
    png = (tmp_path / "sweep-prima-tiny.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10000
    # Without shaped steps: no sweep section, no plot.
    text, dummy = render_report([record("single", 20.0, link="unshaped", bits=0)], [], plot_dir=str(tmp_path / "none"))
    assert "## Link sweep" not in text


def test_round_trip_from_the_unshaped_probe_plus_the_added_delay():
    from ansible_collections.prima.cluster.plugins.plugin_utils.bench.estimate import round_trip_ms

    row = {"network": [{"rtt_ms": 3.0}], "base_network": [{"rtt_ms": 0.2}, {"rtt_ms": 0.4}], "link_delay_ms": 2.0,
           "link_shaping": {"shaped": True, "delay_applied": True}}
    # median of 0.2 and 0.4 = 0.3 ms, plus 2 ms each way
    assert round_trip_ms(row) == pytest.approx(4.3)
    row["link_shaping"]["delay_applied"] = False
    assert round_trip_ms(row) == pytest.approx(0.3)
    assert round_trip_ms({"network": [{"rtt_ms": 3.0}]}) == 3.0


def test_network_table_of_a_sweep_has_a_probe_per_step():
    from ansible_collections.prima.cluster.plugins.plugin_utils.bench.report import networks_table

    records = [record("llama_rpc", 10.0, link=link, bits=bits) for link, bits in (("1gbit", 10 ** 9), ("10mbit", 10 ** 7))]
    records[1]["network"] = [{"host": "n0", "target": "10.77.0.11:50052", "rtt_ms": 2.5, "mbit_s": 9.6}]
    for item in records:
        item["base_network"] = [{"host": "n0", "target": "10.77.0.11:50052", "rtt_ms": 0.2, "mbit_s": 9800.0}]
    lines = networks_table(records).splitlines()
    assert lines[0] == "| Link | From | To | Round trip ms | Throughput Mbit/s |"
    assert lines[2] == "| as it is | n0 | 10.77.0.11:50052 | 0.200 | 9800.0 |"
    assert "| 10mbit | n0 | 10.77.0.11:50052 | 2.500 | 9.6 |" in lines
    assert len(lines) == 2 + 1 + 2 + 1
