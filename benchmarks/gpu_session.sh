#!/usr/bin/env bash
# Everything one GPU session needs, in one command (device time is scarce):
#   install, build the kernels, run the CUDA tests, run the benchmarks.
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
timeout 420 python3 -m pytest -q -rfE -k "$selection" --timeout=120 tests 2>&1 | tee "$OUT/tests.log" | tail -40
timeout 300 python3 benchmarks/bench_ops.py --results "$OUT/RESULTS.md" 2>&1 | tee "$OUT/bench.log" | tail -40
cp benchmarks/speedup_vs_m.png "$OUT/" 2>/dev/null || true
