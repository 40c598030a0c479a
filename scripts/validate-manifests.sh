#!/usr/bin/env bash
# Offline schema validation of every Kubernetes manifest GELO ships or builds, against the
# Kubernetes 1.37 OpenAPI schemas of `kubernetes-validate` (PyPI, pinned in scripts/setup.sh):
#
#   1. the generated CRD (crds/ and the chart's copy);
#   2. every object the reconciler applies, for the kind sample pipeline and for the
#      built-in test pipeline (hub sources: PVCs and fetch Jobs, GPU, runtime class), as
#      printed by `gelo-operator manifests`;
#   3. the Helm chart: values.yaml against values.schema.json, then every template rendered
#      by the real helm (`helm template`, the pinned build of scripts/k8s/build.sh) and
#      validated, for two value sets;
#   4. the sample pipeline against the CRD's own openAPIV3Schema (python-jsonschema), and a
#      broken copy of it that must be refused, so the check cannot pass vacuously.
#
# What this adds to e2e/apiserver, which installs the chart on a real API server: strict
# validation of every object the reconciler can build (hub Jobs, GPUs, runtime classes the
# suite does not exercise) and of the chart under a second value set.
#
# Usage: scripts/validate-manifests.sh   (builds gelo-operator, and helm through
# scripts/k8s/build.sh, if needed; GELO_MANIFESTS_OUT=DIR keeps the rendered files)
set -euo pipefail
cd "$(dirname "$0")/.."
K8S_VERSION=1.37.0
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gelo/target}"

if ! python3 -c 'import kubernetes_validate, jsonschema, yaml' 2>/dev/null; then
  echo "validate-manifests: needs kubernetes-validate==$K8S_VERSION (pip install kubernetes-validate==$K8S_VERSION)" >&2
  exit 1
fi

# The binary `cargo test --workspace` already built, unless the sources are newer.
bin="$CARGO_TARGET_DIR/debug/gelo-operator"
if [ ! -x "$bin" ] || [ -n "$(find operator/src operator/Cargo.toml -newer "$bin" -print -quit)" ]; then
  cargo build --quiet -p gelo-operator
fi

# GELO_MANIFESTS_OUT=DIR keeps everything rendered there, for reading.
if [ -n "${GELO_MANIFESTS_OUT:-}" ]; then
  out="$GELO_MANIFESTS_OUT" && mkdir -p "$out"
else
  out="$(mktemp -d)" && trap 'rm -rf "$out"' EXIT
fi
count=0
validate() { # file...
  for f in "$@"; do
    kubernetes-validate -k "$K8S_VERSION" --strict --quiet "$f"
    count=$((count + $(grep -c '^kind:' "$f")))
  done
}

echo "== CRD"
"$bin" crdgen > "$out/crd.yaml"
cmp -s "$out/crd.yaml" crds/privateragpipelines.gelo.dev.yaml || { echo "crds/ is stale: run gelo-operator crdgen" >&2; exit 1; }
cmp -s "$out/crd.yaml" charts/gelo/crds/privateragpipelines.gelo.dev.yaml || { echo "charts/gelo/crds/ is stale" >&2; exit 1; }
validate crds/privateragpipelines.gelo.dev.yaml

echo "== objects the reconciler builds"
"$bin" manifests e2e/kind/sample-pipeline.yaml > "$out/sample-objects.yaml"
"$bin" manifests > "$out/fixture-objects.yaml"
validate "$out/sample-objects.yaml" "$out/fixture-objects.yaml"

echo "== Helm chart"
helm="$(scripts/k8s/build.sh)/helm" # the pinned build, cached (e2e/apiserver uses the same)
python3 - charts/gelo "$out" <<'PY'
import json, sys
from pathlib import Path
import jsonschema, yaml

chart, out = Path(sys.argv[1]), Path(sys.argv[2])
values = yaml.safe_load((chart / "values.yaml").read_text())
schema = json.loads((chart / "values.schema.json").read_text())
jsonschema.validate(values, schema)

# A second value set: one watched namespace, mock roots allowed, a hub mirror.
variant = json.loads(json.dumps(values))
variant["watchNamespace"] = "gelo-e2e"
variant["attestation"]["allowMockRoots"] = True
variant["nodeSelector"] = {"kubernetes.io/os": "linux"}
variant["hub"]["endpoint"] = "https://hub.internal"
jsonschema.validate(variant, schema)
(out / "values-namespaced.yaml").write_text(yaml.safe_dump(variant))
for field, bad_value in (("replicas", 0), ("hub", {"endpoint": "ftp://hub"})):
    bad = json.loads(json.dumps(values)); bad[field] = bad_value
    try:
        jsonschema.validate(bad, schema)
        sys.exit(f"values.schema.json accepted {field}: {bad_value}")
    except jsonschema.ValidationError:
        pass
PY
"$helm" template gelo charts/gelo --namespace gelo-system >"$out/chart-default.yaml"
"$helm" template gelo charts/gelo --namespace gelo-system -f "$out/values-namespaced.yaml" >"$out/chart-namespaced.yaml"
python3 - "$out" <<'PY'
import sys
from pathlib import Path
import yaml

out = Path(sys.argv[1])
for name in ("default", "namespaced"):
    docs = [d for d in yaml.safe_load_all((out / f"chart-{name}.yaml").read_text()) if d]
    print(f"  helm rendered {len(docs)} objects with {name} values: " + ", ".join(sorted({d["kind"] for d in docs})))
    if name == "namespaced":
        binding = [d for d in docs if d["metadata"]["name"] == "gelo-operator" and d["kind"].endswith("Binding")]
        assert [b["kind"] for b in binding] == ["RoleBinding"] and binding[0]["metadata"]["namespace"] == "gelo-e2e", binding
        env = {e["name"]: e.get("value") for d in docs if d["kind"] == "Deployment"
               for c in d["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])}
        assert env.get("GELO_OPERATOR_HUB_ENDPOINT") == "https://hub.internal", env
PY
validate "$out/chart-default.yaml" "$out/chart-namespaced.yaml"

echo "== sample pipeline against the CRD schema"
python3 - "$out/crd.yaml" e2e/kind/sample-pipeline.yaml <<'PY'
import copy, sys
import jsonschema, yaml

crd = yaml.safe_load(open(sys.argv[1]))
schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
sample = yaml.safe_load(open(sys.argv[2]))
assert sample["apiVersion"] == f'{crd["spec"]["group"]}/{crd["spec"]["versions"][0]["name"]}', sample["apiVersion"]
assert sample["kind"] == crd["spec"]["names"]["kind"]
jsonschema.validate(sample, schema)
# The schema must actually constrain: a moving branch name instead of a commit is refused.
broken = copy.deepcopy(sample)
broken["spec"]["embedder"]["model"] = {"hub": {"repo": "r/m", "revision": "main"}, "modelIdentity": "ab" * 32}
try:
    jsonschema.validate(broken, schema)
    sys.exit("the CRD schema accepted revision 'main'")
except jsonschema.ValidationError as e:
    print(f"  broken copy refused as expected: {e.message}")
print("  e2e/kind/sample-pipeline.yaml matches the CRD schema")
PY

echo "validate-manifests: $count objects valid against Kubernetes $K8S_VERSION, chart values and sample pipeline checked"
