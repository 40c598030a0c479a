#!/usr/bin/env python3
"""Writes a release manifest (schema gelo-release/1, read by services/edge/attest/src/release/):
the commit, the binary's SHA-256, the launch (measure.sh's launch.json, its measurement
included), model identities and the scheme. Keys sorted, two-space indent, one final
newline: the same inputs give the same bytes, and the log holds those bytes.

    manifest.py --commit C --binary PATH --launch launch.json [--model HEX]... \
                [--protection NAME]... [--scheme-identity HEX]... --out manifest.json
"""
import argparse
import hashlib
import json

p = argparse.ArgumentParser()
p.add_argument("--commit", required=True)
p.add_argument("--binary", required=True)
p.add_argument("--launch", required=True)
p.add_argument("--model", action="append", default=[])
p.add_argument("--protection", action="append", default=[])
p.add_argument("--scheme-identity", action="append", default=[])
p.add_argument("--out", required=True)
a = p.parse_args()
with open(a.binary, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
launch = json.load(open(a.launch))
if launch["initrd"]["gelo_sha256"] != digest:
    raise SystemExit(f"{a.launch} was measured with another binary")
for h, n in [(m, 64) for m in a.model] + [(s, 64) for s in a.scheme_identity]:
    bytes.fromhex(h)
    if len(h) != n:
        raise SystemExit(f"{h}: want {n} hex digits")
manifest = {
    "schema": "gelo-release/1",
    "commit": a.commit,
    "binary": {"name": "gelo", "sha256": digest},
    "launch": launch,
    "model_identities": a.model,
    "scheme": {"protections": a.protection or ["sealed"], "scheme_identities": a.scheme_identity},
}
with open(a.out, "w") as f:
    f.write(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
