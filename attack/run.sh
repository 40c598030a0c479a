#!/usr/bin/env bash
# GELO attack harness: capture what the untrusted GPU sees, attack it, print the table,
# check the gates (exit status), write the JSON report. See docs/SECURITY.md.
#
#   attack/run.sh            CI size: MiniLM + SmolLM2, a few dozen prompts
#   attack/run.sh --full     release size: 512 prompts (the table in docs/SECURITY.md)
#   attack/run.sh --strict   the extra attacks' findings fail the run too
#
# Captures go to ${GELO_CACHE:-~/.cache/gelo}/attack/{ci,full}/ (never into git).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gelo/target}"
if ! python3 -c 'import numpy, scipy, sklearn' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check -r attack/requirements.txt
fi
cargo build --quiet -p gelo-attack
exec nice -n 10 python3 attack/report.py --binary "$CARGO_TARGET_DIR/debug/gelo-attack" "$@"
