#!/usr/bin/env bash
# First GPU run of pending/planes_wgmma.patch ("pw": W1A16 at M <= 16 as bit planes on the b1 wgmma) and of
# pending/planes_wgmma_mc.patch ("pwmc": the same, pairs of feature blocks sharing the plane tile by TMA multicast),
# both written without a GPU (thirty-seventh session). On the device, carrying benchmarks/kernels/build (main's
# harness, build/ab/pw.gz and pwmc.gz, the watchdog builds build/pwwd/harness.gz and build/pwmcwd/harness.gz: 54 MB in all):
#   bash benchmarks/kernels/pending/planes_wgmma_first.sh
# Here, before the call: bash benchmarks/kernels/pending/planes_wgmma_build.sh (nvcc, ~5 min on 2 cores from cold).
# 1. For each variant, every forced kernel=4 check row (the rows before the timing sections, and the planted ones),
#    one process a row, on its watchdog build (a protocol bug traps after ~4 s instead of hanging the call; a trap
#    kills only that row's process), each under `timeout 60`.
# 2. ab.sh's A/B of the whole sweep over main and the variants whose checks all passed (a failing variant's .gz is
#    moved aside to build/failed/).
# 3. With PW_NCU=1, ncu of pw's GEMM kernel at M = 16 and M = 1, 8192^2 (gpu_session.sh's ncu stage).
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-.out}"
mkdir -p "$out" "$here/build/failed"
sweep="$here/pending/planes_wgmma.sweep"
for variant in pw pwmc; do
  watchdog="/tmp/${variant}wd_harness"
  gunzip -c "$here/build/${variant}wd/harness.gz" > "$watchdog" 2>/dev/null && chmod +x "$watchdog" ||
    { echo "$variant: no watchdog build ($here/build/${variant}wd/harness.gz): skipped"; continue; }
  failed=0
  while IFS= read -r line; do
    row="${line%%#*}"
    [ -z "${row// }" ] && continue
    case "$row" in *kernel=4*) ;; *) continue ;; esac
    case "$row" in *n=8192*|*n=4096*|*n=16384*|*n=28672*|*n=12288*) case "$row" in *plant=1*) ;; *) continue ;; esac ;; esac
    # shellcheck disable=SC2086
    result="$(timeout 60 "$watchdog" $row 2>&1)"; rc=$?
    echo "$variant: $result" | tail -3 >> "$out/pw_checks.txt"
    if [ $rc -ne 0 ] || ! echo "$result" | grep -q -e " yes " -e "planted error caught"; then
      echo "$variant CHECK FAILED (rc $rc): $row"; echo "$result" | tail -5; failed=1
    else
      echo "$variant ok: $row"
    fi
  done < "$sweep"
  if [ $failed -ne 0 ]; then
    echo "$variant: a check failed; not timed (watchdog output above; $out/pw_checks.txt)"
    [ -f "$here/build/ab/$variant.gz" ] && mv "$here/build/ab/$variant.gz" "$here/build/failed/"
  fi
done
ls "$here"/build/ab/*.gz > /dev/null 2>&1 || { echo "no variant left to time"; exit 1; }
bash "$here/ab.sh" run "$sweep" 1 | tee "$out/pw_ab.txt"
if [ "${PW_NCU:-0}" = 1 ] && [ -f "$here/build/ab/pw.gz" ]; then
  gunzip -c "$here/build/ab/pw.gz" > /tmp/pw_harness && chmod +x /tmp/pw_harness
  HARNESS=/tmp/pw_harness NCU_KERNELS=planes_wgmma NCU_SKIP=0 NCU_ROWS="w1a16 m=16 n=8192 k=8192 dtype=bf16
w1a16 m=1 n=8192 k=8192 dtype=bf16" bash "$here/../gpu_session.sh" ncu
fi
