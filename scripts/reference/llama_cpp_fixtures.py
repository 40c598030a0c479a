#!/usr/bin/env python3
"""Reference outputs of llama.cpp (through llama-cpp-python) for GELO's GGUF models.

llama.cpp is an implementation independent of ours; these fixtures are what the Rust model
code (services/tee/models) and the GGUF tokenizer (services/tee/gguf) are checked against.

For SmolLM2-135M-Instruct (Q4_1) and Qwen2.5-Coder-0.5B-Instruct (Q4_K_M), writes into
services/tee/models/tests/fixtures/llama_cpp/:

  manifest.json               versions (llama-cpp-python, ggml), settings, model SHA-256s
  <model>/generation.json     8 prompts, raw completion (no chat template; BOS as the
                              model's tokenizer.ggml.add_bos_token says, special tokens
                              parsed): prompt ids, the top 64 first-step logits (exact f32),
                              64 greedy tokens (ids, text, per-step top-1/top-2 logit gap)
  <model>/logits/<id>.f16     the full first-step logit vector (next token after the
                              prompt), little-endian float16, n_vocab values
  <model>/tokenization.json   strings and llama.cpp's ids with special=True and False

Greedy decoding is done here, not by llama.cpp's sampler: at each step the argmax of
llama.cpp's raw logits (lowest id on exact ties), so no penalty or sampler setting can
creep in. Generation does not stop at EOS: all 64 tokens are recorded and `eos_index` marks
the first end-of-generation token, if any.

With `--qwen3-tiny`, writes a random-weight Qwen3 of the `tiny` shape of
scripts/bench/random_gguf.py (Qwen3's tokenizer cut to 512 ids), quantized by llama.cpp to
Q4_K_M (Q4_K and Q6_K blocks) and Q8_0, into qwen3-tiny/*.gguf, with the same fixtures for
each file (qwen3-tiny-q4_k_m/, qwen3-tiny-q8_0/): the committed model that checks GELO's
Qwen3 GGUF path and its int8 kernels on K-quants against llama.cpp.

With `--f32`, each model is first re-encoded as an all-F32 GGUF (llama.cpp's own
quantizer with ftype ALL_F32: an exact dequantization of the same weights) and only the
greedy continuations are recorded, into <model>/generation_f32.json. On quantized files
llama.cpp also quantizes activations to 8 bits inside its matmuls; on F32 weights it
computes in f32 like GELO, so these fixtures separate implementation differences from
llama.cpp's activation quantization.

Usage: see scripts/reference/README.md (needs llama-cpp-python==0.3.36 in a venv).
Models are read from ${GELO_CACHE:-~/.cache/gelo}/models (scripts/fetch-models.sh).
"""

import hashlib
import json
import os
import platform
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import llama_cpp
from llama_cpp import Llama

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "services" / "tee" / "models" / "tests" / "fixtures" / "llama_cpp"
MODELS = Path(os.environ.get("GELO_CACHE", Path.home() / ".cache" / "gelo")) / "models"

MODEL_FILES = {
    "smollm2-135m": "smollm2-135m-instruct.gguf",
    "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}

N_THREADS = 2
SEED = 1234
N_CTX = 512
N_GREEDY = 64
N_TOP = 64

PROMPTS = [
    ("short", "The capital of France is"),
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("list", "Here is a list of fruits:\n1. Apple\n2. Banana\n3."),
    ("question", "Question: Why is the sky blue?\nAnswer:"),
    ("math", "Compute step by step: 17 * 23 = 391. Then 391 + 1234 ="),
    (
        "paragraph",
        "The history of computing is longer than the history of computing hardware and "
        "modern computing technology and includes the history of methods intended for pen "
        "and paper or for chalk and slate, with or without the aid of tables. Digital "
        "computing is intimately tied to the representation of numbers. But long before "
        "abstractions like the number arose, there were mathematical concepts to serve the "
        "purposes of civilization. These concepts are implicit in concrete practices such as "
        "one-to-one correspondence, the basis of counting. In the early twentieth century,",
    ),
    ("unicode", "Traduction : « Bonjour le monde » — 你好，世界！こんにちは。Ünïcödé ✓ 🙂🚀 Привет,"),
    (
        "chat",
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n"
        "<|im_start|>assistant\n",
    ),
]

# Tokenizer cases: ASCII, code, digits, whitespace runs, contractions (Qwen2's regex is
# case-insensitive there), accents, CJK, emoji, non-NFC text, odd spaces, special tokens.
TOKENIZE = [
    "",
    " ",
    "Hello world",
    "Hello, world! How are you doing today?",
    "  leading and trailing spaces   ",
    "multiple    spaces\tand\ttabs\n\nand newlines\r\n",
    "\n\n\n    \n",
    "I'm sure you'll see they've done it. I'M SURE YOU'LL SEE THEY'VE DONE IT. It's O'Neil's",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(12))",
    "fn main() { let v: Vec<u32> = (0..10).collect(); println!(\"{v:?}\"); }",
    "{\"key\": [1, 2.5, -3e10], \"nested\": {\"a\": null}}",
    "1234567890 3.14159 -42 1,000,000 2024-11-29 0x1F 1e-6",
    "Numbers12345and67890mixed",
    "https://example.com/path?query=1&other=two#frag",
    "naïve café résumé über Ångström",
    "e\u0301 (decomposed é) and \u00e9 (composed)",
    "中文分词测试：我们今天去公园散步。",
    "日本語のテキスト、カタカナとひらがな。",
    "한국어 텍스트입니다.",
    "Русский текст и العربية и हिन्दी",
    "Emoji: 😀🙂🚀👍🏽 👨‍👩‍👧 🇫🇷",
    "non\u00a0breaking\u3000ideographic\u2003em space",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after end",
    "Not special: <|im_start without end and <im_end|>",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!???...---___***",
    "The quick brown fox jumps over the lazy dog. " * 4,
]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def metadata_bool(llm: Llama, key: str, default: bool) -> bool:
    v = llm.metadata.get(key)
    return default if v is None else v.lower() == "true"


