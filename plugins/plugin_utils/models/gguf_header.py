"""A model's GGUF header, checked, then read: the facts the estimate (estimate.py) and the bench take from it.

A file that is not a readable model GGUF raises GGUFError, one line naming it and what is wrong
(`<path>: not a GGUF file (...)`, `<path>: truncated at offset N (...)`, ...). The gguf library
reads a header only once HeaderWalk has checked it.
"""

import math
import mmap
import os
import struct
from typing import Any, Dict, Optional, Set, Tuple

# GGUF value types (gguf.constants.GGUFValueType; fixed by the format) -> struct format.
GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
GGUF_UINT32, GGUF_STRING, GGUF_ARRAY = 4, 8, 9
GGML_MAX_DIMS = 4
# The fewest bytes a key (name length, type, a 1-byte value) and a tensor description (name
# length, dimension count, type, offset) take: a count that cannot fit is refused before it is
# looped over.
MIN_KEY_BYTES = 8 + 4 + 1
MIN_TENSOR_BYTES = 8 + 4 + 4 + 8


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
