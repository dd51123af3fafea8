#!/usr/bin/env bash
# The fifty-fifth session's first device call (written in the fifty-fourth): main's checks on whatever card comes,
# then the whole CUDA test suite (the fifty-fourth session ran only `-k "cuda and (conv or pack)"` on 865eb2a, the
# wgmma conv's sign words from the registers), bench_ops and the ResNet-18 row with its kernel profile.
#   here:       bash benchmarks/kernels/pending/next_call.sh prepare    (seconds with the harness object cache)
#   on device:  bash benchmarks/kernels/pending/next_call.sh run        carry ["benchmarks/kernels/build/next"];
#               ~8 min (the suite is ~5 of them); logs under $OUT
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"   # benchmarks/kernels
root="$(cd "$here/../.." && pwd)"
next="$here/build/next"
case "${1:-}" in
  prepare)
    set -e
    mkdir -p "$next"
    rm -f "$next"/*.gz
    bash "$here/build.sh"
    gzip -c "$here/build/harness" > "$next/harness_main.gz"
    du -sh "$next" ;;
  run)
    cd "$root"
    out="${OUT:-.out}"
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
    gunzip -c "$next/harness_main.gz" > "$here/build/harness" && chmod +x "$here/build/harness"
    echo "== 1. main's checks (${SECONDS}s)"
    timeout 120 "$here/build/harness" --sweep "$here/pending/conv_wgmma.sweep" graph=0 reps=1 > "$out/checks.txt" 2>&1
    tail -1 "$out/checks.txt"
    echo "== 2. the CUDA suite, bench_ops, ResNet-18 (${SECONDS}s)"
    OUT="$out" bash benchmarks/gpu_session.sh build tests bench resnet 2>&1 | grep -v "^  built" | tail -60
    echo "=== done (${SECONDS}s)" ;;
  *)
    echo "usage: bash $0 prepare|run" >&2
    exit 2 ;;
esac
