#!/usr/bin/env bash
# Fifty-first session, call 2: pa counted by the producer (pap) against main: checks, A/B, trace, ncu duration.
# carry ["benchmarks/kernels/build/next", "benchmarks/kernels/build/ab"]
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${OUT:-.out}"; mkdir -p "$out/r"
save() { tar czf "$out/call.tgz" -C "$out" $(cd "$out" && ls -d ab_raw r 2> /dev/null); }
cd "$root"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
gunzip -c "$here/build/next/harness_main.gz" > "$here/build/harness" && chmod +x "$here/build/harness"
gunzip -c "$here/build/next/trace.gz" > /tmp/trace && chmod +x /tmp/trace
gunzip -c "$here/build/ab/pap.gz" > /tmp/pap && chmod +x /tmp/pap
gunzip -c "$here/build/next/paptrace.gz" > /tmp/paptrace && chmod +x /tmp/paptrace
echo "== checks (${SECONDS}s)"
timeout 120 /tmp/pap --sweep "$here/pending/conv_wgmma.sweep" graph=0 reps=1 > "$out/r/pap_checks.txt" 2>&1
grep -c " NO\| no " "$out/r/pap_checks.txt"; tail -1 "$out/r/pap_checks.txt"
save; echo "== A/B (${SECONDS}s)"
AB_TIMEOUT=100 bash "$here/ab.sh" run "$here/pending/conv_issue_rows.sweep" 3 2>&1 | tail -12
save; echo "== traces (${SECONDS}s)"
i=0
for row in "conv b=64 c=256 h=14 oc=256" "conv b=256 c=512 h=7 oc=512"; do
  i=$((i + 1))
  timeout 60 /tmp/paptrace $row > "$out/r/pt_$i.txt" 2>&1
  timeout 60 /tmp/trace $row > "$out/r/mt_$i.txt" 2>&1
  paste <(sed -n '/clk from entry/,$p' "$out/r/mt_$i.txt" | cut -c1-50) <(sed -n '/clk from entry/,$p' "$out/r/pt_$i.txt" | cut -c26-60)
done
save; echo "== ncu (${SECONDS}s)"
for h in "$here/build/harness" /tmp/pap; do
  for row in "conv b=64 c=256 h=14 oc=256" "conv b=256 c=512 h=7 oc=512"; do
    echo "-- $h $row"
    timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread -k regex:binary_conv2d_wgmma --launch-skip 2 \
      --launch-count 3 "$h" $row graph=0 reps=1 2>&1 | grep -E "^ +[a-z_]+__"
  done
done | tee "$out/r/ncu.txt"
save; echo "== w1a16 waves (${SECONDS}s)"
timeout 120 "$here/build/harness" --sweep "$here/pending/w1a16_waves.sweep" > "$out/r/waves.txt" 2>&1
grep -E "^w1a16|failed" "$out/r/waves.txt" | cut -c1-100
gunzip -c "$here/build/next/w1trace.gz" > /tmp/w1trace && chmod +x /tmp/w1trace
for sl in 2 4; do timeout 60 /tmp/w1trace w1a16 m=1 n=8192 k=8192 slices=$sl > "$out/r/w1sl$sl.txt" 2>&1; sed -n 5,12p "$out/r/w1sl$sl.txt"; done
save; echo "=== done (${SECONDS}s)"
