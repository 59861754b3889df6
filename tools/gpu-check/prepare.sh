#!/usr/bin/env bash
# Fills gpucheck/ (ignored by git) with what tools/gpu-check/run.sh needs on a GPU machine:
# a stripped release kubedev (gzip), cdi-chroot, the CUDA check program, a static busybox and
# this machine's C library for the root filesystem. Run from the repository root.
set -euo pipefail
B=gpucheck
rm -rf "$B"; mkdir -p "$B/libc"
cargo build --release -p kubedev
strip -o "$B/kubedev" target/release/kubedev && gzip -9 "$B/kubedev"
CARGO_TARGET_DIR=target/tools cargo build --release --manifest-path tools/cdi-chroot/Cargo.toml
cp target/tools/release/cdi-chroot "$B/"
cc -O2 -Wall -o "$B/cudacheck" tools/gpu-check/cudacheck.c -ldl
BUSYBOX=/bin/busybox
[ -x "$BUSYBOX" ] && ! ldd "$BUSYBOX" >/dev/null 2>&1 \
  || apt-get install -y --no-install-recommends busybox-static
cp "$BUSYBOX" "$B/busybox"
for l in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libgcc_s.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$l" "$B/libc/"
done
du -sh "$B"
