#!/usr/bin/env bash
# The device calls left by the fifty-ninth session.
#   verify (no carry, ~230 s): the conv / packed / residual CUDA tests of main (the halo kernel's epilogue tables,
#     11cbd14, and test_conv2d_halo_cuda's signed-scale checks never ran in pytest on a GPU), then ResNet-18.
#   prepare (here, ~4 min with the object cache warm): main's harness -> build/main/harness.gz; the variants
#     stride2 (pending/conv_halo_stride2.patch: the halo kernel at stride 2) and wgsigns
#     (pending/conv_wgmma_signs.patch: the wgmma conv's sign words by integer thresholds) -> build/ab
#   ab (carry ["benchmarks/kernels/build/ab", "benchmarks/kernels/build/main"], ~400 s): each variant's sweep once
#     (main, stride2 and wgsigns run both; main refuses the stride=2 tile=3 rows, wgsigns the epi=1 kernel=2 sign-word
#     rows, as each sweep's header says), then the timing rows of both twice more.
#     Merge a variant (each patch carries its dispatch and tests) if every check row of its sweep passes and its
#     timing rows beat main's: stride2 at layer2.0.conv1 (B=256 C=64 56x56 OC=128 stride 2, sign words, tile=3 vs
#     tile=1), wgsigns at layers 2-4's sign-word convs.
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
    bash "$here/ab.sh" build wgsigns "$here/pending/conv_wgmma_signs.patch"
    du -sh "$here/build/ab" "$here/build/main" ;;
  ab)
    gunzip -c "$here/build/main/harness.gz" > "$here/build/harness" && chmod +x "$here/build/harness"
    for sweep in conv_halo_stride2 conv_wgmma_signs conv_wgmma_res_l2; do
      only="stride2 wgsigns"
      [ "$sweep" = conv_wgmma_res_l2 ] && only="wgres wgahead"
      OUT="$out/$sweep" AB_ONLY="$only" AB_TIMEOUT=100 bash "$here/ab.sh" run "$here/pending/$sweep.sweep" 1 2>&1 | tail -52
      for name in $only; do
        echo "== $sweep: $name"
        cut -c1-220 "$out/$sweep/ab_raw/$name.1.txt" | awk '$0 ~ / NO |rejected|failed|rror/' | head -12
      done
    done
    { grep -v "^#" "$here/pending/conv_halo_stride2.sweep" | head -8
      grep -v "^#" "$here/pending/conv_wgmma_signs.sweep" | head -9
      grep -v "^#" "$here/pending/conv_wgmma_res_l2.sweep" | tail -5; } > "$out/timing.sweep"
    OUT="$out/timing" AB_ONLY="stride2 wgsigns wgres wgahead" AB_TIMEOUT=60 bash "$here/ab.sh" run "$out/timing.sweep" 1 2>&1 \
      | tail -26 ;;
  ab1)  # the same sweeps once each, the residual one first, no timing re-run (a short call)
    gunzip -c "$here/build/main/harness.gz" > "$here/build/harness" && chmod +x "$here/build/harness"
    for sweep in conv_wgmma_res_l2 conv_wgmma_signs conv_halo_stride2; do
      only="stride2 wgsigns"
      [ "$sweep" = conv_wgmma_res_l2 ] && only="wgres wgahead"
      [ "$sweep" = conv_wgmma_signs ] && only="wgsigns"
      [ "$sweep" = conv_halo_stride2 ] && only="stride2"
      OUT="$out/$sweep" AB_ONLY="$only" AB_TIMEOUT=80 bash "$here/ab.sh" run "$here/pending/$sweep.sweep" 1 2>&1 | tail -40
      for name in $only; do
        echo "== $sweep: $name"
        cut -c1-220 "$out/$sweep/ab_raw/$name.1.txt" | awk '$0 ~ / NO |rejected|failed|rror/' | head -12
      done
    done ;;
  *)
    echo "usage: bash $0 verify|prepare|ab|ab1" >&2
    exit 2 ;;
esac
