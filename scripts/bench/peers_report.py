#!/usr/bin/env python3
"""Medians and ratios of a scripts/bench/peers.sh run: for each model and cell, GELO's
rate, each peer's, and GELO ÷ the fastest peer (≥ 1.0 means GELO is at least as fast).

    python3 scripts/bench/peers_report.py DIR
"""

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main():
    d = Path(sys.argv[1])
    runs = defaultdict(lambda: defaultdict(list))  # (model, cell) -> runtime -> [rates]
    threads = {}
    memory = defaultdict(lambda: defaultdict(list))  # model -> runtime -> [(added, loaded, file)]
    for f in sorted(d.glob("*.json")):
        doc = json.loads(f.read_text())
        model = f.name.split(".gelo.")[0].split(".llama.")[0].split(".peers.")[0]
        threads[model] = doc.get("threads")
        runtime = "GELO" if ".gelo." in f.name else None
        c = doc["cells"]
        if "rss_loaded" in c and "rss_before" in c:
            who = "GELO" if runtime else "llama.cpp"
            memory[model][who].append((c["rss_loaded"] - c["rss_before"], c["rss_loaded"], c.get("file_bytes", 0)))
        for cell, v in doc["cells"].items():
            if not isinstance(v, (int, float)) or cell.endswith("bytes") or cell.startswith("rss"):
                continue
            if runtime == "GELO":
                runs[(model, cell)]["GELO"].append(v)
            elif ".llama." in f.name:
                runs[(model, cell)]["llama.cpp"].append(v)
            elif cell in ("pytorch", "onnxruntime"):
                runs[(model, "embed")][cell].append(v)
    # GELO's embed cell is named embed_<texts>x<n>; fold it into "embed".
    for (model, cell), by in list(runs.items()):
        if cell.startswith("embed_"):
            runs[(model, "embed")]["GELO"].extend(by["GELO"])
            del runs[(model, cell)]
    print("| model | cell | threads | GELO | peers | GELO ÷ fastest peer |")
    print("|---|---|---|---|---|---|")
    for (model, cell), by in sorted(runs.items()):
        med = {k: statistics.median(v) for k, v in by.items() if v}
        if "GELO" not in med:
            continue
        peers = {k: v for k, v in med.items() if k != "GELO"}
        rng = lambda k: f"{min(by[k]):.1f}–{max(by[k]):.1f}"
        peer_txt = ", ".join(f"{k} {v:.1f} ({rng(k)})" for k, v in sorted(peers.items()))
        ratio = med["GELO"] / max(peers.values()) if peers else float("nan")
        print(f"| {model} | {cell} | {threads.get(model)} | {med['GELO']:.1f} ({rng('GELO')}) | {peer_txt} | {ratio:.2f} |")
    if memory:
        print()
        print("| model | runtime | file MB | resident after load, MB | added by the model, MB | added ÷ file |")
        print("|---|---|---|---|---|---|")
        for model, by in sorted(memory.items()):
            for who, rows in sorted(by.items()):
                added = statistics.median(r[0] for r in rows)
                loaded = statistics.median(r[1] for r in rows)
                file = rows[0][2]
                print(f"| {model} | {who} | {file / 1e6:.1f} | {loaded / 1e6:.1f} | {added / 1e6:.1f} | "
                      f"{added / file if file else float('nan'):.2f} |")


if __name__ == "__main__":
    main()
