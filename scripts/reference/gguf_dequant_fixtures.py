#!/usr/bin/env python3
"""Reference fixtures for the `gguf` crate's reader and dequantizers.

The reference is the `gguf` package from PyPI (llama.cpp's own Python reader, pure numpy:
`gguf.quants.dequantize`), an implementation independent of our Rust code.

Writes into services/tee/gguf/tests/fixtures/:
  dequant_<model>.json  for each real model file, one tensor of every ggml type it holds:
                        name, type, ne, shape, sum, sum of squares (float64) and 64 sampled
                        (flat index, value) pairs, plus the file's SHA-256.
  synthetic.gguf        a small GGUF v3 file written by gguf.GGUFWriter: random block bytes
                        for every type the crate dequantizes (scale fields set to finite
                        values), metadata of every value type, a 64-byte alignment.
  synthetic.json        the expected metadata and the full dequantized values of each tensor
                        (as float32 bit patterns).

Usage (see scripts/reference/README.md for the venv):
  python scripts/reference/gguf_dequant_fixtures.py
Models are read from ${GELO_CACHE:-~/.cache/gelo}/models (scripts/fetch-models.sh).
"""

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "services" / "gguf" / "tests" / "fixtures"
MODELS = Path(os.environ.get("GELO_CACHE", Path.home() / ".cache" / "gelo")) / "models"
MODEL_FILES = {
    "smollm2-135m-instruct": "smollm2-135m-instruct.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_k_m": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}
N_SAMPLES = 64


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def as_f64(x) -> float:
    """Exact double of a float32 value."""
    return float(np.float32(x))


def bits(values) -> list:
    """float32 bit patterns: exact whatever the JSON reader's float parsing does."""
    return [int(b) for b in np.asarray(values, dtype=np.float32).reshape(-1).view(np.uint32)]


def summarize(values: np.ndarray, seed: int) -> dict:
    flat = values.reshape(-1).astype(np.float32)
    rng = np.random.default_rng(seed)
    idx = np.unique(np.concatenate([[0, flat.size - 1], rng.integers(0, flat.size, N_SAMPLES - 2)]))
    f64 = flat.astype(np.float64)
    return {
        "sum": float(f64.sum()),
        "sum_sq": float((f64 * f64).sum()),
        # (flat index, value, float32 bits of the value)
        "samples": [[int(i), as_f64(flat[i]), bits(flat[i])[0]] for i in idx],
    }


def real_model_fixture(key: str, file: str) -> None:
    path = MODELS / file
    if not path.is_file():
        sys.exit(f"{path} is missing: run scripts/fetch-models.sh")
    reader = gguf.GGUFReader(path)
    chosen = {}
    for t in reader.tensors:
        # Per type, the smallest 2-D tensor (exercises row layout, keeps the Rust test
        # fast); 1-D only for types that have nothing else.
        prev = chosen.get(t.tensor_type)
        rank = lambda x: (len(x.shape) < 2, int(x.n_elements))
        if prev is None or rank(t) < rank(prev):
            chosen[t.tensor_type] = t
    tensors = []
    for qtype, t in sorted(chosen.items(), key=lambda kv: kv[0].value):
        values = gguf.quants.dequantize(t.data, qtype)
        ne = [int(d) for d in t.shape]
        assert values.size == int(np.prod(ne)), t.name
        entry = {"name": t.name, "type": qtype.name, "ne": ne, "shape": list(values.shape)}
        entry.update(summarize(values, seed=qtype.value))
        tensors.append(entry)
        print(f"  {key}: {t.name} {qtype.name} ne={ne}")
    doc = {
        "generator": f"scripts/reference/gguf_dequant_fixtures.py with gguf {gguf_version()}",
        "model_file": file,
        "sha256": sha256(path),
        "tensors": tensors,
    }
    (OUT / f"dequant_{key}.json").write_text(json.dumps(doc) + "\n")


def gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


# Byte offsets of the f16 scale fields inside one block, per type (ggml's block structs).
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}


