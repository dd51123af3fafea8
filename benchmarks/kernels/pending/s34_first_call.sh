#!/usr/bin/env bash
# The thirty-fourth session's first device call (NOTES "Left for the thirty-fourth session"): the three pending
# harness variants prebuilt in benchmarks/kernels/build/ab (r192, split, f5; rebuild them with ab.sh build if csrc
# moved past 0c3a012) against main's harness, in one call of ~4 min. Carry ["benchmarks/kernels/build"].
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-.out}"
mkdir -p "$out"
for name in r192 split f5; do gunzip -c "$here/build/ab/$name.gz" > "/tmp/$name" && chmod +x "/tmp/$name"; done
echo "=== r192 (ws_rows192.sweep)"; /tmp/r192 --sweep "$here/pending/ws_rows192.sweep" 2>&1 | tee "$out/r192.txt" | tail -n 25
echo "=== split (ws_wave_split.sweep)"; /tmp/split --sweep "$here/pending/ws_wave_split.sweep" 2>&1 | tee "$out/split.txt" | tail -n 30
echo "=== f5 against main (ws_in_flight5.sweep, 2 passes each, interleaved)"
for pass in 1 2; do
  for name in main f5; do
    binary="/tmp/$name"; [ "$name" = main ] && binary="$here/build/harness"
    "$binary" --sweep "$here/pending/ws_in_flight5.sweep" > "$out/f5_${name}_$pass.txt" 2>&1
  done
done
row() {  # a harness row as "config ok graph_us"
  grep -E "^(w1a16|apot)" "$1" | awk '{ for (i = 1; i <= NF; i++) if ($i == "yes" || $i == "NO") { line = ""; for (j = 2; j < i; j++) line = line " " $j; print line " | " $i " " $(i + 2); break } }'
}
for pass in 1 2; do echo "pass $pass: main | f5"; paste -d "|" <(row "$out/f5_main_$pass.txt") <(row "$out/f5_f5_$pass.txt" | sed 's/.*| //'); done
