#!/usr/bin/env python3
"""The yes/no reranker's SciFact check (`gelo eval rerank`) redone by llama.cpp on the same
GGUF file: how often the relevant abstract scores above a random one, for the first
`--queries` judged test queries.

The prompt is `models::roles::LlmReranker::prompt` (Qwen3-Reranker's format, cut to
`--max-len` tokens keeping its closing), the score the `yes` − `no` logit gap of the next
token. Also reported, to tell a weak model from a prompt that does not suit it: the same
without the empty `<think>` block (Qwen3's; Qwen2.5 has none), and with `yes`/`Yes` and
`no`/`No` pooled. The random documents are drawn by Python's `random` (seed 7), not by the
Rust command's generator, so the two pick different negatives.

    python scripts/reference/llama_cpp_rerank.py --data PATH/TO/BEIR/scifact --model FILE.gguf

Needs llama-cpp-python (scripts/reference/requirements.txt).
"""

import argparse
import json
import math
import os
import random

from llama_cpp import Llama
from llama_cpp_bench import last_logits

SYSTEM = ('Judge whether the Document meets the requirements based on the Query and the Instruct provided. '
          'Note that the answer can only be "yes" or "no".')
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def prompt(query, document, think):
    p = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
         f"<Instruct>: {INSTRUCTION}\n<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n")
    return p + ("<think>\n\n</think>\n\n" if think else "")


def load(data):
    corpus = {}
    for line in open(os.path.join(data, "corpus.jsonl")):
        j = json.loads(line)
        corpus[j["_id"]] = f"{j.get('title', '')} {j['text']}".strip()
    queries = {}
    for line in open(os.path.join(data, "queries.jsonl")):
        j = json.loads(line)
        queries[j["_id"]] = j["text"]
    qrels = {}
    with open(os.path.join(data, "qrels", "test.tsv")) as f:
        next(f)
        for line in f:
            q, d, score = line.split("\t")
            if int(score) > 0:
                qrels.setdefault(q, []).append(d)
    return corpus, queries, qrels


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    corpus, queries, qrels = load(a.data)
    llm = Llama(model_path=a.model, n_ctx=a.max_len + 16, n_threads=a.threads, n_threads_batch=a.threads,
                logits_all=False, verbose=False)

    def tok(text):
        return llm.tokenize(text.encode(), add_bos=False, special=True)

    def single(word):
        ids = tok(word)
        assert len(ids) == 1, f"`{word}` is not one token"
        return ids[0]

    yes, no = [single("yes"), single("Yes")], [single("no"), single("No")]

    def logits(text):
        ids = tok(text)
        if len(ids) > a.max_len:
            tail = tok(text[text.rindex("<|im_end|>"):])
            ids = ids[: a.max_len - len(tail)] + tail
        llm.reset()
        llm.eval(ids)
        return last_logits(llm).copy()

    def lse(v):
        m = max(v)
        return m + math.log(sum(math.exp(x - m) for x in v))

    rng = random.Random(7)
    ids = list(corpus)
    judged = [q for q in queries if q in qrels][: a.queries]
    wins = {"qwen3-reranker prompt": 0, "yes/Yes pooled": 0, "no <think> block": 0, "no <think>, pooled": 0}
    for q in judged:
        negative = rng.choice(ids)
        while negative in qrels[q]:
            negative = rng.choice(ids)
        scores = {}
        for think in (True, False):
            for doc in (qrels[q][0], negative):
                logit = logits(prompt(queries[q], corpus[doc], think))
                scores[think, doc] = (logit[yes[0]] - logit[no[0]],
                                      lse([logit[i] for i in yes]) - lse([logit[i] for i in no]))
        for k, (think, pooled) in zip(wins, [(True, 0), (True, 1), (False, 0), (False, 1)]):
            wins[k] += scores[think, qrels[q][0]][pooled] > scores[think, negative][pooled]
    print(f"| {os.path.basename(a.model)}: relevant above random, {len(judged)} queries | share |")
    print("|---|---|")
    for k, v in wins.items():
        print(f"| {k} | {v / len(judged):.2f} |")


if __name__ == "__main__":
    main()
