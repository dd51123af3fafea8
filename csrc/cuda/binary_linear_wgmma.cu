// binary_linear (W1A1) on Hopper's warpgroup b1 tensor cores: wgmma.mma_async m64nNk256 .b1 AND.POPC with
// both operands in shared memory, staged by TMA (cp.async.bulk.tensor) through an mbarrier ring. The sm_90 path
// of launch_binary_linear (binary_linear.cu), which falls back to its mma.sync kernels where this one answers
// cudaErrorNotSupported (another device, ceil(k / 32) % 4 != 0, bases not 16-byte aligned). Torch-free. Needs
// sm_90a code (bitcompile/_build.py builds Hopper as sm_90a).
//
// ---- Math (as binary_linear.cu) ------------------------------------------------------------------------------
//   dot[m][n] = K - 2 * hamming(a, b) = K - 2 * (pa + pb - 2 * popc(a & b)),
//   a = bits of x row m, b = bits of w row n, pa / pb their popcounts over the K real bits. Only AND.POPC is fast
//   on Hopper. Tail bits of x past K are 0 (pack_signs' contract, SPEC 2.1); words past the end of a row and rows
//   past M / N are zero-filled by TMA (out-of-bound box elements), so they add nothing to popc(a & b) or pa.
//   w's tail bits of the last real word are masked out of pb (defensive, as binary_linear's pipelined kernel);
//   they meet x's zero tail bits in the tensor cores.
//
// ---- Tiles -----------------------------------------------------------------------------------------------------
//   Block tile BM x BN = 128 x 256 (BN = 128 selectable), K stage BK = 1024 bits = 32 words = 128 bytes a row.
//   384 threads = 3 warpgroups:
//     WG0 (producer): warp 0 lane 0 issues the TMA copies; warps 1-3 (96 threads) take the row
//         popcounts pa (128 A rows) and pb (BN B rows) of every landed stage, straight from shared memory.
//     WG1, WG2 (consumers): WG1 owns tile rows 0-63, WG2 rows 64-127, each all BN columns:
//         per stage 4 x wgmma m64nBNk256 (one per 256-bit k step) into BN / 2 s32 registers a thread.
//   Stages: 4 (BN = 256: 48 KiB a stage) or 6 (BN = 128: 32 KiB a stage), ~194 KiB of shared memory, 1 block/SM.
//   Grid: one block per output tile, m tile fastest (consecutive blocks share the B tile; all of A and B of the
//   issue-11 shapes fit in L2 anyway).
//
// ---- Shared-memory layout (what each descriptor describes) ----------------------------------------------------
//   smem (rounded up to 1024 bytes) = [stage 0 | stage 1 | ... ] [pop: (BM + BN) int] [full[S], empty[S] u64]
//   stage s (kStageBytes = (BM + BN) * 128, a multiple of 1024) = A box then B box:
//     A box: rows 0..127 of the block's x tile, 128 bytes (1024 bits of K) a row, row r at byte r * 128;
//     B box: rows 0..BN-1 of the w tile, right after A (byte 16384), row r at 16384 + r * 128.
//   Within each 128-byte row the 16-byte chunks are permuted by TMA's SWIZZLE_128B: logical chunk q (K bits
//   128q..128q+127 of the stage) of row r sits at physical chunk q ^ (r % 8) (Swizzle<3,4,3>: address bits
//   [4:6] ^= bits [7:9]; needs every box 1024-byte aligned, which the layout guarantees).
//   This is the canonical K-major SW128 layout of wgmma (the same bytes as an e4m3 GEMM with BLOCK_K = 128):
//     core matrix = 8 rows x 16 bytes (8 x 128 bits); 8-row groups 1024 bytes apart -> SBO = 1024;
//     LBO unused for swizzled K-major layouts (set to 16 bytes, encoded 1);
//     k step j (bits 256j..256j+255 = bytes 32j..32j+31 of each logical row) -> start address + 32 j;
//     base offset 0 (each 8-row group starts 1024-byte aligned); layout type 1 (SWIZZLE_128B).
//   Descriptors: A of consumer WG w, step j: start = A box + w * 64 * 128 + 32 j (64 rows = 8 groups);
//                B, step j: start = B box + 32 j (BN rows = BN / 8 groups).
//   Descriptor bits (PTX ISA "Matrix Descriptor Format"): 0-13 start >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4,
//   49-51 base offset, 62-63 swizzle (0 none, 1 128B, 2 64B, 3 32B).
//   Why SW128 and not no-swizzle: the TMA box of a whole 128-byte K row lands as one copy per operand per stage
//   in exactly the layout wgmma wants; an unswizzled (interleaved) layout would need one TMA box per 16-byte
//   K chunk (8 copies per operand per stage) or a 3-D tensor map with overlapping strides.
//   Accumulators (s32, PTX "wgmma D fragment", same as the f32 layout): thread t of the warpgroup, warp
//   w4 = t / 32, lane l: d[4i + 0/1] = row 16 w4 + l / 4, columns 8i + 2(l % 4) + 0/1; d[4i + 2/3] = row + 8.
//
// ---- Pipeline protocol (S stages, kb = 0 .. kblocks-1, s = kb % S, phase = (kb / S) & 1) ----------------------
//   full[s]  (count 1): producer arrive.expect_tx(kStageBytes), then TMA A and B complete_tx on it.
//   empty[s] (count 11 = 8 consumer warps + 3 popcount warps): lane 0 of each arrives when its warp is done
//            reading stage s.
//   producer: for kb: if kb >= S wait empty[s] parity ((kb / S) - 1) & 1; arrive.expect_tx full[s]; 2 TMA.
//   popcount warps: for kb: wait full[s] parity phase; count the 128 + BN rows of the stage; arrive empty[s].
//   consumers: for kb: wait full[s] parity phase; wgmma.fence; 4 wgmma; commit_group; wait_group 1 (now the
//            wgmmas of kb - 1 are done); arrive empty[(kb - 1) % S]. After the loop wait_group 0.
//   No generic-proxy write ever targets a stage buffer, so no fence.proxy.async is needed in the loop (TMA
//   writes are made visible to wgmma and to ld.shared by the mbarrier complete_tx / wait); the barrier inits are
//   published with fence.mbarrier_init + fence.proxy.async + __syncthreads. Then __syncthreads, epilogue.
//   Epilogue (consumers): pa, pb from the shared pop array, dot = K - 2(pa + pb - 2 acc), the Epilogue struct
//   (row_factor, scale, bias) and the fp32 / fp16 / bf16 store, as binary_linear.
//
// ---- Measured (H200, 2026-12-01, harness, us L2 flushed / rotating graph, fp32 out, N = K = 8192) -----------
//   The sections above describe the first, one-block-a-tile kernel; the persistent kernel below replaced it (same
//   math, stage layout, descriptors and wgmma loop). Persistent (cluster 1) against it, graph us: M = 16 12.1 /
//   12.1, 256 12.9 / 12.9, 512 18.4 / 18.0, 1024 30.3 / 34.8, 2048 53.3 / 67.8, 4096 99.8 / 133.0 (5.3 POPS of
//   ~15.5), 8192 196.7 / 262.7; fp16 out M = 4096 102.5 / 142.3. The first kernel at M = 4096 (ncu): issue slots
//   28%, 0.39 eligible warps a scheduler; its per-tile ring fill and epilogue overlapped nothing.
// Debugging: -DBITCOMPILE_WGMMA_WATCHDOG turns every mbarrier wait into a ~4 s watchdog that traps (a protocol
//   bug then fails the launch instead of hanging); off by default, a trap kills the CUDA context.
//
// ==== Persistent kernel (binary_linear_persistent_kernel: the sm_90 path of launch_binary_linear) =================
// Same math, tiles (128 x BN), stage layout, descriptors and wgmma loop as above; what changes:
// - Persistent grid: min(units, SMs) CTAs, 1 an SM. Unit = output tile (n tile, m tile), m fastest; CTA c walks the
//   contiguous run [c U / C, (c + 1) U / C) (balanced), so consecutive units mostly share the B tile (hot in L2,
//   and pb reused, below). A and B of the issue-11 shapes (<= 16 MiB) fit in L2, so the run order is chosen for pb
//   reuse, not for L2 capacity.
// - The ring runs across tiles: the producer (warp 0 lane 0) walks the same unit list and never waits for an
//   epilogue, only for empty[s]; while the consumers store tile t it fills the ring with tile t + 1.
// - No clusters: 2-CTA clusters sharing the B tile by TMA multicast (half the B box each, remote empty[s] releases)
//   were built and measured slower at every size (H200, N = K = 8192 fp32 out, graph us: M = 4096 128.7 against
//   99.8, 512 20.9 against 18.4), and deleted (git history: branch w1a1-persistent).
// - No popcount warps (they took ~128 POPC + 32 LDS.128 a thread a stage, the busiest pipe in ncu, on 3 SMSPs):
//   pa: each consumer thread counts the A rows it owns in the accumulators (rows 16 w4 + lane / 4 and + 8 of its
//   warpgroup), the 4 threads of a quad 2 of the 8 chunks each, 4 LDS.128 + 16 POPC a thread a stage, issued after
//   the stage's wgmmas (they overlap), summed by 2 shuffles a tile; pb: only on a tile whose n tile differs from the
//   previous tile's (~1 tile in 5 at M = 4096: runs of ~7.8 units, 16 or 32 units an n tile), consumer thread ct counts B row ct (BN = 128: half a row each, shuffled),
//   w's tail bits past K masked in the last stage; -2 pb written to pop[BN] between two consumer barriers (bar 1, 256):
//   the other warpgroup may still read the old pb a whole tile behind (a tile can be <= S stages). (Why not a global
//   pre-pass: the launcher has no workspace, and a cudaMalloc'd one breaks graph capture. This is ~45% of the old
//   POPC work, spread over all 4 SMSPs (2 consumer warps each: ~25% of the POPC pipe at peak MMA rate) and off the
//   ring's critical path: no stage waits for a popcount warp.)
// - pa given (launch_binary_linear's x_popcounts: pack_signs writes them beside x's bits; the op always passes them):
//   the consumers skip pa's 4 LDS.128 + 16 POPC (+ 8 IADD3) a thread a stage, ~25% of the main loop's instructions
//   (ptxas issued them before the stage's 4th BGMMA), and each thread loads its two rows' counts in the epilogue (rows
//   past M read 0). Null (the harness's pa=0): counted as above. Counted / given, H100, harness rotating graph us,
//   N = K = 8192, 2026-12-05 (an experiment patch, deleted since, gave the counts through a tuning field): M = 512
//   bf16 out, per-column scale 15.65 / 13.80; 2048 fp16 out 39.73 / 38.11; 4096 bf16 out, per-column scale 70.61 /
//   69.67; 8192 bf16 out 132.35 / 129.43 (1-12%).
// - Epilogue through TMA stores where out and its row pitch are 16-byte aligned (else st.global from registers, as
//   above): each consumer warpgroup writes its 64 rows in boxes of 64 rows x 128 bytes (32 fp32 / 64 fp16 columns)
//   into shared memory, SW128-swizzled like the operands (column pair at byte b of row r -> chunk (b / 16) ^ (r % 8):
//   conflict-free), fence.proxy.async, bar (2 + wg, 128), and its first thread issues cp.async.bulk.tensor store +
//   commit_group. B store buffers a warpgroup (4, or 2 where the ring leaves no room), reused round robin: before the
//   barrier of box j that thread waits (cp.async.bulk.wait_group.read B - 2) until box j + 1 - B's store has read its
//   buffer. Boxes wholly past N are not issued; TMA clips the M / N tails. The global writes then drain while the
//   next tile's wgmmas run (the consumers only pay the shared-memory writes).
// - Launched dependent (programmatic dependent launch, ClusterLaunch): its launch and prologue overlap the end of
//   the pack_signs grid before it on the stream; every thread waits (griddepcontrol.wait) before the first TMA load
//   or global read.
// - Registers: setmaxnreg: producer warpgroup 40, consumers 232 (ptxas: 168 at launch, no spills; 128 s32
//   accumulators + the epilogue need more than 168).
//   Shared memory (bytes, S = stages, B = store buffers): BN = 256: TMA stores S 3 B 4: 215088, S 4 B 2: 231488;
//   st.global S 4: 198720. BN = 128: TMA S 5 B 4: 230992, S 6 B 2: 231008; st.global S 6: 198240 (limit 232448).
// Protocol (it = stage counter over the CTA's tiles, s = it % S, phase = (it / S) & 1; per tile kb = 0..kblocks-1):
//   producer: for it: if it >= S wait empty[s] parity phase ^ 1; arrive.expect_tx(full[s], stage bytes); TMA A; TMA B.
//   consumer warpgroups: per tile: zero acc; for kb: wait full[s] parity phase; 4 wgmma; commit; pa (unless given)
//             and pb LDS + POPC of stage s; wait_group 1; arrive empty[previous s]; after the last kb wait_group 0,
//             arrive empty[last s]; epilogue.
// Host model: benchmarks/kernels/w1a1_persistent_model.py checks the staging swizzle, popcount chunks, schedule and
// budgets, and runs randomized interleavings of this protocol (producer, 8 consumer warps a CTA, wgmma groups, pb
// barriers, store-buffer rotation; it still models the deleted 2-CTA multicast too): no race or hang; with
// --mutations it shows it catches each of: releasing before wait_group, a single pb barrier, one store buffer too few
// waited, the wrong empty parity (and the multicast-only mutations).
// First run (one harness process a row: a watchdog trap kills the context; build with EXTRA_NVCC_FLAGS=
// -DBITCOMPILE_WGMMA_WATCHDOG for the first pass): 1 tile (m=1 n=5 k=100 store=1), one k stage over several tiles
// (m=300 n=513 k=1024), ring wrap across tiles (k=4096, 4 stages > S), TMA stores (store=2), then the timing rows.
// Symptoms: a hang / watchdog (role 0: producer on empty; 2: consumer on full) is a protocol bug (counts, parity,
// expect_tx bytes); wrong values with every row hit at the same columns / rows pattern is a layout bug (descriptors,
// swizzle of the staging boxes: a store=1 vs store=2 difference points at the staging layout); values off by a
// per-row or per-column constant are pa / pb (pb only: BN = 128 shuffles, the tail mask, or pb reuse across tiles
// when only rows after the first tile of a run are wrong); bytes written outside the output (harness guard) are the
// output tensor map.
#include <cuda.h>  // CUtensorMap and its enums only: the encoder is fetched through cudaGetDriverEntryPointByVersion
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "device_common.cuh"
#include "wgmma_common.cuh"

