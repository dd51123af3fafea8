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
sources=(pack_signs binary_linear binary_linear_wgmma binary_weight_linear binary_weight_wgmma binary_weight_planes_wgmma binary_conv2d
         binary_conv2d_pipelined binary_conv2d_halo binary_conv2d_wgmma apot_kernels apot_wgmma)
# Objects are cached by content (OBJ_CACHE, default ~/.cache/bitcompile-harness): the key hashes the source, every
# header under csrc and the flags, so an unchanged translation unit is not compiled again (on 2 cores a full build
# takes minutes, a one-file change then seconds; the watchdog build and the normal one keep separate objects).
cache="${OBJ_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bitcompile-harness}"
mkdir -p "$cache"
headers="$(cat "$root"/csrc/*.h "$root"/csrc/cuda/*.cuh "$root"/csrc/cuda/*.h 2>/dev/null | sha1sum | cut -c1-16)"
objects=()
pids=()
compile() {  # source flags object: compile into the cache (atomic rename: a failed compile leaves no object)
  nvcc -std=c++17 -O3 -lineinfo $arch $2 -I "$root/csrc" -c "$1" -o "$3.tmp.$$" && mv "$3.tmp.$$" "$3"
}
for source in "${sources[@]}" harness; do  # one nvcc a translation unit, in parallel
  if [ "$source" = harness ]; then
    file="$here/harness.cu"; flags=""
  else
    file="$root/csrc/cuda/$source.cu"; flags="$define ${EXTRA_NVCC_FLAGS:-}"
  fi
  key="$( (cat "$file"; echo "$headers $arch $flags") | sha1sum | cut -c1-20)"
  object="$cache/$source-$key.o"
  objects+=("$object")
  if [ ! -f "$object" ]; then
    compile "$file" "$flags" "$object" &
    pids+=($!)
  fi
done
for pid in "${pids[@]+"${pids[@]}"}"; do wait "$pid"; done  # set -e: a failed compile stops here
nvcc $arch -o "$build/harness" "${objects[@]}"
echo "built $build/harness"
