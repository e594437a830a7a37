#!/usr/bin/env bash
# Generate kubeconform-compatible JSON schemas offline: Kubernetes kinds and monitoring.coreos.com.
#
# kubeconform normally downloads its schemas from GitHub, which CI cannot reach. The Go types of
# the Kubernetes API (module k8s.io/api) are on the Go module proxy, and k8s.io/kube-openapi's
# openapi-gen turns them into the very OpenAPI definitions kube-apiserver serves. We run
# openapi-gen over a pinned k8s.io/api release, compile the result into k8s-schemas/main.go and
# write standalone-strict schemas in kubeconform's layout. The Prometheus Operator's kinds
# (ServiceMonitor, PrometheusRule, ...) get the same treatment: controller-gen makes CRDs from
# the Go types of github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring and
# k8s-schemas' sibling crd-schemas/main.go converts their openAPIV3Schema. All land in:
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

# Prometheus Operator API (ServiceMonitor, PrometheusRule, ...) and the controller-gen that
# turns its Go types into CRDs, as the operator's own build does.
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.95.2}"
CONTROLLER_TOOLS_VERSION="${CONTROLLER_TOOLS_VERSION:-v0.23.0}"
CRD_STAMP="$OUT/.complete-monitoring-$PROMETHEUS_OPERATOR_VERSION"
CRD_WORK="$CACHE/k8s-schema-gen/monitoring-$PROMETHEUS_OPERATOR_VERSION"
export GOFLAGS="${GOFLAGS:--buildvcs=false}" GOTOOLCHAIN=local

# Quiet unless something fails.
run() { "$@" >>"$LOGFILE" 2>&1 || { cat "$LOGFILE" >&2; log "FAILED: $*"; exit 1; }; }

gen_monitoring_schemas() {
    local t0=$SECONDS
    log "generating monitoring.coreos.com schemas from prometheus-operator $PROMETHEUS_OPERATOR_VERSION (controller-gen $CONTROLLER_TOOLS_VERSION) ..."
    rm -rf "$CRD_WORK"
    mkdir -p "$CRD_WORK/deps" "$CRD_WORK/crds"
    cd "$CRD_WORK"
    LOGFILE="$CRD_WORK/build.log"
    run env GOBIN="$CRD_WORK" "$GO" install "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_TOOLS_VERSION"
    run "$GO" mod init loopwatch.local/crdschemas
    run "$GO" get "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring@$PROMETHEUS_OPERATOR_VERSION"
    printf '%s\n' "// Package deps pins the API packages controller-gen reads." "package deps" \
        "import _ \"github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1\"" \
        > "$CRD_WORK/deps/deps.go"
    cp "$HERE/crd-schemas/main.go" "$CRD_WORK/main.go"
    run "$GO" mod tidy
    run "$CRD_WORK/controller-gen" crd:crdVersions=v1,maxDescLen=0 \
        paths=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1 \
        output:crd:dir="$CRD_WORK/crds"
    "$GO" run . -crds "$CRD_WORK/crds" -out "$OUT"
    touch "$CRD_STAMP"
    log "done in $((SECONDS - t0))s"
}

if [ -f "$OUT/.complete" ]; then
    log "schemas for Kubernetes $KUBE_VERSION already in $OUT (skipped)"
    if [ -f "$CRD_STAMP" ]; then
        log "monitoring.coreos.com schemas ($PROMETHEUS_OPERATOR_VERSION) already there (skipped)"
    else
        gen_monitoring_schemas
    fi
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
LOGFILE="$WORK/build.log"
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
gen_monitoring_schemas