def top_k(logits: np.ndarray, k: int) -> list:
    # Highest first; ties by lower id (stable sort on the negated values).
    order = np.argsort(-logits, kind="stable")[:k]
    return [[int(i), float(logits[i])] for i in order]


def to_f32(path: Path) -> Path:
    """The same weights, exactly dequantized to F32 by llama.cpp's quantizer."""
    out = Path(os.environ.get("TMPDIR", "/tmp")) / (path.stem + ".f32.gguf")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    params.nthread = N_THREADS
    rc = llama_cpp.llama_model_quantize(str(path).encode(), str(out).encode(), params)
    if rc != 0:
        sys.exit(f"requantizing {path} to F32 failed ({rc})")
    return out


def run_f32(key: str, file: str) -> None:
    path = to_f32(MODELS / file)
    llm = Llama(model_path=str(path), n_ctx=N_CTX, n_batch=N_CTX, n_threads=N_THREADS,
                n_threads_batch=N_THREADS, seed=SEED, logits_all=True, verbose=False)
    add_bos = metadata_bool(llm, "tokenizer.ggml.add_bos_token", False)
    prompts = []
    for pid, text in PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[len(ids) - 1], dtype=np.float32)
        first_top = top_k(logits, N_TOP)
        generated, gaps = [], []
        for step in range(N_GREEDY):
            best = int(np.argmax(logits))
            top2 = np.partition(logits, -2)[-2:]
            gaps.append(float(top2[1] - top2[0]))
            generated.append(best)
            if step + 1 < N_GREEDY:
                llm.eval([best])
                logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        prompts.append({"id": pid, "prompt_ids": ids, "first_top": first_top, "greedy_ids": generated, "top2_gap": gaps})
        print(f"  {key}/{pid} (f32): {llm.detokenize(generated, special=True)[:60]!r}")
    out = {"model_file": file, "weights": "all F32 (exact dequantization by llama_model_quantize)",
           "greedy_steps": N_GREEDY, "prompts": prompts}
    (OUT / key / "generation_f32.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    path.unlink()


def run_model(key: str, file: str, path: Path | None = None) -> dict:
    path = path or MODELS / file
    if not path.is_file():
        sys.exit(f"{path} is missing: run scripts/fetch-models.sh")
    llm = Llama(
        model_path=str(path),
        n_ctx=N_CTX,
        n_batch=N_CTX,
        n_threads=N_THREADS,
        n_threads_batch=N_THREADS,
        seed=SEED,
        logits_all=True,
        verbose=False,
    )
    add_bos = metadata_bool(llm, "tokenizer.ggml.add_bos_token", False)
    n_vocab = llm.n_vocab()
    eog = {i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(llm._model.vocab, i)}
    out_dir = OUT / key
    (out_dir / "logits").mkdir(parents=True, exist_ok=True)

    prompts = []
    for pid, text in PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)
        llm.reset()
        llm.eval(ids)
        first = np.array(llm.scores[len(ids) - 1], dtype=np.float32)
        first.astype("<f2").tofile(out_dir / "logits" / f"{pid}.f16")

        generated, gaps = [], []
        logits = first
        for step in range(N_GREEDY):
            best = int(np.argmax(logits))
            top2 = np.partition(logits, -2)[-2:]
            gaps.append(float(top2[1] - top2[0]))
            generated.append(best)
            if step + 1 < N_GREEDY:
                llm.eval([best])
                logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        eos_index = next((i for i, t in enumerate(generated) if t in eog), None)
        prompts.append(
            {
                "id": pid,
                "prompt": text,
                "prompt_ids": ids,
                "first_step": {
                    "logits_file": f"logits/{pid}.f16",
                    "argmax": int(np.argmax(first)),
                    "top": top_k(first, N_TOP),
                    "mean": float(first.mean()),
                    "std": float(first.std()),
                },
                "greedy_ids": generated,
                "greedy_text": llm.detokenize(generated, special=True).decode("utf-8", errors="replace"),
                "top2_gap": gaps,
                "eos_index": eos_index,
            }
        )
        print(f"  {key}/{pid}: {len(ids)} prompt tokens, eos at {eos_index}: {prompts[-1]['greedy_text'][:60]!r}")

    gen = {
        "model_file": file,
        "n_vocab": n_vocab,
        "add_bos": add_bos,
        "eog_ids": sorted(eog),
        "greedy_steps": N_GREEDY,
        "prompts": prompts,
    }
    (out_dir / "generation.json").write_text(json.dumps(gen, ensure_ascii=False, indent=1) + "\n")

    cases = []
    for text in TOKENIZE:
        b = text.encode("utf-8")
        cases.append(
            {
                "text": text,
                "ids_special": llm.tokenize(b, add_bos=False, special=True),
                "ids_plain": llm.tokenize(b, add_bos=False, special=False),
            }
        )
    bos_case = {"text": "Hello world", "ids_add_bos": llm.tokenize(b"Hello world", add_bos=True, special=True)}
    tok = {"model_file": file, "add_bos_token": add_bos, "bos_case": bos_case, "cases": cases}
    (out_dir / "tokenization.json").write_text(json.dumps(tok, ensure_ascii=False, indent=1) + "\n")

    return {
        "file": file,
        "sha256": sha256(path),
        "architecture": llm.metadata.get("general.architecture"),
        "n_vocab": n_vocab,
        "add_bos": add_bos,
    }


