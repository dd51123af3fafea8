#!/usr/bin/env bash
# One GPU round in one command (device time is scarce: benchmarks/kernels/README.md has the device calls).
#   bash benchmarks/gpu_session.sh STAGE...    stages, in the order given:
#     harness   every sweep of benchmarks/kernels with the carried harness binary (built there if it cannot run)
#     ncu       ncu SpeedOfLight/Occupancy/WarpStateStats/MemoryWorkloadAnalysis of the rows in $NCU_ROWS
#               (with $HARNESS, a variant's binary, instead of the carried main build)
#               (kernels matching $NCU_KERNELS, skipping $NCU_SKIP launches, profiling $NCU_COUNT; NCU_SOURCE=1: also
#               the SASS lines with the most stall samples, kernels/ncu_source_top.py, summed over NCU_SRC_COUNT
#               launches: a short kernel gets few samples a launch; NCU_RANK="L1 Wavefronts Shared": the lines again,
#               ranked by that source counter)
#     build     pip install -e . and a timed build of the extension from an empty TORCH_EXTENSIONS_DIR
#     tests     the CUDA tests (pytest -k "$TESTS", default cuda), 8 workers, failures in $OUT/failures.txt
#     bench     benchmarks/bench_ops.py --quick
#     msweep    bench_ops.py's M sweeps, 20 sizes, at N = K = 8192 and N = 4096 K = 11008
#     resnet    examples/bnn_resnet.py in CUDA graphs with its kernel profile, then in the default mode (both models)
#     host      benchmarks/host_time.py (host enqueue against wall time a forward, one-op host times) and
#               benchmarks/weight_op_host.py (the weight ops' host time against their kernel ops')
#     decode    examples/llm_decode.py dim 4096, 4 layers, CUDA graphs: tokens/s, then each model's kernels a token
#     cpu       benchmarks/cpu_threads.py: the host CPU's kernels against fp32 at 1, 2, 4, ... threads
#     peers     benchmarks/peers.py: W1A16 against gemlite and humming-kernels, from .whl (carry [".whl"]; NOTES.md
#               "Peers" says how it is made)
# Logs go under $OUT (the device tool brings them back), or ./.out here.
set -o pipefail
OUT=${OUT:-.out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/bitcompile_extensions}
here="$(cd "$(dirname "$0")" && pwd)"
harness="${HARNESS:-$here/kernels/build/harness}"  # HARNESS=path: another build (a variant)
status=0
stamp() { echo "=== $1 ($(date +%T), ${SECONDS}s)"; }

