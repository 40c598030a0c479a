#!/usr/bin/env python3
"""llama.cpp's CPU speed on a GGUF file, on the workload `gelo bench sealed` runs, so the two
print comparable cells: prefill of one `--prompt`-token prompt (time to its last logits,
as tokens/s), then greedy decode of `--steps` tokens for each batch size (B sequences of
`--context` prompt tokens each, one token per sequence a step; aggregate tokens/s).

Prompt ids are the project's deterministic ones: lo + (i·7919 + salt·104729) mod
(vocab − 2·lo), lo = min(1000, vocab/4), salt = the sequence index. Medians of `--reps`, after one warm-up.

    python3 scripts/bench/llama_cpp_peer.py --model FILE --threads N [--json OUT]

Uses llama-cpp-python's low-level API (the high-level `Llama` has no multi-sequence
batch); scripts/bench/peers.sh builds it for the CPU it runs on.
"""

import argparse
import ctypes
import json
import os
import statistics
import time

import llama_cpp as L
import numpy as np


def prompt_ids(count, vocab, salt=0):
    lo = min(1000, vocab // 4)
    return [lo + (i * 7919 + salt * 104_729) % (vocab - 2 * lo) for i in range(count)]


@L.llama_log_callback
def _quiet(level, text, user_data):
    pass


class Peer:
    def __init__(self, path, threads, n_ctx, n_seq):
        L.llama_log_set(_quiet, ctypes.c_void_p())
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {path}")
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = 512
        cp.n_ubatch = 512
        cp.n_seq_max = n_seq
        cp.n_threads = threads
        cp.n_threads_batch = threads
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(512, 0, n_seq)

    def clear(self):
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)

    def decode(self, items):
        """items: (token, pos, seq, wants_logits); returns the argmax of each wanted row."""
        b = self.batch
        b.n_tokens = len(items)
        for i, (tok, pos, seq, out) in enumerate(items):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if out else 0
        if L.llama_decode(self.ctx, b) != 0:
            raise SystemExit("llama_decode failed")
        nxt = []
        for i, (_, _, _, out) in enumerate(items):
            if out:
                row = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, i), shape=(self.vocab,))
                nxt.append(int(np.argmax(row)))
        return nxt

    def prefill(self, ids, seq=0):
        """Feeds `ids` in batches of 512; returns the next token."""
        nxt = None
        for s in range(0, len(ids), 512):
            chunk = ids[s:s + 512]
            items = [(t, s + i, seq, s + i == len(ids) - 1) for i, t in enumerate(chunk)]
            out = self.decode(items)
            if out:
                nxt = out[0]
        return nxt


def rss():
    """VmRSS of this process in bytes (Linux)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def prefill_rate(peer, n):
    peer.clear()
    ids = prompt_ids(n, peer.vocab)
    t = time.perf_counter()
    peer.prefill(ids)
    return n / (time.perf_counter() - t)


def decode_rate(peer, b, context, steps):
    peer.clear()
    nxt = [peer.prefill(prompt_ids(context, peer.vocab, s), seq=s) for s in range(b)]
    t = time.perf_counter()
    for k in range(steps):
        nxt = peer.decode([(nxt[s], context + k, s, True) for s in range(b)])
    return b * steps / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    batches = [int(b) for b in a.batch.split(",") if b]
    n_seq = max(batches + [1])
    n_ctx = max(a.prompt, (a.context + a.steps + 8)) * n_seq
    rss_before = rss()
    peer = Peer(a.model, a.threads, n_ctx, n_seq)
    rss_loaded = rss()
    prefill_rate(peer, min(a.prompt, 64))
    pre = statistics.median(prefill_rate(peer, a.prompt) for _ in range(a.reps))
    cells = {"prefill": pre}
    for b in batches:
        decode_rate(peer, b, a.context, 2)
        cells[f"decode_b{b}"] = statistics.median(decode_rate(peer, b, a.context, a.steps) for _ in range(a.reps))
    name = os.path.basename(a.model)
    for k, v in cells.items():
        print(f"| llama.cpp | {name} | {k} | {v:.1f} tok/s | {a.threads} threads |")
    # Resident memory as gelo bench sealed reports it (llama.cpp maps the file: its pages
    # count once touched).
    cells.update(rss_before=rss_before, rss_loaded=rss_loaded, rss_end=rss(), file_bytes=os.path.getsize(a.model))
    print(f"memory: file {cells['file_bytes'] / 1e6:.1f} MB, resident before load {rss_before / 1e6:.1f} MB, "
          f"after load {rss_loaded / 1e6:.1f} MB, at end {cells['rss_end'] / 1e6:.1f} MB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(peer="llama.cpp", llama_cpp_python=L.__version__, model=name, threads=a.threads,
                           prompt=a.prompt, context=a.context, steps=a.steps, cells=cells), f, indent=1)


if __name__ == "__main__":
    main()
