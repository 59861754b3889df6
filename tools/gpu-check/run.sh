#!/usr/bin/env bash
# kubedev GPU check: does a container made of only kubedev's CDI spec run CUDA and nvidia-smi?
#
# Run as root on a machine with an NVIDIA GPU and driver, from the repository root, after
# `tools/gpu-check/prepare.sh` has filled gpucheck/ (a release kubedev, cdi-chroot, the CUDA
# check program, a busybox and this machine's C library for the root filesystem). Read-only on
# the GPU: nothing here changes MIG mode, compute mode or clocks.
#
# For each library layout kubedev offers, it writes the spec with `kubedev cdi generate`, builds
# an empty root filesystem holding only busybox, the C library and the check program, applies
# the spec's device nodes, mounts and environment to it (cdi-chroot) in a private mount
# namespace, and runs the check program and nvidia-smi inside. A spec without the driver's
# files (only the device nodes) is tried too, to show the check fails without them.
set -u
B=${GPUCHECK_DIR:-gpucheck}
OUT=${OUT:-$(mktemp -d)}
W=$(mktemp -d /tmp/kubedev-gpucheck.XXXXXX)
trap 'rm -rf "$W"' EXIT
log() { printf '\n== %s\n' "$*"; }

gunzip -c "$B/kubedev.gz" > "$W/kubedev" && chmod +x "$W/kubedev"
log "host driver"
nvidia-smi -L
nvidia-smi --query-gpu=index,name,driver_version,mig.mode.current,compute_mode --format=csv
VERSION=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1 | tr -d ' ')
echo "driver version $VERSION"
for d in /usr/local/nvidia /run/nvidia/driver /usr/lib/x86_64-linux-gnu /usr/lib64; do
  ls -d "$d" 2>/dev/null && ls "$d"/lib64/libcuda.so* "$d"/libcuda.so* 2>/dev/null
done
ls -la /lib/firmware/nvidia 2>/dev/null; ls -la /run/nvidia-persistenced 2>/dev/null
echo "firmware files:"; find / -xdev \( -name 'gsp*.bin' -o -name 'gsp_*.bin' \) 2>/dev/null | head -5
cat /sys/module/nvidia/version /sys/module/firmware_class/parameters/path 2>/dev/null
ls -la /usr/bin/nvidia-cdi-hook /usr/bin/nvidia-ctk /usr/local/nvidia/toolkit 2>/dev/null; ls /usr/local/nvidia /usr/local/nvidia/bin 2>/dev/null | head -30
file /usr/bin/nvidia-smi 2>/dev/null; head -c 300 /usr/bin/nvidia-smi | tr -cd '[:print:]\n' | head -12
NVCC=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
if [ -n "$NVCC" ]; then
  log "building a CUDA runtime check with $NVCC (-cudart static)"
  cat > "$W/cudart-check.cu" <<'CU'
#include <cstdio>
__global__ void add_one(int *p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] += 1; }
int main() {
  int n = 0; cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) { printf("FAIL: cudaGetDeviceCount: %s\n", cudaGetErrorString(e)); return 1; }
  int *d; int h[1024]; for (int i = 0; i < 1024; i++) h[i] = i;
  if ((e = cudaMalloc(&d, sizeof h)) != cudaSuccess) { printf("FAIL: cudaMalloc: %s\n", cudaGetErrorString(e)); return 1; }
  cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice); add_one<<<4, 256>>>(d, 1024);
  cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  for (int i = 0; i < 1024; i++) if (h[i] != i + 1) { printf("FAIL: element %d\n", i); return 1; }
  printf("OK cudart: %d device(s), kernel result correct\n", n); return 0;
}
CU
  "$NVCC" -cudart static -o "$B/cudart-check" "$W/cudart-check.cu" && ldd "$B/cudart-check"
fi

