#!/usr/bin/env python3
"""Scores GELO's answers on a question set with reference facts (eval/rag/questions.jsonl).

    python3 scripts/rag_eval.py --gelo PATH/TO/gelo [--up-args=--small] [--json out.json]

Starts `gelo up` (with `--up-args`), ingests the project's README.md and docs/, asks every
question through the OpenAI-compatible API (model gelo-rag, streamed, temperature 0) and
scores each answer on three counts (and records whether the facts were in the passages
the generator was given at all, `retrieved`: the retrieval's share of a miss):
  facts     every fact group of the question has one of its strings in the answer
            (case-insensitive);
  cited     the answer cites at least one passage, and every citation is a passage it was
            given (no unknown citation);
  fluent    no degenerate repetition: no word 4-gram three times or more, and at most a
            third of the answer's words repeated 4-grams.
A question passes when all three hold. Two more counts, not part of a pass:
  restates  the answer, citations aside, adds no content word to its question;
  citation precision  over all the answers' citations, the share that hold: the cited
            passage contains at least half of its sentence's content words, or as many as
            any other passage the answer was given (scripts/citations.py; by words, not by
            the embedder the gateway checks citations with).
Prints one line per question, then the pass rate, each count's rate and the median time to
first token; --json writes all of it.

--ranks also searches the store for every question (`gelo search`, top 1000, the query's
own retrieval without the focus) and records `rank`, the place of the first passage that
holds the question's facts (None past 1000), and the count of questions whose facts are
among the `--candidates` first passages (the gateway's focus chooses the shown passages from
its 8 candidates). With --no-answers nothing is generated: a retrieval-only run in minutes.
"""

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request

import subprocess

import citations
from gelo_up import ingest_paths, start_up, stop

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def ask(base, key, question, max_tokens):
    body = {"model": "gelo-rag", "messages": [{"role": "user", "content": question}], "stream": True, "temperature": 0}
    if max_tokens:
        body["max_tokens"] = max_tokens
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    req = urllib.request.Request(f"{base}/v1/chat/completions", json.dumps(body).encode(), headers)
    t0 = time.time()
    ttft, text, passages, cites = None, [], [], {"citations": [], "unknown_citations": []}
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"].get("message", "error"))
            passages += [{"id": p["id"], "text": p.get("text", "")} for p in chunk.get("passages", [])]
            if "citations" in chunk:
                cites = chunk["citations"]
            for c in chunk.get("choices", []):
                piece = (c.get("delta") or {}).get("content") or ""
                if piece:
                    ttft = ttft if ttft is not None else time.time() - t0
                    text.append(piece)
    return "".join(text), passages, cites, ttft, time.time() - t0


def rank(gelo, state, item, top_k=1000):
    """The place (from 1) of the first passage `gelo search` returns for the question that
    holds its facts, or None."""
    env = dict(os.environ, GELO_UP_DIR=os.path.join(state, "up"))
    out = subprocess.run([os.path.abspath(gelo), "search", "--json", "--top-k", str(top_k), item["q"]], env=env,
                         check=True, capture_output=True, text=True).stdout
    for i, p in enumerate(json.loads(out)["passages"], 1):
        if has_facts(item, p["text"]):
            return i
    return None


def degenerate(text):
    words = re.findall(r"\w+", text.lower())
    grams = [tuple(words[i:i + 4]) for i in range(len(words) - 3)]
    counts = {}
    for g in grams:
        counts[g] = counts.get(g, 0) + 1
    repeated = sum(c for c in counts.values() if c > 1)
    return any(c >= 3 for c in counts.values()) or (len(words) >= 12 and repeated > len(words) / 3)


def has_facts(item, text):
    low = text.lower()
    return all(any(f.lower() in low for f in group) for group in item["facts"])