namespace bitcompile {
namespace cuda {
namespace {

constexpr int kWgBM = 128;             // rows of x a block (2 consumer warpgroups x 64)
constexpr int kWgBKWords = 32;         // words of K a stage (1024 bits)
constexpr int kWgRowBytes = kWgBKWords * 4;  // 128: one swizzle span
constexpr int kWgThreads = 384;        // producer warpgroup + 2 consumer warpgroups
[[maybe_unused]] constexpr int kWgKSteps = kWgBKWords * 32 / 256;     // wgmma k256 steps a stage: 4
[[maybe_unused]] constexpr int kWgStepBytes = 256 / 8;                // 32 bytes of a row a k step


// ---- PTX wrappers (sm_90a) ----------------------------------------------------------------------------------
[[maybe_unused]] __device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if BC_WGMMA_ENABLED
// The b1 AND.POPC wgmma wrappers and the accumulator fence (wgmma_common.cuh, shared with the conv).
using b1::fence_accumulators;
using b1::wgmma_and_popc;

// ---- TMA store and named-barrier wrappers (the persistent kernel) -------------------------------------------------
// 2-D TMA store of one box from shared memory (the elements outside the tensor are not written); c0: column, c1: row.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(src)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// At most PENDING of this thread's bulk groups still reading their shared memory source.
template <int PENDING>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(PENDING) : "memory");
}
// At most PENDING of this thread's bulk groups not complete (their global writes done).
template <int PENDING>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(PENDING) : "memory");
}
template <int THREADS>
__device__ __forceinline__ void named_barrier_sync(uint32_t id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}
// Warpgroup-wide register budget moves (every warp of the warpgroup executes them): the producer warpgroup
// gives registers back, the consumer warpgroups take them (128 x 40 + 256 x 232 <= 65536).
template <int REGS>
__device__ __forceinline__ void registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
__device__ __forceinline__ int popc4(const uint4& v) { return __popc(v.x) + __popc(v.y) + __popc(v.z) + __popc(v.w); }
#endif  // BC_WGMMA_ENABLED

