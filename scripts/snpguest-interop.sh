#!/usr/bin/env bash
# Peer check: virtee's snpguest (a verifier nobody here wrote) must accept our mock
# evidence, i.e. the mock ARK/ASK/VCEK chain, a mock report's signature and TCB, its
# MEASUREMENT and its REPORT_DATA; and it must refuse a tampered report, a foreign VCEK
# or ASK and other REPORT_DATA, each with its own message, or the acceptance proves
# nothing.
#
# Installs snpguest $SNPGUEST_VERSION once into $GELO_CACHE/tools (default ~/.cache/gelo),
# with a target folder of its own there so the workspace build is untouched, then reuses
# it: about 4-6 minutes on 2 cores, skipped while the pinned version is installed.
# GELO_BIN names a built `gelo` to use (scripts/test.sh passes the one its test run
# built); when it is unset or missing, this builds one. Exits non-zero if snpguest
# rejects our evidence or accepts a tampered one.
set -euo pipefail
cd "$(dirname "$0")/.."

SNPGUEST_VERSION=0.11.0
CACHE="${GELO_CACHE:-$HOME/.cache/gelo}"
TOOLS="$CACHE/tools"
SNPGUEST="$TOOLS/bin/snpguest"

if [[ ! -x "$SNPGUEST" ]] || ! "$SNPGUEST" --version 2>/dev/null | grep -qx "snpguest $SNPGUEST_VERSION"; then
  echo "installing snpguest $SNPGUEST_VERSION into $TOOLS (once; minutes)" >&2
  # snpguest asks for a vendored OpenSSL; linking the system's (libssl-dev) where there is
  # one halves the install's CPU time (154 s instead of 282 s on the 2-core machine).
  no_vendor=()
  if pkg-config --exists openssl 2>/dev/null; then no_vendor=(OPENSSL_NO_VENDOR=1); fi
  env "${no_vendor[@]}" CARGO_TARGET_DIR="$TOOLS/target" \
    cargo install --locked --root "$TOOLS" snpguest --version "$SNPGUEST_VERSION"
fi

if [[ -n "${GELO_BIN:-}" && -x "${GELO_BIN:-}" ]]; then
  GELO="$GELO_BIN"
else
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
  cargo build --quiet -p gelo --bin gelo
  GELO="$CARGO_TARGET_DIR/debug/gelo"
fi

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
  --nonce "$NONCE" --out "$WORK/evidence.pb" --export "$WORK/certs" >/dev/null 2>&1
# REPORT_DATA recomputed here with coreutils, independently of our Rust code.
REPORT_DATA=$( { printf 'gelo/report-data/v1'; printf '%s%s%s%s' "$MODEL" "$SCHEME" "$TLS" "$NONCE" | xxd -r -p; } \
  | sha512sum | cut -d' ' -f1)

echo "== snpguest $SNPGUEST_VERSION verify certs (mock ARK -> ASK -> VCEK)" >&2
"$SNPGUEST" verify certs "$WORK/certs"
echo "== snpguest verify attestation (TCB, signature, measurement, report data)" >&2
"$SNPGUEST" verify attestation "$WORK/certs" "$WORK/certs/report.bin" \
  --measurement "0x$MEASUREMENT" --report-data "0x$REPORT_DATA"

# refuse WHY CMD...: CMD must fail, and snpguest's error must name WHY. Any non-zero exit
# is not enough: a usage error or a missing file would pass a bare exit-status check.
refuse() {
  local why="$1" out
  shift
  if out=$("$@" 2>&1); then
    echo "snpguest accepted what it must refuse ($why):" >&2
    echo "$out" >&2
    exit 1
  fi
  if ! grep -qF "ERROR: $why" <<<"$out"; then
    echo "snpguest refused, but not with \"$why\":" >&2
    echo "$out" >&2
    exit 1
  fi
  echo "   refused: $why" >&2
}

echo "== snpguest must refuse tampering, each for its own reason" >&2
# One bit of the signed MEASUREMENT (report offset 0x90) flipped.
cp "$WORK/certs/report.bin" "$WORK/tampered.bin"
byte=$(od -An -tu1 -j $((0x90)) -N1 "$WORK/tampered.bin" | tr -d ' ')
printf "\\$(printf '%03o' $((byte ^ 1)))" | dd of="$WORK/tampered.bin" bs=1 seek=$((0x90)) conv=notrunc status=none
cmp -s "$WORK/certs/report.bin" "$WORK/tampered.bin" && { echo "tamper step changed nothing" >&2; exit 1; }
refuse "VEK did NOT sign the Attestation Report!" \
  "$SNPGUEST" verify attestation "$WORK/certs" "$WORK/tampered.bin"
# A VCEK our mock ASK did not sign: AMD's real Milan VCEK in the mock chain.
mkdir "$WORK/foreign-vcek"
cp "$WORK/certs/ark.pem" "$WORK/certs/ask.pem" "$WORK/foreign-vcek/"
cp services/edge/attest/testdata/amd/milan-vcek.der "$WORK/foreign-vcek/vcek.der"
refuse "The VCEK was not signed by the AMD ASK!" "$SNPGUEST" verify certs "$WORK/foreign-vcek"
# An ASK our mock ARK did not sign: AMD's real Genoa ASK in the mock chain.
mkdir "$WORK/foreign-ask"
cp "$WORK/certs/ark.pem" "$WORK/certs/vcek.pem" "$WORK/foreign-ask/"
cp services/edge/attest/testdata/amd/genoa-ask.pem "$WORK/foreign-ask/ask.pem"
refuse "The AMD ASK was not signed by the AMD ARK!" "$SNPGUEST" verify certs "$WORK/foreign-ask"
# Claims other than the signed ones: REPORT_DATA for another nonce.
OTHER_DATA=$( { printf 'gelo/report-data/v1'; printf '%s%s%s%064d' "$MODEL" "$SCHEME" "$TLS" 0 | xxd -r -p; } \
  | sha512sum | cut -d' ' -f1)
refuse "Report Data did not match" \
  "$SNPGUEST" verify attestation "$WORK/certs" "$WORK/certs/report.bin" --report-data "0x$OTHER_DATA"

echo "snpguest $SNPGUEST_VERSION accepts GELO mock evidence and refuses a tampered report, VCEK and ASK" >&2