def random_blocks(rng, qtype: T, n_blocks: int) -> np.ndarray:
    """Random block bytes with finite, moderate scales: every bit pattern of the quants."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS.get(qtype, []):
        scales = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        raw[:, off : off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    if qtype == T.Q8_K:
        d = (rng.standard_normal(n_blocks) * 0.01).astype(np.float32)
        raw[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
    return raw


def dequantize_reference(raw: np.ndarray, qtype: T) -> np.ndarray:
    if qtype == T.Q8_K:
        # gguf-py has no Q8_K dequantizer; ggml's is y = d * q (d: f32, q: int8 × 256).
        d = raw[:, 0:4].copy().view(np.float32)
        q = raw[:, 4 : 4 + 256].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    return gguf.quants.dequantize(raw, qtype).reshape(-1)


def synthetic_fixture() -> None:
    rng = np.random.default_rng(20261129)
    path = OUT / "synthetic.gguf"
    w = gguf.GGUFWriter(path, arch="synthetic")
    w.add_custom_alignment(64)
    V = gguf.GGUFValueType
    meta = [
        ("test.u8", 200, V.UINT8),
        ("test.i8", -100, V.INT8),
        ("test.u16", 60000, V.UINT16),
        ("test.i16", -30000, V.INT16),
        ("test.u32", 4000000000, V.UINT32),
        ("test.i32", -2000000000, V.INT32),
        ("test.u64", 2**63 + 5, V.UINT64),
        ("test.i64", -(2**62), V.INT64),
        ("test.f32", 0.15625, V.FLOAT32),
        ("test.f64", 1e-300, V.FLOAT64),
        ("test.bool", True, V.BOOL),
        ("test.string", "héllo ✓ 世界", V.STRING),
    ]
    for key, val, vtype in meta:
        w.add_key_value(key, val, vtype)
    w.add_array("test.array_i32", [1, -2, 3])
    w.add_array("test.array_str", ["a", "", "ĠĠ"])
    w.add_array("test.array_f32", [0.5, -1.25])
    w.add_array("test.array_nested", [[1, 2], [3]])

    shapes = {}  # name -> (qtype, ne)
    expected = []
    quant_types = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K]
    for qtype in quant_types:
        block, size = GGML_QUANT_SIZES[qtype]
        ne = [2 * 256, 3]  # 3 rows of 512: whole blocks for every type
        n_blocks = ne[0] * ne[1] // block
        raw = random_blocks(rng, qtype, n_blocks)
        name = f"synthetic.{qtype.name.lower()}"
        w.add_tensor(name, raw.reshape(ne[1], -1), raw_dtype=qtype)
        expected.append({"name": name, "type": qtype.name, "ne": ne, "bits": bits(dequantize_reference(raw, qtype))})
        shapes[name] = (qtype, ne)
    floats = rng.standard_normal((4, 40)).astype(np.float32)
    for qtype, arr in [
        (T.F32, floats),
        (T.F16, floats.astype(np.float16)),
    ]:
        name = f"synthetic.{qtype.name.lower()}"
        w.add_tensor(name, arr)
        expected.append({"name": name, "type": qtype.name, "ne": [40, 4], "bits": bits(arr.astype(np.float32))})
    bf16 = (floats.view(np.uint32) >> 16).astype(np.uint16)
    w.add_tensor("synthetic.bf16", bf16.view(np.uint8).reshape(4, 80), raw_dtype=T.BF16)
    bf16_ref = gguf.quants.dequantize(bf16.view(np.uint8).reshape(4, 80), T.BF16).reshape(-1)
    expected.append({"name": "synthetic.bf16", "type": "BF16", "ne": [40, 4], "bits": bits(bf16_ref)})
    # A 1-D and a 3-D tensor, to check shape handling.
    w.add_tensor("synthetic.vec", np.arange(7, dtype=np.float32))
    expected.append({"name": "synthetic.vec", "type": "F32", "ne": [7], "bits": bits(np.arange(7))})
    cube = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    w.add_tensor("synthetic.cube", cube)
    expected.append({"name": "synthetic.cube", "type": "F32", "ne": [4, 3, 2], "bits": bits(cube)})

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    doc = {
        "generator": f"scripts/reference/gguf_dequant_fixtures.py with gguf {gguf_version()}",
        "alignment": 64,
        "metadata": {k: v for k, v, _ in meta},
        "tensors": expected,
    }
    (OUT / "synthetic.json").write_text(json.dumps(doc) + "\n")
    print(f"  synthetic: {len(expected)} tensors, {path.stat().st_size} bytes")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    synthetic_fixture()
    for key, file in MODEL_FILES.items():
        real_model_fixture(key, file)


if __name__ == "__main__":
    main()
