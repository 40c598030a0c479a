#!/usr/bin/env bash
# Installs what the test command needs and a fresh machine lacks, each step skipped when its
# pinned version is already there (so scripts/test.sh runs it every time, in seconds once a
# machine is set up). Needs root or sudo for the Debian packages, and Go, Rust (rustup) and
# Python 3 with pip, as a fresh machine of the kind CI uses has them.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

# Mesa's lavapipe: the Vulkan engine's tests run on it (a Vulkan driver on the CPU).
# Debian's Chromium and its WebDriver: scripts/console_check.py drives the web console headless.
# curl and iproute2's `ip`: e2e/local/proxy.rs (curl through `gelo proxy`; this machine's own
# non-loopback address for the gateway).
pkgs=()
for p in mesa-vulkan-drivers libvulkan1 chromium chromium-driver curl iproute2; do
  dpkg -s "$p" >/dev/null 2>&1 || pkgs+=("$p")
done
if [ ${#pkgs[@]} -gt 0 ]; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${pkgs[@]}"
fi

# Offline Kubernetes 1.37 schemas (and jsonschema, PyYAML) for scripts/validate-manifests.sh.
if ! python3 -m pip show kubernetes-validate 2>/dev/null | grep -qx 'Version: 1.37.0'; then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore kubernetes-validate==1.37.0
fi
# The official OpenAI client, for scripts/openai_client_check.py (run by scripts/test.sh).
if ! python3 -m pip show openai 2>/dev/null | grep -qx 'Version: 3.51.0'; then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore openai==3.51.0
fi
# schemathesis fuzzes the gateway's HTTP API against its OpenAPI document (scripts/openapi_fuzz.py).
if ! python3 -m pip show schemathesis 2>/dev/null | grep -qx 'Version: 4.32.5'; then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore schemathesis==4.32.5
fi
# Selenium (pinned in scripts/console/requirements.txt) for scripts/console_check.py.
if ! python3 -m pip show selenium 2>/dev/null | grep -qx 'Version: 4.50.0'; then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -r scripts/console/requirements.txt
fi
# numpy, SciPy, scikit-learn and fpylll (pinned in attack/requirements.txt) for the attack harness.
if ! python3 -c 'import numpy, scipy, sklearn, fpylll; assert (numpy.__version__, scipy.__version__, sklearn.__version__, fpylll.__version__) == ("2.4.6", "1.17.1", "1.9.1", "0.6.4")' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -r attack/requirements.txt
fi

# Go builds the pinned Kubernetes control plane, kubectl and helm for e2e/apiserver
# (scripts/k8s/build.sh, cached under ~/.cache/gelo/k8s); openssl makes its certificates.
command -v go >/dev/null || { echo "Go is required (scripts/k8s/build.sh)" >&2; exit 1; }
if ! command -v openssl >/dev/null; then
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openssl
fi

# rustfmt and clippy: scripts/test.sh checks formatting and lints first.
for c in rustfmt clippy; do
  rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
done
