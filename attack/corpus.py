"""The prompt corpus: SciFact claims and abstract sentences, plus templated prompts that
carry the kind of secrets a user sends (names, identifiers, diagnoses), plus groups of
repeated and near-identical prompts for the multi-observation attack.

Deterministic for a given size and seed; offline. The SciFact text comes from
`attack/data/scifact-prompts.json` (the claims and abstract sentences `build` draws from, cut
from BEIR SciFact by `extract`; attack/data/README.md), or from a BEIR SciFact folder, which
gives the same prompts:

    python3 attack/corpus.py --out prompts.jsonl [--size 512] [--data FILE_OR_BEIR_FOLDER]
    python3 attack/corpus.py --extract PATH/TO/BEIR/scifact --out attack/data/scifact-prompts.json
"""

import json
import random
import re
from pathlib import Path

# The vendored claims and sentences (what `extract` writes).
DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "scifact-prompts.json"
SOURCE = ("BEIR SciFact (Thakur et al. 2021; Wadden et al. 2020, allenai/scifact), CC BY-NC 2.0: "
          "`claims` is the text of every line of queries.jsonl, `sentences` the first two sentences "
          "(of 6 words or more) of the text of lines 1, 8, 15, ... (every 7th from the first) of "
          "corpus.jsonl, both in file order; written by "
          "`python3 attack/corpus.py --extract DIR --out FILE` (attack/data/README.md)")

NAMES = ["Alice Moreau", "Bogdan Petrov", "Chen Wei", "Dalia Haddad", "Emeka Obi", "Farah Khan",
         "Gustavo Lima", "Hana Sato", "Ivan Horvat", "Julia Novak", "Kwame Mensah", "Lena Fischer"]
CONDITIONS = ["type 2 diabetes", "early-stage melanoma", "chronic kidney disease", "atrial fibrillation",
              "major depressive disorder", "hepatitis C", "rheumatoid arthritis", "asthma"]
TEMPLATES = [
    "Summarize the evidence for this claim: {claim}",
    "Is it true that {claim_lc} Answer briefly.",
    "Write a short email to {name} explaining that {claim_lc}",
    "Patient {name}, record {num}, was diagnosed with {cond}. Draft a referral letter.",
    "My account number is {num} and my password hint is {word}. Why was my card declined?",
    "Translate into French: {claim}",
    "{name} asked whether {claim_lc} What should I tell them?",
    "Give three follow-up questions about: {claim}",
]
# Near-identical prompts: one template, different fills (the multi-observation attack).
SIMILAR = "Confidential: {name} ({num}) has {cond} and starts treatment on {day}."
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]


def _sentences(text):
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 6]


def _lc(claim):
    c = claim.rstrip(".")
    return (c[0].lower() + c[1:] if c[:2] != c[:2].upper() else c) + "."


def extract(beir_dir):
    """The claims and abstract sentences `build` draws from, in file order, from a BEIR
    SciFact folder: every claim of queries.jsonl, the first two sentences of every 7th abstract."""
    beir_dir = Path(beir_dir)
    with (beir_dir / "queries.jsonl").open(encoding="utf-8") as f:
        claims = [json.loads(l)["text"] for l in f]
    sentences = []
    with (beir_dir / "corpus.jsonl").open(encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i % 7:
                continue
            sentences.extend(_sentences(json.loads(line)["text"])[:2])
    return claims, sentences


def load(data=DEFAULT_DATA):
    """(claims, sentences) from a BEIR SciFact folder or from a file `write_extract` wrote."""
    data = Path(data)
    if data.is_dir():
        return extract(data)
    d = json.loads(data.read_text(encoding="utf-8"))
    return list(d["claims"]), list(d["sentences"])


def write_extract(beir_dir, path):
    claims, sentences = extract(beir_dir)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"source": SOURCE, "claims": claims, "sentences": sentences}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    return len(claims), len(sentences)


def build(data_dir=DEFAULT_DATA, size=512, seed=2026, repeats=(4, 8), similar=8):
    """`size` prompts: `repeats[0]` texts sent `repeats[1]` times each, `similar`
    near-identical prompts, the rest mixed claims, abstract sentences and templates.
    `data_dir`: a BEIR SciFact folder or the extract (`DEFAULT_DATA`); both give the same prompts."""
    rng = random.Random(seed)
    claims, sentences = load(data_dir)
    rng.shuffle(claims)
    rng.shuffle(sentences)

    def fill(t):
        claim = rng.choice(claims)
        return t.format(claim=claim, claim_lc=_lc(claim), name=rng.choice(NAMES), cond=rng.choice(CONDITIONS),
                        num=f"{rng.randrange(10**7, 10**8)}", word=rng.choice(["tangerine", "harbour", "violet"]),
                        day=rng.choice(DAYS))

    out = []
    n_rep, times = repeats
    for g in range(n_rep):
        text = fill(TEMPLATES[3 if g % 2 else 4])
        out += [{"text": text, "family": "repeat", "group": g}] * times
    for _ in range(similar):
        out.append({"text": fill(SIMILAR), "family": "similar", "group": n_rep})
    rest = max(0, size - len(out))
    kinds = ["claim", "sentence", "template"]
    for i in range(rest):
        kind = kinds[i % 3]
        if kind == "claim":
            text = claims[i % len(claims)]
        elif kind == "sentence":
            text = sentences[i % len(sentences)]
        else:
            text = fill(TEMPLATES[i % len(TEMPLATES)])
        out.append({"text": text, "family": kind, "group": -1})
    return out[:max(size, n_rep * times + similar)]


def write(path, prompts):
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps(p) + "\n")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="the extract or a BEIR SciFact folder")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--extract", metavar="BEIR_DIR", help="write the extract of this BEIR SciFact folder to --out")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.extract:
        n_claims, n_sentences = write_extract(a.extract, a.out)
        print(f"{a.out}: {n_claims} claims, {n_sentences} sentences")
    else:
        write(a.out, build(a.data, a.size))