// The epilogue's integer-to-float conversion, in two exact steps. dot = (k - 2 pa) + (4 and - 2 pb): the column
// array holds kMagicBits - 2 pb (0x4B400000 = 1.5 * 2^23 as a float), so one IMAD (4 and + that) gives the bits of
// the float 1.5 * 2^23 + (4 and - 2 pb), exact while |4 and - 2 pb| <= 2 k < 2^22; one FADD of the row term
// (k - 2 pa) - 1.5 * 2^23 (an integer below 2^24: exact) then gives dot exactly (both operands and the sum are
// representable). K >= 2^21 bits goes to the mma.sync kernels. (Before: one IMAD + one IADD + one FADD an output;
// and before that I2F.S64 and 64-bit sums, ~12 instructions an output.)
constexpr int64_t kEpilogueMaxK = int64_t{1} << 21;
constexpr int kMagicBits = 0x4B400000;
constexpr int kMagicInt = 12582912;  // the float of kMagicBits

// Stand-ins for a missing per-column scale (1) or bias (0): the epilogue then reads every column term the same way,
// at a per-thread pointer and immediate offsets, with no test of the pointer an output.
#define BC_ONES4 1.f, 1.f, 1.f, 1.f
#define BC_ONES32 BC_ONES4, BC_ONES4, BC_ONES4, BC_ONES4, BC_ONES4, BC_ONES4, BC_ONES4, BC_ONES4
__device__ const float kUnitColumns[256] = {BC_ONES32, BC_ONES32, BC_ONES32, BC_ONES32,
                                            BC_ONES32, BC_ONES32, BC_ONES32, BC_ONES32};
#undef BC_ONES32
#undef BC_ONES4
__device__ const float kZeroColumns[256] = {};

// A thread's column terms of one tile: columns n0 + c_lane + 8 i + 0/1 (c_lane = 2 (lane % 4)), read at the
// pointers (already at column n0 + c_lane) plus 8 i + 0/1. A scalar scale is folded into the row factor (the
// columns then read kUnitColumns). kTail: the tile reaches past N (the last n tile, `limit` = its columns inside
// N minus c_lane); columns past N read 1 and 0 instead of memory past the arrays (their outputs are not stored).
template <bool kTail>
struct ColumnTerms {
  const float* scale;
  const float* bias;
  int limit;
  __device__ __forceinline__ ColumnTerms(const Epilogue& ep, int64_t n0, int c_lane, int valid) {
    const bool per_column = ep.scale != nullptr && ep.scale_count != 1;
    scale = per_column ? ep.scale + n0 + c_lane : kUnitColumns + c_lane;
    bias = ep.bias != nullptr ? ep.bias + n0 + c_lane : kZeroColumns + c_lane;
    limit = valid - c_lane;
  }
  // columns 8 i + j of this thread (j = 0, 1)
  __device__ __forceinline__ float scale_at(int i, int j) const {
    return !kTail || 8 * i + j < limit ? scale[8 * i + j] : 1.f;
  }
  __device__ __forceinline__ float bias_at(int i, int j) const {
    return !kTail || 8 * i + j < limit ? bias[8 * i + j] : 0.f;
  }
};

