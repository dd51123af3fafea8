#!/usr/bin/env bash
# The next session's first device call (the fifty-sixth session got one ~100 s call on an H100 out of 17 tries, and
# ran run23 there: see NOTES): the sign-word sweep of pending/conv_out_signs.patch (never run: Epilogue::out_signs,
# the output's sign words beside it, in the mma.sync kernels' staged store and the wgmma conv's E2), then both patches'
# build, CUDA tests and the ResNet-18 A/B. Here:
#   export PATH=/usr/local/cuda/bin:$PATH; bash benchmarks/kernels/pending/next_call.sh prepare   (the patched harness)
#   git apply benchmarks/kernels/pending/conv_out_signs.patch benchmarks/kernels/pending/residual_pass.patch
# (uncommitted changes travel to the device), then one call, carry ["benchmarks/kernels/build/next"], ~250 s:
#   bash benchmarks/kernels/pending/next_call.sh run; bash benchmarks/kernels/pending/next_call.sh run23
# run: the patched conv_residual.sweep ($OUT/out_signs.txt): every check row must pass, the plant / plantw rows must
#   say NO ("planted error caught").
# run23: the extension, `-k "cuda and (residual or with_signs)"` (38 passed on an H100 in the fifty-sixth session),
#   and residual_debug.py --ab reduce-overhead: binary with / without the pass and float, timed and profiled in one
#   process, each add FUSED / left ($OUT/resnet_ab.txt). The pass should fold 5 adds (layer1's two, layer2-4's
#   second) and write 4 sums' sign words.
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"   # benchmarks/kernels
root="$(cd "$here/../.." && pwd)"
next="$here/build/next"
case "${1:-}" in
  prepare)
    set -e
    mkdir -p "$next"
    rm -f "$next"/*
    tree="$(mktemp -d)/tree"
    git -C "$root" worktree add -q --detach "$tree" HEAD
    git -C "$tree" apply "$here/pending/conv_out_signs.patch"
    BUILD_DIR="$tree/build" bash "$tree/benchmarks/kernels/build.sh"
    gzip -c "$tree/build/harness" > "$next/harness_out_signs.gz"
    cp "$tree/benchmarks/kernels/conv_residual.sweep" "$next/conv_out_signs.sweep"
    git -C "$root" worktree remove --force "$tree"
    du -sh "$next" ;;
  run)
    cd "$root"
    out="${OUT:-.out}"
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
    gunzip -c "$next/harness_out_signs.gz" > "$here/build/harness" && chmod +x "$here/build/harness"
    timeout 240 "$here/build/harness" --sweep "$next/conv_out_signs.sweep" 2>&1 | tee "$out/out_signs.txt" |
      awk '{ if (length($0) > 250) print substr($0, 1, 95) " ... " substr($0, length($0) - 150); else print }'
    echo "=== done (${SECONDS}s)" ;;
  run23)  # the build, the residual / with_signs CUDA tests, the A/B (timeout: room for `run` first, 600 s a call)
    cd "$root"
    out="${OUT:-.out}"
    mkdir -p "$out"
    export TORCH_EXTENSIONS_DIR="$root/build/ext"
    TESTS="cuda and (residual or with_signs)" OUT="$out" bash benchmarks/gpu_session.sh build tests 2>&1 |
      grep -v "^  built" | tail -8
    echo "=== bnn_resnet A/B (${SECONDS}s)"
    PYTHONPATH="$root" timeout $((480 - SECONDS)) python3 benchmarks/residual_debug.py --ab reduce-overhead 2>&1 |
      grep -v "Warn\|warn_once\|rewritten  binary\|skipped  " | tee "$out/resnet_ab.txt" | cut -c1-200 | tail -120
    echo "=== done (${SECONDS}s)" ;;
  *)
    echo "usage: bash $0 prepare|run|run23" >&2
    exit 2 ;;
esac
