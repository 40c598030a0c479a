"""The prompt corpus: SciFact claims and abstract sentences, plus templated prompts that
carry the kind of secrets a user sends (names, identifiers, diagnoses), plus groups of
repeated and near-identical prompts for the multi-observation attack.

Deterministic for a given size and seed; needs only the SciFact files (offline).
"""

import json
import random
import re
from pathlib import Path

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


def build(data_dir, size, seed=2026, repeats=(4, 8), similar=8):
    """`size` prompts: `repeats[0]` texts sent `repeats[1]` times each, `similar`
    near-identical prompts, the rest mixed claims, abstract sentences and templates."""
    data_dir = Path(data_dir)
    rng = random.Random(seed)
    claims = [json.loads(l)["text"] for l in (data_dir / "queries.jsonl").open()]
    sentences = []
    with (data_dir / "corpus.jsonl").open() as f:
        for i, line in enumerate(f):
            if i % 7:
                continue
            sentences.extend(_sentences(json.loads(line)["text"])[:2])
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
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    write(a.out, build(a.data, a.size))
