#!/usr/bin/env bash
# Install the tools the ops checks (tests/ops/) need: helm, kubeconform, promtool, the offline
# Kubernetes JSON schemas for kubeconform, and grafana-foundation-sdk for the dashboards.
#
#   scripts/install-ops-tools.sh        # install what is missing; prints where the tools are
#   export PATH="${LOOPWATCH_CACHE:-$HOME/.cache/loopwatch}/bin:$PATH"
#
# Idempotent and cached, each step skipped when its result is already there:
#   * helm and kubeconform: `go install` into ${LOOPWATCH_CACHE:-$HOME/.cache/loopwatch}/bin,
#     rebuilt only when the binary there was not built from the pinned version (`go version -m`).
#   * promtool: Debian's `prometheus` package, installed only when `promtool` is not on PATH.
#   * Kubernetes JSON schemas: generated from the Go types of k8s.io/api by
#     scripts/ops/gen-k8s-schemas.sh into ${LOOPWATCH_CACHE}/kubernetes-json-schema.
#   * grafana-foundation-sdk: pip-installed into the project venv (${LOOPWATCH_VENV:-.venv})
#     when that venv exists and lacks the pinned version.
#
# A cold run on a 2-core machine takes about 7 minutes, most of it compiling helm (~5 min).
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
KUBECONFORM_VERSION="${KUBECONFORM_VERSION:-v0.8.0}"
# Kubernetes release the offline schemas describe (k8s.io/api v0.X.Y == Kubernetes 1.X.Y).
K8S_API_VERSION="${K8S_API_VERSION:-v0.37.2}"
GRAFANA_SDK_VERSION="${GRAFANA_SDK_VERSION:-1769699379!11.6.0}"   # builders for Grafana 11.6

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
CACHE="${LOOPWATCH_CACHE:-$HOME/.cache/loopwatch}"
BIN="$CACHE/bin"
VENV="${LOOPWATCH_VENV:-$REPO/.venv}"
mkdir -p "$BIN"

log() { printf '[install-ops-tools] %s\n' "$*"; }

GO=""
if command -v go >/dev/null 2>&1; then GO="$(command -v go)"
elif [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go
fi
# Never switch Go toolchains behind our back; everything here builds with the machine's Go.
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:--buildvcs=false}"

# go_install NAME MODULE PACKAGE VERSION LDFLAGS
# Skipped when $BIN/NAME was built from MODULE@VERSION (`go version -m`) with the same ldflags
# (recorded in $BIN/.NAME.ldflags, since -trimpath builds don't embed them).
go_install() {
    local name="$1" module="$2" pkg="$3" version="$4" ldflags="$5" have=""
    if [ -x "$BIN/$name" ] && [ -n "$GO" ]; then
        have="$("$GO" version -m "$BIN/$name" 2>/dev/null | awk -v m="$module" '$1=="mod" && $2==m {print $3}')"
    fi
    if [ "$have" = "$version" ] && [ "$(cat "$BIN/.$name.ldflags" 2>/dev/null)" = "$ldflags" ]; then
        log "$name $version already in $BIN (skipped)"
        return 0
    fi
    [ -n "$GO" ] || { log "ERROR: Go is needed to build $name (looked for go on PATH and /usr/local/go/bin/go)"; return 1; }
    log "building $name $version with go install ..."
    local t0=$SECONDS
    GOBIN="$BIN" CGO_ENABLED=0 "$GO" install -trimpath -ldflags="$ldflags" "$pkg@$version"
    printf '%s' "$ldflags" > "$BIN/.$name.ldflags"
    log "$name $version installed in $((SECONDS - t0))s"
}

T_START=$SECONDS
[ -n "$GO" ] && log "using $("$GO" version)"

# helm: set the version strings its release Makefile sets, including the Kubernetes version
# `helm template`/`helm lint` assume (otherwise 1.20), taken from the client-go it links.
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
if [ -n "$GO" ]; then
    helm_gomod="$("$GO" mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"GoMod": *"\(.*\)".*/\1/p')"
    k8s_minor="$(awk '$1=="k8s.io/client-go" {print $2}' "$helm_gomod" | cut -d. -f2)"
    for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
        helm_ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
    done
fi
go_install helm helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm "$HELM_VERSION" "$helm_ldflags"
go_install kubeconform github.com/yannh/kubeconform github.com/yannh/kubeconform/cmd/kubeconform \
    "$KUBECONFORM_VERSION" "-s -w -X main.version=$KUBECONFORM_VERSION"

# promtool (and prometheus) from Debian.
if command -v promtool >/dev/null 2>&1; then
    log "promtool already on PATH (skipped)"
else
    log "installing Debian package prometheus (provides promtool) ..."
    t0=$SECONDS
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    if ! $SUDO apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1; then
        $SUDO apt-get update -q >/dev/null
        $SUDO apt-get install -y -q --no-install-recommends prometheus >/dev/null
    fi
    log "prometheus package installed in $((SECONDS - t0))s"
fi

# Offline Kubernetes JSON schemas for kubeconform.
LOOPWATCH_CACHE="$CACHE" K8S_API_VERSION="$K8S_API_VERSION" GO="$GO" bash "$HERE/ops/gen-k8s-schemas.sh"

# grafana-foundation-sdk for `python -m streams.ops.dashboards`.
if [ -x "$VENV/bin/python" ]; then
    if [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("grafana-foundation-sdk"))' 2>/dev/null)" = "$GRAFANA_SDK_VERSION" ]; then
        log "grafana-foundation-sdk $GRAFANA_SDK_VERSION already in $VENV (skipped)"
    else
        log "installing grafana-foundation-sdk==$GRAFANA_SDK_VERSION into $VENV ..."
        "$VENV/bin/python" -m pip install -q "grafana-foundation-sdk==$GRAFANA_SDK_VERSION"
    fi
else
    log "no venv at $VENV: skipped grafana-foundation-sdk (pip install 'grafana-foundation-sdk==$GRAFANA_SDK_VERSION')"
fi

KUBE_VERSION="1.${K8S_API_VERSION#v0.}"
log "done in $((SECONDS - T_START))s. Tools:"
log "  helm         $BIN/helm ($("$BIN/helm" version --short 2>/dev/null || echo '?'))"
log "  kubeconform  $BIN/kubeconform ($("$BIN/kubeconform" -v 2>/dev/null || echo '?'))"
log "  promtool     $(command -v promtool) ($(promtool --version 2>&1 | head -1))"
log "  k8s schemas  $CACHE/kubernetes-json-schema/v$KUBE_VERSION-standalone-strict"
log "use:  export PATH=\"$BIN:\$PATH\""