// The row terms of a thread's two accumulator rows (h = 0, 1: rows r and r + 8): (k - 2 pa) - 1.5 * 2^23 and
// the row factor times a scalar scale (0 for a row past M).
struct RowTerms {
  float term[2];
  float factor[2];
};

template <typename OutT>
__device__ __forceinline__ void store_pair(OutT* p, float v0, float v1, bool both, bool vector_ok) {
  if (both && vector_ok) {
    if constexpr (sizeof(OutT) == 4) {
      *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
    } else {
      OutT pair[2] = {from_float<OutT>(v0), from_float<OutT>(v1)};
      *reinterpret_cast<uint32_t*>(p) = *reinterpret_cast<const uint32_t*>(pair);
    }
  } else {
    p[0] = from_float<OutT>(v0);
    if (both) p[1] = from_float<OutT>(v1);
  }
}

// ==== The persistent kernel (top of the file, "Persistent kernel") ==============================================

// Kernel arguments besides the tensor maps, the epilogue and the output pointer.
struct PersistentShape {
  int64_t m_rows, n_rows, words, k;
  int m_tiles, n_tiles;
  int stages;         // ring depth S
  int store_buffers;  // 0: st.global from registers; 2 or 4: TMA stores through that many boxes a warpgroup
  int pair_stores;    // st.global path: columns 2t, 2t + 1 in one store (n_rows even, out aligned to two elements)
  const int32_t* x_popcounts;  // pa of x's rows ([m_rows], from pack_signs), or null: counted a stage at a time
};

// Shared memory of the persistent kernel (offsets from the 1024-byte aligned base; S and the store buffers are
// launch arguments): [ring: S stages of (A box | B box), as the kernel above] [staging: 2 warpgroups x store_buffers
// boxes of 8 KiB] [pb: BN int] [full[S], empty[S] u64]
template <int BN>
struct PersistentLayout {
  static_assert(BN == 128 || BN == 256, "BN");
  static constexpr int kBytesA = kWgBM * kWgRowBytes;  // 16384
  static constexpr int kBytesB = BN * kWgRowBytes;
  static constexpr int kStageBytes = kBytesA + kBytesB;
  static_assert(kBytesA % 1024 == 0 && kStageBytes % 1024 == 0, "boxes must stay 1024-byte aligned (SW128)");
  static constexpr int kBoxRows = 64;               // one consumer warpgroup's rows
  static constexpr int kBoxBytes = kBoxRows * 128;  // a store box: 64 rows x 128 bytes (one swizzle span)
  static constexpr int kPopBytes = BN * 4;          // pb of the tile's B rows
  static constexpr int kSmemLimit = 227 * 1024;     // sm_90 opt-in maximum a block
  __host__ __device__ static constexpr int staging_offset(int stages) { return stages * kStageBytes; }
  __host__ __device__ static constexpr int pop_offset(int stages, int buffers) {
    return staging_offset(stages) + 2 * buffers * kBoxBytes;
  }
  __host__ __device__ static constexpr int bar_offset(int stages, int buffers) {
    return pop_offset(stages, buffers) + kPopBytes;
  }
  // + slack to round the base up to 1024 bytes
  __host__ __device__ static constexpr int smem_bytes(int stages, int buffers) {
    return bar_offset(stages, buffers) + 2 * stages * 8 + 1024;
  }
  // BN = 256: 4 stages (with TMA stores beside 2 store buffers, not 3 stages beside 4: H200 harness, rotating graph,
  // N = K = 8192 fp32 out, 4 / 3 stages: M = 1024 29.5 / 30.3 us, 2048 51.3 / 54.0, 4096 93.8 / 102.1, 8192 182.8 /
  // 201.1, 512 17.9 / 17.6). BN = 128: the deepest ring beside 4 store buffers or alone (5 / 6 stages: no difference).
  static constexpr int default_stages(bool tma_store) {
    return BN == 256 ? 4 : (tma_store ? 5 : 6);
  }
  static_assert(smem_bytes(default_stages(true), BN == 256 ? 2 : 4) <= kSmemLimit &&
                    smem_bytes(default_stages(false), 0) <= kSmemLimit,
                "shared memory");
};

constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= 65536, "register file");

