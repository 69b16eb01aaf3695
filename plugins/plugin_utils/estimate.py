"""What a split model should cost on the wire and in memory, from its GGUF header.

    python3 plugins/estimate.py --gguf FILE [--runtime prima|llama_rpc] [--act-bytes N] [--type-k T]
        [--type-v T] [--tps N] [--batch N] [--mem-gib A,B,...] [--rtt-ms X] [--link-gbit Y]
        [--single-ms-per-token Z] [--world W]

prints one JSON object. Pure arithmetic over the header (the gguf library reads it); a GGUF
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
import mmap
import os
import struct
import sys
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

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

# GGUF value types (gguf.constants.GGUFValueType; fixed by the format) -> struct format.
GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
GGUF_UINT32, GGUF_STRING, GGUF_ARRAY = 4, 8, 9
GGML_MAX_DIMS = 4
# The fewest bytes a key (name length, type, a 1-byte value) and a tensor description (name
# length, dimension count, type, offset) take: a count that cannot fit is refused before it is
# looped over.
MIN_KEY_BYTES = 8 + 4 + 1
MIN_TENSOR_BYTES = 8 + 4 + 4 + 8
# model_facts' header keys under the architecture's prefix, by fact; the estimate needs them.
ESTIMATE_KEYS = (("n_layer", "block_count"), ("n_embd", "embedding_length"), ("n_head_kv", "attention.head_count"),
                 ("key_length", "attention.head_count"), ("value_length", "attention.head_count"))


class GGUFError(ValueError):
    """A file that is not a readable model GGUF. str() is one line: `<name>: <problem>`."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__("%s: %s" % (name, problem))
        self.name, self.problem = name, problem


class GGUFTruncated(GGUFError):
    """The file ends (at `size`) before its header or its tensors do."""

    def __init__(self, name: str, size: int, what: str) -> None:
        super().__init__(name, "truncated at offset %d (%s)" % (size, what))
        self.size, self.what = size, what


class HeaderCut(GGUFError):
    """The first bytes of a weights file, fetched from a node, end inside the GGUF header."""


def whole(value: float) -> Any:
    """2052.0 -> 2052; fractional byte counts (quantized KV blocks) stay as they are."""
    return int(value) if float(value).is_integer() else value


# --- the GGUF header, checked before the gguf library reads it ------------------------------------
# The library indexes past the end of a cut file (IndexError, numpy view errors, tracebacks) and
# loops for ever on an array length with a flipped high bit; this walk bounds every length first.

