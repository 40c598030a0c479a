#!/usr/bin/env python3
"""Cut the SciFact subset in e2e/data/scifact from a full BEIR SciFact folder.

    python3 scripts/scifact_subset.py --source PATH/TO/BEIR/scifact --out e2e/data/scifact --others 100

Keeps exactly what `cargo test -p gelo --test e2e scifact_search` reads by default
(e2e/local/retrieval.rs): every corpus document judged in qrels/test.tsv plus the first
`--others` lines of corpus.jsonl (the test's rule `kept < others || judged`, which keeps
the first `others` lines and then only judged documents), in corpus order; the queries
that have judgements in qrels/test.tsv, in file order; qrels/test.tsv as is. Lines are
copied byte for byte. Standard library only.

The full BEIR folder: https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/scifact.zip
"""

import argparse
import json
import shutil
from pathlib import Path


def qrels(path):
    """(query ids, document ids) of qrels/test.tsv, parsed as models::beir::BeirData::load does."""
    queries, docs = set(), set()
    for i, line in enumerate(path.read_text().splitlines()):
        cols = line.split("\t")
        if len(cols) < 3:
            continue
        try:
            int(cols[2].strip())
        except ValueError:
            if i == 0:
                continue  # header
            raise
        queries.add(cols[0])
        docs.add(cols[1])
    return queries, docs


def copy_lines(src, dst, keep):
    """Copies the non-blank lines of a JSONL file whose record `keep` accepts, byte for byte."""
    n = 0
    with src.open("rb") as f, dst.open("wb") as out:
        for line in f:
            if not line.strip():
                continue
            if keep(json.loads(line)):
                out.write(line if line.endswith(b"\n") else line + b"\n")
                n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="a full BEIR SciFact folder")
    ap.add_argument("--out", required=True, help="where to write the subset")
    ap.add_argument("--others", type=int, default=100, help="leading corpus lines kept besides the judged ones")
    a = ap.parse_args()
    src, out = Path(a.source), Path(a.out)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    judged_queries, judged_docs = qrels(src / "qrels" / "test.tsv")
    shutil.copyfile(src / "qrels" / "test.tsv", out / "qrels" / "test.tsv")

    kept = 0

    def keep_doc(d):
        nonlocal kept
        if kept < a.others or d["_id"] in judged_docs:
            kept += 1
            return True
        return False

    docs = copy_lines(src / "corpus.jsonl", out / "corpus.jsonl", keep_doc)
    queries = copy_lines(src / "queries.jsonl", out / "queries.jsonl", lambda q: q["_id"] in judged_queries)
    print(f"{out}: {docs} documents, {queries} queries, {len(judged_docs)} judged documents")


if __name__ == "__main__":
    main()
