#!/usr/bin/env bash
# run.sh TARGET.json: builds the grpc-go kubelet client (main.go beside this script, a Go module
# whose go.mod and go.sum pin k8s.io/kubelet's generated stubs and grpc-go) with the machine's
# `go` in module mode, then runs it against TARGET.json (interop_target's first line). Exits
# with the client's status. Installs nothing: `go build` downloads the pinned modules (through
# GOPROXY, proxy.golang.org by default) into Go's module cache and checks them against go.sum;
# a missing tool is reported (see README.md).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 TARGET.json" >&2
    exit 2
fi
info=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The Go release go.mod's `go` line names; GOTOOLCHAIN=local below keeps `go` from fetching a
# newer toolchain itself.
need_go=1.26

# 1. The tools.
if ! command -v go >/dev/null 2>&1; then
    echo "FAIL tools: no \`go\` on PATH; the client needs Go $need_go or newer (from go.dev/dl," \
        "e.g. /usr/local/go/bin)" >&2
    exit 1
fi
export GOTOOLCHAIN=local
version=$(go env GOVERSION 2>/dev/null || true)
if ! printf '%s\n' "$version" | grep -Eq '^go1\.([0-9]{3,}|2[6-9]|[3-9][0-9])([^0-9]|$)'; then
    echo "FAIL tools: $(command -v go) is ${version:-of unknown version}; the client's go.mod" \
        "needs Go $need_go or newer" >&2
    exit 1
fi
for f in go.mod go.sum main.go; do
    [ -r "$here/$f" ] || { echo "FAIL sources: missing $here/$f" >&2; exit 1; }
done
[ -r "$info" ] || { echo "FAIL target: cannot read $info" >&2; exit 1; }

# 2. The client, built quietly into a temporary directory. Go's build and module caches stay
# where Go keeps them (they make later builds fast); a temporary build cache when there is none.
work=$(mktemp -d "${TMPDIR:-/tmp}/kubedev-go-interop.XXXXXX")
trap 'rm -rf "$work"' EXIT
log=$work/build.log
if ! go env GOCACHE 2>/dev/null | grep -q '^/'; then
    export GOCACHE=$work/gocache
fi
# -mod=readonly: the committed go.sum decides, whatever GOFLAGS says; -buildvcs=false: no
# version-control stamp (the tree is shared and may be mid-commit).
if ! (cd "$here" && go build -mod=readonly -buildvcs=false -o "$work/kubelet-client" .) \
    >"$log" 2>&1; then
    echo "FAIL build: building the grpc-go client (module $here) failed; its modules come" \
        "from GOPROXY=$(go env GOPROXY) into $(go env GOMODCACHE):" >&2
    cat "$log" >&2
    exit 1
fi

# 3. The client; its status is this script's.
set +e
"$work/kubelet-client" "$info"
status=$?
exit $status