#if BC_WGMMA_ENABLED
__device__ __forceinline__ uint4 load_shared_16(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
#endif

#if BC_WGMMA_ENABLED
// One output of the epilogue: dot = (column bits + 4 and as a float) + the row term (exact, kEpilogueMaxK above).
__device__ __forceinline__ float output_value(int column_bits, int and_count, const RowTerms& rows, int h, float scale,
                                              float bias) {
  return epilogue_value(__int_as_float(column_bits + 4 * and_count) + rows.term[h], rows.factor[h], scale, bias);
}

// The same where the epilogue is dot * scale[column] alone (no row factor, bias or scalar scale: binary_linear(x, w, k,
// alpha), a BNN layer's form; rows past M, whose factor is 0 in output_value, are clipped by the TMA store): the
// multiply by a factor of 1 and the add of a bias of 0 (its loads) dropped, the same values (up to the sign of a zero).
// 2 instructions of ~8 an output (H100 ncu, W1A1 M = 4096 bf16 out, 2026-12-05: the epilogue ~1009 instructions a
// warp a tile, ~32% of the kernel's stall samples, while the tensor cores idle).
__device__ __forceinline__ float plain_value(int column_bits, int and_count, const RowTerms& rows, int h, float scale) {
  return (__int_as_float(column_bits + 4 * and_count) + rows.term[h]) * scale;
}

// What a consumer warpgroup needs to stage and store its 64 rows of a tile through TMA.
struct TmaStoreTile {
  const CUtensorMap* map;
  uint8_t* staging;  // this warpgroup's store buffers
  int buffers;       // 2 or 4
  int r_local, quad_row, c_lane;
  bool elected;  // the warpgroup's first thread
  int wg;
  int64_t n0, m0;
};

// Boxes of 64 rows x 128 bytes (32 fp32 / 64 fp16 columns), SW128 like the operands: the thread's column pair at
// byte b of a box row r goes to chunk (b / 16) ^ (r % 8); with b = 8 g size + c_lane size (group g of the box) that
// is (8 g size) ^ swizzle, swizzle the group-0 offset (8 g size only has chunk bits: 16 | 8 g size, and for fp32
// the lane's chunk bit is below 2 g's). The elected thread stores each box once all 128 threads wrote it, and before
// the barrier of box j waits until at most B - 2 of its stores (B = buffers) still read shared memory: box j + 1's
// buffer (last used by box j + 1 - B) is then free. Boxes wholly past N are skipped (so none is wholly outside the
// tensor); TMA clips the rest.
template <int BN, typename OutT, bool kTail, bool kPlain>
__device__ __forceinline__ void store_tile_tma(const int (&acc)[BN / 2], const int* pop, const RowTerms& rows,
                                               const ColumnTerms<kTail>& columns, const TmaStoreTile& t, int valid,
                                               int& box) {
  constexpr int kSize = static_cast<int>(sizeof(OutT));
  constexpr int kBoxCols = 128 / kSize;
  constexpr int kBoxes = BN / kBoxCols;
  constexpr int kGroupsPerBox = kBoxCols / 8;
  constexpr int kBoxBytes = PersistentLayout<BN>::kBoxBytes;
  const int boxes = (valid + kBoxCols - 1) / kBoxCols;
  const int lane_byte = t.c_lane * kSize;
  const int swizzle = (((lane_byte >> 4) ^ t.quad_row) << 4) | (lane_byte & 15);
#pragma unroll
  for (int b = 0; b < kBoxes; ++b) {
    if (b >= boxes) break;
    uint8_t* buffer = t.staging + (box & (t.buffers - 1)) * kBoxBytes;
    uint8_t* row = buffer + t.r_local * 128;  // + 1024 for the row 8 below (same swizzle phase)
#pragma unroll
    for (int g = 0; g < kGroupsPerBox; ++g) {
      const int i = b * kGroupsPerBox + g;
      const int2 bits = *reinterpret_cast<const int2*>(pop + 8 * i + t.c_lane);
      const float scale0 = columns.scale_at(i, 0), bias0 = kPlain ? 0.f : columns.bias_at(i, 0);
      const float scale1 = columns.scale_at(i, 1), bias1 = kPlain ? 0.f : columns.bias_at(i, 1);
      uint8_t* p = row + (swizzle ^ (8 * g * kSize));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float v0 = kPlain ? plain_value(bits.x, acc[4 * i + 2 * h], rows, h, scale0)
                                : output_value(bits.x, acc[4 * i + 2 * h], rows, h, scale0, bias0);
        const float v1 = kPlain ? plain_value(bits.y, acc[4 * i + 2 * h + 1], rows, h, scale1)
                                : output_value(bits.y, acc[4 * i + 2 * h + 1], rows, h, scale1, bias1);
        if constexpr (kSize == 4) {
          *reinterpret_cast<float2*>(p + 1024 * h) = make_float2(v0, v1);
        } else {
          OutT pair[2] = {from_float<OutT>(v0), from_float<OutT>(v1)};
          *reinterpret_cast<uint32_t*>(p + 1024 * h) = *reinterpret_cast<const uint32_t*>(pair);
        }
      }
    }
    fence_proxy_async_shared();  // this thread's writes, before the TMA engine reads them
    if (t.elected) {
      if (t.buffers == 4) {
        bulk_wait_read<2>();
      } else {
        bulk_wait_read<0>();
      }
    }
    named_barrier_sync<128>(2 + t.wg);
    if (t.elected) {
      tma_store_2d(t.map, shared_address(buffer), static_cast<int>(t.n0 + b * kBoxCols), static_cast<int>(t.m0));
      bulk_commit();
    }
    ++box;
  }
}

// The st.global epilogue (out or its row pitch not 16-byte aligned): straight from the accumulators.
template <typename OutT>
struct GlobalStoreTile {
  OutT* out;
  int64_t m_rows, n_rows, m0, n0;
  int r_local, c_lane;
  bool pair_stores;  // columns 2t, 2t + 1 in one store (n_rows even, out aligned to two elements)
};

template <int BN, typename OutT, bool kTail>
__device__ __forceinline__ void store_tile_global(const int (&acc)[BN / 2], const int* pop, const RowTerms& rows,
                                                  const ColumnTerms<kTail>& columns, const GlobalStoreTile<OutT>& t,
                                                  int valid) {
#pragma unroll
  for (int i = 0; i < BN / 8; ++i) {
    const int c = 8 * i + t.c_lane;
    if (c >= valid) continue;
    const bool both = c + 1 < valid;
    const int2 bits = *reinterpret_cast<const int2*>(pop + c);
    const float scale0 = columns.scale_at(i, 0), bias0 = columns.bias_at(i, 0);
    const float scale1 = columns.scale_at(i, 1), bias1 = columns.bias_at(i, 1);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = t.m0 + t.r_local + 8 * h;
      if (m >= t.m_rows) continue;
      const float v0 = output_value(bits.x, acc[4 * i + 2 * h], rows, h, scale0, bias0);
      const float v1 = output_value(bits.y, acc[4 * i + 2 * h + 1], rows, h, scale1, bias1);
      store_pair(t.out + m * t.n_rows + t.n0 + c, v0, v1, both, t.pair_stores);
    }
  }
}
#endif  // BC_WGMMA_ENABLED

