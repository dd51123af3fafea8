#!/usr/bin/env bash
# The fifty-eighth session's first device call (~250 s with the start): where layer1's conv time goes, and a first
# run of the halo kernel. The harness builds are git-ignored, so a fresh machine rebuilds them here first:
#   export PATH=/usr/local/cuda/bin:$PATH; bash benchmarks/kernels/pending/next_call.sh prepare     (~12 min, 2 cores)
# then one call, carry ["benchmarks/kernels/build/ab", "benchmarks/kernels/build/main", "benchmarks/kernels/build/halo"]
# (~55 MB):
#   bash benchmarks/kernels/pending/next_call.sh run
# run: (1) pending/conv_halo.sweep on the halo build (pending/conv_halo.patch; its tile=1 rows are main's pipelined
#   kernel in the same process), two passes: every check row must say yes, the two plant rows NO, the two reject rows
#   "rejected" ($OUT/halo.N.txt);
#   (2) main and the five knockout variants of pending/conv_pipelined_ko.patch on pending/conv_pipelined_ko.sweep
#   (ab.sh, two passes: graph us side by side; the variants' checks fail on purpose, main's must pass);
#   (3) ncu of main's layer1 sign-word and residual + sign-word rows and of the halo kernel's, with source counters.
# Then the second call: `OUT=$OUT bash benchmarks/gpu_session.sh build tests bench resnet` (the whole CUDA suite, the
# issue tables, ResNet-18).
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"   # benchmarks/kernels
root="$(cd "$here/../.." && pwd)"
case "${1:-}" in
  prepare)
    set -e
    rm -rf "$here/build/ab" "$here/build/main" "$here/build/halo"
    mkdir -p "$here/build/main" "$here/build/halo"
    bash "$here/build.sh"
    gzip -c "$here/build/harness" > "$here/build/main/harness.gz"
    bash "$here/ab.sh" build halo "$here/pending/conv_halo.patch"
    mv "$here/build/ab/halo.gz" "$here/build/halo/halo.gz"
    for k in 1 2 4 8 15; do
      bash "$here/ab.sh" build "ko$k" "$here/pending/conv_pipelined_ko.patch" "-DBC_KO=$k"
    done
    du -sh "$here/build/ab" "$here/build/main" "$here/build/halo" ;;
  run)
    cd "$root"
    out="${OUT:-.out}"
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
    gunzip -c "$here/build/main/harness.gz" > "$here/build/harness" && chmod +x "$here/build/harness"
    gunzip -c "$here/build/halo/halo.gz" > "$here/build/halo/harness" && chmod +x "$here/build/halo/harness"
    for pass in 1 2; do
      echo "=== halo pass $pass (${SECONDS}s)"
      timeout 120 "$here/build/halo/harness" --sweep "$here/pending/conv_halo.sweep" > "$out/halo.$pass.txt" 2>&1
      awk '{ if (length($0) > 200) print substr($0, 1, 200); else print }' "$out/halo.$pass.txt"
    done
    echo "=== knockouts (${SECONDS}s)"
    OUT="$out" AB_TIMEOUT=120 bash "$here/ab.sh" run "$here/pending/conv_pipelined_ko.sweep" 2 2>&1 | tail -20
    echo "=== ncu (${SECONDS}s)"
    NCU_ROWS=$'conv b=256 c=64 h=56 oc=64 signs=1\nconv b=256 c=64 h=56 oc=64 res=1 sumw=1' \
      NCU_KERNELS=binary_conv2d NCU_SOURCE=1 OUT="$out" timeout 200 bash "$root/benchmarks/gpu_session.sh" ncu 2>&1 |
      cut -c1-220 | head -100
    NCU_ROWS=$'conv b=256 c=64 h=56 oc=64 kernel=1 tile=3 signs=1\nconv b=256 c=64 h=56 oc=64 kernel=1 tile=3 res=1 sumw=1' \
      HARNESS="$here/build/halo/harness" NCU_KERNELS=binary_conv2d NCU_SOURCE=1 OUT="$out" timeout 200 \
      bash "$root/benchmarks/gpu_session.sh" ncu 2>&1 | cut -c1-220 | head -100
    echo "=== done (${SECONDS}s)" ;;
  *)
    echo "usage: bash $0 prepare|run" >&2
    exit 2 ;;
esac
