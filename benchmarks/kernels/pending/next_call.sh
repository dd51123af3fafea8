#!/usr/bin/env bash
# The fifty-second session's first device call (written in the fifty-first, not run): u2 (pending/conv_e2_two_rows.patch)
# against main on the H200, 3 passes, with its checks; then main's conv timeline again for the same card.
#   here:       bash benchmarks/kernels/pending/next_call.sh prepare    (~1 min with the harness object cache)
#   on device:  bash benchmarks/kernels/pending/next_call.sh run        carry ["benchmarks/kernels/build/next",
#               "benchmarks/kernels/build/ab"]; ~4 min; logs tarred into $OUT/next_call.tgz after each part
# The fifty-first session's one H100 A/B had u2 1.2-1.6% faster on 6 of 8 rows (the patch's header): merge it only
# if it holds here, then the CUDA suite and bench_ops' conv rows (NOTES, "Fifty-first session").
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
    bash "$here/ab.sh" build u2 "$here/pending/conv_e2_two_rows.patch"
    du -sh "$next" "$here/build/ab" ;;
  run)
    cd "$root"
    out="${OUT:-.out}"
    mkdir -p "$out/r"
    save() { tar czf "$out/next_call.tgz" -C "$out" $(cd "$out" && ls -d ab_raw r 2> /dev/null); }
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
    gunzip -c "$next/harness_main.gz" > "$here/build/harness" && chmod +x "$here/build/harness"
    gunzip -c "$next/trace.gz" > /tmp/trace && chmod +x /tmp/trace
    gunzip -c "$here/build/ab/u2.gz" > /tmp/u2 && chmod +x /tmp/u2
    echo "== 1. u2 checks (${SECONDS}s)"
    timeout 120 /tmp/u2 --sweep "$here/pending/conv_wgmma.sweep" graph=0 reps=1 > "$out/r/u2_checks.txt" 2>&1
    tail -1 "$out/r/u2_checks.txt"
    save; echo "== 2. A/B main / u2, 3 passes (${SECONDS}s)"
    AB_TIMEOUT=100 bash "$here/ab.sh" run "$here/pending/conv_issue_rows.sweep" 3 2>&1 | tail -11
    save; echo "== 3. main's conv timeline (${SECONDS}s)"
    i=0
    for row in "conv b=64 c=256 h=14 oc=256" "conv b=256 c=512 h=7 oc=512"; do
      i=$((i + 1)); echo "-- $row"; timeout 60 /tmp/trace $row > "$out/r/ct_$i.txt" 2>&1; tail -32 "$out/r/ct_$i.txt"
    done
    save && rm -rf "$out/ab_raw" "$out/r"
    echo "=== done (${SECONDS}s)" ;;
  *)
    echo "usage: bash $0 prepare|run" >&2
    exit 2 ;;
esac