// Persistent: each CTA walks its contiguous run of output tiles; the producer keeps the ring going across tiles. Layout, protocol and popcounts: top of the file.
template <int BN, typename OutT>
__global__ __launch_bounds__(kWgThreads, 1) void binary_linear_persistent_kernel(
    const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
    const __grid_constant__ CUtensorMap map_out, const PersistentShape shape, const Epilogue ep,
    OutT* __restrict__ out) {
#if BC_WGMMA_ENABLED
  using L = PersistentLayout<BN>;
  const int S = shape.stages;
  const int store_buffers = shape.store_buffers;  // 0: st.global
  extern __shared__ uint8_t persistent_smem_raw[];
  uint8_t* smem = persistent_smem_raw + ((1024 - (shared_address(persistent_smem_raw) & 1023)) & 1023);
  const uint32_t smem_base = shared_address(smem);
  int* pop = reinterpret_cast<int*>(smem + L::pop_offset(S, store_buffers));
  const uint32_t full_bar = smem_base + L::bar_offset(S, store_buffers);  // full[s] at full_bar + 8 s
  const uint32_t empty_bar = full_bar + 8 * S;                        // empty[s] at empty_bar + 8 s

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  // Static schedule. Unit = output tile (n tile, m tile), m tiles fastest; CTA c takes the contiguous run
  // [u_begin, u_end) (a balanced split), so consecutive units mostly share the n tile (pb reused).
  const int m_groups = shape.m_tiles;
  const int units = m_groups * shape.n_tiles;
  const int ctas = static_cast<int>(gridDim.x);
  const int cta = static_cast<int>(blockIdx.x);
  const int per_cta = units / ctas, extra = units % ctas;
  const int u_begin = cta * per_cta + min(cta, extra);
  const int u_end = u_begin + per_cta + (cta < extra ? 1 : 0);
  const int kblocks = static_cast<int>(ceil_div(shape.words, kWgBKWords));  // words < 2^26 (k <= INT_MAX)

  if (tid == 0) {
    init_stage_ring(full_bar, empty_bar, S, 1, 8);  // empty: the 8 consumer warps
    fence_proxy_async_shared();
  }
  __syncthreads();
  // Launched dependent (after pack_signs of x): everything above ran while that grid finished.
  wait_for_prerequisite_grid();

  if (warp < 4) {
    // ---- producer warpgroup: warp 0 lane 0 issues the TMA loads; warps 1-3 have nothing to do ----
    registers_decrease<kProducerRegisters>();
    if (warp == 0 && lane == 0) {
      uint32_t s = 0, phase = 0;  // of ring round it / S
      int it = 0;                 // stages issued so far, over all of this CTA's tiles
      for (int u = u_begin; u < u_end; ++u) {
        const int n_tile = u / m_groups;
        const int m_tile = u - n_tile * m_groups;
        for (int kb = 0; kb < kblocks; ++kb, ++it) {
          if (it >= S) mbar_wait(empty_bar + 8 * s, phase ^ 1u, 0, kb);  // round it / S - 1 released it
          const uint32_t stage = smem_base + s * L::kStageBytes;
          const uint32_t full = full_bar + 8 * s;
          mbar_arrive_expect_tx(full, L::kStageBytes);  // the A box and the B box
          tma_load_2d(stage, &map_a, kb * kWgBKWords, m_tile * kWgBM, full);
          tma_load_2d(stage + L::kBytesA, &map_b, kb * kWgBKWords, n_tile * BN, full);
          if (++s == static_cast<uint32_t>(S)) {
            s = 0;
            phase ^= 1u;
          }
        }
      }
    }
    __syncwarp();
  } else {
    // ---- consumer warpgroups: wg 0 tile rows 0-63, wg 1 rows 64-127, all BN columns ----
    registers_increase<kConsumerRegisters>();
    const int wg = warp / 4 - 1;
    const int ct = tid - 128;  // 0..255
    const int w4 = warp & 3;
    const int quad_row = lane >> 2;  // row within its 8-row group = the row's swizzle phase
    const bool elected = (ct & 127) == 0;
    // pa: this thread's A rows are the accumulator rows it owns, 64 wg + 16 w4 + lane / 4 and + 8; the 4 threads
    // of a quad split each row's 8 chunks (logical chunks 2 (lane % 4) + 0/1), summed by shuffles per tile.
    const int a_row = wg * 64 + w4 * 16 + quad_row;
    const int a_chunk0 = ((2 * (lane & 3)) ^ quad_row) * 16;
    const int a_chunk1 = ((2 * (lane & 3) + 1) ^ quad_row) * 16;
    // pb (tiles whose n tile differs from the previous tile's): BN = 256: B row ct, all 8 chunks; BN = 128: row
    // ct / 2, chunks 4 (ct % 2) + 0..3, the pair summed by a shuffle.
    constexpr int kPbChunks = BN == 256 ? 8 : 4;
    const int b_row = BN == 256 ? ct : ct >> 1;
    const int b_chunk_first = BN == 256 ? 0 : (ct & 1) * 4;
    int acc[BN / 2];
    // The epilogue is dot * scale[column] alone (plain_value): uniform over the grid.
    const bool plain = ep.bias == nullptr && ep.row_factor == nullptr && (ep.scale == nullptr || ep.scale_count != 1);
    uint32_t s = 0, phase = 0;
    int box = 0;  // TMA store boxes this warpgroup has issued (store buffer box % store_buffers)
    int last_n_tile = -1;
    for (int u = u_begin; u < u_end; ++u) {
      const int n_tile = u / m_groups;
      const int m_tile = u - n_tile * m_groups;
      const bool need_pb = n_tile != last_n_tile;  // uniform over the CTA
      last_n_tile = n_tile;
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[i] = 0;
      int pa0 = 0, pa1 = 0, pb = 0;
      uint32_t previous_s = 0;
      for (int kb = 0; kb < kblocks; ++kb) {
        mbar_wait(full_bar + 8 * s, phase, 2, kb);
        const uint32_t stage = smem_base + s * L::kStageBytes;
        fence_accumulators(acc);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < kWgKSteps; ++j) {
          wgmma_and_popc<BN>(acc, sw128_descriptor(stage + wg * (64 * kWgRowBytes) + j * kWgStepBytes),
                             sw128_descriptor(stage + L::kBytesA + j * kWgStepBytes));
        }
        wgmma_commit();
        // Row popcounts of the landed stage while its wgmmas run (ld.shared of TMA-written bytes, ordered by the
        // full barrier as the wgmma reads are). x's bits past K are 0 (contract), so pa needs no mask.
        // Skipped where the rows' popcounts are given (x_popcounts, read in the epilogue).
        const uint8_t* stage_ptr = smem + s * L::kStageBytes;
        if (shape.x_popcounts == nullptr) {  // uniform over the grid
          const uint8_t* a_ptr = stage_ptr + a_row * kWgRowBytes;
          pa0 += popc4(load_shared_16(a_ptr + a_chunk0)) + popc4(load_shared_16(a_ptr + a_chunk1));
          pa1 += popc4(load_shared_16(a_ptr + 8 * kWgRowBytes + a_chunk0)) +
                 popc4(load_shared_16(a_ptr + 8 * kWgRowBytes + a_chunk1));
        }
        if (need_pb) {
          const uint8_t* b_ptr = stage_ptr + L::kBytesA + b_row * kWgRowBytes;
          if (kb + 1 < kblocks) {
#pragma unroll
            for (int c = 0; c < kPbChunks; ++c) {
              pb += popc4(load_shared_16(b_ptr + (((b_chunk_first + c) ^ (b_row & 7)) << 4)));
            }
          } else {  // the last stage: w's tail bits past K are masked out of pb (defensive, as the kernel above)
#pragma unroll
            for (int c = 0; c < kPbChunks; ++c) {
              const int q = b_chunk_first + c;
              uint4 v = load_shared_16(b_ptr + ((q ^ (b_row & 7)) << 4));
              const int64_t word = static_cast<int64_t>(kb) * kWgBKWords + 4 * q;
              v.x &= valid_bits(shape.k, word);
              v.y &= valid_bits(shape.k, word + 1);
              v.z &= valid_bits(shape.k, word + 2);
              v.w &= valid_bits(shape.k, word + 3);
              pb += popc4(v);
            }
          }
        }
        wgmma_wait<1>();  // the wgmmas of kb - 1 are complete: their stage may be refilled
        fence_accumulators(acc);
        if (kb > 0) {
          __syncwarp();
          if (lane == 0) mbar_arrive(empty_bar + 8 * previous_s);
        }
        previous_s = s;
        if (++s == static_cast<uint32_t>(S)) {
          s = 0;
          phase ^= 1u;
        }
      }
      wgmma_wait<0>();
      fence_accumulators(acc);
      __syncwarp();
      if (lane == 0) mbar_arrive(empty_bar + 8 * previous_s);  // the tile's last stage, now rather than after the epilogue

      // ---- epilogue: rows 64 wg + 16 w4 + lane / 4 (+ 8 h), columns 8 i + 2 (lane % 4) + 0/1 ----
      if (shape.x_popcounts == nullptr) {
        pa0 += __shfl_xor_sync(kFullMask, pa0, 1);
        pa0 += __shfl_xor_sync(kFullMask, pa0, 2);
        pa1 += __shfl_xor_sync(kFullMask, pa1, 1);
        pa1 += __shfl_xor_sync(kFullMask, pa1, 2);
      } else {  // given: written by an earlier launch (pack_signs), visible after the griddepcontrol.wait above; rows
                // past M read 0 (their outputs are not stored)
        const int64_t row = static_cast<int64_t>(m_tile) * kWgBM + a_row;
        pa0 = row < shape.m_rows ? shape.x_popcounts[row] : 0;
        pa1 = row + 8 < shape.m_rows ? shape.x_popcounts[row + 8] : 0;
      }
      if (need_pb) {
        // The other warpgroup may still be in the epilogue of an earlier tile, reading the old pb (with tiles of
        // at most S stages it can be a whole tile behind): both consumer warpgroups meet before and after the write.
        if constexpr (BN == 128) pb += __shfl_xor_sync(kFullMask, pb, 1);
        named_barrier_sync<256>(1);
        if (BN == 256 || (ct & 1) == 0) pop[b_row] = kMagicBits - 2 * pb;  // the epilogue's column term
        named_barrier_sync<256>(1);
      }
      const int64_t m0 = static_cast<int64_t>(m_tile) * kWgBM + wg * 64;  // this warpgroup's first row
      const int64_t n0 = static_cast<int64_t>(n_tile) * BN;
      const int r_local = w4 * 16 + quad_row;  // + 8 h: row within the warpgroup's 64
      const int c_lane = 2 * (lane & 3);
      const int valid = shape.n_rows - n0 < BN ? static_cast<int>(shape.n_rows - n0) : BN;  // columns inside N
      RowTerms rows;
      const float scalar = ep.scale != nullptr && ep.scale_count == 1 ? ep.scale[0] : 1.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t m = m0 + r_local + 8 * h;
        rows.term[h] = static_cast<float>(static_cast<int>(shape.k) - 2 * (h == 0 ? pa0 : pa1) - kMagicInt);
        rows.factor[h] = m < shape.m_rows ? row_factor(ep, m) * scalar : 0.f;
      }
      if (store_buffers != 0) {
        if (m0 < shape.m_rows) {
          uint8_t* staging = smem + L::staging_offset(S) + wg * (store_buffers * L::kBoxBytes);
          const TmaStoreTile tile{&map_out, staging, store_buffers, r_local, quad_row, c_lane, elected, wg, n0, m0};
          if (valid == BN && plain) {
            store_tile_tma<BN, OutT, false, true>(acc, pop, rows, ColumnTerms<false>(ep, n0, c_lane, valid), tile,
                                                  valid, box);
          } else if (valid == BN) {
            store_tile_tma<BN, OutT, false, false>(acc, pop, rows, ColumnTerms<false>(ep, n0, c_lane, valid), tile,
                                                   valid, box);
          } else {
            store_tile_tma<BN, OutT, true, false>(acc, pop, rows, ColumnTerms<true>(ep, n0, c_lane, valid), tile,
                                                  valid, box);
          }
        }
      } else {
        const GlobalStoreTile<OutT> tile{out, shape.m_rows, shape.n_rows, m0, n0, r_local, c_lane,
                                         shape.pair_stores != 0};
        if (valid == BN) {
          store_tile_global<BN, OutT>(acc, pop, rows, ColumnTerms<false>(ep, n0, c_lane, valid), tile, valid);
        } else {
          store_tile_global<BN, OutT>(acc, pop, rows, ColumnTerms<true>(ep, n0, c_lane, valid), tile, valid);
        }
      }
    }
    if (store_buffers != 0 && elected) bulk_wait<0>();  // every store written (its shared memory read) before exit
    __syncwarp();
  }
