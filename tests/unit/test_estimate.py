"""The estimator against cases worked out by hand (the arithmetic is in each test)."""

import json
import subprocess
import sys
import os

import gguf
import numpy as np
import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.models import gguf_header
from ansible_collections.prima.cluster.plugins.plugin_utils.models.estimate import (
    GIB, boundaries_crossed, decode_estimate, estimate, kv_bytes_per_token, main)
from ansible_collections.prima.cluster.plugins.plugin_utils.models.gguf_header import header_facts, model_facts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def header_only(path, layers=80, embd=8192, heads=64, heads_kv=8, context=8192, tensors=None):
    """A Llama-3-70B-shaped GGUF header (no tensors unless given)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_embedding_length(embd)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads_kv)
    writer.add_context_length(context)
    for name, array in (tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@pytest.fixture()
def llama70b(tmp_path):
    return model_facts(header_only(tmp_path / "70b-header.gguf"))


def test_header_facts(llama70b):
    assert (llama70b["n_layer"], llama70b["n_embd"], llama70b["n_head"], llama70b["n_head_kv"]) == (80, 8192, 64, 8)
    assert llama70b["key_length"] == llama70b["value_length"] == 8192 // 64 == 128
    assert llama70b["context_length"] == 8192 and llama70b["tensor_bytes"] == 0


def test_prima_sends_f32_hidden_state_and_a_position(llama70b):
    result = estimate(llama70b, "prima", tps=10, batch=1, link_gbit=1)
    # 8192 floats x 4 bytes + one int32 position = 32772 bytes a token
    assert result["boundary_bytes_per_token"] == 8192 * 4 + 4 == 32772
    # 32772 bytes x 10 tokens/s x 8 bits / 1e6 = 2.62176 Mbit/s, 0.262% of 1 Gbit/s
    assert result["link_mbit_s"] == pytest.approx(2.62176)
    assert result["link_share"] == pytest.approx(2.62176 / 1000)
    assert "f32" in result["activation"]


def test_the_pages_fp16_assumption_and_llama_rpc(llama70b):
    assert estimate(llama70b, "prima", act_bytes=2)["boundary_bytes_per_token"] == 8192 * 2 + 4 == 16388
    assert estimate(llama70b, "llama_rpc")["boundary_bytes_per_token"] == 8192 * 4
    # batch 4 at 25 t/s over RPC: 32768 x 25 x 4 x 8 / 1e6 = 26.2144 Mbit/s
    assert estimate(llama70b, "llama_rpc", tps=25, batch=4)["link_mbit_s"] == pytest.approx(26.2144)


def test_kv_cache_bytes_per_token():
    # f16 K and V: 80 layers x 8 KV heads x (128 + 128) x 2 bytes = 327680 bytes (320 KiB) a token
    assert kv_bytes_per_token(80, 8, 128, 128, "f16", "f16") == 80 * 8 * 256 * 2 == 327680
    # q8_0: 34 bytes per block of 32 -> 80 x 8 x 256 x 34/32 = 174080
    assert kv_bytes_per_token(80, 8, 128, 128, "q8_0", "q8_0") == 174080
    # q4_0 K (18/32) with f16 V: 80 x 8 x (128 x 18/32 + 128 x 2) = 80 x 8 x 328 = 209920
    assert kv_bytes_per_token(80, 8, 128, 128, "q4_0", "f16") == 209920
    with pytest.raises(ValueError, match="KV cache type 'q3'"):
        kv_bytes_per_token(80, 8, 128, 128, "q3", "f16")


def test_context_fit_needs_and_uses_the_weights(tmp_path, llama70b):
    with pytest.raises(ValueError, match="header and no tensors"):
        estimate(llama70b, mem_gib=[24, 24])
    tensors = {"token_embd.weight": np.zeros((64, 1024), dtype=np.float32)}  # 256 KiB of weights
    path = header_only(tmp_path / "small.gguf", layers=2, embd=64, heads=4, heads_kv=4, context=512, tensors=tensors)
    facts = model_facts(path)
    result = estimate(facts, mem_gib=[1, 1], reserve_gib_per_node=0.25)
    # KV: 2 layers x 4 heads x (16 + 16) x 2 bytes = 512 bytes a token
    assert result["kv_bytes_per_token"] == 512
    # free: 2 GiB - the file - 2 x 0.25 GiB reserve, in 512-byte tokens
    assert result["context_fit_tokens"] == int((2 * GIB - os.path.getsize(path) - 0.5 * GIB) // 512)


def test_facts_from_the_first_bytes_of_the_weights(tmp_path):
    # What bench.yml fetches from a node: the file's first bytes only.
    tensors = {"token_embd.weight": np.ones((64, 4096), dtype=np.float32)}  # 1 MiB of weights
    path = header_only(tmp_path / "whole.gguf", layers=2, embd=64, heads=4, heads_kv=4, context=512, tensors=tensors)
    whole = model_facts(path)
    prefix = tmp_path / "prefix.gguf"
    prefix.write_bytes(open(path, "rb").read(64 * 1024))
    assert header_facts(str(prefix), os.path.getsize(path)) == dict(whole)
    # Too few bytes for the header itself: said, with the way out.
    prefix.write_bytes(open(path, "rb").read(40))
    with pytest.raises(ValueError, match="do not hold the whole GGUF header"):
        header_facts(str(prefix), os.path.getsize(path))


def test_latency_bound_decode():
    assert boundaries_crossed("prima", 3) == 3 and boundaries_crossed("llama_rpc", 3) == 4
    assert boundaries_crossed("prima", 1) == 0
    result = decode_estimate(50.0, 3, 3, 32772, 69, 0.2, 1.0)
    # one token's message: (32772 + 69) bytes x 8 / 1e9 bit/s = 0.262728 ms; three hops of 0.1 + 0.262728 ms
    assert result["transfer_ms_per_boundary"] == pytest.approx(0.262728)
    assert result["ms_per_token"] == pytest.approx(50 + 3 * (0.1 + 0.262728))
    assert result["decode_tps"] == pytest.approx(1000 / 51.088184)


def test_command_line(tmp_path, capsys):
    path = header_only(tmp_path / "70b-header.gguf")
    assert main(["--gguf", path, "--tps", "10", "--link-gbit", "2.5", "--type-k", "q8_0", "--type-v", "q8_0"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {key: result[key] for key in ("n_layer", "n_embd", "n_head_kv", "boundary_bytes_per_token",
                                         "kv_bytes_per_token")} == {
        "n_layer": 80, "n_embd": 8192, "n_head_kv": 8, "boundary_bytes_per_token": 32772, "kv_bytes_per_token": 174080}
    assert result["link_mbit_s"] == pytest.approx(2.62176)
    failed = subprocess.run([sys.executable, os.path.join(ROOT, "plugins", "estimate.py"), "--gguf", path,
                             "--mem-gib", "24,24"], capture_output=True, text=True, check=False)
    assert failed.returncode == 2 and "header and no tensors" in failed.stderr


# --- damaged files: one line naming the file and what is wrong -------------------------------------

def small_model(path, embedding_length=64):
    """A 2-layer llama GGUF with a vocabulary (a string array and a float array) and one tensor;
    `embedding_length` goes in as given (a str makes it a string field)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    if isinstance(embedding_length, str):
        writer.add_string("llama.embedding_length", embedding_length)
    else:
        writer.add_embedding_length(embedding_length)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_context_length(512)
    writer.add_token_list(["a", "b", "c"] * 10)
    writer.add_token_scores([0.0] * 30)
    writer.add_tensor("token_embd.weight", np.ones((64, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def field_offset(path, key):
    """Where the value of `key` starts (after its name and type)."""
    field = gguf.GGUFReader(path).fields[key]
    return field.offset + 8 + len(key) + 4


def damaged(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return str(path)


def one_line_error(path, call=model_facts):
    with pytest.raises(gguf_header.GGUFError) as caught:
        call(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(path + ": "), message
    return message[len(path) + 2:]


def test_not_a_gguf_file(tmp_path):
    assert one_line_error(damaged(tmp_path, "empty.gguf", b"")) == "not a GGUF file (empty)"
    assert one_line_error(damaged(tmp_path, "text.gguf", b"hello, world\n")).startswith(
        "not a GGUF file (it starts with b'hell'")
    assert one_line_error(damaged(tmp_path, "v9.gguf", b"GGUF\x09\x00\x00\x00" + bytes(16))).startswith(
        "GGUF version 9")


def test_truncated_gguf_says_where(tmp_path):
    whole = open(small_model(tmp_path / "whole.gguf"), "rb").read()
    scores = field_offset(str(tmp_path / "whole.gguf"), "tokenizer.ggml.scores")
    assert one_line_error(damaged(tmp_path, "cut2.gguf", whole[:2])) == (
        "truncated at offset 2 (reading the magic at offset 0)")
    assert one_line_error(damaged(tmp_path, "cut30.gguf", whole[:30])) == (
        "truncated at offset 30 (reading the 8 keys at offset 24)")
    assert one_line_error(damaged(tmp_path, "cut-scores.gguf", whole[:scores + 20])) == (
        "truncated at offset %d (reading the 30 items of key 'tokenizer.ggml.scores' at offset %d)"
        % (scores + 20, scores + 12))
    message = one_line_error(damaged(tmp_path, "cut-data.gguf", whole[:-100]))
    assert message == "truncated at offset %d (tensor 'token_embd.weight' runs to offset %d)" % (
        len(whole) - 100, len(whole))


def test_bit_flips_say_what_is_wrong(tmp_path):
    path = small_model(tmp_path / "whole.gguf")
    whole = open(path, "rb").read()
    scores = field_offset(path, "tokenizer.ggml.scores")
    flipped = bytearray(whole)
    flipped[scores + 4 + 6] ^= 0x10  # the array's length, 30 -> 30 + 2**52: the gguf library loops on it
    assert one_line_error(damaged(tmp_path, "length.gguf", flipped)).startswith(
        "truncated at offset %d (reading the %d items of key 'tokenizer.ggml.scores'" % (len(whole), 30 + 2 ** 52))
    flipped = bytearray(whole)
    flipped[field_offset(path, "llama.block_count") - 4] = 77  # its value type
    assert one_line_error(damaged(tmp_path, "type.gguf", flipped)) == (
        "malformed GGUF at offset %d (key 'llama.block_count' has value type 77, which GGUF does not have)"
        % (field_offset(path, "llama.block_count") - 4))
    flipped = bytearray(whole)
    flipped[whole.index(b"llama.embedding_length") + 2] ^= 0x80  # an invalid UTF-8 key name
    assert "is not UTF-8" in one_line_error(damaged(tmp_path, "utf8.gguf", flipped))


def test_header_values_of_the_wrong_kind_or_missing(tmp_path, capsys):
    path = small_model(tmp_path / "text.gguf", embedding_length="8192")  # a TypeError escaped here
    assert one_line_error(path) == "llama.embedding_length is the text '8192', not a count"
    bare = str(tmp_path / "bare.gguf")
    writer = gguf.GGUFWriter(bare, "llama")
    writer.add_block_count(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert model_facts(bare)["n_embd"] is None  # bench_model_facts takes what there is
    assert main(["--gguf", bare]) == 2  # the estimate itself needs the widths: a TypeError escaped here
    assert capsys.readouterr().err == ("estimate.py: %s: no llama.embedding_length, llama.attention.head_count in "
                                       "the header; the estimate needs them\n" % bare)


def test_command_line_damaged_file_is_one_line_and_no_traceback(tmp_path):
    path = small_model(tmp_path / "whole.gguf")
    flipped = bytearray(open(path, "rb").read())
    flipped[field_offset(path, "tokenizer.ggml.tokens") + 4 + 8 + 5] ^= 0x01  # the first token's length
    failed = subprocess.run([sys.executable, os.path.join(ROOT, "plugins", "estimate.py"), "--gguf",
                             damaged(tmp_path, "flipped.gguf", flipped)], capture_output=True, text=True, check=False)
    assert failed.returncode == 2 and failed.stdout == ""
    [line] = failed.stderr.splitlines()
    assert line.startswith("estimate.py: %s: " % (tmp_path / "flipped.gguf")) and "Traceback" not in failed.stderr


def test_command_line_numbers_out_of_range(tmp_path, capsys):
    path = header_only(tmp_path / "small.gguf", layers=2, embd=64, heads=4, heads_kv=4, context=512,
                       tensors={"token_embd.weight": np.zeros((64, 64), dtype=np.float32)})
    assert main(["--gguf", path, "--mem-gib", "1,1e999"]) == 2
    assert "--mem-gib" in capsys.readouterr().err
    assert main(["--gguf", path, "--mem-gib", "1e300", "--tps", "1e308"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["context_fit_tokens"] is None and result["link_mbit_s"] is None


def test_header_facts_name_the_nodes_file(tmp_path):
    path = small_model(tmp_path / "whole.gguf")
    whole = open(path, "rb").read()
    prefix = damaged(tmp_path, "prefix.gguf", whole[:100])
    with pytest.raises(gguf_header.HeaderCut,
                       match=r"^/models/m\.gguf: the first 100 bytes do not hold the whole GGUF header \(reading "):
        header_facts(prefix, len(whole), "/models/m.gguf")
    other = damaged(tmp_path, "other.gguf", b"PK\x03\x04" + whole[4:])
    with pytest.raises(gguf_header.GGUFError, match=r"^/models/m\.gguf: not a GGUF file") as caught:
        header_facts(other, len(whole), "/models/m.gguf")
    assert not isinstance(caught.value, gguf_header.HeaderCut)
    # The bytes are the whole file, and it ends inside its header: no use fetching more.
    with pytest.raises(gguf_header.GGUFTruncated, match=r"^/models/m\.gguf: truncated at offset 100 \(reading "):
        header_facts(prefix, 100, "/models/m.gguf")
    # The header promises more tensor data than the node's file has: the file there is cut short.
    with pytest.raises(gguf_header.GGUFError,
                       match=r"^/models/m\.gguf: truncated at offset 1000 \(tensor 'token_embd.weight' runs to offset "):
        header_facts(damaged(tmp_path, "head.gguf", whole[:900]), 1000, "/models/m.gguf")


def run_bench_model_facts(tmp_path, prefix, size):
    """The bench_model_facts action on one model, its node side played by a copy of `prefix`."""
    from unittest import mock

    from ansible_collections.prima.cluster.plugins.action.bench_model_facts import ActionModule

    task = mock.MagicMock(async_val=0, check_mode=False, args={
        "models": {"m": {"path": "/models/m.gguf", "size": size, "total": size}}, "remote_dir": "/var/tmp"})
    connection = mock.MagicMock()
    connection.fetch_file.side_effect = lambda remote, local: open(local, "wb").write(open(prefix, "rb").read())
    action = ActionModule(task, connection, mock.MagicMock(), loader=None, templar=None)
    action._low_level_execute_command = mock.MagicMock(return_value={"rc": 0, "stdout": "", "stderr": ""})
    return action.run(task_vars={})


def test_bench_model_facts_fails_in_one_line_on_any_damage(tmp_path):
    from ansible.errors import AnsibleActionFail

    path = small_model(tmp_path / "good.gguf")
    facts = run_bench_model_facts(tmp_path, path, os.path.getsize(path))["ansible_facts"]["bench_model_facts"]["m"]
    assert (facts["n_layer"], facts["n_embd"]) == (2, 64)
    text = small_model(tmp_path / "text.gguf", embedding_length="8192")  # a TypeError escaped here
    with pytest.raises(AnsibleActionFail) as caught:
        run_bench_model_facts(tmp_path, text, os.path.getsize(text))
    assert str(caught.value) == ("m: /models/m.gguf: llama.embedding_length is the text '8192', not a count")
    cut = damaged(tmp_path, "cut.gguf", open(path, "rb").read()[:300])
    with pytest.raises(AnsibleActionFail,
                       match=r"^m: /models/m\.gguf: the first 300 bytes .*\(raise bench_header_mib\)$"):
        run_bench_model_facts(tmp_path, cut, os.path.getsize(path))


def test_a_byte_array_length_with_a_flipped_high_bit_fails_at_once(tmp_path):
    # The gguf library walked such an array item by item, past the end of the file, for hours.
    writer = gguf.GGUFWriter(str(tmp_path / "bytes.gguf"), "llama")
    writer.add_block_count(2)
    writer.add_array("x.bytes", [1, 2, 3])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    data = bytearray((tmp_path / "bytes.gguf").read_bytes())
    length = data.index(b"x.bytes") + len("x.bytes") + 4 + 4
    data[length + 5] = 1  # 3 -> 3 + 2**40
    assert one_line_error(damaged(tmp_path, "flipped.gguf", data)) == (
        "truncated at offset %d (reading the %d items of key 'x.bytes' at offset %d)"
        % (len(data), 3 + 2 ** 40, length + 8))
