#!/usr/bin/env bash
# The device calls of the sixty-second to sixty-fifth sessions (all ran on H100s):
#   verify (no carry, ~270 s with the build; VERIFY_PATCH=pending/NAME.patch applies a pending patch first): main's
#     conv / packed / residual / weight-memo CUDA tests, the backend's CUDA-graph (reduce-overhead) and training
#     tests, then ResNet-18 in CUDA graphs with its kernel profile and in the default mode.
#   host (no carry, ~120 s after verify on a warm machine): benchmarks/host_time.py, weight_op_host.py on CUDA and
#     examples/llm_decode.py's tokens/s.
#   profile (carry ["benchmarks/kernels/build/main"], ~50 s): ncu with source counters of the wgmma conv at
#     layer2's residual and sign-word convs and layer3's residual conv (kernels/ncu_lines.py joins them to lines).
#   halo (carry ["benchmarks/kernels/build/ab", "benchmarks/kernels/build/main"], ~120 s; HALO_NCU=0 ~60 s):
#     pending/conv_wgmma_halo.patch's harness (build/ab/halo.gz: `ab.sh build halo
#     benchmarks/kernels/pending/conv_wgmma_halo.patch`, with no other variant in build/ab) against main's on
#     pending/conv_wgmma_halo.sweep (HALO_SWEEPS, HALO_PASSES: below), then ncu with source counters of it at layer2's
#     sign-word and residual rows and layer3's residual row; the logs come back as one tarball. (The sixty-fourth
#     session ran it on the patch's third form and its row-store form, with ncu at the B = 64 sign-word row too.)
#   leads (carry ["benchmarks/kernels/build/main"], ~25 s), ab (~150 s a variant), sweeps: below. (ko, the planes-wgmma
#     knockouts, ran in the sixty-sixth and sixty-seventh sessions; deleted with its patch when the combination they
#     measured was rewritten: git log -- benchmarks/kernels/pending/planes_wgmma_ko.patch.) (The sixty-fifth
#     session's `rule` call is now `halo` with HALO_SWEEPS="conv_wgmma_halo conv_wgmma_halo_rule" HALO_NCU=0; it
#     also timed halo + e2add, a variant since deleted.)
set -uo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$root"
out="${OUT:-.out}"
mkdir -p "$out"
main_harness() {  # main's harness, carried gzipped in build/main (gpu_session.sh's ncu stage runs build/harness)
  gunzip -c benchmarks/kernels/build/main/harness.gz > benchmarks/kernels/build/harness
  chmod +x benchmarks/kernels/build/harness
}
ab_sweeps() {  # ab_sweeps FOLDER ONLY SWEEP_FILE...: ab.sh run, two passes, on each sweep with AB_ONLY=ONLY (none: main
  # alone), the raw logs under $out/FOLDER/NAME, all of them back as one tarball, FOLDER_logs.tgz
  local folder="$1" only="$2" sweep
  shift 2
  for sweep in "$@"; do
    AB_ONLY="$only" OUT="$out/$folder/$(basename "$sweep" .sweep)" bash benchmarks/kernels/ab.sh run "$sweep" 2 2>&1 |
      tail -200
  done
  tar czf "/tmp/${folder}_logs.tgz" -C "$out" "$folder" && rm -rf "${out:?}/$folder" && mv "/tmp/${folder}_logs.tgz" "$out/"
}
case "${1:-}" in
  verify)
    # VERIFY_PATCH=pending/NAME.patch: that patch applied to the tree first (its kernels built into the extension)
    if [ -n "${VERIFY_PATCH:-}" ]; then
      git apply "benchmarks/kernels/$VERIFY_PATCH" || exit 1
    fi
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
    main_harness
    NCU_ROWS=$'conv b=256 c=128 h=28 oc=128 kernel=2 res=1 sumw=1\nconv b=256 c=128 h=28 oc=128 kernel=2 signs=1\nconv b=256 c=256 h=14 oc=256 kernel=2 res=1 sumw=1' \
      NCU_KERNELS=wgmma NCU_SOURCE=1 OUT="$out" bash benchmarks/gpu_session.sh ncu 2>&1 | tail -120 ;;
  halo)
    # pending/conv_wgmma_halo.patch's harness (build/ab/halo.gz) against main on each sweep of HALO_SWEEPS (default
    # conv_wgmma_halo; the sixty-fifth session added conv_wgmma_halo_rule: the shape rule's rows), HALO_PASSES passes
    # each (default 1), then ncu (sections and source counters) of it at layer2's sign-word and residual convs and
    # layer3's residual conv; logs packed into one tarball (carry build/ab and build/main); HALO_NCU=0: the A/B alone
    main_harness
    gunzip -c benchmarks/kernels/build/ab/halo.gz > /tmp/halo_harness
    chmod +x /tmp/halo_harness
    for sweep in ${HALO_SWEEPS:-conv_wgmma_halo}; do
      echo "=== $sweep"
      AB_ONLY=halo AB_TIMEOUT=150 OUT="$out/ab/$sweep" bash benchmarks/kernels/ab.sh run \
        "benchmarks/kernels/pending/$sweep.sweep" "${HALO_PASSES:-1}" 2>&1 | tail -45
      grep -H -E "NO|error|refused" "$out/ab/$sweep"/ab_raw/halo*.txt | head -20
    done
    [ "${HALO_NCU:-1}" = 0 ] && { tar czf "$out/halo_logs.tgz" -C "$out" ab && rm -rf "$out/ab"; exit 0; }
    HARNESS=/tmp/halo_harness NCU_ROWS=$'conv b=256 c=128 h=28 oc=128 kernel=2 signs=1\nconv b=256 c=128 h=28 oc=128 kernel=2 res=1 sumw=1\nconv b=256 c=256 h=14 oc=256 kernel=2 res=1 sumw=1' \
      NCU_KERNELS=wgmma_halo NCU_SOURCE=1 OUT="$out/ncu" bash benchmarks/gpu_session.sh ncu 2>&1 | tail -90
    tar czf /tmp/halo_logs.tgz -C "$out" ab ncu && rm -rf "$out/ab" "$out/ncu" && mv /tmp/halo_logs.tgz "$out/" ;;
  leads)
    # (carry ["benchmarks/kernels/build/main"], ~25 s) the rows furthest from their targets that no session has
    # profiled lately: conv B = 1 C = 256 14x14 (issue 11: 1.15x against 2x) and W1A16 M = 1 / 16 (issue 10: 4.6x / 2.6x
    # in a rotating graph against 7x / 6x): main's harness timings, ncu sections of every kernel of each row's call
    # (x planes, weight kernel, tap table, conv), and source counters of the conv
    main_harness
    printf '%s\n' 'conv b=1 c=256 h=14 oc=256' 'conv b=1 c=256 h=14 oc=256 kernel=1' 'conv b=1 c=256 h=14 oc=256 kernel=2' \
      'w1a16 m=1 n=8192 k=8192 dtype=bf16' 'w1a16 m=16 n=8192 k=8192 dtype=bf16' 'w1a16 m=1 n=16384 k=16384 dtype=bf16' \
      > /tmp/leads.sweep
    mkdir -p "$out/leads"
    benchmarks/kernels/build/harness --sweep /tmp/leads.sweep 2>&1 | tee "$out/leads/timings.txt"
    NCU_ROWS=$'w1a16 m=1 n=8192 k=8192 dtype=bf16\nw1a16 m=16 n=8192 k=8192 dtype=bf16\nconv b=1 c=256 h=14 oc=256' \
      NCU_COUNT=4 NCU_SKIP=2 OUT="$out/leads" bash benchmarks/gpu_session.sh ncu 2>&1 | tail -60
    NCU_ROWS='conv b=1 c=256 h=14 oc=256' NCU_KERNELS=conv2d NCU_SOURCE=1 OUT="$out/leads_src" \
      bash benchmarks/gpu_session.sh ncu 2>&1 | tail -30
    tar czf /tmp/leads_logs.tgz -C "$out" leads leads_src && rm -rf "$out/leads" "$out/leads_src" && mv /tmp/leads_logs.tgz "$out/" ;;
  ab)
    # (carry ["benchmarks/kernels/build/ab", "benchmarks/kernels/build/main"], ~100 s a variant) `next_call.sh ab NAME...`:
    # each variant's harness (build/ab/NAME.gz: `bash benchmarks/kernels/ab.sh build NAME
    # benchmarks/kernels/pending/PATCH.patch`) against main on the planes-wgmma sweep (its correctness edges first)
    # and the decode sweep, two passes, all interleaved; the raw logs (a folder a sweep) come back as one
    # tarball. No variant is built now. (The seventieth session ran xb1 / xb2 / xb4, at most 1 / 2 / 4 x_row_planes
    # blocks a row against main's 16: slower at every M = 2..16 row (xb1 +6.4 us at 8192^2 M = 2), xb4 within 0.5 us
    # at M = 16 and M = 32; deleted with pending/xrow_blocks.patch. The sixty-ninth session ran xrowdep,
    # x_row_planes_kernel launched dependent: merged; and xrowcl / xrowcldep, x_row_planes as one-warp cluster
    # blocks beside the GEMM's: 3-4 us slower, deleted with xrowwarp, not run; git log --
    # benchmarks/kernels/pending/xrow_cluster.patch finds them.
    # The sixty-eighth session ran cores256 / cores512 (pending/coresident.patch, deleted: a wash or slower) and sums
    # (merged, 64412e4) this way; the sixty-seventh redux and comb, both merged.)
    main_harness
    shift
    ab_sweeps ab "$*" benchmarks/kernels/planes_wgmma.sweep benchmarks/kernels/w1a16_decode.sweep ;;
  sweeps)
    # (carry ["benchmarks/kernels/build/main"], ~60-90 s a 100-row sweep) `next_call.sh sweeps NAME...`: main's
    # harness alone on pending/NAME.sweep, two passes (ab.sh run, no variant), the raw logs as one tarball. The
    # sixty-eighth session ran planes_m16_tiles, planes_plan and planes_pays (the 9..32-row rule, 37b200d) this way.
    main_harness
    shift
    files=()
    for name in "$@"; do files+=("benchmarks/kernels/pending/$name.sweep"); done
    ab_sweeps sweeps none "${files[@]}" ;;
  *)
    echo "usage: bash $0 verify|host|profile|halo|leads|ab NAME...|sweeps NAME..." >&2
    exit 2 ;;
esac