rootfs() { # $1: directory
  local r=$1
  mkdir -p "$r"/bin "$r"/lib/x86_64-linux-gnu "$r"/lib64 "$r"/usr/bin "$r"/etc "$r"/tmp
  cp "$B/busybox" "$r/bin/busybox"
  for a in sh ls cat env stat head grep; do ln -s busybox "$r/bin/$a"; done
  # The C and C++ libraries (not the driver's): this machine's, else the ones carried along.
  cp "$B"/libc/* "$r/lib/x86_64-linux-gnu/"
  for l in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libgcc_s.so.1 libstdc++.so.6; do
    [ -e "/lib/x86_64-linux-gnu/$l" ] && cp -L "/lib/x86_64-linux-gnu/$l" "$r/lib/x86_64-linux-gnu/"
  done
  ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$r/lib64/ld-linux-x86-64.so.2"
  cp "$B/cudacheck" "$r/usr/bin/cudacheck"
  [ -x "$B/cudart-check" ] && cp "$B/cudart-check" "$r/usr/bin/cudart-check"
  echo "root:x:0:0::/:/bin/sh" > "$r/etc/passwd"
}

INSIDE='echo "-- libraries the loader can see:"; ls /usr/lib/x86_64-linux-gnu/libcuda* /usr/local/nvidia/lib64/libcuda* 2>/dev/null;
echo "-- cudacheck"; cudacheck; c=$?;
[ -x /usr/bin/cudart-check ] && { echo "-- cudart-check"; cudart-check; };
echo "-- nvidia-smi -L"; nvidia-smi -L; s=$?;
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
echo "cudacheck=$c nvidia-smi=$s"; [ $c = 0 ] && [ $s = 0 ]'

run_case() { # $1 name, $2 layout, $3 extra config lines, $4.. image env
  local name=$1 layout=$2 extra=$3; shift 3
  log "case $name (libraryLayout $layout)"
  mkdir -p "$W/$name"
  cat > "$W/$name/kubedev.yaml" <<EOF
nodeName: gpu-node
hostRoot: /
stateDir: $W/$name/state
dra:
  enabled: true
  driverName: gpu.kubedev.io
backends:
  nvidia:
    libraryLayout: $layout
${GPUCHECK_NVIDIA_EXTRA:-}
$extra
EOF
  "$W/kubedev" cdi generate --config "$W/$name/kubedev.yaml" -o json --output-file "$W/$name/spec.json" || return 1
  cp "$W/$name/spec.json" "$OUT/spec-$name.json"
  rootfs "$W/$name/root"
  local envs=()
  for e in "$@"; do envs+=(--env "$e"); done
  unshare --mount --propagation private "$B/cdi-chroot" "$W/$name/spec.json" gpu-0 "$W/$name/root" \
    "${envs[@]}" -- /bin/sh -c "$INSIDE"
  echo "case $name exit $?"
}

PLAIN=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
CUDA=(PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
      LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64)
run_case host-plain host "" "${PLAIN[@]}"
run_case host-cuda-image host "" "${CUDA[@]}"
run_case usr-local-nvidia usrLocalNvidia "" "${CUDA[@]}"

log "control: the same container with the spec's device nodes and environment only"
python3 - "$W/host-plain/spec.json" "$W/nodes-only.json" <<'EOF' 2>/dev/null || sed 's/"mounts"/"ignoredMounts"/' "$W/host-plain/spec.json" > "$W/nodes-only.json"
import json, sys
s = json.load(open(sys.argv[1]))
for e in [s.get("containerEdits", {})] + [d["containerEdits"] for d in s["devices"]]:
    e.pop("mounts", None)
json.dump(s, open(sys.argv[2], "w"))
EOF
rootfs "$W/control-root"
unshare --mount --propagation private "$B/cdi-chroot" "$W/nodes-only.json" gpu-0 "$W/control-root" \
  --env "${CUDA[1]}" --env "${CUDA[0]}" -- /bin/sh -c 'cudacheck; echo "control cudacheck exit $?"'
log "done"
