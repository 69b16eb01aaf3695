"""The log parsers and the estimator against input no program printed: seeded random cuts, flipped
bytes, noise and huge numbers, laid over the real captured files. The property: nothing raises (the
GGUF reader: a GGUFError of one line naming the file), nothing hangs, and every result dumps as
strict JSON (no Infinity, no NaN). Deterministic (fixed seeds); a few seconds in all."""

import json
import os
import random
import re
import time

import gguf
import numpy as np
import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.bench import log as bench_log
from ansible_collections.prima.cluster.plugins.plugin_utils.bench import perflog
from ansible_collections.prima.cluster.plugins.plugin_utils.models import estimate, gguf_header

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
TEXTS = ("perf/prima-a_world2-rank0.stderr", "perf/llamacpp-single-llama-completion.stderr",
         "benchlog/prima-b_world3-rank0.stderr", "benchlog/prima-q1_world3_q8_0_auto-rank0.stderr",
         "benchlog/llamacpp-bench-rpc2-json.stdout", "benchlog/llamacpp-bench-rpc2-ts-ngl-sweep-md.stdout",
         "benchlog/llamacpp-server-curl-completion.json", "benchlog/prima-s1_server_world2_auto-completion.json")
HUGE = ("9" * 400, "9" * 5000, "0" * 5000 + "1", "1e999", "-1e999", "1e308", "9007199254740993", "inf", "-nan",
        "NaN", "Infinity", "\u0663\u0664", "1" + "0" * 4299)
NOISE = "0123456789 .,:=/|-+e\n\r\t{}[]\"\x1b[ \u00b1\u017f\u0131\u212a\ufffd"
SLOW_S = 2.0  # every case here takes milliseconds; the quadratic regexes this guards against took minutes


