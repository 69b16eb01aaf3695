"""The benchmark-log parsers on real captured output (tests/fixtures/benchlog, copied verbatim from
runs of prima.cpp bdf9d8e7 and llama.cpp 0c1e570) and on the variants seen in the wild (ANSI
colours, CR LF, runs cut short, inf/nan figures). Expected values were read off the files."""

import json
import os

from ansible_collections.prima.cluster.plugins.plugin_utils.bench import log as bench_log

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "benchlog")


def fixture(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8", errors="replace") as handle:  # random-model text
        return handle.read()


def rank(case, number, stream="stderr"):
    return fixture("prima-%s-rank%d.%s" % (case, number, stream))


# --- prima.cpp ------------------------------------------------------------------------------------

def test_auto_run_rank0_keeps_the_last_allocation():
    # b_world3: HiGHS first gave [6, 1, 1], dropped ranks 1 and 2, then gave rank 0 all 8 layers.
    result = bench_log.parse_prima_rank(rank("b_world3", 0))
    assert result["window"] == 8 and result["gpu_layers"] == 0 and result["removed"] is False
    assert result["allocation"] == [{"device": "node0", "index": 0, "window": 8, "gpu_layers": 0}]


def test_auto_run_rank0_profile_table():
    profile = bench_log.parse_prima_rank(rank("b_world3", 0))["profile"]
    assert profile["ranks"] == ["Rank 0", "Rank 1", "Rank 2"]
    rows = profile["rows"]
    assert len(rows) == 67
    assert list(rows)[:3] == ["Device Name", "Device OS", "CPU Name"]
    assert rows["Device Name"] == ["node0", "node1", "node2"]
    assert rows["CPU Description"] == ["Intel(R) X"] * 3
    assert rows["CPU flops (F32xF32, GFLOPS)"] == ["21.8", "10.9", "13.1"]
    assert rows["Disk Read Seq Speed (GB/s)"] == ["0.42", "0.13", "0.44"]
    assert rows["GPU Name"] == ["", "", ""]  # blank cells are cells
    assert rows["CUDA flops (IQ1MxF32, GFLOPS)"] == ["0.0", "0.0", "0.0"]
    assert "Model flops (output F32xF32)" not in rows and "Model bytes  (output)" not in rows  # one column


def test_auto_run_dropped_workers():
    for number in (1, 2):
        assert bench_log.parse_prima_rank(rank("b_world3", number)) == {
            "window": None, "gpu_layers": None, "removed": True, "allocation": None, "profile": None}


def test_q8_0_auto_run_rank2_gets_seven_layers():
    head = bench_log.parse_prima_rank(rank("q1_world3_q8_0_auto", 0))
    assert head["window"] == 1 and head["removed"] is False
    # After node1 was dropped, node2 became device index 1 of the second round.
    assert head["allocation"] == [{"device": "node0", "index": 0, "window": 1, "gpu_layers": 0},
                                  {"device": "node2", "index": 1, "window": 7, "gpu_layers": 0}]
    assert head["profile"]["rows"]["CPU flops (F32xF32, GFLOPS)"] == ["9.4", "10.9", "32.8"]
    assert bench_log.parse_prima_rank(rank("q1_world3_q8_0_auto", 1))["removed"] is True
    worker = bench_log.parse_prima_rank(rank("q1_world3_q8_0_auto", 2))
    assert (worker["window"], worker["gpu_layers"], worker["removed"]) == (7, 0, False)
    assert worker["allocation"] is None and worker["profile"] is None


def test_lw_run_has_every_window_and_no_profiling():
    results = [bench_log.parse_prima_rank(rank("c_world3_lw332", number)) for number in range(3)]
    assert [result["window"] for result in results] == [3, 3, 2]
    assert [result["gpu_layers"] for result in results] == [0, 0, 0]
    assert not any(result["removed"] for result in results)
    assert all(result["allocation"] is None and result["profile"] is None for result in results)


def test_stdout_and_stderr_together():
    text = rank("b_world3", 0, "stdout") + rank("b_world3", 0)
    assert bench_log.parse_prima_rank(text) == bench_log.parse_prima_rank(rank("b_world3", 0))


def test_ansi_colours_and_crlf():
    plain = rank("q1_world3_q8_0_auto", 0)
    coloured = "".join("\x1b[32m%s\x1b[0m\r\n" % line for line in plain.split("\n"))
    coloured = coloured.replace("node2", "\x1b[1;33mnode2\x1b[0m")
    assert "\x1b[" in coloured and "\r\n" in coloured
    assert bench_log.parse_prima_rank(coloured) == bench_log.parse_prima_rank(plain)
    worker = rank("q1_world3_q8_0_auto", 1).replace("\n", "\r\n").replace("No layer", "\x1b[31mNo layer")
    assert bench_log.parse_prima_rank(worker)["removed"] is True


def test_log_cut_off_inside_the_first_allocation():
    text = rank("q1_world3_q8_0_auto", 0)
    cut = text[:text.index("node2:\n")]
    result = bench_log.parse_prima_rank(cut)
    assert result["window"] is None
    assert result["allocation"] == [{"device": "node0", "index": 0, "window": 1, "gpu_layers": 0},
                                    {"device": "node1", "index": 1, "window": 1, "gpu_layers": 0}]


def test_profile_summary_of_a_real_table():
    profile = bench_log.parse_prima_rank(rank("b_world3", 0))["profile"]
    assert bench_log.profile_summary(profile) == [
        {"cpu_cores": 2, "ram_gib": 23.54, "disk_read_gbs": 0.42, "gpu": "", "vram_gib": 0.0, "device": "node0"},
        {"cpu_cores": 2, "ram_gib": 23.54, "disk_read_gbs": 0.13, "gpu": "", "vram_gib": 0.0, "device": "node1"},
        {"cpu_cores": 2, "ram_gib": 23.54, "disk_read_gbs": 0.44, "gpu": "", "vram_gib": 0.0, "device": "node2"}]


def test_profile_summary_of_missing_rows_and_odd_cells():
    profile = {"ranks": ["Rank 0", "Rank 1"],
               "rows": {"Device Name": ["a", "b"], "Number of CPU cores": ["8", "?"],
                        "Disk Read Seq Speed (GB/s)": ["inf", "-nan"], "GPU Name": ["RTX 4090", ""]}}
    assert bench_log.profile_summary(profile) == [
        {"cpu_cores": 8, "ram_gib": None, "disk_read_gbs": None, "gpu": "RTX 4090", "vram_gib": None, "device": "a"},
        {"cpu_cores": None, "ram_gib": None, "disk_read_gbs": None, "gpu": "", "vram_gib": None, "device": "b"}]


# --- llama-bench ----------------------------------------------------------------------------------

def test_llama_bench_json():
    assert bench_log.parse_llama_bench_json(fixture("llamacpp-bench-rpc2-json.stdout")) == [
        {"test": "pp64", "n_prompt": 64, "n_gen": 0, "avg_ts": 4127.531462, "stddev_ts": 51.075356,
         "samples_ts": [4138.48, 4172.25, 4071.87], "backends": "RPC", "n_gpu_layers": 99,
         "model_type": "llama ?B F16"},
        {"test": "tg32", "n_prompt": 0, "n_gen": 32, "avg_ts": 346.240261, "stddev_ts": 4.706601,
         "samples_ts": [349.962, 347.809, 340.95], "backends": "RPC", "n_gpu_layers": 99,
         "model_type": "llama ?B F16"}]


def test_llama_bench_json_cut_off_with_nan():
    text = fixture("llamacpp-bench-rpc2-json.stdout")
    text = text.replace('"stddev_ts": 51.075356', '"stddev_ts": NaN').replace("4172.25", "Infinity")
    cut = text[:text.index('"avg_ts": 346.240261')]  # killed during the second test
    [first] = bench_log.parse_llama_bench_json(cut)
    assert first["test"] == "pp64" and first["avg_ts"] == 4127.531462
    assert first["stddev_ts"] is None and first["samples_ts"] == [4138.48, None, 4071.87]


def test_llama_bench_jsonl_names_mixed_and_deep_tests():
    record = json.loads(fixture("llamacpp-bench-rpc2-json.stdout"))[0]
    record.update(n_prompt=512, n_gen=128, n_depth=1024)
    [result] = bench_log.parse_llama_bench_json("main: loading\n" + json.dumps(record) + "\n")
    assert result["test"] == "pp512+tg128 @ d1024"


def test_llama_bench_md_local():
    assert bench_log.parse_llama_bench_md(fixture("llamacpp-bench-local-md.stdout")) == [
        {"model": "llama ?B F16", "size": "43.27 MiB", "params": "22.68 M", "backend": "CPU", "threads": "2",
         "test": "pp64", "t/s": "9530.80 \u00b1 852.90", "avg_ts": 9530.8, "stddev_ts": 852.9},
        {"model": "llama ?B F16", "size": "43.27 MiB", "params": "22.68 M", "backend": "CPU", "threads": "2",
         "test": "tg32", "t/s": "1127.29 \u00b1 12.68", "avg_ts": 1127.29, "stddev_ts": 12.68}]


def test_llama_bench_md_rpc_has_ngl_not_threads():
    rows = bench_log.parse_llama_bench_md(fixture("llamacpp-bench-rpc2-md.stdout"))
    assert [(row["backend"], row["ngl"], row["test"], row["avg_ts"], row["stddev_ts"]) for row in rows] == [
        ("RPC", "99", "pp64", 4094.67, 4.9), ("RPC", "99", "tg32", 371.48, 53.11)]
    assert "threads" not in rows[0]


def test_llama_bench_md_sweep_keys_by_header():
    rows = bench_log.parse_llama_bench_md(fixture("llamacpp-bench-rpc2-ts-ngl-sweep-md.stdout"))
    assert list(rows[0]) == ["model", "size", "params", "backend", "ngl", "ts", "test", "t/s", "avg_ts",
                             "stddev_ts"]
    assert [(row["ngl"], row["ts"], row["test"], row["avg_ts"], row["stddev_ts"]) for row in rows] == [
        ("0", "1.00/1.00", "pp64", 8896.78, 727.93), ("0", "1.00/1.00", "tg32", 999.31, 0.32),
        ("0", "1.00/3.00", "pp64", 8911.25, 1259.15), ("0", "1.00/3.00", "tg32", 994.73, 2.35),
        ("4", "1.00/1.00", "pp64", 4576.77, 167.97), ("4", "1.00/1.00", "tg32", 464.81, 6.73),
        ("4", "1.00/3.00", "pp64", 4922.76, 652.21), ("4", "1.00/3.00", "tg32", 463.70, 97.01),
        ("99", "1.00/1.00", "pp64", 4234.67, 124.34), ("99", "1.00/1.00", "tg32", 354.34, 36.03),
        ("99", "1.00/3.00", "pp64", 4210.00, 21.03), ("99", "1.00/3.00", "tg32", 385.07, 55.20)]


def test_llama_bench_md_inf_and_crlf():
    text = fixture("llamacpp-bench-local-md.stdout").replace("9530.80 \u00b1 852.90", "inf \u00b1 -nan")
    rows = bench_log.parse_llama_bench_md(text.replace("\n", "\r\n"))
    assert (rows[0]["avg_ts"], rows[0]["stddev_ts"]) == (None, None)
    assert (rows[1]["test"], rows[1]["avg_ts"]) == ("tg32", 1127.29)


def test_llama_bench_md_without_a_table():
    assert bench_log.parse_llama_bench_md("build: 0c1e570 (11312)\n") == []


# --- llama-server ---------------------------------------------------------------------------------

def test_server_timings_llama_cpp():
    assert bench_log.parse_server_timings(fixture("llamacpp-server-curl-completion.json")) == {
        "prompt_n": 5, "prompt_ms": 8.875, "prompt_per_second": 563.3802816901409,
        "predicted_n": 32, "predicted_ms": 133.361, "predicted_per_second": 232.45176625850138}


def test_server_timings_prima():
    assert bench_log.parse_server_timings(fixture("prima-s1_server_world2_auto-completion.json")) == {
        "prompt_n": 2, "prompt_ms": 4.689, "prompt_per_second": 426.53017701002346,
        "predicted_n": 32, "predicted_ms": 60.268, "predicted_per_second": 530.9617043870711}


def test_server_timings_missing_or_not_numbers():
    nothing = dict.fromkeys(bench_log.TIMING_KEYS)
    assert bench_log.parse_server_timings('{"error":{"code":503,"message":"Loading model"}}') == nothing
    assert bench_log.parse_server_timings("") == nothing
    answer = json.loads(fixture("prima-s1_server_world2_auto-completion.json"))
    answer["timings"].update(prompt_ms=0.0, prompt_per_second=None)
    del answer["timings"]["predicted_n"]
    text = json.dumps(answer).replace('"predicted_per_second": 530.9617043870711', '"predicted_per_second": Infinity')
    timings = bench_log.parse_server_timings(text)
    assert timings["prompt_ms"] == 0.0 and timings["prompt_per_second"] is None
    assert timings["predicted_n"] is None and timings["predicted_per_second"] is None


# --- input no run prints, and a damaged or crafted file can hold ----------------------------------

def test_a_5000_digit_window_is_null_not_a_value_error():
    text = "Using window size: %s, GPU layers: %s\n" % ("9" * 5000, "0" * 4999 + "7")
    assert bench_log.parse_window(text) == {"window": None, "gpu_layers": 7}
    assert bench_log.parse_prima_rank(text)["window"] is None


def test_figures_out_of_range_are_null():
    assert bench_log.to_int(10 ** 400) is None and bench_log.to_float(10 ** 400) is None
    assert bench_log.to_float("1e999") is None and bench_log.to_float(2.0 ** 53) is None
    assert bench_log.to_int(2 ** 53 - 1) == 2 ** 53 - 1
    record = {"n_prompt": 10 ** 400, "n_gen": 32, "avg_ts": 1e300, "samples_ts": 7}
    [result] = bench_log.parse_llama_bench_json(json.dumps(record))
    assert (result["test"], result["n_prompt"], result["avg_ts"], result["samples_ts"]) == ("tg32", None, None, [])
    answer = '{"timings": {"prompt_n": 1%s, "prompt_ms": 1e999, "predicted_n": 3}}' % ("0" * 400)
    timings = bench_log.parse_server_timings(answer)
    assert (timings["prompt_n"], timings["prompt_ms"], timings["predicted_n"]) == (None, None, 3)


def test_json_nested_200k_deep_is_no_record_not_a_recursion_error():
    deep = "[" * 200000 + "]" * 200000
    assert bench_log.parse_server_timings(deep) == dict.fromkeys(bench_log.TIMING_KEYS)
    assert bench_log.parse_server_timings('{"timings": %s}' % deep) == dict.fromkeys(bench_log.TIMING_KEYS)
    good = fixture("llamacpp-bench-rpc2-json.stdout")
    assert bench_log.parse_llama_bench_json('{"a": %s}\n' % deep + good) == bench_log.parse_llama_bench_json(good)
