#!/usr/bin/env bash
# run.sh TARGET.json: builds the grpc-go kubelet client (main.go beside this script) with
# Debian's Go and grpc-go in GOPATH mode, from stubs generated out of kubedev's own .proto
# files into a temporary GOPATH, then runs it against TARGET.json (interop_target's first
# line). Exits with the client's status. Installs nothing: a missing tool is reported with the
# Debian package that provides it (see README.md).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 TARGET.json" >&2
    exit 2
fi
info=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
proto=$(cd "$here/../../proto" && pwd)
gocode=/usr/share/gocode/src

# 1. The tools, each with the Debian package that provides it.
missing=()
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }
need_file() { [ -e "$1" ] || missing+=("$2"); }
need_cmd go golang-go
need_cmd protoc protobuf-compiler
need_cmd protoc-gen-go-grpc protoc-gen-go-grpc
need_file "$gocode/google.golang.org/grpc/clientconn.go" golang-google-grpc-dev
need_file "$gocode/google.golang.org/protobuf/proto/proto.go" golang-google-protobuf-dev
# grpc-go's codec marshals through github.com/golang/protobuf; only 1.5 (built on the
# APIv2 runtime, registry.go) handles APIv2 messages; 1.3 (golang-github-golang-protobuf-1-3-dev)
# does not.
need_file "$gocode/github.com/golang/protobuf/proto/registry.go" golang-github-golang-protobuf-1-5-dev
# The APIv2 protoc-gen-go (the only one that accepts proto3 `optional`, used by dra/v1);
# protoc-gen-go-1-3's binary has the same name but no --version.
if ! command -v protoc-gen-go >/dev/null 2>&1 ||
    ! protoc-gen-go --version </dev/null 2>/dev/null | grep -q '^protoc-gen-go v1\.'; then
    missing+=(protoc-gen-go)
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "FAIL tools: missing Debian packages: ${missing[*]} (install them with apt-get as root;" \
        "protoc-gen-go and golang-github-golang-protobuf-1-5-dev replace protoc-gen-go-1-3 and" \
        "golang-github-golang-protobuf-1-3-dev)" >&2
    exit 1
fi
[ -r "$info" ] || { echo "FAIL target: cannot read $info" >&2; exit 1; }

# 2. A temporary GOPATH with the stubs and the client, built quietly.
work=$(mktemp -d "${TMPDIR:-/tmp}/kubedev-go-interop.XXXXXX")
trap 'rm -rf "$work"' EXIT
log=$work/build.log
src=$work/gopath/src
root=kubedev.interop
mkdir -p "$src/$root/kubelet-client"
cp "$here/main.go" "$src/$root/kubelet-client/"

# Each .proto file -> Go import path (the files have no go_package option).
files=(
    pluginregistration/v1/api.proto
    dra/v1/api.proto
    dra/v1beta1/api.proto
    drahealth/v1/api.proto
    drahealth/v1alpha1/api.proto
    deviceplugin/v1beta1/api.proto
)
go_opts=()
grpc_opts=()
for f in "${files[@]}"; do
    pkg=$root/gen/$(dirname "$f")
    go_opts+=("--go_opt=M$f=$pkg")
    grpc_opts+=("--go-grpc_opt=M$f=$pkg")
done

build() {
    (
        cd "$proto" &&
            protoc -I . \
                --go_out="$src" "${go_opts[@]}" \
                --go-grpc_out="$src" "${grpc_opts[@]}" \
                "${files[@]}"
    ) || return 1
    GOPATH="$work/gopath:/usr/share/gocode" GO111MODULE=off GOFLAGS= GOPROXY=off \
        go build -o "$work/kubelet-client" "$root/kubelet-client"
}
# The Go build cache stays where Go keeps it (it makes later builds fast); a temporary one
# when there is none to use.
if ! go env GOCACHE 2>/dev/null | grep -q '^/'; then
    export GOCACHE=$work/gocache
fi
if ! build >"$log" 2>&1; then
    echo "FAIL build: generating stubs or building the grpc-go client failed:" >&2
    cat "$log" >&2
    exit 1
fi

# 3. The client; its status is this script's.
set +e
"$work/kubelet-client" "$info"
status=$?
exit $status