for stage in "$@"; do
  case "$stage" in
    harness)
      stamp harness
      if ! "$harness" pack m=1 k=32 graph=0 reps=1 > /dev/null 2>&1; then
        echo "the carried harness does not run here: building it"; bash "$here/kernels/build.sh" || exit 1
      fi
      for sweep in "$here"/kernels/*.sweep; do
        "$harness" --sweep "$sweep" 2>&1 | tee "$OUT/harness_$(basename "$sweep" .sweep).txt" || status=1
      done ;;
    ncu)
      stamp ncu
      while IFS= read -r row; do
        [ -z "$row" ] && continue
        name=$(echo "$row" | tr ' =' '_-' | cut -c1-60)
        ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
          --section MemoryWorkloadAnalysis --section LaunchStats -k "regex:${NCU_KERNELS:-binary|linear|pack|conv}" \
          --launch-skip "${NCU_SKIP:-1}" --launch-count "${NCU_COUNT:-1}" \
          "$harness" $row graph=0 reps=1 > "$OUT/ncu_$name.txt" 2>&1
        grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Grid Size|stalled" "$OUT/ncu_$name.txt" | cut -c1-400 | head -40
        if [ -n "${NCU_SOURCE:-}" ]; then  # instruction by instruction (kernels/ncu_source_top.py)
          ncu --clock-control none --section SourceCounters --page source --print-source sass --csv \
            -k "regex:${NCU_KERNELS:-binary|linear|pack|conv}" --launch-skip "${NCU_SKIP:-1}" \
            --launch-count "${NCU_SRC_COUNT:-1}" "$harness" $row graph=0 reps="$((${NCU_SRC_COUNT:-1} + 2))" \
            > "$OUT/src_$name.csv" 2> /dev/null
          python3 "$here/kernels/ncu_source_top.py" "$OUT/src_$name.csv" 25 | tee "$OUT/src_$name.txt"
          if [ -n "${NCU_RANK:-}" ]; then  # the same lines ranked by a source counter, e.g. "L1 Wavefronts Shared"
            python3 "$here/kernels/ncu_source_top.py" "$OUT/src_$name.csv" 25 "$NCU_RANK" | tee -a "$OUT/src_$name.txt"
          fi
        fi
      done <<< "${NCU_ROWS:-w1a16 m=1 n=8192 k=8192}" ;;
    build)
      stamp build
      { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
        python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"; } 2>&1 | tee "$OUT/environment.txt"
      python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { tail -30 "$OUT/install.log"; exit 1; }
      rm -rf "$TORCH_EXTENSIONS_DIR"
      start=$SECONDS
      python3 -m bitcompile > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
      cat "$OUT/build.log"; echo "extension build from an empty cache: $((SECONDS - start)) s wall" ;;
    tests)
      stamp tests
      # -n 8: `-k cuda` (1340 tests) in ~290 s on the H200 machine; the whole suite (3136 there) does not fit one
      # call. pytest_failnow writes each failure to $OUT/failures.txt at once: a run cut by the limit still names them.
      PYTHONPATH="$here:${PYTHONPATH:-}" timeout 420 python3 -m pytest -q -rfE -n 8 -k "${TESTS:-cuda}" --timeout=300 \
        -p pytest_failnow -p no:cacheprovider tests 2>&1 | tee "$OUT/tests.log" | tail -25 || status=1 ;;
    bench)
      stamp bench
      timeout 300 python3 benchmarks/bench_ops.py --quick --results "$OUT/RESULTS.md" 2>&1 | tee "$OUT/bench.log" | tail -32 || status=1
      cp benchmarks/speedup_vs_m.png "$OUT/" 2>/dev/null ;;
    msweep)
      stamp msweep  # issue 10's M sweeps (no cliff at any M): N = K = 8192 (the plot) and N = 4096, K = 11008
      sizes=1,2,4,8,16,32,64,96,128,160,192,256,384,512,640,768,1024,2048,4096,8192
      for shape in 8192,8192 4096,11008; do
        timeout 200 python3 benchmarks/bench_ops.py --quick --sweep-only --shape "$shape" --sizes "$sizes" \
          --results "$OUT/RESULTS.md" 2>&1 | tee -a "$OUT/msweep.log" | tail -24 || status=1
      done
      cp benchmarks/speedup_vs_m.png "$OUT/" 2>/dev/null ;;
    resnet)
      stamp resnet
      timeout 300 python3 examples/bnn_resnet.py --mode reduce-overhead --profile --top 30 > "$OUT/bnn_graphs.txt" 2>&1 || status=1
      grep -E "images/s|us a forward|x$|exact" "$OUT/bnn_graphs.txt"
      timeout 200 python3 examples/bnn_resnet.py > "$OUT/bnn_default.txt" 2>&1 || status=1
      grep -E "images/s|x$|exact" "$OUT/bnn_default.txt" ;;
    host)
      stamp host
      timeout 150 python3 benchmarks/host_time.py 2>&1 | tee "$OUT/host_time.txt" || status=1
      timeout 60 python3 benchmarks/weight_op_host.py --device cuda 2>&1 | tee "$OUT/weight_op_host.txt" || status=1 ;;
    decode)
      stamp decode
      timeout 200 python3 examples/llm_decode.py --device cuda --dim 4096 --layers 4 --compile --tokens 128 \
        > "$OUT/decode.txt" 2>&1 || status=1
      tail -5 "$OUT/decode.txt"
      timeout 250 python3 examples/llm_decode.py --device cuda --dim 4096 --layers 4 --compile --profile --top 12 \
        > "$OUT/decode_profile.txt" 2>&1 || status=1
      grep -E "wall a token" "$OUT/decode_profile.txt" ;;
    cpu)
      stamp cpu
      # the host's topology first: whether 2 threads share a core (SMT siblings) changes how the rows read
      { lscpu | grep -E "Model name|^CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket|NUMA node\(s\)|L1d|L2|L3|Flags" |
          sed -E 's/^(Flags:).*/\1 (avx512 ones:) /'; grep -o -w -E "avx512[a-z_0-9]*|amx[a-z_0-9]*" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
        cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null | sed 's/^/cpu0 siblings: /'; } 2>&1 |
        tee "$OUT/cpu_topology.txt"
      timeout 300 python3 benchmarks/cpu_threads.py 2>&1 | tee "$OUT/cpu_threads.txt" || status=1 ;;
    peers)
      stamp peers
      wheels="$here/../.whl"
      if ls "$wheels"/*.whl > /dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/peers_site \
          "$wheels"/*.whl > "$OUT/peers_install.log" 2>&1 || { tail -5 "$OUT/peers_install.log"; status=1; }
        PYTHONPATH="/tmp/peers_site:$wheels/gemlite_src:${PYTHONPATH:-}" timeout 300 python3 benchmarks/peers.py \
          --results "$OUT/RESULTS.md" > "$OUT/peers.log" 2>&1 || status=1
        grep -E "^\| |not run" "$OUT/peers.log" | head -20
      else
        echo "no wheels in .whl: carry it (NOTES.md \"Peers\")"; status=1
      fi ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
stamp done
# The device tool brings back at most 8 files from $OUT (the twenty-ninth session lost the M-sweep plot to that):
# past 8, everything goes into one tarball.
if [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
  tar czf /tmp/gpu_session_logs.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/gpu_session_logs.tgz "$OUT/logs.tgz"
  echo "more than 8 files under $OUT: packed into $OUT/logs.tgz"
fi
exit $status
