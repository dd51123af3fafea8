#!/usr/bin/env bash
# Builds, here (nvcc, no GPU), what pending/planes_wgmma_first.sh runs on the device: main's harness, the variants
# pw (planes_wgmma.patch) and pwmc (planes_wgmma_mc.patch) for ab.sh, and a watchdog build of each
# (build/pwwd/harness.gz, build/pwmcwd/harness.gz: out of build/ab, so that ab.sh does not time them). Then carry
# benchmarks/kernels/build (54 MB; the carry holds 64 MiB).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
bash "$here/build.sh"
for variant in pw pwmc; do
  patch="$here/pending/planes_wgmma.patch"
  [ "$variant" = pwmc ] && patch="$here/pending/planes_wgmma_mc.patch"
  bash "$here/ab.sh" build "$variant" "$patch"
  bash "$here/ab.sh" build "${variant}wd" "$patch" -DBITCOMPILE_WGMMA_WATCHDOG
  mkdir -p "$here/build/${variant}wd"
  mv "$here/build/ab/${variant}wd.gz" "$here/build/${variant}wd/harness.gz"
done
ls -la "$here"/build/ab "$here"/build/pwwd "$here"/build/pwmcwd