def fixture(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8", errors="replace") as handle:
        return handle.read()


def strict_dump(value):
    return json.dumps(value, allow_nan=False)


# --- mutations -------------------------------------------------------------------------------------

def cut(rng, text):
    return text[:rng.randrange(len(text) + 1)]


def flip(rng, text):
    chars = list(text)
    for dummy in range(rng.randrange(1, 8)):
        chars[rng.randrange(len(chars))] = rng.choice(NOISE)
    return "".join(chars)


def huge_numbers(rng, text):
    """Some of the text's numbers replaced by figures no run prints."""
    return re.sub(r"\d+(?:\.\d+)?", lambda match: rng.choice(HUGE) if rng.random() < 0.3 else match.group(0), text)


def noise(rng, text):
    at = rng.randrange(len(text) + 1)
    return text[:at] + "".join(rng.choices(NOISE, k=rng.randrange(1, 200))) + text[at:]


def repeat_a_line(rng, text):
    lines = text.split("\n")
    line = rng.choice(lines)
    return "\n".join(lines + [line] * rng.randrange(2, 300))


def random_bytes(rng, _text):
    return rng.randbytes(rng.randrange(2000)).decode("latin-1")


MUTATIONS = (cut, flip, huge_numbers, noise, repeat_a_line, random_bytes)


def mutated_texts(seed, count):
    rng = random.Random(seed)
    texts = [fixture(name) for name in TEXTS]
    for dummy in range(count):
        text = rng.choice(texts)
        for mutation in rng.sample(MUTATIONS, rng.randrange(1, 3)):
            text = mutation(rng, text)
        yield text


# --- the text parsers ------------------------------------------------------------------------------

def parse_everything(text):
    """Every text parser of bench/perflog.py and bench/log.py on `text`, as one JSON-ready value."""
    rank = bench_log.parse_prima_rank(text)
    return {"perf": perflog.parse_perf(text), "file": perflog.file_figures(text),
            "server": perflog.parse_server_timings(perflog.json_object(text)), "rank": rank,
            "summary": bench_log.profile_summary(rank["profile"]), "bench_json": bench_log.parse_llama_bench_json(text),
            "bench_md": bench_log.parse_llama_bench_md(text), "timings": bench_log.parse_server_timings(text)}


@pytest.mark.parametrize("seed", range(4))
def test_text_parsers_never_raise_and_give_strict_json(seed):
    for text in mutated_texts(seed, 40):
        started = time.monotonic()
        strict_dump(parse_everything(text))
        assert time.monotonic() - started < SLOW_S, text[:200]


PATHOLOGICAL = {
    "long blanks in an allocation item": "----- Allocation Strategy (by HiGHS) -----\nnode0:\n  - Device Index"
                                         + " " * 100000 + "x\n",
    "a line of perf markers": "llama_perf_" * 50000,
    "a 5000-digit window": "Using window size: %s, GPU layers: %s\n" % ("9" * 5000, "9" * 5000),
    "JSON nested 200k deep": "[" * 200000 + "]" * 200000,
    "an object nested 200k deep": '{"timings": ' + "[" * 200000 + "]" * 200000 + "}",
    "a huge JSON figure": '{"timings": {"prompt_n": 1%s, "prompt_ms": 1e999}}' % ("0" * 400),
    "a table row of pipes": "| a | t/s |\n|---|---|\n" + "|" * 100000 + "\n",
    "a profile header alone": "| Property | " * 20000,
}


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_pathological_shapes_are_quick_and_strict_json(name):
    started = time.monotonic()
    strict_dump(parse_everything(PATHOLOGICAL[name]))
    assert time.monotonic() - started < SLOW_S


def test_perflog_command_line_on_damaged_files(tmp_path, capsys):
    rng = random.Random(7)
    for index, text in enumerate(mutated_texts(7, 25)):
        path = tmp_path / ("file%d" % index)
        data = text.encode("utf-8", "surrogatepass")
        if rng.random() < 0.3:
            data = rng.randbytes(300) + data  # not UTF-8 either
        path.write_bytes(data)
        status = perflog.main([str(path)])
        out, err = capsys.readouterr()
        if status == 0:
            [record] = json.loads(out, parse_constant=pytest.fail)
            assert list(record) == list(perflog.PERF_KEYS)
        else:
            assert status == 1 and out == "" and err.count("\n") == 1 and str(path) in err


# --- the estimator -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_bytes(tmp_path_factory):
    """A small llama GGUF with a vocabulary (string, float and int arrays) and two tensors."""
    path = str(tmp_path_factory.mktemp("gguf") / "model.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_context_length(512)
    writer.add_token_list(["<s>", "a", "b", "\u00e9t\u00e9"] * 8)
    writer.add_token_scores([0.5] * 32)
    writer.add_token_types([1] * 32)
    writer.add_tensor("token_embd.weight", np.ones((32, 64), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones((64,), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open(path, "rb") as handle:
        return handle.read()


def damaged_models(whole, seed):
    """(label, bytes): cuts at every offset of the first 64 bytes and at random ones, flipped bits
    (half of them in the header, where they matter), random bytes, a GGUF magic before random bytes."""
    rng = random.Random(seed)
    header_end = whole.index(b"output_norm.weight") + 40
    for offset in list(range(64)) + rng.sample(range(len(whole)), 40):
        yield "cut at %d" % offset, whole[:offset]
    for dummy in range(80):
        data = bytearray(whole)
        for dummy in range(rng.randrange(1, 4)):
            data[rng.randrange(header_end if rng.random() < 0.5 else len(whole))] ^= 1 << rng.randrange(8)
        yield "flipped", bytes(data)
    for size in (1, 3, 4, 8, 24, 100, 5000):
        garbage = rng.randbytes(size)
        yield "random", garbage
        yield "random after the magic", b"GGUF\x03\x00\x00\x00" + garbage


def assert_one_line_about(error, path):
    message = str(error)
    assert isinstance(error, gguf_header.GGUFError), repr(error)
    assert "\n" not in message and message.startswith(path + ": ") and len(message) < 400, message


@pytest.mark.parametrize("seed", range(2))
def test_model_facts_on_damaged_files(tmp_path, model_bytes, seed):
    path = str(tmp_path / "model.gguf")
    for label, data in damaged_models(model_bytes, seed):
        with open(path, "wb") as handle:
            handle.write(data)
        started = time.monotonic()
        try:
            strict_dump(gguf_header.model_facts(path))
        except gguf_header.GGUFError as error:
            assert_one_line_about(error, path)
        assert time.monotonic() - started < SLOW_S, label


def test_header_facts_on_damaged_prefixes(tmp_path, model_bytes):
    prefix = str(tmp_path / "prefix.gguf")
    for label, data in damaged_models(model_bytes, 2):
        with open(prefix, "wb") as handle:
            handle.write(data)
        try:
            strict_dump(gguf_header.header_facts(prefix, len(model_bytes), "/models/m.gguf"))
        except gguf_header.GGUFError as error:
            assert_one_line_about(error, "/models/m.gguf")
            assert str(tmp_path) not in str(error), label  # the local copy is no use to the reader


def test_estimate_command_line_on_damaged_files(tmp_path, model_bytes, capsys):
    path = str(tmp_path / "model.gguf")
    rng = random.Random(3)
    for label, data in damaged_models(model_bytes, 3):
        if rng.random() > 0.25:
            continue
        with open(path, "wb") as handle:
            handle.write(data)
        status = estimate.main(["--gguf", path, "--tps", "10", "--mem-gib", "1,1e300", "--single-ms-per-token", "5"])
        out, err = capsys.readouterr()
        if status == 0:
            json.loads(out, parse_constant=pytest.fail)
        else:
            assert status == 2 and out == "", label
            [line] = err.splitlines()
            assert line.startswith("estimate.py: %s: " % path), line
