"""Whether an answer's citations hold, and whether it restates its question: the checks
scripts/rag_eval.py and scripts/console_check.py share, by words alone (independent of the
embedder the gateway checks citations with).

A citation belongs to the sentence it stands in (a sentence ends at `.`, `!` or `?` followed
by a space and anything but a lowercase letter, or at a line break); one standing alone
after the last sentence belongs to that sentence. A citation *holds* when the cited
passage contains at least half of its sentence's content words, or at least as many as any
other passage the answer was given. An answer *restates* its question when, citations
aside, it has no content word that the question does not have.
"""

import re

STOP = set("""
a about according all also an and answer answers any are as at be been being both but by can context could did do does
doing done each excerpt following for from given had has have here how i if in information into is it its just me
mentioned my number of on one or our passage passages provided question should so some such text that the their them
then there these they this those to use used uses using very was we were what when where which who whom why will with would
you your
""".split())

CITE = re.compile(r"\[([^\[\]\n]{1,200})\]")
WORD = re.compile(r"[\w./#@:=-]*\w[\w./#@:=-]*")


def words(text):
    """Lowercased content words (function words left out), trailing joiners trimmed."""
    out = []
    for w in WORD.findall(text.lower()):
        w = w.strip("./#@:=").rstrip("-")
        if w and w not in STOP and any(c.isalnum() for c in w):
            out.append(w)
    return out


def stem(w):
    for suffix in ("ing", "ed", "es", "s"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3 and not w.endswith("ss"):
            return w[: -len(suffix)]
    return w


def citations(answer, ids):
    """[(sentence, [cited ids])] for each citation of a passage among `ids`, in order."""
    spans = []
    for m in CITE.finditer(answer):
        parts = [p.strip() for p in re.split(r"[,;]", m.group(1))]
        if parts and all(p in ids for p in parts):
            spans.append((m.start(), m.end(), parts))
    if not spans:
        return []
    # Sentence ends, found in the answer with its citations blanked out.
    blank = list(answer)
    for s, e, _ in spans:
        blank[s:e] = " " * (e - s)
    blank = "".join(blank)
    ends = [m.end() for m in re.finditer(r"([.!?])(?= +(?:[^ a-z]|$))|(\n)", blank)]
    bounds = [0] + sorted(set(ends)) + [len(answer)]
    sentences = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    out = {}
    for s, _, parts in spans:
        i = next(i for i, (a, b) in enumerate(sentences) if a <= s < b or (s == b == len(answer)))
        # A citation in a segment without words cites the sentence before it.
        while i > 0 and not words(blank[sentences[i][0]:sentences[i][1]]):
            i -= 1
        out.setdefault(i, []).extend(p for p in parts if p not in out.get(i, []))
    return [(" ".join(blank[sentences[i][0]:sentences[i][1]].split()), cited) for i, cited in sorted(out.items())]


def support(sentence, passage):
    """The share of the sentence's content words the passage contains (by stem)."""
    have = {stem(w) for w in words(passage)}
    mine = [stem(w) for w in words(sentence)]
    return sum(w in have for w in mine) / len(mine) if mine else 0.0


def check(answer, passages):
    """Each citation of `answer` against `passages` ({id: text}): dicts with the sentence, the
    cited id, its support, the best-supporting passage and whether the citation holds."""
    rows = []
    for sentence, cited in citations(answer, set(passages)):
        scores = {pid: support(sentence, text) for pid, text in passages.items()}
        best = max(scores, key=lambda p: scores[p])
        for pid in cited:
            holds = scores[pid] >= 0.5 or (scores[pid] > 0 and scores[pid] >= scores[best])
            rows.append({"sentence": sentence, "cited": pid, "support": round(scores[pid], 3), "best": best,
                         "best_support": round(scores[best], 3), "holds": holds})
    return rows


def restates(answer, question):
    """Whether `answer`, citations aside, adds no content word to `question`."""
    asked = {stem(w) for w in words(question)}
    return not [w for w in words(CITE.sub(" ", answer)) if stem(w) not in asked]


if __name__ == "__main__":
    bees = "Honey bees tell their hive mates where flowers are with the waggle dance, a figure-of-eight run on the comb."
    tea = "Green tea and black tea come from the same plant, Camellia sinensis; black tea is oxidised before drying."
    passages = {"bees.txt#0": bees, "tea.md#0": tea}
    wrong = "[tea.md#0] Honey bees tell their hive mates where flowers are with the waggle dance."
    right = "Honey bees tell their hive mates where flowers are with the waggle dance [bees.txt#0]."
    assert [r["holds"] for r in check(wrong, passages)] == [False], check(wrong, passages)
    assert [r["holds"] for r in check(right, passages)] == [True], check(right, passages)
    assert citations("It is P-384. [a#1]", {"a#1"}) == [("It is P-384.", ["a#1"])]
    assert citations("[a#1] One. [b#2] Two.", {"a#1", "b#2"}) == [("One.", ["a#1"]), ("Two.", ["b#2"])]
    assert restates("[a#1] To run the tests, you run the tests.", "How do I run the tests?")
    assert not restates("Run bash scripts/test.sh [a#1].", "How do I run the tests?")
    print("ok")
