#!/usr/bin/env python3
"""Checks that the README's layout answers still hold for the code.

- every path in the README's layout table exists;
- a `Masked` operand is made only inside the protocol crate (`Masked::mixed`), and the
  named opt-out `expose_plaintext` is called only by the plaintext executor, the engines'
  own tests and the benchmarks;
- the `Engine` trait is implemented only by the engines in `kernels/`, the protocol's
  blanket and unit-test engines, the attack harness's recorder, and test code;
- masks are sampled only in the protocol crate (and its tests);
- evidence is verified in `services/edge/attest/src/verify/` (its `Verifier` lives there).
"""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def tracked_rust():
    out = subprocess.run(["git", "ls-files", "*.rs"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / p for p in out.stdout.split()]


def is_test(rel):
    return "/tests/" in f"/{rel}" or rel.endswith("/tests.rs") or "/benches/" in f"/{rel}"


def code(text):
    return re.sub(r"//[^\n]*", "", text)


def main():
    errors = []
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layout") :].split("\n\n")[2]
    for row in table.splitlines()[2:]:
        for path in re.findall(r"`([^`]+)`", row.split("|")[1]):
            if not (ROOT / path).exists():
                errors.append(f"README layout names `{path}`, which does not exist")

    rules = [
        (r"\bMasked::mixed\(", lambda rel: rel.startswith("services/tee/protocol/src/"), "makes a Masked operand"),
        (
            r"\bexpose_plaintext\(",
            lambda rel: rel.startswith(("services/tee/protocol/src/", "kernels/", "services/tools/bench/"))
            or is_test(rel),
            "sends plaintext to an engine",
        ),
        (
            r"\bimpl(<[^>]*>)?\s+(protocol::)?Engine\s+for\b",
            lambda rel: rel.startswith(("kernels/", "attack/capture/src/"))
            or rel in ("services/tee/protocol/src/engine.rs", "services/tee/protocol/src/executor/test_engine.rs")
            or is_test(rel),
            "implements the Engine trait",
        ),
        (
            r"\b(haar::sample|Hd3::sample|BlockMask::sample)\b",
            lambda rel: rel.startswith("services/tee/protocol/src/") or (rel.startswith("services/tee/protocol/") and is_test(rel)),
            "samples a mask",
        ),
        (r"\bstruct Verifier\b", lambda rel: rel.startswith("services/edge/attest/src/verify/"), "defines the verifier"),
    ]
    for f in tracked_rust():
        rel = str(f.relative_to(ROOT))
        if rel.startswith("scripts/"):
            continue
        text = code(f.read_text())
        for pattern, allowed, what in rules:
            if re.search(pattern, text) and not allowed(rel):
                errors.append(f"{rel} {what}, outside the places README.md's layout names")
    if not any(re.search(r"\bstruct Verifier\b", code(f.read_text())) for f in (ROOT / "services/edge/attest/src/verify").rglob("*.rs")):
        errors.append("services/edge/attest/src/verify/ no longer defines the Verifier")
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        sys.exit(1)
    print("README layout answers hold: paths exist, boundary, engines, masks and verifier where it says")


if __name__ == "__main__":
    main()
