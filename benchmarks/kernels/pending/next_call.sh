#!/usr/bin/env bash
# The fifty-ninth session's first device call: the op-level CUDA tests of the halo kernel's merge (fifty-eighth
# session; its harness sweep pending/halo2.sweep passed, its pytest cases never ran), then ResNet-18 with it.
#   one call (no carry):  bash benchmarks/kernels/pending/next_call.sh
# A failure in the first step comes before anything else. halo2.sweep reruns the harness A/B (carry
# benchmarks/kernels/build with a fresh `bash benchmarks/kernels/build.sh`): `build/harness --sweep
# benchmarks/kernels/pending/halo2.sweep` (tile=1: the pipelined kernel, tile=3: the halo kernel, one process).
set -uo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$root"
out="${OUT:-.out}"
mkdir -p "$out"
TESTS="cuda and (conv or residual or with_signs or packed or bnn)" OUT="$out" \
  bash benchmarks/gpu_session.sh build tests 2>&1 | tail -30
cat "$out/failures.txt" 2>/dev/null | head -60
OUT="$out" bash benchmarks/gpu_session.sh resnet 2>&1 | tail -20
