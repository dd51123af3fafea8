#!/usr/bin/env bash
# Everything one GPU session needs, in one command (device time is scarce):
#   install, build the kernels, run the CUDA tests and the benchmarks, on the default CUDA kernels
#   and on the speed-work kernels (BITCOMPILE_CUDA_LEGACY=0, not yet the default: see csrc/cuda/binary_ops.cpp).
# Logs go under $OUT (the device tool fetches them), or ./.out here.
#   bash benchmarks/gpu_session.sh [pytest -k expression]   (default: cuda)
set -o pipefail
OUT=${OUT:-.out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/bitcompile_extensions}
selection=${1:-cuda}

{ nvidia-smi; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"; } 2>&1 | tee "$OUT/environment.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
BITCOMPILE_VERBOSE_BUILD=1 python3 -m bitcompile > "$OUT/build.log" 2>&1
build=$?
grep -E "built|error|Error" "$OUT/build.log" | tail -40
[ $build -eq 0 ] || { tail -60 "$OUT/build.log"; exit 1; }
for kernels in default 0; do
  if [ "$kernels" = default ]; then unset BITCOMPILE_CUDA_LEGACY; else export BITCOMPILE_CUDA_LEGACY=$kernels; fi
  echo "=== CUDA tests, BITCOMPILE_CUDA_LEGACY=${BITCOMPILE_CUDA_LEGACY:-unset}"
  timeout 400 python3 -m pytest -q -rfE -k "$selection" --timeout=120 tests 2>&1 | tee "$OUT/tests_$kernels.log" | tail -25
  echo "=== benchmarks, BITCOMPILE_CUDA_LEGACY=${BITCOMPILE_CUDA_LEGACY:-unset}"
  timeout 300 python3 benchmarks/bench_ops.py --quick --results "$OUT/RESULTS_$kernels.md" 2>&1 | tee "$OUT/bench_$kernels.log" | tail -32
  cp benchmarks/speedup_vs_m.png "$OUT/speedup_vs_m_$kernels.png" 2>/dev/null || true
done
