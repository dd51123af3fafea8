#!/usr/bin/env bash
# Builds the torch-free kernel harness for the H200 (sm_90a) with nvcc, linking the kernel sources of
# csrc/cuda directly (no torch, no pip). The binary lands in benchmarks/kernels/build/ (git-ignored): carry
# that folder to the GPU machine (benchmarks/kernels/README.md). ARCH overrides the target, BUILD_DIR the folder,
# EXTRA_NVCC_FLAGS adds flags to the kernel sources (e.g. -DBITCOMPILE_WGMMA_WATCHDOG).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
arch="${ARCH:--gencode=arch=compute_90a,code=sm_90a}"
build="${BUILD_DIR:-$here/build}"
mkdir -p "$build"
define=""  # sm_90a code: the launchers may take their wgmma kernels (BITCOMPILE_SM90A, csrc/cuda/device_common.cuh)
if [[ "$arch" == *90a* ]]; then define="-DBITCOMPILE_SM90A=1"; fi
sources=(pack_signs binary_linear binary_linear_wgmma binary_weight_linear binary_weight_wgmma binary_conv2d apot_kernels)
objects=()
pids=()
for source in "${sources[@]}"; do  # one nvcc a translation unit, in parallel
  nvcc -std=c++17 -O3 -lineinfo $arch $define ${EXTRA_NVCC_FLAGS:-} -I "$root/csrc" -c "$root/csrc/cuda/$source.cu" -o "$build/$source.o" &
  pids+=($!)
  objects+=("$build/$source.o")
done
nvcc -std=c++17 -O3 -lineinfo $arch -I "$root/csrc" -c "$here/harness.cu" -o "$build/harness.o" &
pids+=($!)
for pid in "${pids[@]}"; do wait "$pid"; done  # set -e: a failed compile stops here
nvcc $arch -o "$build/harness" "$build/harness.o" "${objects[@]}"
rm -f "$build"/*.o  # only the binary travels
echo "built $build/harness"
