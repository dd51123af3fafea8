#!/usr/bin/env bash
# The device calls left by the sixty-first session (its one call ran the A/B of stride2, wgsigns, wgres and wgahead
# and the CUDA tests of the four together: 437 passed; stride2, wgsigns and wgahead are merged, wgres was not).
#   verify (no carry, ~300 s with the build): the conv / packed / residual / weight-memo CUDA tests of main, then
#     ResNet-18 in CUDA graphs with its kernel profile and in the default mode (the merge's figures, and the weight
#     memo's effect on the default mode's host time).
#   host (no carry, ~250 s after verify on a warm machine, ~330 s alone): benchmarks/host_time.py (host enqueue
#     against wall time a forward, one call of each conv op) and examples/llm_decode.py's tokens/s (the weight memo
#     serves linear_of_weight and packed_linear_group too).
set -uo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$root"
out="${OUT:-.out}"
mkdir -p "$out"
case "${1:-}" in
  verify)
    TESTS="cuda and (conv or residual or with_signs or packed or bnn or memo)" OUT="$out" \
      bash benchmarks/gpu_session.sh build tests 2>&1 | tail -30
    touch .device_built
    cat "$out/failures.txt" 2>/dev/null | head -60
    OUT="$out" bash benchmarks/gpu_session.sh resnet 2>&1 | tail -20 ;;
  host)
    # (.device_built: this machine built the extension in an earlier call; git ignores it, the device keeps it)
    [ -f .device_built ] || { OUT="$out" bash benchmarks/gpu_session.sh build 2>&1 | tail -5 && touch .device_built; }
    OUT="$out" bash benchmarks/gpu_session.sh host decode 2>&1 | tail -40 ;;
  *)
    echo "usage: bash $0 verify|host" >&2
    exit 2 ;;
esac
