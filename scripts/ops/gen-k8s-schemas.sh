#!/usr/bin/env bash
# Generate kubeconform-compatible Kubernetes JSON schemas offline.
#
# kubeconform normally downloads its schemas from GitHub, which CI cannot reach. The Go types of
# the Kubernetes API (module k8s.io/api) are on the Go module proxy, and k8s.io/kube-openapi's
# openapi-gen turns them into the very OpenAPI definitions kube-apiserver serves. We run
# openapi-gen over a pinned k8s.io/api release, compile the result into k8s-schemas/main.go and
# write standalone-strict schemas in kubeconform's layout:
#
#   ${LOOPWATCH_CACHE}/kubernetes-json-schema/v<k8s version>-standalone-strict/<kind>-<group>-<version>.json
#
# Use with:  kubeconform -strict -kubernetes-version <k8s version> \
#   -schema-location "$CACHE/kubernetes-json-schema/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json"
set -euo pipefail

K8S_API_VERSION="${K8S_API_VERSION:-v0.37.2}"        # k8s.io/api release (v0.X.Y == Kubernetes 1.X.Y)
KUBE_VERSION="1.${K8S_API_VERSION#v0.}"
CACHE="${LOOPWATCH_CACHE:-$HOME/.cache/loopwatch}"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$CACHE/kubernetes-json-schema/v${KUBE_VERSION}-standalone-strict"
WORK="$CACHE/k8s-schema-gen/$K8S_API_VERSION"

log() { printf '[gen-k8s-schemas] %s\n' "$*"; }

if [ -f "$OUT/.complete" ]; then
    log "schemas for Kubernetes $KUBE_VERSION already in $OUT (skipped)"
    exit 0
fi

# Every API group of k8s.io/api (types of one group refer to others, e.g. core/v1 to
# scheduling), plus the apimachinery types they embed.
PACKAGES=(
    k8s.io/apimachinery/pkg/apis/meta/v1
    k8s.io/apimachinery/pkg/api/resource
    k8s.io/apimachinery/pkg/util/intstr
    k8s.io/apimachinery/pkg/runtime
    k8s.io/apimachinery/pkg/version
    k8s.io/api/...
)

t0=$SECONDS
log "generating Kubernetes $KUBE_VERSION schemas from k8s.io/api $K8S_API_VERSION (openapi-gen) ..."
rm -rf "$WORK"
mkdir -p "$WORK/openapi" "$WORK/deps"
cd "$WORK"
export GOFLAGS="${GOFLAGS:--buildvcs=false}" GOTOOLCHAIN=local
# Quiet unless something fails.
run() { "$@" >>"$WORK/build.log" 2>&1 || { cat "$WORK/build.log" >&2; log "FAILED: $*"; exit 1; }; }
run "$GO" mod init loopwatch.local/k8sschemas
run "$GO" get "k8s.io/api@$K8S_API_VERSION" "k8s.io/apimachinery@$K8S_API_VERSION"
# openapi-gen from the kube-openapi release this k8s.io/api release already depends on.
KO_VERSION="$("$GO" list -m -f '{{.Version}}' k8s.io/kube-openapi)"
run "$GO" get "k8s.io/kube-openapi/cmd/openapi-gen@$KO_VERSION"
run "$GO" build -o "$WORK/openapi-gen" k8s.io/kube-openapi/cmd/openapi-gen
# openapi-gen type-checks the input packages, so the module needs all their dependencies.
{
    echo "// Package deps pins the dependencies of the packages openapi-gen reads."
    echo "package deps"
    echo "import ("
    for p in "${PACKAGES[@]:0:5}" k8s.io/api/core/v1 k8s.io/kube-openapi/pkg/common k8s.io/kube-openapi/pkg/validation/spec; do
        echo "    _ \"$p\""
    done
    echo ")"
} > "$WORK/deps/deps.go"
run "$GO" mod tidy
: > "$WORK/header.txt"
run "$WORK/openapi-gen" --output-dir "$WORK/openapi" --output-pkg loopwatch.local/k8sschemas/openapi \
    --output-file zz_generated.openapi.go --go-header-file "$WORK/header.txt" \
    --report-filename "$WORK/api-violations.txt" "${PACKAGES[@]}"
cp "$HERE/k8s-schemas/main.go" "$WORK/main.go"
run "$GO" mod tidy
rm -rf "$OUT"
"$GO" run . -out "$OUT" -api-dir "$("$GO" list -m -f '{{.Dir}}' k8s.io/api)"
touch "$OUT/.complete"
log "done in $((SECONDS - t0))s: $OUT"