#else
  __trap();  // built for another target: the launcher refuses without sm_90a code on a 9.0 device
#endif
}


// [rows, words] uint32 K-contiguous packed bits, box = 32 words x box_rows, SWIZZLE_128B, zero OOB fill.
bool encode_operand_map(CUtensorMap* map, const uint32_t* bits, int64_t rows, int64_t words, int box_rows) {
  return encode_sw128_map(map, CU_TENSOR_MAP_DATA_TYPE_UINT32, bits, rows, words, words * 4, kWgBKWords, box_rows);
}

// [rows, cols] row-major output of `type`, box = 64 rows x 128 bytes, SWIZZLE_128B (the staging layout).
bool encode_output_map(CUtensorMap* map, void* out, FloatType type, int64_t rows, int64_t cols) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const int size = type == FloatType::kFloat32 ? 4 : 2;
  const CUtensorMapDataType data_type = type == FloatType::kFloat32   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                        : type == FloatType::kFloat16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                      : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * size};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(128 / size), 64};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result = encode(map, data_type, 2, out, dims, strides, box, element_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS;
}

template <typename OutT>
constexpr FloatType float_type_of() {
  return sizeof(OutT) == 4 ? FloatType::kFloat32
                           : (std::is_same<OutT, __half>::value ? FloatType::kFloat16 : FloatType::kBFloat16);
}

