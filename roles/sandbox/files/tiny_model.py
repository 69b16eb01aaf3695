"""Write a tiny random-weight llama GGUF (one file, or split into parts) with the gguf library.

The sandbox's stand-in for real weights: the real download, fan-out and load paths run
on it. Weights are random but seeded, so the same arguments give the same bytes.

    python3 roles/sandbox/files/tiny_model.py --out DIR [--name tiny] [--layers 8] [--embd 256] [--split 2]
"""

import argparse
import json
import os
import sys
from typing import Dict, List

import gguf
import numpy as np

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]


def byte_vocab() -> List[str]:
    """An SPM vocabulary of the specials and the 256 byte tokens: every text encodes."""
    return SPECIAL_TOKENS + ["<0x%02X>" % value for value in range(256)]


def layer_tensors(rng: np.random.Generator, n_embd: int, n_ff: int, n_head: int, n_head_kv: int,
                  layer: int) -> Dict[str, np.ndarray]:
    head_dim = n_embd // n_head
    kv_dim = head_dim * n_head_kv

    def weight(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    prefix = "blk.%d." % layer
    return {
        prefix + "attn_norm.weight": np.ones(n_embd, dtype=np.float32),
        prefix + "attn_q.weight": weight(n_embd, n_embd),
        prefix + "attn_k.weight": weight(kv_dim, n_embd),
        prefix + "attn_v.weight": weight(kv_dim, n_embd),
        prefix + "attn_output.weight": weight(n_embd, n_embd),
        prefix + "ffn_norm.weight": np.ones(n_embd, dtype=np.float32),
        prefix + "ffn_gate.weight": weight(n_ff, n_embd),
        prefix + "ffn_up.weight": weight(n_ff, n_embd),
        prefix + "ffn_down.weight": weight(n_embd, n_ff),
    }


def write_tiny_model(out_dir: str, name: str = "tiny", n_layer: int = 8, n_embd: int = 256, n_ff: int = 768,
                     n_head: int = 4, n_head_kv: int = 4, n_ctx: int = 2048, split: int = 1,
                     seed: int = 0) -> List[str]:
    """Write the model; returns the file names, first part first."""
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
    rng = np.random.default_rng(seed)
    vocab = byte_vocab()
    tensors = {
        "token_embd.weight": (rng.standard_normal((len(vocab), n_embd), dtype=np.float32) * 0.02).astype(np.float16),
    }
    for layer in range(n_layer):
        tensors.update(layer_tensors(rng, n_embd, n_ff, n_head, n_head_kv, layer))
    tensors["output_norm.weight"] = np.ones(n_embd, dtype=np.float32)
    tensors["output.weight"] = (rng.standard_normal((len(vocab), n_embd), dtype=np.float32) * 0.02).astype(np.float16)

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name + ".gguf")
    per_part = -(-len(tensors) // split) if split > 1 else 0
    writer = gguf.GGUFWriter(path, "llama", split_max_tensors=per_part)
    writer.add_name(name)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_block_count(n_layer)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(vocab)
    writer.add_token_scores([0.0] * len(vocab))
    writer.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                           + [gguf.TokenType.BYTE] * 256)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for tensor_name, data in tensors.items():
        writer.add_tensor(tensor_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if split > 1:
        return ["%s-%05d-of-%05d.gguf" % (name, part, split) for part in range(1, split + 1)]
    return [name + ".gguf"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--name", default="tiny")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--embd", type=int, default=256)
    parser.add_argument("--ff", type=int, default=768)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--split", type=int, default=1, help="number of GGUF parts")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    files = write_tiny_model(args.out, args.name, args.layers, args.embd, args.ff, args.heads, args.heads,
                             split=args.split, seed=args.seed)
    sizes = {name: os.path.getsize(os.path.join(args.out, name)) for name in files}
    print(json.dumps({"files": files, "sizes": sizes, "n_layer": args.layers}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
