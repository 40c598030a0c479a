#!/usr/bin/env python3
"""Random-weight Qwen3 GGUF files at a named shape, quantized by llama.cpp's own quantizer:
the models GELO and llama.cpp are compared on where no real checkpoint of that shape can be
downloaded, and the small fixture the model tests check GELO against llama.cpp with.

    python3 scripts/bench/random_gguf.py --shape qwen3-1.7b --out DIR [--types Q4_K_M,Q8_0]

writes DIR/<shape>-f16.gguf (gguf-py's writer: weights N(0, 0.02²), norms 1) and, for each
type, DIR/<shape>-<type>.gguf through `llama_model_quantize` (llama-cpp-python). The
tokenizer is Qwen3's (`--tokenizer`, the tokenizer.json of scripts/fetch-models.sh's
qwen3-tokenizer), cut to the shape's vocabulary for the small shapes: the first N tokens,
with the merges that stay inside them. Deterministic for a `--seed`.
"""

import argparse
import json
import os
from pathlib import Path

import numpy as np

SHAPES = {
    # hidden, layers, ffn, heads, kv heads, head dim, vocab
    "tiny": (256, 2, 768, 4, 2, 64, 512),
    "qwen3-0.6b": (1024, 28, 3072, 16, 8, 128, 151936),
    "qwen3-1.7b": (2048, 28, 6144, 16, 8, 128, 151936),
    "qwen3-8b": (4096, 36, 12288, 32, 8, 128, 151936),
}

FTYPES = {"Q4_K_M": 15, "Q8_0": 7, "Q4_0": 2, "Q5_K_M": 17, "Q6_K": 18, "F16": 1}


def vocabulary(path, n):
    """(tokens, types, merges, eos id) of Qwen3's tokenizer cut to `n` ids."""
    tj = json.loads(Path(path).read_text())
    vocab = tj["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    special = {a["id"]: a["content"] for a in tj.get("added_tokens", [])}
    tokens, types = [], []
    for i in range(n):
        if i in special:
            tokens.append(special[i]), types.append(3)  # control
        elif i in by_id:
            tokens.append(by_id[i]), types.append(1)  # normal
        else:
            tokens.append(f"[PAD{i}]"), types.append(5)  # unused
    keep = set(tokens[:n])
    merges = []
    for m in tj["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in keep and b in keep and (a + b) in keep:
            merges.append(f"{a} {b}")
    eos = next((i for i, t in special.items() if t == "<|im_end|>" and i < n), n - 1)
    return tokens, types, merges, eos


def write_f16(shape, out, tokenizer, seed):
    import gguf

    d, layers, ffn, heads, kv, hd, vocab = SHAPES[shape]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), "qwen3")
    w.add_name(f"random {shape}")
    w.add_context_length(4096)
    w.add_embedding_length(d)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1_000_000.0)
    w.add_file_type(FTYPES["F16"])
    tokens, types, merges, eos = vocabulary(tokenizer, vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(eos)
    w.add_bos_token_id(eos)
    w.add_add_bos_token(False)

    def rand(*s):
        return (rng.standard_normal(s, dtype=np.float32) * 0.02).astype(np.float16)

    ones = lambda n: np.ones(n, dtype=np.float32)
    w.add_tensor("token_embd.weight", rand(vocab, d))
    w.add_tensor("output_norm.weight", ones(d))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(d))
        w.add_tensor(p + "attn_q.weight", rand(heads * hd, d))
        w.add_tensor(p + "attn_k.weight", rand(kv * hd, d))
        w.add_tensor(p + "attn_v.weight", rand(kv * hd, d))
        w.add_tensor(p + "attn_q_norm.weight", ones(hd))
        w.add_tensor(p + "attn_k_norm.weight", ones(hd))
        w.add_tensor(p + "attn_output.weight", rand(d, heads * hd))
        w.add_tensor(p + "ffn_norm.weight", ones(d))
        w.add_tensor(p + "ffn_gate.weight", rand(ffn, d))
        w.add_tensor(p + "ffn_up.weight", rand(ffn, d))
        w.add_tensor(p + "ffn_down.weight", rand(d, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(src, dst, ftype, threads):
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.nthread = threads
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) != 0:
        raise SystemExit(f"llama.cpp could not quantize {src} to {ftype}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--types", default="Q4_K_M,Q8_0")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    cache = Path(os.environ.get("GELO_CACHE", Path.home() / ".cache" / "gelo"))
    ap.add_argument("--tokenizer", type=Path, default=cache / "models" / "qwen3-tokenizer" / "tokenizer.json")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    f16 = a.out / f"{a.shape}-f16.gguf"
    write_f16(a.shape, f16, a.tokenizer, a.seed)
    print(f"wrote {f16} ({f16.stat().st_size / 1e6:.1f} MB)")
    for t in [t for t in a.types.split(",") if t]:
        dst = a.out / f"{a.shape}-{t.lower()}.gguf"
        quantize(f16, dst, t, a.threads)
        print(f"wrote {dst} ({dst.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
