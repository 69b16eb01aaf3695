"""The perf-line parser on real captured logs (tests/fixtures/perf, copied from runs of
prima.cpp bdf9d8e7 and llama.cpp 0c1e570) and on the other shapes seen in the wild."""

import json
import os
import subprocess
import sys

from ansible_collections.prima.cluster.plugins.plugin_utils import perflog

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "perf")
SCRIPT = os.path.join(os.path.dirname(FIXTURES), "..", "..", "plugins", "perflog.py")


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return handle.read()


def test_prima_rank0():
    assert perflog.parse_perf(fixture("prima-a_world2-rank0.stderr")) == {
        "load_ms": 38.48, "prompt_ms": 3.35, "prompt_tokens": 2, "prompt_tps": 597.55,
        "eval_ms": 38.73, "eval_runs": 26, "eval_tps": 671.33, "total_ms": 59.13, "total_tokens": 28,
        "sampling_ms": 0.89, "sampling_runs": 34}


def test_current_llama_cpp_behind_timestamps():
    figures = perflog.parse_perf(fixture("llamacpp-single-llama-completion.stderr"))
    assert figures["prompt_tps"] == 1716.44 and figures["eval_runs"] == 31 and figures["total_tokens"] == 36
    assert figures["sampling_ms"] == 1.91 and figures["sampling_runs"] is None  # "samplers time" is not it


def test_worker_log_has_none():
    assert perflog.parse_perf(fixture("prima-a_world2-rank1.stderr")) is None


def test_old_format_ansi_crlf_and_glued_text():
    text = ("\x1b[32mllama_print_timings:        load time =   812.40 ms\x1b[0m\r\n"
            "llama_print_timings:      sample time =    10.00 ms /   128 runs   (    0.08 ms per token, 12800.00 "
            "tokens per second)\r\n"
            "The answer is 42.llama_print_timings: prompt eval time =   200.00 ms /    16 tokens (   12.50 ms per "
            "token,    80.00 tokens per second)\r\n"
            "llama_print_timings:        eval time =  3000.00 ms /   127 runs   (   23.62 ms per token,    42.33 "
            "tokens per second)\r\n"
            "llama_print_timings:       total time =  3300.00 ms\r\n")
    assert perflog.parse_perf(text) == {
        "load_ms": 812.4, "prompt_ms": 200.0, "prompt_tokens": 16, "prompt_tps": 80.0, "eval_ms": 3000.0,
        "eval_runs": 127, "eval_tps": 42.33, "total_ms": 3300.0, "total_tokens": None, "sampling_ms": 10.0,
        "sampling_runs": 128}


def test_inf_is_not_a_number():
    text = "llama_perf_context_print: prompt eval time =       0.00 ms /     1 tokens (    0.00 ms per token,      " \
           "inf tokens per second)\n"
    figures = perflog.parse_perf(text)
    assert figures["prompt_ms"] == 0.0 and figures["prompt_tokens"] == 1 and figures["prompt_tps"] is None


def test_the_last_block_wins():
    first = ("llama_perf_context_print:        eval time =      10.00 ms /     5 runs   (    2.00 ms per token, "
             "  500.00 tokens per second)\n")
    second = first.replace("10.00 ms", "20.00 ms").replace("500.00", "250.00")
    assert perflog.parse_perf(first + second)["eval_tps"] == 250.0


def test_command_line(tmp_path):
    result = subprocess.run([sys.executable, SCRIPT, os.path.join(FIXTURES, "prima-a_world2-rank0.stderr")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert result.returncode == 0, result.stderr
    [record] = json.loads(result.stdout)
    assert list(record) == list(perflog.PERF_KEYS)
    assert record["eval_tps"] == 671.33


def test_command_line_names_the_file_without_perf_lines(tmp_path):
    empty = tmp_path / "worker.log"
    empty.write_text("No layer is assigned to me, exit.\n")
    result = subprocess.run([sys.executable, SCRIPT, os.path.join(FIXTURES, "prima-a_world2-rank0.stderr"),
                             str(empty)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert result.returncode == 1 and result.stdout == ""
    assert str(empty) in result.stderr and "has no llama.cpp/prima.cpp perf lines" in result.stderr
