#!/usr/bin/env bash
# The fifty-ninth session's device calls.
#   tests (no carry, ~300 s): the op-level CUDA tests of the halo kernel's merge (fifty-eighth session; its harness
#     sweep pending/halo2.sweep passed, its pytest cases never ran), then ResNet-18 with it. A failure here comes first.
#   prepare (here, ~3 min with the object cache warm): main's harness -> build/main/harness.gz; the variants
#     halores (pending/conv_halo_residual.patch) and halorescol (that patch, then pending/conv_halo_columns.patch) ->
#     build/ab
#   ab (carry ["benchmarks/kernels/build/ab", "benchmarks/kernels/build/main"], ~300 s): one pass of
#     pending/conv_halo_residual.sweep (every check; main rejects the tile=3 residual rows it cannot run: read the
#     variants' columns there), then pending/conv_halo_timing.sweep twice. halores stages a tile's residual into its
#     stage with the tile's halo (cp.async, two stages), so the halo kernel can take layer1's residual convs; halorescol
#     also reads the columns' (scale, bias) from a table made once a block. Merge halores (the patch has its dispatch
#     and tests) only if its tile=3 residual rows beat tile=1 and every check row passes; then the columns patch if it
#     gains.
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"   # benchmarks/kernels
root="$(cd "$here/../.." && pwd)"
cd "$root"
out="${OUT:-.out}"
mkdir -p "$out"
case "${1:-}" in
  tests)
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
    bash "$here/ab.sh" build halores "$here/pending/conv_halo_residual.patch"
    tree="$(mktemp -d)/tree"  # the two patches in one (ab.sh builds one)
    git worktree add -q --detach "$tree" HEAD
    git -C "$tree" apply "$here/pending/conv_halo_residual.patch" "$here/pending/conv_halo_columns.patch"
    git -C "$tree" diff > "$tree.patch"
    git worktree remove --force "$tree"
    bash "$here/ab.sh" build halorescol "$tree.patch"
    du -sh "$here/build/ab" "$here/build/main" ;;
  ab)
    gunzip -c "$here/build/main/harness.gz" > "$here/build/harness" && chmod +x "$here/build/harness"
    OUT="$out/full" AB_TIMEOUT=150 bash "$here/ab.sh" run "$here/pending/conv_halo_residual.sweep" 1 2>&1 | tail -64
    for name in halores halorescol; do
      echo "== $name"; cut -c1-200 "$out/full/ab_raw/$name.1.txt" | awk '$0 ~ / NO |rejected|failed|rror/' | head -20
    done
    OUT="$out/timing" AB_TIMEOUT=100 bash "$here/ab.sh" run "$here/pending/conv_halo_timing.sweep" 2 2>&1 | tail -16 ;;
  *)
    echo "usage: bash $0 tests|prepare|ab" >&2
    exit 2 ;;
esac
