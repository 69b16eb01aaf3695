"""The estimator against cases worked out by hand (the arithmetic is in each test)."""

import json
import subprocess
import sys
import os

import gguf
import numpy as np
import pytest

from ansible_collections.prima.cluster.plugins.plugin_utils.estimate import (GIB, boundaries_crossed, decode_estimate,
                                                                             estimate, header_facts,
                                                                             kv_bytes_per_token, main, model_facts)

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