class HeaderWalk:
    """A GGUF header read front to back, every length checked against the end of the file."""

    def __init__(self, data: "mmap.mmap", name: str) -> None:
        self.data, self.name, self.offset, self.order = data, name, 0, "<"

    def need(self, size: int, what: str) -> None:
        if self.offset + size > len(self.data):
            raise GGUFTruncated(self.name, len(self.data), "reading %s at offset %d" % (what, self.offset))

    def skip(self, size: int, what: str) -> None:
        self.need(size, what)
        self.offset += size

    def take(self, size: int, what: str) -> bytes:
        self.need(size, what)
        self.offset += size
        return self.data[self.offset - size:self.offset]

    def number(self, code: str, what: str) -> Any:
        size = struct.calcsize("<" + code)
        self.need(size, what)
        value = struct.unpack_from(self.order + code, self.data, self.offset)[0]
        self.offset += size
        return value

    def text(self, what: str) -> bytes:
        """A GGUF string (uint64 length, bytes); a cut in either part reads as one place, where it starts."""
        self.need(8, what)
        length = struct.unpack_from(self.order + "Q", self.data, self.offset)[0]
        return self.take(8 + length, what)[8:]

    def skip_texts(self, count: int, key: str) -> None:
        """Past `count` strings, the items of key `key` (quoted): text() in a tight loop, since a
        vocabulary has a quarter of a million of them."""
        data, offset, end, length_code = self.data, self.offset, len(self.data), self.order + "Q"
        for index in range(count):
            length = struct.unpack_from(length_code, data, offset)[0] if offset + 8 <= end else end
            if offset + 8 + length > end:
                raise GGUFTruncated(self.name, end, "reading item %d of key %s at offset %d" % (index + 1, key, offset))
            offset += 8 + length
        self.offset = offset

    def malformed(self, at: int, problem: str) -> GGUFError:
        return GGUFError(self.name, "malformed GGUF at offset %d (%s)" % (at, problem))

    def utf8(self, raw: bytes, at: int, what: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.malformed(at, "%s is not UTF-8" % what) from None


def quoted(name: str) -> str:
    """A key or tensor name for an error line: quoted, escaped, and cut at 60 characters (a bit flip
    in a name's length runs it into the bytes after it)."""
    return repr(name if len(name) <= 60 else name[:60] + "...")


def walk_start(walk: HeaderWalk) -> Tuple[int, int]:
    """Magic and version (which also tells the byte order); the tensor and key counts."""
    first = walk.data[:4]
    if not b"GGUF".startswith(first):
        raise GGUFError(walk.name, "not a GGUF file (it starts with %r, not b'GGUF')" % first)
    walk.skip(4, "the magic")
    version = walk.number("I", "the version")
    if version & 0xFFFF == 0:  # the gguf library's rule: a file written on a machine of the other byte order
        walk.order = ">"
        version = struct.unpack(">I", struct.pack("<I", version))[0]
    from gguf.gguf_reader import READER_SUPPORTED_VERSIONS

    if version not in READER_SUPPORTED_VERSIONS:
        raise GGUFError(walk.name, "GGUF version %d, which the gguf library does not read (it reads %s)"
                        % (version, ", ".join(str(known) for known in READER_SUPPORTED_VERSIONS)))
    return walk.number("Q", "the tensor count"), walk.number("Q", "the key count")


def walk_value(walk: HeaderWalk, value_type: int, key: str, at: int) -> Any:
    """Past one key's value (`key`: its name, quoted); returns it when it is a scalar (general.alignment
    is needed)."""
    what = "the value of key %s" % key
    if value_type in GGUF_SCALARS:
        return walk.number(GGUF_SCALARS[value_type], what)
    if value_type == GGUF_STRING:
        walk.text(what)
        return None
    if value_type != GGUF_ARRAY:
        raise walk.malformed(at, "key %s has value type %d, which GGUF does not have" % (key, value_type))
    item_type = walk.number("I", what)
    count = walk.number("Q", what)
    items = "the %d items of key %s" % (count, key)
    if item_type in GGUF_SCALARS:
        walk.skip(count * struct.calcsize("<" + GGUF_SCALARS[item_type]), items)
    elif item_type == GGUF_STRING:
        walk.need(count * 8, items)  # every string has at least its length
        walk.skip_texts(count, key)
    elif item_type == GGUF_ARRAY:
        raise walk.malformed(at, "key %s is an array of arrays, which llama.cpp does not read" % key)
    else:
        raise walk.malformed(at, "key %s has items of type %d, which GGUF does not have" % (key, item_type))
    return None


def walk_keys(walk: HeaderWalk, count: int) -> int:
    """Past the key/value section; returns the data alignment (general.alignment, or 32)."""
    walk.need(count * MIN_KEY_BYTES, "the %d keys" % count)
    alignment = 32  # GGUF's default
    seen: Set[str] = set()
    for index in range(count):
        at = walk.offset
        key = walk.utf8(walk.text("the name of key %d" % (index + 1)), at, "the name of key %d" % (index + 1))
        if key in seen:
            raise walk.malformed(at, "key %s appears twice" % quoted(key))
        seen.add(key)
        type_at = walk.offset
        value_type = walk.number("I", "the value type of key %s" % quoted(key))
        value = walk_value(walk, value_type, quoted(key), type_at)
        if key == "general.alignment":
            if value_type != GGUF_UINT32 or not value or value & (value - 1):
                raise walk.malformed(type_at, "general.alignment must be a power of two, as a uint32")
            alignment = value
    return alignment


def walk_tensor(walk: HeaderWalk, index: int, seen: Set[str]) -> Tuple[str, int]:
    """Past one tensor description; its name (quoted) and the offset its data ends at (from the data start)."""
    from gguf.constants import GGML_QUANT_SIZES

    at = walk.offset
    name = walk.utf8(walk.text("the name of tensor %d" % index), at, "the name of tensor %d" % index)
    if name in seen:
        raise walk.malformed(at, "tensor %s appears twice" % quoted(name))
    seen.add(name)
    name = quoted(name)
    n_dims = walk.number("I", "the dimensions of tensor %s" % name)
    if n_dims > GGML_MAX_DIMS:
        raise walk.malformed(at, "tensor %s has %d dimensions; GGML allows %d" % (name, n_dims, GGML_MAX_DIMS))
    dims = [walk.number("Q", "the dimensions of tensor %s" % name) for dummy in range(n_dims)]
    tensor_type = walk.number("I", "the type of tensor %s" % name)
    data_offset = walk.number("Q", "the data offset of tensor %s" % name)
    if tensor_type not in GGML_QUANT_SIZES:
        raise walk.malformed(at, "tensor %s has type %d, which the gguf library does not know" % (name, tensor_type))
    block, block_bytes = GGML_QUANT_SIZES[tensor_type]
    if dims and dims[0] % block:
        raise walk.malformed(at, "tensor %s has rows of %d, not whole blocks of %d" % (name, dims[0], block))
    return name, data_offset + math.prod(dims) * block_bytes // block


def check_gguf(path: str, name: str, tensor_data: bool = True) -> None:
    """Raises GGUFError, naming the file `name`, unless `path` holds a whole GGUF header the gguf
    library reads; with `tensor_data`, also unless every tensor's data lies inside the file."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            raise GGUFError(name, "not a GGUF file (empty)")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            walk = HeaderWalk(data, name)
            tensor_count, key_count = walk_start(walk)
            alignment = walk_keys(walk, key_count)
            walk.need(tensor_count * MIN_TENSOR_BYTES, "the %d tensor descriptions" % tensor_count)
            seen: Set[str] = set()
            ends = [walk_tensor(walk, index + 1, seen) for index in range(tensor_count)]
            data_start = -(-walk.offset // alignment) * alignment
    for tensor, end in ends if tensor_data else []:
        if data_start + end > size:
            raise GGUFTruncated(name, size, "tensor %s runs to offset %d" % (tensor, data_start + end))


def one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return "%s: %s" % (type(error).__name__, lines[0] if lines else "")


def open_gguf(path: str, name: str) -> Any:
    """The gguf library's reader over a checked file."""
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except Exception as error:  # the header checked out: whatever the library still trips on is the file's
        raise GGUFError(name, "the gguf library cannot read it (%s)" % one_line(error)) from None


def header_value(reader: Any, key: str, name: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    try:
        return field.contents() if hasattr(field, "contents") else field.parts[field.data[0]].tolist()[0]
    except (ValueError, IndexError) as error:  # a string value that is not UTF-8
        raise GGUFError(name, "the value of %s is unreadable (%s)" % (key, one_line(error))) from None


def describe(value: Any) -> str:
    """A header value in a few words, for an error line."""
    if isinstance(value, str):
        return "the text %r" % (value if len(value) <= 40 else value[:40] + "...")
    if isinstance(value, list):
        return "a list of %d values" % len(value)
    return repr(value)[:40]


def header_count(reader: Any, key: str, name: str) -> Optional[int]:
    """A count from the header (layers, width, heads); None when absent or 0 (not given)."""
    value = header_value(reader, key, name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GGUFError(name, "%s is %s, not a count" % (key, describe(value)))
    return value or None


def model_facts(path: str, name: Optional[str] = None) -> Dict[str, Any]:
    """Layers, widths, heads and context length from the GGUF header; the file's size. A file that
    is not a readable model GGUF raises GGUFError, one line naming it `name` (default: path)."""
    label = name or path
    check_gguf(path, label)
    reader = open_gguf(path, label)
    arch = header_value(reader, "general.architecture", label)
    if not isinstance(arch, str) or not arch:
        raise GGUFError(label, "no general.architecture: not a model GGUF")

    def count(key: str) -> Optional[int]:
        return header_count(reader, "%s.%s" % (arch, key), label)

    n_embd, n_head = count("embedding_length"), count("attention.head_count")
    head_dim = n_embd // n_head if n_embd and n_head else None
    return {
        "architecture": arch,
        "n_layer": count("block_count"),
        "n_embd": n_embd,
        "n_head": n_head,
        "n_head_kv": count("attention.head_count_kv") or n_head,
        "key_length": count("attention.key_length") or head_dim,
        "value_length": count("attention.value_length") or head_dim,
        "context_length": count("context_length"),
        "file_bytes": os.path.getsize(path),
        "tensor_bytes": sum(int(tensor.n_bytes) for tensor in reader.tensors),
    }


def header_facts(prefix_path: str, file_bytes: int, name: Optional[str] = None) -> Dict[str, Any]:
    """model_facts from the first bytes of a weights file (fetched from a node): padded with a hole
    to the file's size, so the gguf library finds every tensor it expects (as zeros), on no disk.
    Errors name the file `name` (the weights file on the node; default: prefix_path); HeaderCut
    when the bytes end inside the header (fetch more), another GGUFError when the file is bad
    (cut short included: when the bytes are the whole file)."""
    import shutil
    import tempfile

    label = name or prefix_path
    try:
        check_gguf(prefix_path, label, tensor_data=False)
    except GGUFTruncated as error:
        if error.size >= int(file_bytes):  # the whole file came: the file is cut, not the copy of it
            raise
        raise HeaderCut(label, "the first %d bytes do not hold the whole GGUF header (%s); fetch more of it"
                        % (error.size, error.what)) from None
    with tempfile.NamedTemporaryFile(suffix=".gguf") as padded:
        with open(prefix_path, "rb") as prefix:
            shutil.copyfileobj(prefix, padded)
        padded.truncate(max(int(file_bytes), os.path.getsize(prefix_path)))
        padded.flush()
        return model_facts(padded.name, label)


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
