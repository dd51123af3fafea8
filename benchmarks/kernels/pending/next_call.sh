#!/usr/bin/env bash
# The device calls left by the sixtieth session (the fifty-ninth's verify ran there: 413 passed).
#   verify (no carry, ~260 s with the build): the conv / packed / residual CUDA tests of main, then ResNet-18 (run it
#     after a merge).
#   prepare (here, ~5 min with the object cache warm): main's harness -> build/main/harness.gz; the variants -> build/ab:
#     stride2 (pending/conv_halo_stride2.patch: the halo kernel at stride 2), wgsigns (conv_wgmma_signs.patch: the
#     wgmma conv's sign words by integer thresholds), wgres (conv_wgmma_res_l2.patch: the wgmma conv's residual rows
#     prefetched into L2 by the producer warps), wgahead (conv_wgmma_res_ahead.patch: E2's residual loads a trip ahead)
#   ab1 (carry ["benchmarks/kernels/build/ab", "benchmarks/kernels/build/main"], ~200-300 s): each sweep once, main
#     beside its variants (conv_wgmma_res_l2: wgres, wgahead; conv_wgmma_signs: wgsigns; conv_halo_stride2: stride2);
#     main refuses the stride=2 tile=3 rows and wgsigns the epi=1 kernel=2 sign-word rows, as each sweep's header says.
#   ab (same carry, ~400 s): ab1, then the timing rows of the three sweeps once more.
#   all (same carry, ~550 s): ab1, then verify on the tree with all four patches applied (pending/conv_all4.patch:
#     the four applied in that order with git apply -3, since wgsigns' context overlaps stride2's; it compiles without
#     spills: halo 114-124 registers, wgmma 94-96). If every variant wins, that verify is the merge's.
#   Merge a variant if every check row of its sweep passes and its timing rows beat main's: stride2 at
#   layer2.0.conv1 (B=256 C=64 56x56 OC=128 stride 2, sign words, tile=3 against tile=1), wgsigns at layers 2-4's
#   sign-word convs, wgres / wgahead at layers 2-4's residual convs (both may merge: they touch different code).
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"   # benchmarks/kernels
root="$(cd "$here/../.." && pwd)"
cd "$root"
out="${OUT:-.out}"
mkdir -p "$out"
case "${1:-}" in
  verify)
    TESTS="cuda and (conv or residual or with_signs or packed or bnn or memo)" OUT="$out" \
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
    bash "$here/ab.sh" build wgres "$here/pending/conv_wgmma_res_l2.patch"
    bash "$here/ab.sh" build wgahead "$here/pending/conv_wgmma_res_ahead.patch"
    du -sh "$here/build/ab" "$here/build/main" ;;
  ab1)  # each sweep once with its variants (AB_ONLY), the residual one first (a short call)
    gunzip -c "$here/build/main/harness.gz" > "$here/build/harness" && chmod +x "$here/build/harness"
    for sweep in conv_wgmma_res_l2 conv_wgmma_signs conv_halo_stride2; do
      case "$sweep" in
        conv_wgmma_res_l2) only="wgres wgahead" ;;
        conv_wgmma_signs) only="wgsigns" ;;
        *) only="stride2" ;;
      esac
      OUT="$out/$sweep" AB_ONLY="$only" AB_TIMEOUT=80 bash "$here/ab.sh" run "$here/pending/$sweep.sweep" 1 2>&1 | tail -40
      for name in $only; do
        echo "== $sweep: $name"
        cut -c1-220 "$out/$sweep/ab_raw/$name.1.txt" | awk '$0 ~ / NO |rejected|failed|rror/' | head -12
      done
    done ;;
  ab)  # ab1, then the timing rows of every sweep once more
    bash "$0" ab1
    { grep -v "^#" "$here/pending/conv_halo_stride2.sweep" | head -8
      grep -v "^#" "$here/pending/conv_wgmma_signs.sweep" | head -9
      grep -v "^#" "$here/pending/conv_wgmma_res_l2.sweep" | tail -5; } > "$out/timing.sweep"
    OUT="$out/timing" AB_TIMEOUT=60 bash "$here/ab.sh" run "$out/timing.sweep" 1 2>&1 | tail -26 ;;
  all)  # one call (~550 s): ab1, then the four patches applied together on this (device) tree, its tests and ResNet-18
    bash "$0" ab1
    git apply "$here/pending/conv_all4.patch" || { echo "conv_all4.patch did not apply"; exit 1; }
    bash "$0" verify ;;
  *)
    echo "usage: bash $0 verify|prepare|ab1|ab|all" >&2
    exit 2 ;;
esac
