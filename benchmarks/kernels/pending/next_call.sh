#!/usr/bin/env bash
# The device calls left by the sixty-first session (its one call ran the A/B of stride2, wgsigns, wgres and wgahead
# and the CUDA tests of the four together: 437 passed; stride2, wgsigns and wgahead are merged, wgres was not).
#   verify (no carry, ~320 s with the build): the conv / packed / residual / weight-memo CUDA tests of main and the
#     backend's CUDA-graph (reduce-overhead) and training tests, which the memo's calls go through, then
#     ResNet-18 in CUDA graphs with its kernel profile and in the default mode (the merge's figures, and the weight
#     memo's effect on the default mode's host time).
#   host (no carry, ~250 s after verify on a warm machine, ~330 s alone): benchmarks/host_time.py (host enqueue
#     against wall time a forward, one call of each conv op) and examples/llm_decode.py's tokens/s (the weight memo
#     serves linear_of_weight and packed_linear_group too).
#   profile (carry ["benchmarks/kernels/build/main"], ~200 s): ncu of the wgmma conv on ResNet's largest residual
#     conv (layer2: B=256 C=128 28x28, residual + sign words, 72.7 graph us on an H100 against a ~33 us DRAM floor for
#     its ~110 MB) and layer3's, and layer2's sign-word conv (47.3 us against a ~4 us floor: the largest gap of the
#     forward, benchmarks/resnet_floor.py), with the SASS lines that stall most (NCU_SOURCE=1): where the next wgmma
#     change goes.
#     build/main/harness.gz is main's harness (here: `bash benchmarks/kernels/build.sh`, then
#     `gzip -c benchmarks/kernels/build/harness > benchmarks/kernels/build/main/harness.gz`).
set -uo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$root"
out="${OUT:-.out}"
mkdir -p "$out"
case "${1:-}" in
  verify)
    TESTS="cuda and (conv or residual or with_signs or packed or bnn or memo or reduce_overhead or training_and_inference)" OUT="$out" \
      bash benchmarks/gpu_session.sh build tests 2>&1 | tail -30
    touch .device_built
    cat "$out/failures.txt" 2>/dev/null | head -60
    OUT="$out" bash benchmarks/gpu_session.sh resnet 2>&1 | tail -20 ;;
  host)
    # (.device_built: this machine built the extension in an earlier call; git ignores it, the device keeps it)
    [ -f .device_built ] || { OUT="$out" bash benchmarks/gpu_session.sh build 2>&1 | tail -5 && touch .device_built; }
    OUT="$out" bash benchmarks/gpu_session.sh host decode 2>&1 | tail -40 ;;
  profile)
    gunzip -c benchmarks/kernels/build/main/harness.gz > benchmarks/kernels/build/harness
    chmod +x benchmarks/kernels/build/harness
    NCU_ROWS=$'conv b=256 c=128 h=28 oc=128 kernel=2 res=1 sumw=1\nconv b=256 c=128 h=28 oc=128 kernel=2 signs=1\nconv b=256 c=256 h=14 oc=256 kernel=2 res=1 sumw=1' \
      NCU_KERNELS=wgmma NCU_SOURCE=1 OUT="$out" bash benchmarks/gpu_session.sh ncu 2>&1 | tail -120 ;;
  *)
    echo "usage: bash $0 verify|host|profile" >&2
    exit 2 ;;
esac
