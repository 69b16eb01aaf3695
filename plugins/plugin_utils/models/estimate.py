"""What a split model should cost on the wire and in memory, from its GGUF header.

    python3 plugins/estimate.py --gguf FILE [--runtime prima|llama_rpc] [--act-bytes N] [--type-k T]
        [--type-v T] [--tps N] [--batch N] [--mem-gib A,B,...] [--rtt-ms X] [--link-gbit Y]
        [--single-ms-per-token Z] [--world W]

prints one JSON object. Pure arithmetic over the header (gguf_header.py reads it); a GGUF
with a header and no tensors is enough for everything but the context that fits (which
needs the weights' size). A figure out of float range comes out null.

A file that is not a readable model GGUF fails with one line naming it and what is wrong
(`<path>: not a GGUF file (...)`, `<path>: truncated at offset N (...)`, ...), exit status 2.

What crosses a pipeline boundary per token:
- prima.cpp (llama_send_tensors in its src/llama.cpp): the hidden state as f32 (n_embd x 4
  bytes) plus the token's int32 position, in one ZeroMQ multipart message per step with a
  fixed part (the keys "sub_gf_out" and "inp_pos", the int64 shape of each, frame headers).
- llama.cpp RPC: the activations as the graph holds them, f32 unless --act-bytes says other.
- A planning estimate that assumes fp16 activations (2 bytes an element): --act-bytes 2.
"""

import argparse
import json
import math
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from ansible_collections.prima.cluster.plugins.plugin_utils.models.gguf_header import GGUFError, model_facts

GIB = 1024 ** 3
# Bytes per element of the KV cache types llama.cpp offers (-ctk / -ctv): block size / block length.
KV_TYPE_BYTES = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0,
    "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32, "q4_1": 20 / 32, "q4_0": 18 / 32, "iq4_nl": 18 / 32,
}
# prima.cpp's fixed part of each message: "sub_gf_out" (10) + 4 x int64 shape (32) + "inp_pos" (7)
# + 1 x int64 shape (8), and six ZMTP short-frame headers of 2 bytes each.
PRIMA_MESSAGE_BYTES = 10 + 32 + 7 + 8 + 6 * 2
PRIMA_POSITION_BYTES = 4

# model_facts' header keys under the architecture's prefix, by fact; the estimate needs them.
ESTIMATE_KEYS = (("n_layer", "block_count"), ("n_embd", "embedding_length"), ("n_head_kv", "attention.head_count"),
                 ("key_length", "attention.head_count"), ("value_length", "attention.head_count"))


def whole(value: float) -> Any:
    """2052.0 -> 2052; fractional byte counts (quantized KV blocks) stay as they are."""
    return int(value) if float(value).is_integer() else value


def missing_for_estimate(facts: Dict[str, Any]) -> List[str]:
    """The header keys the estimate needs and the facts lack (a GGUF of another kind of model)."""
    missing: List[str] = []
    for fact, key in ESTIMATE_KEYS:
        full_key = "%s.%s" % (facts.get("architecture"), key)
        if facts.get(fact) is None and full_key not in missing:
            missing.append(full_key)
    return missing


def boundary_bytes_per_token(n_embd: int, runtime: str, act_bytes: Optional[float]) -> Dict[str, Any]:
    """Bytes per token that cross one pipeline boundary, and the fixed bytes per message."""
    if runtime == "prima":
        element = act_bytes or 4.0
        return {"per_token": whole(n_embd * element + PRIMA_POSITION_BYTES), "per_message": PRIMA_MESSAGE_BYTES,
                "activation": "f32 hidden state + int32 position (prima.cpp llama_send_tensors)"
                if not act_bytes else "%g-byte activations (--act-bytes) + int32 position" % act_bytes}
    element = act_bytes or 4.0
    return {"per_token": whole(n_embd * element), "per_message": 0,
            "activation": "f32 activations (llama.cpp RPC)" if not act_bytes else "%g-byte activations" % act_bytes}


def link_mbit_s(bytes_per_token: float, tps: float, batch: int) -> float:
    """Decimal megabits per second across one boundary at tps tokens per second, batch sequences."""
    return bytes_per_token * tps * batch * 8 / 1e6


def kv_bytes_per_token(n_layer: int, n_head_kv: int, key_length: int, value_length: int, type_k: str,
                       type_v: str) -> float:
    for name in (type_k, type_v):
        if name not in KV_TYPE_BYTES:
            raise ValueError("KV cache type %r: use one of %s" % (name, ", ".join(sorted(KV_TYPE_BYTES))))
    return whole(n_layer * n_head_kv * (key_length * KV_TYPE_BYTES[type_k] + value_length * KV_TYPE_BYTES[type_v]))


