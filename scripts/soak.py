#!/usr/bin/env python3
"""A soak of `gelo up` through its HTTP port, with `gelo bench serve --role gateway`.

    python3 scripts/soak.py --gelo PATH/TO/gelo [--small] [--duration 600] [--warmup 60] \\
        [--concurrency 8] [--limit 16] [--overload 32] [--json out.json]

Starts `gelo up` (its gateway's --max-concurrent-requests set to --limit), adds a few
documents, runs the soak — concurrent streamed `gelo-rag` answers, embeddings, ingests and
reranks, then --overload streamed answers at once — prints its tables (requests/s, p50/p95/p99 of whole requests and of the first token,
errors by code, each process's resident memory) and stops the stack. Exits non-zero when the
soak does: an error other than the documented 429 `overloaded`, or a slow refusal.

Meanwhile it samples every process's resident memory split into anonymous memory (heap,
stacks) and file pages (the mapped binary, which the kernel evicts and maps back under
memory pressure) every --sample seconds, and prints both after the warm-up and at the end
of the measured phase, with the anonymous memory's range (--samples FILE keeps them all): a
growth in file pages is the page cache, not the process.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from gelo_up import http_call, start_up, stop


def children(pid):
    """The processes `pid` started, by the role they serve (`gelo ROLE ...`)."""
    out = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and len(args) > 1:
            out[args[1].decode(errors="replace")] = int(d)
    return out


def memory(pid):
    """RssAnon and RssFile of `pid` in MiB, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return tuple(int(fields[k].split()[0]) / 1024 for k in ("RssAnon", "RssFile"))
    except (OSError, KeyError, ValueError):
        return None


def sample(stack, every, samples, done):
    """Appends (seconds, {role: (anon, file)}) to `samples` until `done` is set."""
    t0 = time.time()
    while not done.wait(0 if not samples else every):
        samples.append((time.time() - t0, {role: memory(pid) for role, pid in stack.items()}))


def split_table(samples, warmup, measured):
    """Each process's anonymous and file-backed memory after the warm-up and at the end of
    the measured phase (before the overload burst), with the anonymous memory's range over
    the measured phase: a single sample of a model service shows what it had in flight."""
    phase = [m for t, m in samples if warmup <= t <= measured] or [samples[-1][1]]
    after, end = phase[0], phase[-1]
    print(f"\nresident memory split ({len(phase)} samples from the warm-up's end to the overload): anonymous | file pages, MiB")
    print("| process | anon after warm-up | anon at end | anon growth | anon min–max | file after warm-up | file at end |")
    print("|---|---|---|---|---|---|---|")
    for role in sorted(end):
        anon = [m[role][0] for m in phase if m.get(role)]
        if not (after.get(role) and end.get(role)):
            continue
        (a0, f0), (a1, f1) = after[role], end[role]
        growth = 100 * (a1 - a0) / a0
        print(f"| {role} | {a0:.1f} | {a1:.1f} | {growth:+.1f} % | {min(anon):.1f}–{max(anon):.1f} | {f0:.1f} | {f1:.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gelo", required=True)
    ap.add_argument("--small", action="store_true", help="gelo up --small (SmolLM2-135M)")
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--warmup", type=float, default=20)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--limit", type=int, default=16, help="the gateway's --max-concurrent-requests")
    ap.add_argument("--overload", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--json")
    ap.add_argument("--sample", type=float, default=10, help="seconds between memory samples")
    ap.add_argument("--samples", help="write every memory sample (seconds, role: [anon, file] MiB) to this JSON file")
    a = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="gelo-soak-") as state:
        args = (["--small"] if a.small else []) + ["--", "--max-concurrent-requests", str(a.limit)]
        proc, up = start_up(a.gelo, state, args=args)
        try:
            base = f"http://{up['http']}"
            docs = [
                {"name": f"seed-{i}.md", "text": f"# Seed {i}\n\n" + f"GELO keeps prompts and documents inside attested CVMs ({i}). " * 20}
                for i in range(8)
            ]
            status, _, body = http_call(f"{base}/v1/documents", up["api_key"], body={"documents": docs}, timeout=600)
            if status != 200:
                raise SystemExit(f"FAIL: seeding the store: {status} {body}")
            # Every process of the stack: the services `gelo up` names, the gateway, and `up` itself.
            stack = {**children(proc.pid), **up["pids"], "up": proc.pid}
            pids = [f"{role}={pid}" for role, pid in sorted(stack.items())]
            cmd = [
                a.gelo, "bench", "serve", "--role", "gateway", "--http", up["http"],
                "--concurrency", str(a.concurrency), "--duration", str(a.duration), "--warmup", str(a.warmup),
                "--max-tokens", str(a.max_tokens), "--overload", str(a.overload), "--pids", ",".join(pids),
            ]
            if a.json:
                cmd += ["--json", a.json]
            print("+", " ".join(cmd), flush=True)
            samples, done = [], threading.Event()
            sampler = threading.Thread(target=sample, args=(stack, a.sample, samples, done), daemon=True)
            sampler.start()
            rc = subprocess.run(cmd, env=dict(os.environ, OPENAI_API_KEY=up["api_key"])).returncode
            done.set()
            sampler.join()
            split_table(samples, a.warmup, a.warmup + a.duration)
            if a.samples:
                with open(a.samples, "w") as f:
                    json.dump([{"t": t, "rss": m} for t, m in samples], f)
        finally:
            stop(proc)
    if rc != 0:
        raise SystemExit(f"FAIL: the soak exited with {rc}")
    print("ok: soak")


if __name__ == "__main__":
    sys.exit(main())
