#!/usr/bin/env bash
# The fifty-eighth session's first device call (~200 s with the start): where layer1's conv time goes. The harness
# builds are git-ignored, so a fresh machine rebuilds them here first:
#   export PATH=/usr/local/cuda/bin:$PATH; bash benchmarks/kernels/pending/next_call.sh prepare     (~12 min, 2 cores)
# then one call, carry ["benchmarks/kernels/build/ab", "benchmarks/kernels/build/main"]:
#   bash benchmarks/kernels/pending/next_call.sh run
# run: (1) main and the five knockout variants of pending/conv_pipelined_ko.patch on pending/conv_pipelined_ko.sweep
#   (ab.sh, two passes: graph us side by side; the variants' checks fail on purpose, main's must pass);
#   (2) ncu of main's layer1 sign-word and residual + sign-word rows with source counters (the SASS lines with the most
#   stall samples), $OUT/ncu_*.txt and src_*.txt.
# Then the second call: `OUT=$OUT bash benchmarks/gpu_session.sh build tests bench resnet` (the whole CUDA suite, the
# issue tables, ResNet-18).
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"   # benchmarks/kernels
root="$(cd "$here/../.." && pwd)"
case "${1:-}" in
  prepare)
    set -e
    rm -rf "$here/build/ab" "$here/build/main"
    mkdir -p "$here/build/main"
    bash "$here/build.sh"
    gzip -c "$here/build/harness" > "$here/build/main/harness.gz"
    for k in 1 2 4 8 15; do
      bash "$here/ab.sh" build "ko$k" "$here/pending/conv_pipelined_ko.patch" "-DBC_KO=$k"
    done
    du -sh "$here/build/ab" "$here/build/main" ;;
  run)
    cd "$root"
    out="${OUT:-.out}"
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
    gunzip -c "$here/build/main/harness.gz" > "$here/build/harness" && chmod +x "$here/build/harness"
    OUT="$out" AB_TIMEOUT=120 bash "$here/ab.sh" run "$here/pending/conv_pipelined_ko.sweep" 2 2>&1 | tail -20
    echo "=== ncu (${SECONDS}s)"
    NCU_ROWS=$'conv b=256 c=64 h=56 oc=64 signs=1\nconv b=256 c=64 h=56 oc=64 res=1 sumw=1' \
      NCU_KERNELS=binary_conv2d NCU_SOURCE=1 OUT="$out" timeout 240 bash "$root/benchmarks/gpu_session.sh" ncu 2>&1 |
      cut -c1-220 | head -120
    echo "=== done (${SECONDS}s)" ;;
  *)
    echo "usage: bash $0 prepare|run" >&2
    exit 2 ;;
esac
