#!/usr/bin/env bash
# Builds, here (nvcc, no GPU), what pending/planes_wgmma_first.sh runs on the device: main's harness, the variants
# pw (planes_wgmma.patch) and pwmc (planes_wgmma_mc.patch) for ab.sh, and a watchdog build of each
# (build/pwwd/harness.gz, build/pwmcwd/harness.gz). Then carry benchmarks/kernels/build.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
root="$(cd "$here/../.." && pwd)"
bash "$here/build.sh"
for variant in pw pwmc; do
  patch="$here/pending/planes_wgmma.patch"
  [ "$variant" = pwmc ] && patch="$here/pending/planes_wgmma_mc.patch"
  bash "$here/ab.sh" build "$variant" "$patch"
  tree="$(mktemp -d)/tree"
  git -C "$root" worktree add -q --detach "$tree" HEAD
  git -C "$tree" apply "$patch"
  EXTRA_NVCC_FLAGS=-DBITCOMPILE_WGMMA_WATCHDOG BUILD_DIR="$here/build/${variant}wd" bash "$tree/benchmarks/kernels/build.sh"
  git -C "$root" worktree remove --force "$tree"
  gzip -f "$here/build/${variant}wd/harness"  # the carry holds 64 MiB: main's harness, 2 variants, 2 watchdog builds
done
ls -la "$here"/build/ab "$here"/build/pwwd "$here"/build/pwmcwd
