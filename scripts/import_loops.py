#!/usr/bin/env python3
"""Fails when two modules of one crate import each other, directly or through others.

A module is a top-level file of a crate's `src/` (`src/report.rs`, or the folder
`src/verify/` with everything under it); the crate root (`lib.rs`, `main.rs`) only
declares and re-exports, so it is not a node. An edge `a -> b` is any `crate::b` path in
`a`'s code (in `use` lists too; comments and doc links do not count). Test modules (`#[cfg(test)]` files named `tests.rs`)
are left out: they may reach anything.
"""
import pathlib
import re
import subprocess
import sys

PATH = re.compile(r"\bcrate::(\{[^;]*\}|[a-z_][a-z0-9_]*)", re.S)


def code_of(text):
    """The text without comments (doc links name modules without importing them)."""
    return re.sub(r"//[^\n]*", "", text)


def names_in(text):
    text = code_of(text)
    out = set()
    for m in PATH.finditer(text):
        body = m.group(1)
        if body.startswith("{"):
            depth, cur, items = 0, "", []
            for ch in body[1:-1]:
                if ch in "{":
                    depth += 1
                elif ch in "}":
                    depth -= 1
                if ch == "," and depth == 0:
                    items.append(cur)
                    cur = ""
                else:
                    cur += ch
            items.append(cur)
            out.update(re.split(r"::|\s", i.strip())[0] for i in items if i.strip())
        else:
            out.add(body)
    return out


def modules(src):
    mods = {}
    for p in sorted(src.iterdir()):
        if p.name in ("lib.rs", "main.rs"):
            continue
        if p.is_file() and p.suffix == ".rs":
            mods[p.stem] = [p]
        elif p.is_dir():
            mods.setdefault(p.name, []).extend(sorted(p.rglob("*.rs")))
    return mods


def cycles(graph):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    manifests = subprocess.run(
        ["git", "ls-files", "*Cargo.toml"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    bad = 0
    for m in manifests:
        src = (root / m).parent / "src"
        if not src.is_dir():
            continue
        mods = modules(src)
        graph = {}
        for name, files in mods.items():
            refs = set()
            for f in files:
                if f.name == "tests.rs":
                    continue
                refs |= names_in(f.read_text())
            graph[name] = sorted(r for r in refs if r in mods and r != name)
        for comp in cycles(graph):
            bad += 1
            print(f"{src.relative_to(root)}: modules import each other: {' <-> '.join(comp)}", file=sys.stderr)
    if bad:
        sys.exit(1)
    print(f"no import loops between the modules of {len(manifests)} crates")


if __name__ == "__main__":
    main()