def ggml_version() -> str:
    lib = Path(llama_cpp.__file__).parent / "lib"
    names = sorted(p.name for p in lib.glob("libllama.so.*")) + sorted(p.name for p in lib.glob("libggml.so.*"))
    return ", ".join(names)


def qwen3_tiny() -> None:
    sys.path.insert(0, str(REPO / "scripts" / "bench"))
    import random_gguf

    tokenizer = MODELS / "qwen3-tokenizer" / "tokenizer.json"
    d = OUT / "qwen3-tiny"
    d.mkdir(parents=True, exist_ok=True)
    f16 = Path(os.environ.get("TMPDIR", "/tmp")) / "qwen3-tiny-f16.gguf"
    random_gguf.write_f16("tiny", f16, tokenizer, seed=1)
    models = {}
    for ftype in ["Q4_K_M", "Q8_0"]:
        file = f"qwen3-tiny-{ftype.lower()}.gguf"
        random_gguf.quantize(f16, d / file, ftype, N_THREADS)
        models[file] = run_model(file.removesuffix(".gguf"), file, d / file)
    f16.unlink()
    manifest = {
        "generator": "scripts/reference/llama_cpp_fixtures.py --qwen3-tiny",
        "llama_cpp_python": version("llama-cpp-python"),
        "weights": "random N(0, 0.02^2), norms 1, seed 1 (scripts/bench/random_gguf.py, shape tiny)",
        "models": models,
    }
    (d / "manifest.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=1) + "\n")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    if "--qwen3-tiny" in sys.argv[1:]:
        qwen3_tiny()
        return
    if "--f32" in sys.argv[1:]:
        for key, file in MODEL_FILES.items():
            run_f32(key, file)
        return
    models = {key: run_model(key, file) for key, file in MODEL_FILES.items()}
    manifest = {
        "generator": "scripts/reference/llama_cpp_fixtures.py",
        "llama_cpp_python": version("llama-cpp-python"),
        "numpy": version("numpy"),
        "llama_cpp_libraries": ggml_version(),
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode("utf-8").strip(),
        "build": "pip install llama-cpp-python==0.3.36 with CMAKE_ARGS=-DGGML_NATIVE=OFF",
        "machine": platform.machine(),
        "settings": {
            "n_threads": N_THREADS,
            "n_ctx": N_CTX,
            "n_batch": N_CTX,
            "seed": SEED,
            "logits_all": True,
            "greedy": "argmax of raw logits, lowest id on ties; not stopped at EOS",
            "prompt_tokenization": "tokenize(text, add_bos=<tokenizer.ggml.add_bos_token>, special=True)",
        },
        "models": models,
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
