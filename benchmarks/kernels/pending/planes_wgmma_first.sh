#!/usr/bin/env bash
# First GPU run of pending/planes_wgmma.patch (written without a GPU, thirty-seventh session). On the device, carrying
# benchmarks/kernels/build (main's harness, build/ab/pw.gz, build/pwwd/harness):
#   bash benchmarks/kernels/pending/planes_wgmma_first.sh
# Here, before the call (nvcc, ~4 min on 2 cores):
#   bash benchmarks/kernels/build.sh
#   bash benchmarks/kernels/ab.sh build pw benchmarks/kernels/pending/planes_wgmma.patch
#   git worktree add /tmp/pwwd HEAD && git -C /tmp/pwwd apply $PWD/benchmarks/kernels/pending/planes_wgmma.patch &&
#     EXTRA_NVCC_FLAGS=-DBITCOMPILE_WGMMA_WATCHDOG BUILD_DIR=$PWD/benchmarks/kernels/build/pwwd
#     bash /tmp/pwwd/benchmarks/kernels/build.sh; git worktree remove --force /tmp/pwwd
# 1. Every forced kernel=4 row before the timing section, one process a row, on the watchdog build (a protocol bug
#    traps after ~4 s instead of hanging the call; a trap kills only that row's process), each under `timeout 60`.
# 2. Only if all of them pass (the planted rows must say "planted error caught"): ab.sh's A/B of the whole sweep.
# 3. With PW_NCU=1, ncu of the variant's GEMM kernel at M = 16 and M = 1, 8192^2 (gpu_session.sh's ncu stage).
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-.out}"
mkdir -p "$out"
sweep="$here/pending/planes_wgmma.sweep"
watchdog="$here/build/pwwd/harness"
failed=0
while IFS= read -r line; do
  row="${line%%#*}"
  [ -z "${row// }" ] && continue
  case "$row" in *kernel=4*) ;; *) continue ;; esac
  case "$row" in *n=8192*|*n=4096*|*n=16384*|*n=28672*|*n=12288*) case "$row" in *plant=1*) ;; *) continue ;; esac ;; esac
  # shellcheck disable=SC2086
  result="$(timeout 60 "$watchdog" $row 2>&1)"; rc=$?
  echo "$result" | tail -3 >> "$out/pw_checks.txt"
  if [ $rc -ne 0 ] || ! echo "$result" | grep -q -e " yes " -e "planted error caught"; then
    echo "CHECK FAILED (rc $rc): $row"; echo "$result" | tail -5; failed=1
  else
    echo "ok: $row"
  fi
done < "$sweep"
if [ $failed -ne 0 ]; then echo "not timing: a check failed (watchdog output above; $out/pw_checks.txt)"; exit 1; fi
bash "$here/ab.sh" run "$sweep" 1 | tee "$out/pw_ab.txt"
if [ "${PW_NCU:-0}" = 1 ]; then
  gunzip -c "$here/build/ab/pw.gz" > /tmp/pw_harness && chmod +x /tmp/pw_harness
  HARNESS=/tmp/pw_harness NCU_KERNELS=planes_wgmma NCU_SKIP=0 NCU_ROWS="w1a16 m=16 n=8192 k=8192 dtype=bf16
w1a16 m=1 n=8192 k=8192 dtype=bf16" bash "$here/../gpu_session.sh" ncu
fi
