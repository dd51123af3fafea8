#!/usr/bin/env bash
# The device calls left by the fifty-ninth session.
#   verify (no carry, ~230 s): the conv / packed / residual CUDA tests of main (the halo kernel's epilogue tables,
#     11cbd14, and test_conv2d_halo_cuda's signed-scale checks never ran in pytest on a GPU), then ResNet-18.
#   prepare (here, ~3 min with the object cache warm): main's harness -> build/main/harness.gz; the variant `stride2`
#     (pending/conv_halo_stride2.patch: the halo kernel at stride 2) -> build/ab/stride2.gz
#   ab (carry ["benchmarks/kernels/build/ab", "benchmarks/kernels/build/main"], ~150 s): pending/conv_halo_stride2.sweep
#     once (its checks; main refuses the stride=2 tile=3 rows), then its first 10 rows (the timing rows) twice more.
#     Merge the patch (it carries its dispatch and tests) if every check row passes and its stride 2 tile=3 rows beat
#     tile=1 (layer2.0.conv1 of ResNet-18: B=256 C=64 56x56 OC=128 stride 2, sign words).
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"   # benchmarks/kernels
root="$(cd "$here/../.." && pwd)"
cd "$root"
out="${OUT:-.out}"
mkdir -p "$out"
case "${1:-}" in
  verify)
    TESTS="cuda and (conv or residual or with_signs or packed or bnn)" OUT="$out" \
      bash benchmarks/gpu_session.sh build tests 2>&1 | tail -30
    cat "$out/failures.txt" 2>/dev/null | head -60
    OUT="$out" bash benchmarks/gpu_session.sh resnet 2>&1 | tail -20 ;;
  prepare)
    set -e
    rm -rf "$here/build/ab" "$here/build/main"
    mkdir -p "$here/build/main"
    bash "$here/build.sh"
    gzip -c "$here/build/harness" > "$here/build/main/harness.gz"
    bash "$here/ab.sh" build stride2 "$here/pending/conv_halo_stride2.patch"
    du -sh "$here/build/ab" "$here/build/main" ;;
  ab)
    gunzip -c "$here/build/main/harness.gz" > "$here/build/harness" && chmod +x "$here/build/harness"
    OUT="$out/full" AB_TIMEOUT=120 bash "$here/ab.sh" run "$here/pending/conv_halo_stride2.sweep" 1 2>&1 | tail -52
    cut -c1-220 "$out/full/ab_raw/stride2.1.txt" | awk '$0 ~ / NO |rejected|failed|rror/' | head -20
    grep -v "^#" "$here/pending/conv_halo_stride2.sweep" | head -10 > "$out/timing.sweep"
    OUT="$out/timing" AB_TIMEOUT=60 bash "$here/ab.sh" run "$out/timing.sweep" 2 2>&1 | tail -14 ;;
  *)
    echo "usage: bash $0 verify|prepare|ab" >&2
    exit 2 ;;
esac
