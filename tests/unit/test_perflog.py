"""The perf-line parser on real captured logs (tests/fixtures/perf, copied from runs of
prima.cpp bdf9d8e7 and llama.cpp 0c1e570) and on the other shapes seen in the wild."""

import json
import os
import subprocess
import sys

from ansible_collections.prima.cluster.plugins.plugin_utils.bench import perflog

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


# --- numbers a log should never print, and a crafted log could ------------------------------------

def run_script(*paths):
    return subprocess.run([sys.executable, SCRIPT] + [str(path) for path in paths], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, check=False)


def strict_json(text):
    """json.loads that refuses NaN and Infinity, which are not JSON."""
    def refuse(literal):
        raise ValueError("not JSON: %s" % literal)
    return json.loads(text, parse_constant=refuse)


def test_a_400_digit_figure_is_null_not_an_overflow():
    text = "llama_perf_context_print:        load time = %s ms\n" % ("9" * 400)
    assert perflog.parse_perf(text)["load_ms"] is None
    text = "llama_perf_context_print:        eval time = 1.00 ms / %s runs\n" % ("9" * 5000)
    figures = perflog.parse_perf(text)
    assert figures["eval_ms"] == 1.0 and figures["eval_runs"] is None


def test_a_figure_past_float_range_is_null_in_strict_json(tmp_path):
    log = tmp_path / "rank0.stderr"
    log.write_text("llama_perf_context_print:        load time = 1e999 ms\n"
                   "llama_perf_context_print:        eval time = 1e300 ms / 9007199254740993 runs\n")
    result = run_script(log)
    assert result.returncode == 0, result.stderr
    [record] = strict_json(result.stdout)
    assert record["load_ms"] is None and record["eval_ms"] is None and record["eval_runs"] is None


def test_look_alike_letters_do_not_name_a_phase():
    # Unicode case folding would let U+017F (long s) match "s" and then miss the phase table.
    text = "llama_print_timings:      \u017fample time =    10.00 ms /   128 runs\n"
    assert perflog.parse_perf(text)["sampling_ms"] is None


# --- llama-server answers --------------------------------------------------------------------------

BENCHLOG_FIXTURES = os.path.join(os.path.dirname(FIXTURES), "benchlog")
# llama.cpp 0c1e570's /v1/chat/completions answer (shared fixtures, s-llama-server-2-workers/curl-chat.json).
LLAMA_CPP_CHAT = (
    '{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"e \\u043f\\u0440\\u043e'
    '\\u0432 header"}}],"created":1796201159,"model":"<work>/models/tiny-llama-spm32k-8L-256d-f16.gguf",'
    '"system_fingerprint":"b11312-0c1e570","object":"chat.completion","usage":{"completion_tokens":16,'
    '"prompt_tokens":29,"total_tokens":45,"prompt_tokens_details":{"cached_tokens":0}},'
    '"id":"chatcmpl-X7cON3DANZNhDm5gx1LEp8THPLjW5myr","timings":{"cache_n":0,"prompt_n":29,"prompt_ms":13.917,'
    '"prompt_per_token_ms":0.4798965517241379,"prompt_per_second":2083.7824243730693,"predicted_n":16,'
    '"predicted_ms":61.273,"predicted_per_token_ms":4.084866666666667,"predicted_per_second":244.80603202062898}}\n')
# prima.cpp bdf9d8e7's /v1/chat/completions answer (s1_server_world2_auto/chat_completion.json): no timings.
PRIMA_CHAT = ('{"choices":[{"finish_reason":"stop","index":0,"message":{"content":"una surrounding",'
              '"role":"assistant"}}],"created":1796201848,"model":"gpt-3.5-turbo-0613","object":"chat.completion","usage":'
              '{"completion_tokens":16,"prompt_tokens":29,"total_tokens":45},'
              '"id":"chatcmpl-6MROva7A56m0oBMN7x34I1iDHKWp45f3"}')
NO_LOG_FIGURES = {"load_ms": None, "total_ms": None, "total_tokens": None, "sampling_ms": None, "sampling_runs": None}


def server_fixture(name):
    with open(os.path.join(BENCHLOG_FIXTURES, name), encoding="utf-8") as handle:
        return json.load(handle)


def test_server_timings_of_a_llama_cpp_completion():
    assert perflog.parse_server_timings(server_fixture("llamacpp-server-curl-completion.json")) == dict(
        NO_LOG_FIGURES, prompt_tokens=5, prompt_ms=8.875, prompt_tps=563.3802816901409, eval_runs=32,
        eval_ms=133.361, eval_tps=232.45176625850138)


def test_server_timings_of_a_prima_completion_and_of_the_bare_timings_object():
    answer = server_fixture("prima-s1_server_world2_auto-completion.json")
    expected = dict(NO_LOG_FIGURES, prompt_tokens=2, prompt_ms=4.689, prompt_tps=426.53017701002346, eval_runs=32,
                    eval_ms=60.268, eval_tps=530.9617043870711)
    assert perflog.parse_server_timings(answer) == expected
    assert perflog.parse_server_timings(answer["timings"]) == expected


def test_server_timings_missing_odd_and_out_of_range_are_null():
    timings = {"prompt_n": True, "prompt_ms": "4.6", "prompt_per_second": float("inf"), "predicted_n": 10 ** 400,
               "predicted_ms": float("nan")}
    assert perflog.parse_server_timings({"timings": timings}) == dict.fromkeys(perflog.PERF_KEYS[1:])
    assert perflog.parse_server_timings([1, 2]) == dict.fromkeys(perflog.PERF_KEYS[1:])


def test_command_line_reads_server_answers(tmp_path):
    chat = tmp_path / "chat.json"
    chat.write_text(LLAMA_CPP_CHAT)
    completion = os.path.join(BENCHLOG_FIXTURES, "llamacpp-server-curl-completion.json")
    result = run_script(chat, completion)
    assert result.returncode == 0, result.stderr
    first, second = strict_json(result.stdout)
    assert list(first) == list(perflog.PERF_KEYS)
    assert first == dict(NO_LOG_FIGURES, file=str(chat), prompt_tokens=29, prompt_ms=13.917,
                         prompt_tps=2083.7824243730693, eval_runs=16, eval_ms=61.273, eval_tps=244.80603202062898)
    assert (second["file"], second["eval_tps"], second["load_ms"]) == (completion, 232.45176625850138, None)


def test_command_line_server_figures_past_range_are_null(tmp_path):
    answer = tmp_path / "completion.json"
    answer.write_text('{"timings": {"prompt_n": %s, "prompt_ms": 1e999, "prompt_per_second": Infinity,'
                      ' "predicted_n": 3, "predicted_ms": NaN}}' % ("9" * 400))
    result = run_script(answer)
    assert result.returncode == 0, result.stderr
    [record] = strict_json(result.stdout)
    assert record == dict(dict.fromkeys(perflog.PERF_KEYS), file=str(answer), eval_runs=3)


def test_command_line_names_an_answer_without_timings(tmp_path):
    chat = tmp_path / "prima-chat.json"
    chat.write_text(PRIMA_CHAT)
    result = run_script(chat)
    assert result.returncode == 1 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert str(chat) in line and "no timings" in line
