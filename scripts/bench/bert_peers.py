#!/usr/bin/env python3
"""PyTorch and ONNX Runtime on CPU embedding the same BERT weights as `gelo bench sealed`:
`--texts` sequences of exactly `--n` tokens a forward pass, texts/s (medians of `--reps`
after a warm-up), on `--threads` threads. The peers a user would pick for sentence
embeddings on a CPU.

    python3 scripts/bench/bert_peers.py --model DIR --threads N [--texts 32 --n 256] [--json OUT]
    python3 scripts/bench/bert_peers.py --random bert-base --out DIR --tokenizer-from MINILM_DIR

The second form writes a random-weight BERT of a named shape (transformers' own
initialisation, seed 0) as a sentence-transformers folder GELO loads: config.json,
model.safetensors, and the tokenizer and pooling files of `--tokenizer-from` (all-MiniLM-L6-v2
uses bert-base-uncased's vocabulary).
"""

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

SHAPES = {
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "minilm-l6": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
}

TOKENIZER_FILES = ["tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "modules.json",
                   "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling/config.json"]


def write_random(shape, out: Path, tokenizer_from: Path):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, max_position_embeddings=512, **SHAPES[shape])
    BertModel(cfg).save_pretrained(out, safe_serialization=True)
    for f in TOKENIZER_FILES:
        src = tokenizer_from / f
        if src.exists():
            (out / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, out / f)
    print(f"wrote random {shape} to {out}")


def timed(fn, reps):
    fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def bench(model_dir: Path, threads, texts, n, reps):
    import numpy as np
    import torch
    from transformers import BertModel

    torch.set_num_threads(threads)
    model = BertModel.from_pretrained(model_dir).eval()
    rng = np.random.default_rng(0)
    ids = torch.tensor(rng.integers(1000, 29000, size=(texts, n)), dtype=torch.long)
    mask = torch.ones_like(ids)

    def pooled(out):
        return torch.nn.functional.normalize(out.last_hidden_state.mean(dim=1), dim=-1)

    def run_torch():
        with torch.inference_mode():
            pooled(model(input_ids=ids, attention_mask=mask))

    cells = {"pytorch": texts / timed(run_torch, reps)}
    try:
        import onnxruntime as ort

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "bert.onnx")
            class Hidden(torch.nn.Module):
                """The encoder called by keyword: newer transformers' positional order
                (`use_cache` among them) no longer matches the exporter's arguments."""

                def __init__(self, inner):
                    super().__init__()
                    self.inner = inner

                def forward(self, input_ids, attention_mask):
                    return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

            with torch.inference_mode():
                torch.onnx.export(Hidden(model), (ids[:1], mask[:1]), path, input_names=["input_ids", "attention_mask"],
                                  output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                                  dynamic_axes={"input_ids": {0: "b", 1: "n"}, "attention_mask": {0: "b", 1: "n"},
                                                "last_hidden_state": {0: "b", 1: "n"}})
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}

            def run_ort():
                h = sess.run(None, feed)[0].mean(axis=1)
                return h / np.linalg.norm(h, axis=-1, keepdims=True)

            cells["onnxruntime"] = texts / timed(run_ort, reps)
            cells["onnxruntime_version"] = ort.__version__
    except Exception as e:  # a peer that cannot run is reported, not fatal to the other
        print(f"onnxruntime: not measured ({type(e).__name__}: {e})")
    cells["torch_version"] = torch.__version__
    return cells


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--texts", type=int, default=32)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--random", choices=sorted(SHAPES))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tokenizer-from", type=Path)
    a = ap.parse_args()
    if a.random:
        write_random(a.random, a.out, a.tokenizer_from)
        return
    cells = bench(a.model, a.threads, a.texts, a.n, a.reps)
    for k in ("pytorch", "onnxruntime"):
        if k in cells:
            print(f"| {k} | {a.model.name} | embed_{a.texts}x{a.n} | {cells[k]:.1f} texts/s | {a.threads} threads |")
    if a.json:
        Path(a.json).write_text(json.dumps(dict(model=a.model.name, threads=a.threads, texts=a.texts, n=a.n,
                                                cells=cells), indent=1))


if __name__ == "__main__":
    main()
