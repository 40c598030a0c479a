#!/usr/bin/env python3
"""Tiny random-weight checkpoints and their reference outputs from Hugging Face transformers.

No Qwen3 weights are obtainable offline, so the Qwen3 code path (per-head QK-norm, head_dim
different from hidden/heads) is checked on small random checkpoints whose outputs come from
an independent implementation: transformers with PyTorch.

  generate DIR   writes the checkpoints (numpy only; numpy's legacy RandomState stream is
                 frozen, so every machine writes identical bytes):
                   DIR/qwen3-tiny/        Qwen3ForCausalLM, tied head, f32
                   DIR/qwen3-tiny-bf16/   Qwen3ForCausalLM, untied head, bf16
                   DIR/bert-ce-tiny/      BertForSequenceClassification, 1 label, f32
                 tokenizers are copied from --qwen3-tokenizer and --bert-tokenizer.
  reference DIR OUT   runs transformers on them and writes OUT/hf_reference.json.

    python3 scripts/reference/hf_reference.py generate ~/.cache/gelo/models/tiny \\
        --qwen3-tokenizer ~/.cache/gelo/models/qwen3-tokenizer \\
        --bert-tokenizer ~/.cache/gelo/models/all-minilm-l6-v2
    python3 scripts/reference/hf_reference.py reference ~/.cache/gelo/models/tiny \\
        services/tee/models/tests/fixtures/hf     # needs torch and transformers
"""
import argparse
import hashlib
import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
    "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "hidden_act": "silu",
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
    "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "float32",
}
BERT = {
    "architectures": ["BertForSequenceClassification"], "model_type": "bert", "vocab_size": 30522,
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
    "hidden_act": "gelu", "max_position_embeddings": 512, "type_vocab_size": 2,
    "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
    "num_labels": 1, "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}, "pad_token_id": 0,
}
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    return",
    "Qwen3 uses per-head RMSNorm on queries and keys before rotary embeddings.",
    "数字 12345 和 emoji 🙂 mixed with English.",
]
EMBED_TEXTS = ["A man is eating food.", "Scientific claims need evidence."]
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
PAIRS = [
    ("what causes rain", "Rain forms when water vapour condenses into droplets heavy enough to fall."),
    ("what causes rain", "The stock market closed higher on Tuesday."),
    ("capital of france", "Paris is the capital of France."),
]
N_SUBSET = 1024


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, round to nearest even."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def save_safetensors(path: Path, tensors: dict, bf16: bool) -> None:
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name], dtype=np.float32)
        raw = bf16_bits(arr).tobytes() if bf16 else arr.astype("<f4").tobytes()
        header[name] = {"dtype": "BF16" if bf16 else "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def qwen3_tensors(rng: np.random.RandomState, cfg: dict, tied: bool) -> dict:
    d, ff, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    w = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.05
    norm = lambda n: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    t = {"model.embed_tokens.weight": w(cfg["vocab_size"], d), "model.norm.weight": norm(d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(d)
        t[p + "post_attention_layernorm.weight"] = norm(d)
        t[p + "self_attn.q_proj.weight"] = w(q, d)
        t[p + "self_attn.k_proj.weight"] = w(kv, d)
        t[p + "self_attn.v_proj.weight"] = w(kv, d)
        t[p + "self_attn.o_proj.weight"] = w(d, q)
        t[p + "self_attn.q_norm.weight"] = norm(hd)
        t[p + "self_attn.k_norm.weight"] = norm(hd)
        t[p + "mlp.gate_proj.weight"] = w(ff, d)
        t[p + "mlp.up_proj.weight"] = w(ff, d)
        t[p + "mlp.down_proj.weight"] = w(d, ff)
    if not tied:
        t["lm_head.weight"] = w(cfg["vocab_size"], d)
    return t


def bert_tensors(rng: np.random.RandomState, cfg: dict) -> dict:
    d, ff = cfg["hidden_size"], cfg["intermediate_size"]
    w = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.05
    b = lambda n: (0.02 * rng.standard_normal(n)).astype(np.float32)
    norm = lambda n: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    t = {
        "bert.embeddings.word_embeddings.weight": w(cfg["vocab_size"], d),
        "bert.embeddings.position_embeddings.weight": w(cfg["max_position_embeddings"], d),
        "bert.embeddings.token_type_embeddings.weight": w(cfg["type_vocab_size"], d),
        "bert.embeddings.LayerNorm.weight": norm(d),
        "bert.embeddings.LayerNorm.bias": b(d),
        "bert.pooler.dense.weight": w(d, d),
        "bert.pooler.dense.bias": b(d),
        "classifier.weight": w(1, d) * 10,
        "classifier.bias": b(1),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"bert.encoder.layer.{i}."
        for name, din, dout in [("attention.self.query", d, d), ("attention.self.key", d, d),
                                ("attention.self.value", d, d), ("attention.output.dense", d, d),
                                ("intermediate.dense", d, ff), ("output.dense", ff, d)]:
            t[p + name + ".weight"] = w(dout, din)
            t[p + name + ".bias"] = b(dout)
        for name in ["attention.output.LayerNorm", "output.LayerNorm"]:
            t[p + name + ".weight"] = norm(d)
            t[p + name + ".bias"] = b(d)
    return t


def copy_tokenizer(src: Path, dst: Path, names) -> None:
    for n in names:
        if (src / n).exists():
            shutil.copy(src / n, dst / n)


def generate(out: Path, qtok: Path, btok: Path) -> None:
    specs = [("qwen3-tiny", 1, True, False), ("qwen3-tiny-bf16", 2, False, True)]
    for name, seed, tied, bf16 in specs:
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        cfg = dict(QWEN3, tie_word_embeddings=tied, torch_dtype="bfloat16" if bf16 else "float32")
        (d / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
        save_safetensors(d / "model.safetensors", qwen3_tensors(np.random.RandomState(seed), cfg, tied), bf16)
        copy_tokenizer(qtok, d, ["tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"])
    d = out / "bert-ce-tiny"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(BERT, indent=1) + "\n")
    save_safetensors(d / "model.safetensors", bert_tensors(np.random.RandomState(3), BERT), False)
    copy_tokenizer(btok, d, ["tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"])


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def reference(root: Path, out: Path) -> None:
    import torch
    import transformers
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    result = {"transformers": transformers.__version__, "torch": torch.__version__, "models": {}}
    for name in ["qwen3-tiny", "qwen3-tiny-bf16"]:
        d = root / name
        tok = AutoTokenizer.from_pretrained(d)
        lm = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
        base = AutoModel.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
        vocab = lm.config.vocab_size
        subset = np.random.RandomState(7).choice(vocab, N_SUBSET, replace=False).tolist()
        prompts = []
        with torch.no_grad():
            for text in PROMPTS:
                ids = tok(text)["input_ids"]
                logits = lm(torch.tensor([ids])).logits[0].double().numpy()
                last = logits[-1]
                top = np.argsort(-last, kind="stable")[:64].tolist()
                prompts.append({
                    "text": text, "ids": ids,
                    "last_top": [[int(i), float(last[i])] for i in top],
                    "last_subset": [float(last[i]) for i in subset],
                    "first_subset": [float(logits[0][i]) for i in subset],
                })
            embeds = []
            for text in EMBED_TEXTS:
                for instructed in (False, True):
                    t = f"Instruct: {INSTRUCTION}\nQuery:{text}" if instructed else text
                    ids = tok(t)["input_ids"]
                    h = base(torch.tensor([ids])).last_hidden_state[0, -1].double()
                    h = (h / h.norm()).numpy()
                    embeds.append({"text": text, "instructed": instructed, "ids": ids, "embedding": h.tolist()})
        result["models"][name] = {"sha256": sha256(d / "model.safetensors"), "subset": subset,
                                  "prompts": prompts, "embeddings": embeds, "instruction": INSTRUCTION}
    d = root / "bert-ce-tiny"
    tok = AutoTokenizer.from_pretrained(d)
    ce = AutoModelForSequenceClassification.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
    pairs = []
    with torch.no_grad():
        for q, doc in PAIRS:
            enc = tok(q, doc, return_tensors="pt")
            logit = float(ce(**enc).logits[0, 0])
            pairs.append({"query": q, "document": doc, "ids": enc["input_ids"][0].tolist(), "logit": logit})
    result["models"]["bert-ce-tiny"] = {"sha256": sha256(d / "model.safetensors"), "pairs": pairs}
    out.mkdir(parents=True, exist_ok=True)
    (out / "hf_reference.json").write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {out / 'hf_reference.json'}")


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("dir", type=Path)
    g.add_argument("--qwen3-tokenizer", type=Path, required=True)
    g.add_argument("--bert-tokenizer", type=Path, required=True)
    r = sub.add_parser("reference")
    r.add_argument("dir", type=Path)
    r.add_argument("out", type=Path)
    a = ap.parse_args()
    if a.cmd == "generate":
        generate(a.dir, a.qwen3_tokenizer, a.bert_tokenizer)
    else:
        reference(a.dir, a.out)


if __name__ == "__main__":
    sys.exit(main())