template <int BN, typename OutT>
cudaError_t binary_linear_persistent_typed(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows,
                                           int64_t n_rows, int64_t k, const Epilogue& ep, OutT* out, int store,
                                           int stages, const int32_t* x_popcounts, int sm_count,
                                           cudaStream_t stream) {
  using L = PersistentLayout<BN>;
  const int64_t words = ceil_div(k, 32);
  const int64_t m_tiles = ceil_div(m_rows, kWgBM), n_tiles = ceil_div(n_rows, BN);
  // TMA stores: 16-byte aligned base and row pitch.
  const bool store_ok =
      reinterpret_cast<uintptr_t>(out) % 16 == 0 && (n_rows * static_cast<int64_t>(sizeof(OutT))) % 16 == 0;
  if (store < 0 || store > 2) return cudaErrorInvalidValue;
  if (store == 2 && !store_ok) return cudaErrorNotSupported;
  const bool tma_store = store != 1 && store_ok;
  if (stages == 0) stages = L::default_stages(tma_store);
  // 4 store buffers a warpgroup where they fit beside the ring, else 2.
  const int store_buffers = !tma_store ? 0 : (L::smem_bytes(stages, 4) <= L::kSmemLimit ? 4 : 2);
  if (stages < 2 || L::smem_bytes(stages, store_buffers) > L::kSmemLimit) return cudaErrorInvalidValue;
  const int64_t units = m_tiles * n_tiles;
  if (units > INT_MAX) return cudaErrorInvalidValue;

  CUtensorMap map_a, map_b, map_out;
  if (!encode_operand_map(&map_a, x_bits, m_rows, words, kWgBM) ||
      !encode_operand_map(&map_b, w_bits, n_rows, words, BN)) {
    return cudaErrorNotSupported;
  }
  if (tma_store) {
    if (!encode_output_map(&map_out, out, float_type_of<OutT>(), m_rows, n_rows)) return cudaErrorNotSupported;
  } else {
    std::memset(&map_out, 0, sizeof map_out);  // not read
  }
  auto kernel = binary_linear_persistent_kernel<BN, OutT>;
  static unsigned long long smem_devices = 0;
  cudaError_t error = allow_dynamic_smem(kernel, L::kSmemLimit, smem_devices);
  if (error != cudaSuccess) return error;

  PersistentShape shape;
  shape.m_rows = m_rows;
  shape.n_rows = n_rows;
  shape.words = words;
  shape.k = k;
  shape.m_tiles = static_cast<int>(m_tiles);
  shape.n_tiles = static_cast<int>(n_tiles);
  shape.stages = stages;
  shape.store_buffers = store_buffers;
  shape.pair_stores = n_rows % 2 == 0 && reinterpret_cast<uintptr_t>(out) % (2 * sizeof(OutT)) == 0;
  shape.x_popcounts = x_popcounts;

  const size_t smem = static_cast<size_t>(L::smem_bytes(stages, store_buffers));
  // Persistent grid: one CTA an SM (1 fits an SM), at most one a unit.
  const int64_t ctas = std::max<int64_t>(1, std::min<int64_t>(units, sm_count));
  const ClusterLaunch launch(dim3(static_cast<unsigned>(ctas)), kWgThreads, smem, 1, stream, /*dependent=*/true);
  return cudaLaunchKernelEx(&launch.config, kernel, map_a, map_b, map_out, shape, ep, out);
}

template <typename OutT>
cudaError_t binary_linear_persistent_tile(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows,
                                          int64_t n_rows, int64_t k, const Epilogue& ep, OutT* out,
                                          const int32_t* x_popcounts, const BinaryLinearTuning& t, int sm_count,
                                          cudaStream_t stream) {
  int tile_n = t.tile_n;  // as the kernel above
  if (tile_n == 0) tile_n = ceil_div(m_rows, kWgBM) * ceil_div(n_rows, 256) * 8 >= int64_t{sm_count} * 7 ? 256 : 128;
  if (tile_n == 128) {
    return binary_linear_persistent_typed<128>(x_bits, w_bits, m_rows, n_rows, k, ep, out, t.store, t.stages,
                                               x_popcounts, sm_count, stream);
  }
  return binary_linear_persistent_typed<256>(x_bits, w_bits, m_rows, n_rows, k, ep, out, t.store, t.stages,
                                             x_popcounts, sm_count, stream);
}

}  // namespace

cudaError_t launch_binary_linear_wgmma(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                       int64_t k, const Epilogue& epilogue, void* out, FloatType out_type,
                                       const int32_t* x_popcounts, const BinaryLinearTuning& tuning,
                                       cudaStream_t stream) {
  if (tuning.tile_n != 0 && tuning.tile_n != 128 && tuning.tile_n != 256) return cudaErrorInvalidValue;
  const int64_t words = ceil_div(k, 32);
  // TMA: row stride a multiple of 16 bytes, 16-byte aligned bases, 32-bit coordinates.
  if (words % 4 != 0 || reinterpret_cast<uintptr_t>(x_bits) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(w_bits) % 16 != 0 || m_rows > INT_MAX || n_rows > INT_MAX || k >= kEpilogueMaxK) {
    return cudaErrorNotSupported;
  }
  DeviceFacts device;
  const cudaError_t error = current_device_facts(device);
  if (error != cudaSuccess) return error;
  if (!wgmma_device(device)) return cudaErrorNotSupported;
  switch (out_type) {
    case FloatType::kFloat32:
      return binary_linear_persistent_tile(x_bits, w_bits, m_rows, n_rows, k, epilogue, static_cast<float*>(out),
                                           x_popcounts, tuning, device.sm_count, stream);
    case FloatType::kFloat16:
      return binary_linear_persistent_tile(x_bits, w_bits, m_rows, n_rows, k, epilogue, static_cast<__half*>(out),
                                           x_popcounts, tuning, device.sm_count, stream);
    case FloatType::kBFloat16:
      return binary_linear_persistent_tile(x_bits, w_bits, m_rows, n_rows, k, epilogue,
                                           static_cast<__nv_bfloat16*>(out), x_popcounts, tuning, device.sm_count,
                                           stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace bitcompile