def context_fit_tokens(mem_gib: Sequence[float], weights_bytes: int, kv_per_token: float,
                       reserve_gib_per_node: float) -> Optional[int]:
    """Tokens of KV cache that fit in the nodes' memory after the weights and a compute reserve per node;
    None when the memory given is past float range."""
    free = sum(mem_gib) * GIB - weights_bytes - reserve_gib_per_node * GIB * len(mem_gib)
    if not math.isfinite(free):
        return None
    return max(int(free // kv_per_token), 0) if kv_per_token > 0 else 0


def decode_estimate(single_ms_per_token: float, world: int, boundaries: int, bytes_per_token: float,
                    per_message: float, rtt_ms: float, link_gbit: float) -> Dict[str, float]:
    """Latency-bound decode: the layers' compute (split or not, one token walks every layer once)
    plus, per boundary crossed, half a round trip and the transfer time of one token's message."""
    transfer_ms = (bytes_per_token + per_message) * 8 / (link_gbit * 1e9) * 1000 if link_gbit else 0.0
    network_ms = boundaries * (rtt_ms / 2 + transfer_ms)
    per_token = single_ms_per_token + network_ms
    return {"compute_ms_per_token": single_ms_per_token, "network_ms_per_token": network_ms,
            "transfer_ms_per_boundary": transfer_ms, "ms_per_token": per_token,
            "decode_tps": 1000.0 / per_token if per_token > 0 else 0.0, "world": world, "boundaries": boundaries}


def boundaries_crossed(runtime: str, world: int) -> int:
    """prima.cpp's ring: every rank hands to the next, and the last back to rank 0 (world hops);
    llama.cpp RPC: the head sends to and reads back from each worker (2 per worker)."""
    if world <= 1:
        return 0
    return world if runtime == "prima" else 2 * (world - 1)


def estimate(facts: Dict[str, Any], runtime: str = "prima", act_bytes: Optional[float] = None, type_k: str = "f16",
             type_v: str = "f16", tps: float = 1.0, batch: int = 1, mem_gib: Optional[List[float]] = None,
             rtt_ms: Optional[float] = None, link_gbit: Optional[float] = None,
             single_ms_per_token: Optional[float] = None, world: Optional[int] = None,
             reserve_gib_per_node: float = 0.5) -> Dict[str, Any]:
    boundary = boundary_bytes_per_token(facts["n_embd"], runtime, act_bytes)
    result = dict(facts)
    link = link_mbit_s(boundary["per_token"], tps, batch)
    result.update({
        "runtime": runtime, "activation": boundary["activation"],
        "boundary_bytes_per_token": boundary["per_token"], "boundary_bytes_per_message": boundary["per_message"],
        "tps": tps, "batch": batch, "link_mbit_s": link,
        "type_k": type_k, "type_v": type_v,
        "kv_bytes_per_token": kv_bytes_per_token(facts["n_layer"], facts["n_head_kv"], facts["key_length"],
                                                 facts["value_length"], type_k, type_v),
    })
    if link_gbit:
        result["link_share"] = link / (link_gbit * 1000)
    if mem_gib:
        if not facts["tensor_bytes"]:
            raise ValueError("the context fit needs the weights: this GGUF has a header and no tensors")
        result["context_fit_tokens"] = context_fit_tokens(mem_gib, facts["file_bytes"], result["kv_bytes_per_token"],
                                                          reserve_gib_per_node)
        result["reserve_gib_per_node"] = reserve_gib_per_node
    if single_ms_per_token is not None:
        ranks = world or (len(mem_gib) if mem_gib else 1)
        result["decode"] = decode_estimate(single_ms_per_token, ranks, boundaries_crossed(runtime, ranks),
                                           boundary["per_token"], boundary["per_message"], rtt_ms or 0.0,
                                           link_gbit or 0.0)
    return result


def finite_or_none(value: Any) -> Any:
    """`value` with every non-finite float in it (a figure past float range) made None: JSON has no
    Infinity."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite_or_none(item) for item in value]
    return value


def finite_number(text: str) -> float:
    """argparse's type for figures: a finite float (inf and nan are refused by name)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError("%r is not a finite number" % text)
    return value


def parse_mem_gib(text: str) -> List[float]:
    """--mem-gib 24,24,8 -> [24.0, 24.0, 8.0]; ValueError naming the option otherwise."""
    try:
        return [finite_number(part) for part in text.split(",")]
    except argparse.ArgumentTypeError as error:
        raise ValueError("--mem-gib %s: %s" % (text, error)) from None


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--gguf", required=True, help="the model file (a header-only GGUF is enough)")
    parser.add_argument("--runtime", choices=["prima", "llama_rpc"], default="prima")
    parser.add_argument("--act-bytes", type=finite_number, help="bytes per activation element (default: f32, 4)")
    parser.add_argument("--type-k", default="f16", help="KV cache type of K (-ctk)")
    parser.add_argument("--type-v", default="f16", help="KV cache type of V (-ctv)")
    parser.add_argument("--tps", type=finite_number, default=1.0, help="tokens per second for the link traffic")
    parser.add_argument("--batch", type=int, default=1, help="sequences decoded at once")
    parser.add_argument("--mem-gib", help="usable memory per node, comma separated (GiB)")
    parser.add_argument("--reserve-gib", type=finite_number, default=0.5, help="compute buffers per node (GiB)")
    parser.add_argument("--rtt-ms", type=finite_number, help="measured round trip between neighbouring ranks")
    parser.add_argument("--link-gbit", type=finite_number, help="link rate, Gbit/s")
    parser.add_argument("--single-ms-per-token", type=finite_number, help="ms per token of the single-node run")
    parser.add_argument("--world", type=int, help="ranks (default: one per --mem-gib entry)")
    args = parser.parse_args(argv)
    if not os.path.exists(args.gguf):
        parser.error("--gguf %s: no such file" % args.gguf)
    try:
        mem = parse_mem_gib(args.mem_gib) if args.mem_gib else None
        facts = model_facts(args.gguf)
        missing = missing_for_estimate(facts)
        if missing:
            raise GGUFError(args.gguf, "no %s in the header; the estimate needs %s"
                            % (", ".join(missing), "it" if len(missing) == 1 else "them"))
        result = estimate(facts, args.runtime, args.act_bytes, args.type_k, args.type_v, args.tps, args.batch, mem,
                          args.rtt_ms, args.link_gbit, args.single_ms_per_token, args.world, args.reserve_gib)
    except (ValueError, OSError) as error:
        print("estimate.py: %s" % error, file=sys.stderr)
        return 2
    print(json.dumps(finite_or_none(result), sort_keys=True, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
