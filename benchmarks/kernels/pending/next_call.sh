#!/usr/bin/env bash
# The device calls left by the fifty-ninth session.
#   verify (no carry, ~230 s): the conv / packed / residual CUDA tests of main (the halo kernel with residuals,
#     10076b8, never ran in pytest on a GPU), then ResNet-18.
#   prepare (here, ~3 min with the object cache warm): main's harness -> build/main/harness.gz; the variant `tables`
#     (pending/conv_halo_tables.patch) -> build/ab/tables.gz
#   ab (carry ["benchmarks/kernels/build/ab", "benchmarks/kernels/build/main"], ~200 s): pending/conv_halo_tables.sweep
#     once (its checks; main runs the epi=1 tile=3 row the variant refuses), then its first 11 rows (the timing rows)
#     twice more. Merge the tables patch if every check row passes and its tile=3 rows beat main's.
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
    bash "$here/ab.sh" build tables "$here/pending/conv_halo_tables.patch"
    du -sh "$here/build/ab" "$here/build/main" ;;
  ab)
    gunzip -c "$here/build/main/harness.gz" > "$here/build/harness" && chmod +x "$here/build/harness"
    OUT="$out/full" AB_TIMEOUT=120 bash "$here/ab.sh" run "$here/pending/conv_halo_tables.sweep" 1 2>&1 | tail -52
    cut -c1-220 "$out/full/ab_raw/tables.1.txt" | awk '$0 ~ / NO |rejected|failed|rror/' | head -20
    grep -v "^#" "$here/pending/conv_halo_tables.sweep" | head -11 > "$out/timing.sweep"
    OUT="$out/timing" AB_TIMEOUT=60 bash "$here/ab.sh" run "$out/timing.sweep" 2 2>&1 | tail -14 ;;
  *)
    echo "usage: bash $0 verify|prepare|ab" >&2
    exit 2 ;;
esac
