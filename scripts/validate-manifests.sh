#!/usr/bin/env bash
# Offline schema validation of every Kubernetes manifest GELO ships or builds, against the
# Kubernetes 1.37 OpenAPI schemas of `kubernetes-validate` (PyPI, pinned in .ci/run):
#
#   1. the generated CRD (crds/ and the chart's copy);
#   2. every object the reconciler applies, for the kind sample pipeline and for the
#      built-in test pipeline (hub sources: PVCs and fetch Jobs, GPU, runtime class), as
#      printed by `gelo-operator manifests`;
#   3. the Helm chart: values.yaml against values.schema.json, then every template rendered
#      (see "Rendering the chart" below) and validated, for two value sets;
#   4. the sample pipeline against the CRD's own openAPIV3Schema (python-jsonschema), and a
#      broken copy of it that must be refused, so the check cannot pass vacuously.
#
# Rendering the chart: no `helm` binary is reachable here, and no faithful Go-template +
# Sprig renderer exists on the registries we can use. The templates are therefore kept to
# a small subset, and the renderer below implements exactly that subset, failing on
# anything else: `{{ .Values.a.b }}`, `{{ .Release.Name }}`, `{{ .Release.Namespace }}`,
# `{{ .Chart.AppVersion }}`, `| quote`, `{{ toYaml X | nindent N }}`,
# `{{ if X }} / {{ else }} / {{ end }}`, and `{{-` / `-}}` whitespace trimming. Nothing in
# the chart stays unrendered; what is not exercised is Helm itself (install hooks, CRD
# install from crds/, `helm lint`).
#
# Usage: scripts/validate-manifests.sh   (builds gelo-operator if needed; GELO_MANIFESTS_OUT=DIR
# keeps the rendered files)
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
python3 - charts/gelo "$out" <<'PY'
import json, re, sys
from pathlib import Path
import jsonschema, yaml

chart, out = Path(sys.argv[1]), Path(sys.argv[2])
meta = yaml.safe_load((chart / "Chart.yaml").read_text())
values = yaml.safe_load((chart / "values.yaml").read_text())
schema = json.loads((chart / "values.schema.json").read_text())
jsonschema.validate(values, schema)

# A second value set: one watched namespace, mock roots allowed (the kind suite's).
variant = json.loads(json.dumps(values))
variant["watchNamespace"] = "gelo-e2e"
variant["attestation"]["allowMockRoots"] = True
variant["nodeSelector"] = {"kubernetes.io/os": "linux"}
jsonschema.validate(variant, schema)
try:
    bad = json.loads(json.dumps(values)); bad["replicas"] = 0
    jsonschema.validate(bad, schema)
    sys.exit("values.schema.json accepted replicas: 0")
except jsonschema.ValidationError:
    pass

TOKEN = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)

def lookup(path, ctx):
    root, *rest = path.lstrip(".").split(".")
    node = ctx[root]
    for part in rest:
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"{path}: no such value")
        node = node[part]
    return node

def scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)

def evaluate(expr, ctx):
    parts = [p.strip() for p in expr.split("|")]
    head = parts[0]
    if head.startswith("toYaml "):
        text = yaml.safe_dump(lookup(head[len("toYaml "):].strip(), ctx), default_flow_style=False, sort_keys=False).rstrip("\n")
    elif re.fullmatch(r"\.[A-Za-z][\w.]*", head):
        text = scalar(lookup(head, ctx))
    else:
        raise ValueError(f"unsupported template expression: {{{{ {expr} }}}}")
    for f in parts[1:]:
        if f == "quote":
            text = json.dumps(text)
        elif m := re.fullmatch(r"nindent (\d+)", f):
            pad = " " * int(m.group(1))
            text = "\n" + "\n".join(pad + line if line else line for line in text.split("\n"))
        else:
            raise ValueError(f"unsupported template function: {f}")
    return text

def render(src, ctx):
    # Tokenize, applying {{- and -}} trimming to the neighbouring text.
    pieces, pos = [], 0
    for m in TOKEN.finditer(src):
        text = src[pos:m.start()]
        if m.group(1):
            text = text.rstrip(" \t\n")
        pieces.append(("text", text))
        pieces.append(("tag", m.group(2), bool(m.group(3))))
        pos = m.end()
    pieces.append(("text", src[pos:]))
    for i, p in enumerate(pieces):
        if p[0] == "tag" and p[2] and i + 1 < len(pieces):
            pieces[i + 1] = ("text", pieces[i + 1][1].lstrip(" \t\n"))
    outp, stack = [], []  # stack of (active, branch_taken)
    active = lambda: all(a for a, _ in stack)
    for p in pieces:
        if p[0] == "text":
            if active():
                outp.append(p[1])
            continue
        expr = p[1]
        if expr.startswith("if "):
            cond = bool(lookup(expr[3:].strip(), ctx)) if active() else False
            stack.append((cond, cond))
        elif expr == "else":
            if not stack:
                raise ValueError("else without if")
            _, taken = stack.pop()
            stack.append((not taken, True))
        elif expr == "end":
            if not stack:
                raise ValueError("end without if")
            stack.pop()
        elif expr.startswith("/*"):
            continue
        elif active():
            outp.append(evaluate(expr, ctx))
    if stack:
        raise ValueError("unclosed if")
    return "".join(outp)

rendered = 0
for name, vals in (("default", values), ("namespaced", variant)):
    ctx = {"Values": vals, "Release": {"Name": "gelo", "Namespace": "gelo-system"},
           "Chart": {"Name": meta["name"], "Version": meta["version"], "AppVersion": meta["appVersion"]}}
    docs = []
    for tpl in sorted((chart / "templates").glob("*.yaml")):
        try:
            text = render(tpl.read_text(), ctx)
        except (KeyError, ValueError) as e:
            sys.exit(f"{tpl}: {e}")
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append(doc)
        rendered += 1
    (out / f"chart-{name}.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    kinds = sorted({(d["kind"], d["metadata"].get("namespace", "")) for d in docs})
    print(f"  rendered {len(docs)} objects with {name} values: " + ", ".join(f"{k}" for k, _ in kinds))
    if name == "namespaced":
        binding = [d for d in docs if d["metadata"]["name"] == "gelo-operator" and d["kind"].endswith("Binding")]
        assert [b["kind"] for b in binding] == ["RoleBinding"] and binding[0]["metadata"]["namespace"] == "gelo-e2e", binding
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
