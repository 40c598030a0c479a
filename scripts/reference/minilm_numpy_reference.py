"""Independent numpy implementation of all-MiniLM-L6-v2 (BERT + mean pooling + L2),
used to check the Rust encoder. Needs numpy, safetensors and tokenizers from PyPI.

    python3 scripts/reference/minilm_numpy_reference.py ~/.cache/gelo/models/all-minilm-l6-v2

Prints the pairwise cosine similarities of two sentence triples: sentence-transformers'
quickstart triple (published: 0.6660, 0.1046, 0.1411) and the triple of the models issue.
"""
import json
import math
import sys

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

root = sys.argv[1]
W = load_file(f"{root}/model.safetensors")
cfg = json.load(open(f"{root}/config.json"))
tok = Tokenizer.from_file(f"{root}/tokenizer.json")
tok.no_padding()
tok.enable_truncation(256)
H = cfg["num_attention_heads"]
HD = cfg["hidden_size"] // H
erf = np.vectorize(math.erf)


def layer_norm(x, w, b, eps=cfg["layer_norm_eps"]):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def embed(text):
    ids = tok.encode(text).ids
    n = len(ids)
    x = (W["embeddings.word_embeddings.weight"][ids] + W["embeddings.position_embeddings.weight"][:n]
         + W["embeddings.token_type_embeddings.weight"][0])
    x = layer_norm(x, W["embeddings.LayerNorm.weight"], W["embeddings.LayerNorm.bias"])
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        lin = lambda x, name: x @ W[p + name + ".weight"].T + W[p + name + ".bias"]
        q, k, v = (lin(x, f"attention.self.{n}") for n in ("query", "key", "value"))
        ctx = np.zeros_like(q)
        for h in range(H):
            s = slice(h * HD, (h + 1) * HD)
            a = q[:, s] @ k[:, s].T / math.sqrt(HD)
            a = np.exp(a - a.max(-1, keepdims=True))
            ctx[:, s] = (a / a.sum(-1, keepdims=True)) @ v[:, s]
        x = layer_norm(lin(ctx, "attention.output.dense") + x, W[p + "attention.output.LayerNorm.weight"],
                       W[p + "attention.output.LayerNorm.bias"])
        inter = lin(x, "intermediate.dense")
        inter = 0.5 * inter * (1 + erf(inter / math.sqrt(2)))
        x = layer_norm(lin(inter, "output.dense") + x, W[p + "output.LayerNorm.weight"], W[p + "output.LayerNorm.bias"])
    e = x.mean(0)
    return e / np.linalg.norm(e)


for triple in (["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."],
               ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."]):
    e = [embed(s) for s in triple]
    print(triple, [round(float(e[0] @ e[1]), 4), round(float(e[0] @ e[2]), 4), round(float(e[1] @ e[2]), 4)])
