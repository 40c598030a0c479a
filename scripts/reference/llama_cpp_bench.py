#!/usr/bin/env python3
"""Plain decode speed of llama.cpp (through llama-cpp-python) on a GGUF file: the peer that
`gelo bench model --model FILE --decode` is compared with in docs/BENCHMARKS.md.

The workload is the one `gelo bench model --decode` runs: a prompt of `--prompt`
deterministic token ids (the same ids: 1000 + (i·7919) mod (vocab − 2000)), prefilled in
one call, then `--steps` greedy decode steps, one token each, batch 1. Time to first token
is the prefill plus the first argmax; tok/s is over the decode steps. Medians of `--reps`.

    python scripts/reference/llama_cpp_bench.py --model FILE [--threads N] [--json OUT]

Needs llama-cpp-python (scripts/reference/requirements.txt). For a speed comparison build
it for this CPU (the default, GGML_NATIVE=ON), not the portable build the fixtures use.
"""

import argparse
import json
import os
import statistics
import time
from importlib.metadata import version

import numpy as np
import llama_cpp
from llama_cpp import Llama


def prompt_ids(count, vocab, salt=0):
    return [1000 + (i * 7919 + salt * 104_729) % (vocab - 2000) for i in range(count)]


def last_logits(llm):
    """The last evaluated position's logits. (`llm.scores` stays zero when the model is
    opened with logits_all=False, which keeps prefill from computing every position's.)"""
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))


def run_once(llm, prompt, steps):
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    nxt = int(np.argmax(last_logits(llm)))
    ttft = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(steps):
        llm.eval([nxt])
        nxt = int(np.argmax(last_logits(llm)))
    return ttft, steps / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    llm = Llama(model_path=a.model, n_ctx=a.prompt + a.steps + 8, n_batch=512, n_threads=a.threads,
                n_threads_batch=a.threads, logits_all=False, verbose=False)
    prompt = prompt_ids(a.prompt, llm.n_vocab())
    run_once(llm, prompt, 2)  # warm-up
    runs = [run_once(llm, prompt, a.steps) for _ in range(a.reps)]
    ttft = statistics.median(r[0] for r in runs)
    rate = statistics.median(r[1] for r in runs)
    name = os.path.basename(a.model)
    print("| model | batch | prompt | llama.cpp tok/s | llama.cpp TTFT s | threads |")
    print("|---|---|---|---|---|---|")
    print(f"| {name} | 1 | {a.prompt} | {rate:.1f} | {ttft:.3f} | {a.threads} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(model=name, llama_cpp_python=version("llama-cpp-python"), threads=a.threads,
                           prompt=a.prompt, steps=a.steps, tok_s=rate, ttft_s=ttft), f, indent=1)


if __name__ == "__main__":
    main()
