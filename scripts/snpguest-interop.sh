#!/usr/bin/env bash
# Peer check: virtee's snpguest (a verifier nobody here wrote) must accept our mock
# evidence, i.e. the mock ARK/ASK/VCEK chain and a mock report's signature and TCB.
#
# Installs snpguest 0.11.0 once into $GELO_CACHE/snpguest (default ~/.cache/gelo; the
# build takes about 5 minutes on 2 cores and needs libssl-dev), then reuses it.
# Exits non-zero if snpguest rejects anything.
set -euo pipefail
cd "$(dirname "$0")/.."

SNPGUEST_VERSION=0.11.0
CACHE="${GELO_CACHE:-$HOME/.cache/gelo}"
SNPGUEST="$CACHE/snpguest/bin/snpguest"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"

if [[ ! -x "$SNPGUEST" ]] || ! "$SNPGUEST" --version 2>/dev/null | grep -q "$SNPGUEST_VERSION"; then
  echo "installing snpguest $SNPGUEST_VERSION into $CACHE/snpguest (once)" >&2
  cargo install --locked --root "$CACHE/snpguest" snpguest --version "$SNPGUEST_VERSION"
fi

cargo build --quiet -p gelo --bin gelo
GELO="$CARGO_TARGET_DIR/debug/gelo"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# A mock PKI with a chosen launch digest, and evidence with arbitrary identities.
MEASUREMENT=$(printf 'snpguest-interop' | sha384sum | cut -d' ' -f1)
"$GELO" attest mock-pki --out "$WORK/pki" --measurement "$MEASUREMENT" >/dev/null
NONCE=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
MODEL=$(printf model | sha256sum | cut -d' ' -f1)
SCHEME_JSON='{"mask":"haar","role":"embedder"}' # already canonical: sorted keys, no spaces
SCHEME=$(printf '%s' "$SCHEME_JSON" | sha256sum | cut -d' ' -f1)
TLS=$(printf key | sha256sum | cut -d' ' -f1)
"$GELO" attest issue --issuer mock --mock-pki "$WORK/pki" \
  --model-identity "$MODEL" --scheme-json "$SCHEME_JSON" --tls-spki-sha256 "$TLS" \
  --nonce "$NONCE" --out "$WORK/evidence.pb" --export "$WORK/certs" >/dev/null
# REPORT_DATA recomputed here with coreutils, independently of our Rust code.
REPORT_DATA=$( { printf 'gelo/report-data/v1'; printf '%s%s%s%s' "$MODEL" "$SCHEME" "$TLS" "$NONCE" | xxd -r -p; } \
  | sha512sum | cut -d' ' -f1)

echo "== snpguest verify certs" >&2
"$SNPGUEST" verify certs "$WORK/certs"
echo "== snpguest verify attestation" >&2
"$SNPGUEST" verify attestation "$WORK/certs" "$WORK/certs/report.bin" \
  --measurement "0x$MEASUREMENT" --report-data "0x$REPORT_DATA"

# And snpguest must refuse a tampered report, or the check above proves nothing.
cp "$WORK/certs/report.bin" "$WORK/tampered.bin"
printf '\x01' | dd of="$WORK/tampered.bin" bs=1 seek=$((0x90)) conv=notrunc status=none
if "$SNPGUEST" verify attestation "$WORK/certs" "$WORK/tampered.bin" >/dev/null 2>&1; then
  echo "snpguest accepted a tampered report" >&2
  exit 1
fi
echo "snpguest $SNPGUEST_VERSION accepts GELO mock evidence and rejects a tampered report" >&2