def score(item, text, cites, passages):
    facts = has_facts(item, text)
    # The retrieval's share: were the facts in what the generator was given at all?
    retrieved = has_facts(item, " ".join(p["text"] for p in passages))
    cited = len(cites.get("citations", [])) > 0 and not cites.get("unknown_citations")
    fluent = bool(text.strip()) and not degenerate(text)
    checked = citations.check(text, {p["id"]: p["text"] for p in passages})
    return {"facts": facts, "cited": cited, "fluent": fluent, "retrieved": retrieved, "pass": facts and cited and fluent,
            "restates": citations.restates(text, item["q"]), "citations_checked": checked,
            "citations_hold": sum(c["holds"] for c in checked), "citations_total": len(checked)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gelo", required=True)
    ap.add_argument("--up-args", default="", help="more flags for gelo up, e.g. --small")
    ap.add_argument("--questions", default=os.path.join(ROOT, "eval/rag/questions.jsonl"))
    ap.add_argument("--max-tokens", type=int, default=0, help="0: the gateway's default")
    ap.add_argument("--corpus", default=ROOT, help="the folder whose README.md and docs/ are ingested (default: this checkout), "
                    "e.g. `git archive COMMIT README.md docs | tar -x -C DIR` to compare two builds on the same text")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--label", default="")
    ap.add_argument("--ranks", action="store_true", help="record each question's retrieval rank (gelo search)")
    ap.add_argument("--candidates", type=int, default=8, help="--ranks: count the questions ranked within this")
    ap.add_argument("--no-answers", action="store_true", help="with --ranks: rank only, generate nothing")
    ap.add_argument("--env", action="append", default=[], help="K=V for gelo up and its services, e.g. GELO_QUERY_TOP_K=3")
    a = ap.parse_args()
    items = [json.loads(line) for line in open(a.questions) if line.strip()]
    with tempfile.TemporaryDirectory() as state:
        env = dict(os.environ, **dict(kv.split("=", 1) for kv in a.env))
        proc, ready = start_up(a.gelo, state, env=env, args=a.up_args.split())
        try:
            t0 = time.time()
            ingest_paths(a.gelo, state, ["README.md", "docs"], cwd=a.corpus)
            ingest_s = time.time() - t0
            base = f"http://{ready['http']}"
            rows = []
            for item in items:
                r = rank(a.gelo, state, item) if a.ranks else None
                if a.no_answers:
                    rows.append({"q": item["q"], "rank": r})
                    print(f"rank {r if r else '-':>5}  {item['q']}", flush=True)
                    continue
                text, passages, cites, ttft, total = ask(base, ready["api_key"], item["q"], a.max_tokens)
                s = score(item, text, cites, passages)
                rows.append({"q": item["q"], "answer": text, "passages": passages, **cites, "ttft_s": ttft, "total_s": total,
                             "rank": r, **s})
                mark = "PASS" if s["pass"] else "fail " + ",".join(k for k in ("facts", "cited", "fluent") if not s[k])
                mark += " restates" if s["restates"] else ""
                hold = f"{s['citations_hold']}/{s['citations_total']}"
                print(f"{mark:<22} {hold:>4} {ttft or 0:5.2f}s  {item['q'][:60]:<60}  {' '.join(text.split())[:90]}", flush=True)
        finally:
            stop(proc)
    n = len(rows)
    ranked = {"ranked_within": sum(1 for r in rows if r["rank"] and r["rank"] <= a.candidates), "candidates": a.candidates,
              "ranks": [r["rank"] for r in rows]} if a.ranks else {}
    if a.no_answers:
        summary = {"label": a.label, "env": a.env, "questions": n, "ingest_s": ingest_s, **ranked}
        print(json.dumps(summary))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"summary": summary, "rows": rows}, f, indent=1)
        return
    rate = lambda k: sum(r[k] for r in rows) / n
    ttfts = [r["ttft_s"] for r in rows if r["ttft_s"] is not None]
    summary = {"label": a.label, "up_args": a.up_args, "env": a.env, "questions": n, "pass": rate("pass"), "facts": rate("facts"),
               "cited": rate("cited"), "fluent": rate("fluent"), "retrieved": rate("retrieved"), "passed": sum(r["pass"] for r in rows), "restating": sum(r["restates"] for r in rows),
               "citation_precision": sum(r["citations_hold"] for r in rows) / max(1, sum(r["citations_total"] for r in rows)),
               "citations": sum(r["citations_total"] for r in rows), "median_ttft_s": statistics.median(ttfts) if ttfts else None,
               "median_total_s": statistics.median(r["total_s"] for r in rows), "ingest_s": ingest_s, **ranked}
    print(json.dumps(summary))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
