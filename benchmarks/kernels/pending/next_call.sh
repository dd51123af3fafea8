#!/usr/bin/env bash
# The fiftieth session's first device call, not run (no device machine started in that session): everything it
# built, measured in one call of ~6 minutes, ordered by value (each part's logs are tarred into $OUT/next_call.tgz as
# soon as it ends, so a call cut short still brings back what it measured).
#   here:       bash benchmarks/kernels/pending/next_call.sh prepare   (the binaries, ~2 min with the object cache)
#   on device:  bash benchmarks/kernels/pending/next_call.sh run
#               carry ["benchmarks/kernels/build/next", "benchmarks/kernels/build/ab"]
# Parts: 1. the W1A16 M <= 2 trace (pending/w1a16_trace.patch: how much of x_planes_kernel the weight kernel's W loads
# hide in the rotating graph); 2. the conv's block timeline after the E2 swizzle (pending/conv_trace.patch);
# 3. ncu source lines of the conv at B = 64, ranked by stall samples and by shared-load wavefronts (what holds E2);
# 4. ncu shared-memory metrics of main and both E2 variants; 5. the A/B of main, padsets (pending/conv_pad_sets.patch)
# and u2 (pending/conv_e2_two_rows.patch) on pending/conv_issue_rows.sweep, 2 passes; 6. both variants' checks on
# pending/conv_wgmma.sweep (every padding / stride / dilation / NCHW / epilogue edge, planted errors).
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"   # benchmarks/kernels
root="$(cd "$here/../.." && pwd)"
next="$here/build/next"
case "${1:-}" in
  prepare)
    set -e
    mkdir -p "$next"
    rm -f "$here"/build/ab/*.gz
    bash "$here/build.sh"
    gzip -c "$here/build/harness" > "$next/harness_main.gz"
    bash "$here/ab.sh" build trace "$here/pending/conv_trace.patch"
    bash "$here/ab.sh" build w1trace "$here/pending/w1a16_trace.patch"
    mv "$here/build/ab/trace.gz" "$here/build/ab/w1trace.gz" "$next/"
    bash "$here/ab.sh" build padsets "$here/pending/conv_pad_sets.patch"
    bash "$here/ab.sh" build u2 "$here/pending/conv_e2_two_rows.patch"
    du -sh "$next" "$here/build/ab" ;;
  run)
    cd "$root"
    out="${OUT:-.out}"
    mkdir -p "$out/r"
    save() { tar czf "$out/next_call.tgz" -C "$out" $(cd "$out" && ls -d ab_raw r ncu 2> /dev/null); }
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
    gunzip -c "$next/harness_main.gz" > "$here/build/harness" && chmod +x "$here/build/harness"
    for v in trace w1trace; do gunzip -c "$next/$v.gz" > "/tmp/$v" && chmod +x "/tmp/$v"; done
    for v in padsets u2; do gunzip -c "$here/build/ab/$v.gz" > "/tmp/$v" && chmod +x "/tmp/$v"; done
    echo "== 1. w1a16 trace (${SECONDS}s)"
    i=0
    for row in "w1a16 m=1 n=8192 k=8192" "w1a16 m=1 n=16384 k=16384" "w1a16 m=1 n=4096 k=11008" "w1a16 m=2 n=8192 k=8192"; do
      i=$((i + 1)); echo "-- $row"; timeout 60 /tmp/w1trace $row > "$out/r/w1_$i.txt" 2>&1; tail -20 "$out/r/w1_$i.txt"
    done
    save; echo "== 2. conv trace (${SECONDS}s)"
    i=0
    for row in "conv b=64 c=256 h=14 oc=256" "conv b=256 c=512 h=7 oc=512"; do
      i=$((i + 1)); echo "-- $row"; timeout 60 /tmp/trace $row > "$out/r/ct_$i.txt" 2>&1; tail -26 "$out/r/ct_$i.txt"
    done
    save; echo "== 3. ncu source (${SECONDS}s)"
    OUT="$out/ncu" NCU_ROWS="conv b=64 c=256 h=14 oc=256" NCU_KERNELS=binary_conv2d_wgmma NCU_SOURCE=1 NCU_SRC_COUNT=4 \
      NCU_RANK="L1 Wavefronts Shared" timeout 200 bash benchmarks/gpu_session.sh ncu > "$out/r/ncu_source_log.txt" 2>&1
    tail -60 "$out/r/ncu_source_log.txt"
    save; echo "== 4. ncu metrics (${SECONDS}s)"
    metrics=l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
    metrics=$metrics,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,smsp__inst_executed_op_shared_ld.sum
    metrics=$metrics,gpu__time_duration.sum,smsp__inst_executed.sum
    for h in "$here/build/harness" /tmp/padsets /tmp/u2; do
      for row in "conv b=64 c=256 h=14 oc=256" "conv b=256 c=512 h=7 oc=512"; do
        echo "-- $h $row"
        timeout 60 ncu --clock-control none --metrics "$metrics" -k regex:binary_conv2d_wgmma --launch-skip 1 \
          --launch-count 1 "$h" $row graph=0 reps=1 2>&1 | grep -E "^ +[a-z_]+__|gpu__"
      done
    done | tee "$out/r/ncu_metrics.txt"
    save; echo "== 5. A/B (${SECONDS}s)"
    AB_TIMEOUT=100 bash "$here/ab.sh" run "$here/pending/conv_issue_rows.sweep" 2 2>&1 | tail -12
    save; echo "== 6. checks (${SECONDS}s)"
    for v in padsets u2; do
      echo "$v: $(timeout 90 /tmp/$v --sweep "$here/pending/conv_wgmma.sweep" graph=0 reps=1 2>&1 | tail -1)"
    done
    save && rm -rf "$out/ab_raw" "$out/r" "$out/ncu"
    echo "=== done (${SECONDS}s)" ;;
  *)
    echo "usage: bash $0 prepare|run" >&2
    exit 2 ;;
esac
