#!/usr/bin/env bash
# The fifty-fourth session's first device call (written in the fifty-third): main's checks on whatever card comes, its
# block timeline at the two issue shapes (with and without pack_signs; conv_trace.patch, stamps 41-43 new), and the
# whole CUDA test suite of the extension (1eb678e changed which devices the wgmma launchers and the table-first launch
# accept: host code, no kernel's PTX changed).
#   here:       bash benchmarks/kernels/pending/next_call.sh prepare    (~1 min with the harness object cache)
#   on device:  bash benchmarks/kernels/pending/next_call.sh run        carry ["benchmarks/kernels/build/next"];
#               ~7 min (the suite is ~5 of them); logs tarred into $OUT/next_call.tgz after each part
# Then (a second call): `bash benchmarks/gpu_session.sh build bench resnet`, for bench_ops' rows and the ResNet-18 row
# on that card (NOTES, "Fifty-third session").
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"   # benchmarks/kernels
root="$(cd "$here/../.." && pwd)"
next="$here/build/next"
case "${1:-}" in
  prepare)
    set -e
    mkdir -p "$next"
    rm -f "$here"/build/ab/*.gz "$next"/*.gz
    bash "$here/build.sh"
    gzip -c "$here/build/harness" > "$next/harness_main.gz"
    bash "$here/ab.sh" build trace "$here/pending/conv_trace.patch"
    mv "$here/build/ab/trace.gz" "$next/"
    du -sh "$next" ;;
  run)
    cd "$root"
    out="${OUT:-.out}"
    mkdir -p "$out/r"
    save() { tar czf "$out/next_call.tgz" -C "$out" r; }
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
    gunzip -c "$next/harness_main.gz" > /tmp/harness_main && chmod +x /tmp/harness_main
    gunzip -c "$next/trace.gz" > /tmp/trace && chmod +x /tmp/trace
    echo "== 1. main's checks (${SECONDS}s)"
    timeout 120 /tmp/harness_main --sweep "$here/pending/conv_wgmma.sweep" graph=0 reps=1 > "$out/r/checks.txt" 2>&1
    tail -1 "$out/r/checks.txt"
    save; echo "== 2. main's conv timeline (${SECONDS}s)"
    i=0
    for row in "conv b=64 c=256 h=14 oc=256" "conv b=256 c=512 h=7 oc=512" "conv b=64 c=256 h=14 oc=256 pack=1" \
               "conv b=256 c=512 h=7 oc=512 pack=1"; do
      i=$((i + 1)); echo "-- $row"; timeout 60 /tmp/trace $row > "$out/r/ct_$i.txt" 2>&1; tail -30 "$out/r/ct_$i.txt"
    done
    save; echo "== 3. the CUDA suite (${SECONDS}s)"
    OUT="$out/r" bash benchmarks/gpu_session.sh build tests 2>&1 | tail -8
    save && rm -rf "$out/r"
    echo "=== done (${SECONDS}s)" ;;
  *)
    echo "usage: bash $0 prepare|run" >&2
    exit 2 ;;
esac
