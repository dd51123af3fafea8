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
//   consumer warpgroups: per tile: zero acc; for kb: wait full[s] parity phase; 4 wgmma; commit; pa (and pb) LDS +
//             POPC of stage s; wait_group 1; arrive empty[previous s]; after the last kb wait_group 0,
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
// Orders this thread's generic-proxy shared memory writes before later async-proxy (TMA) reads of them.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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

// The epilogue's integer-to-float conversion: dot = k - 2 (pa + pb) + 4 and, summed in 32 bits onto the magic
// 0x4B400000 (1.5 * 2^23 as a float): for |dot| < 2^22 the sum's bits are the float 1.5 * 2^23 + dot, and one FADD
// of -1.5 * 2^23 gives dot exactly (the value static_cast<float> gave). IADD + FADD on full-rate pipes against
// I2F.S64 (quarter rate) and the 64-bit sums the epilogue took before (~12 instructions an output, H200 ncu).
// K >= 2^22 bits goes to the mma.sync kernels. H200 harness, N = K = 8192, us per call in a rotating graph, before
// -> after: M = 512 fp32 17.5 -> 16.1, bf16 18.4 -> 15.7; M = 1024 29.3 -> 26.4; M = 4096 fp32 94.0 -> 82.2 (6.5
// POPS), bf16 96.9 -> 75.9 (7.0 POPS); M = 8192 182.7 -> 159-162 (6.8 POPS). ncu M = 4096: 99.9 -> 83.6 us.
constexpr int64_t kEpilogueMaxK = int64_t{1} << 22;
constexpr int kMagicBits = 0x4B400000;
constexpr float kMagicValue = 12582912.f;
__device__ __forceinline__ float magic_dot(int biased) { return __int_as_float(biased) - kMagicValue; }

// A tile's column terms (columns n0 + c, c < valid): the scale (1 where there is none) and bias (0), 0 past N.
struct TileColumns {
  const float* scale;  // at column n0 (or the scalar); null: 1
  const float* bias;   // at column n0; null: 0
  int scale_step;      // 0: one scalar scale
  int valid;           // columns of the tile inside N
  __device__ __forceinline__ TileColumns(const Epilogue& ep, int64_t n0, int64_t n_rows, int bn) {
    const bool scalar = ep.scale_count == 1;
    scale = ep.scale == nullptr ? nullptr : ep.scale + (scalar ? 0 : n0);
    bias = ep.bias == nullptr ? nullptr : ep.bias + n0;
    scale_step = scalar ? 0 : 1;
    valid = n_rows - n0 < bn ? static_cast<int>(n_rows - n0) : bn;
  }
  __device__ __forceinline__ float scale_at(int c) const {
    return c < valid ? (scale != nullptr ? scale[c * scale_step] : 1.f) : 0.f;
  }
  __device__ __forceinline__ float bias_at(int c) const { return c < valid && bias != nullptr ? bias[c] : 0.f; }
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
    for (int s = 0; s < S; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, 8);  // the 8 consumer warps
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
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
        const uint8_t* stage_ptr = smem + s * L::kStageBytes;
        const uint8_t* a_ptr = stage_ptr + a_row * kWgRowBytes;
        pa0 += popc4(load_shared_16(a_ptr + a_chunk0)) + popc4(load_shared_16(a_ptr + a_chunk1));
        pa1 += popc4(load_shared_16(a_ptr + 8 * kWgRowBytes + a_chunk0)) +
               popc4(load_shared_16(a_ptr + 8 * kWgRowBytes + a_chunk1));
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
      pa0 += __shfl_xor_sync(kFullMask, pa0, 1);
      pa0 += __shfl_xor_sync(kFullMask, pa0, 2);
      pa1 += __shfl_xor_sync(kFullMask, pa1, 1);
      pa1 += __shfl_xor_sync(kFullMask, pa1, 2);
      if (need_pb) {
        // The other warpgroup may still be in the epilogue of an earlier tile, reading the old pb (with tiles of
        // at most S stages it can be a whole tile behind): both consumer warpgroups meet before and after the write.
        if constexpr (BN == 128) pb += __shfl_xor_sync(kFullMask, pb, 1);
        named_barrier_sync<256>(1);
        if (BN == 256 || (ct & 1) == 0) pop[b_row] = -2 * pb;  // the epilogue's column term
        named_barrier_sync<256>(1);
      }
      const int* pbs = pop;  // -2 pb a column
      const int64_t m0 = static_cast<int64_t>(m_tile) * kWgBM + wg * 64;  // this warpgroup's first row
      const int64_t n0 = static_cast<int64_t>(n_tile) * BN;
      const int r_local = w4 * 16 + quad_row;  // + 8 h: row within the warpgroup's 64
      const int c_lane = 2 * (lane & 3);
      // dot + magic = (k - 2 pa + magic) + (-2 pb) + 4 and (magic_dot above)
      const int row_term[2] = {static_cast<int>(shape.k) - 2 * pa0 + kMagicBits,
                               static_cast<int>(shape.k) - 2 * pa1 + kMagicBits};
      const TileColumns columns(ep, n0, shape.n_rows, BN);
      float factor[2];
      bool row_ok[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t m = m0 + r_local + 8 * h;
        row_ok[h] = m < shape.m_rows;
        factor[h] = row_ok[h] ? row_factor(ep, m) : 0.f;
      }
      if (store_buffers != 0) {
        // Boxes of 64 rows x 128 bytes (32 fp32 / 64 fp16 columns), SW128 like the operands: the thread's column
        // pair at byte b of a box row r goes to chunk (b / 16) ^ (r % 8). The elected thread (the warpgroup's
        // first) stores each box once all 128 threads wrote it, and before the barrier of box j waits until at
        // most B - 2 of its stores (B = store_buffers) still read shared memory: box j + 1's buffer (last used by
        // box j + 1 - B) is then free. Boxes wholly past N are skipped (so none is wholly outside the tensor).
        if (m0 < shape.m_rows) {
          constexpr int kBoxCols = 128 / static_cast<int>(sizeof(OutT));
          constexpr int kBoxes = BN / kBoxCols;
          constexpr int kGroupsPerBox = kBoxCols / 8;
          const int boxes = static_cast<int>(ceil_div(columns.valid, kBoxCols));
          uint8_t* staging = smem + L::staging_offset(S) + wg * (store_buffers * L::kBoxBytes);
#pragma unroll
          for (int b = 0; b < kBoxes; ++b) {
            if (b >= boxes) break;
            uint8_t* buffer = staging + (box & (store_buffers - 1)) * L::kBoxBytes;
#pragma unroll
            for (int g = 0; g < kGroupsPerBox; ++g) {
              const int i = b * kGroupsPerBox + g;
              const int c = 8 * i + c_lane;
              const int2 pb_pair = *reinterpret_cast<const int2*>(pbs + c);
              const float scale0 = columns.scale_at(c), bias0 = columns.bias_at(c);
              const float scale1 = columns.scale_at(c + 1), bias1 = columns.bias_at(c + 1);
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const int and0 = acc[4 * i + 2 * h], and1 = acc[4 * i + 2 * h + 1];
                const float v0 = epilogue_value(magic_dot(row_term[h] + pb_pair.x + 4 * and0), factor[h], scale0, bias0);
                const float v1 = epilogue_value(magic_dot(row_term[h] + pb_pair.y + 4 * and1), factor[h], scale1, bias1);
                const int row = r_local + 8 * h;  // row % 8 == quad_row
                const int byte = (8 * g + c_lane) * static_cast<int>(sizeof(OutT));
                uint8_t* p = buffer + row * 128 + ((((byte >> 4) ^ quad_row) << 4) | (byte & 15));
                if constexpr (sizeof(OutT) == 4) {
                  *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
                } else {
                  OutT pair[2] = {from_float<OutT>(v0), from_float<OutT>(v1)};
                  *reinterpret_cast<uint32_t*>(p) = *reinterpret_cast<const uint32_t*>(pair);
                }
              }
            }
            fence_proxy_async_shared();  // this thread's writes, before the TMA engine reads them
            if (elected) {
              if (store_buffers == 4) {
                bulk_wait_read<2>();
              } else {
                bulk_wait_read<0>();
              }
            }
            named_barrier_sync<128>(2 + wg);
            if (elected) {
              tma_store_2d(&map_out, shared_address(buffer), static_cast<int>(n0 + b * kBoxCols), static_cast<int>(m0));
              bulk_commit();
            }
            ++box;
          }
        }
      } else {
        const bool vector_ok = shape.pair_stores != 0;
#pragma unroll
        for (int i = 0; i < BN / 8; ++i) {
          const int c = 8 * i + c_lane;
          if (c >= columns.valid) continue;
          const bool both = c + 1 < columns.valid;
          const int pb0 = pbs[c], pb1 = pbs[c + 1];
          const float scale0 = columns.scale_at(c), bias0 = columns.bias_at(c);
          const float scale1 = columns.scale_at(c + 1), bias1 = columns.bias_at(c + 1);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (!row_ok[h]) continue;
            const int64_t m = m0 + r_local + 8 * h;
            const int and0 = acc[4 * i + 2 * h], and1 = acc[4 * i + 2 * h + 1];
            const float v0 = epilogue_value(magic_dot(row_term[h] + pb0 + 4 * and0), factor[h], scale0, bias0);
            const float v1 = epilogue_value(magic_dot(row_term[h] + pb1 + 4 * and1), factor[h], scale1, bias1);
            store_pair(out + m * shape.n_rows + n0 + c, v0, v1, both, vector_ok);
          }
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
                                           int stages, int sm_count, cudaStream_t stream) {
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

  const size_t smem = static_cast<size_t>(L::smem_bytes(stages, store_buffers));
  // Persistent grid: one CTA an SM (1 fits an SM), at most one a unit.
  const int64_t ctas = std::max<int64_t>(1, std::min<int64_t>(units, sm_count));
  const ClusterLaunch launch(dim3(static_cast<unsigned>(ctas)), kWgThreads, smem, 1, stream, /*dependent=*/true);
  return cudaLaunchKernelEx(&launch.config, kernel, map_a, map_b, map_out, shape, ep, out);
}

template <typename OutT>
cudaError_t binary_linear_persistent_tile(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows,
                                          int64_t n_rows, int64_t k, const Epilogue& ep, OutT* out,
                                          const BinaryLinearTuning& t, int sm_count, cudaStream_t stream) {
  int tile_n = t.tile_n;  // as the kernel above
  if (tile_n == 0) tile_n = ceil_div(m_rows, kWgBM) * ceil_div(n_rows, 256) * 8 >= int64_t{sm_count} * 7 ? 256 : 128;
  if (tile_n == 128) {
    return binary_linear_persistent_typed<128>(x_bits, w_bits, m_rows, n_rows, k, ep, out, t.store, t.stages,
                                               sm_count, stream);
  }
  return binary_linear_persistent_typed<256>(x_bits, w_bits, m_rows, n_rows, k, ep, out, t.store, t.stages, sm_count,
                                             stream);
}

}  // namespace

cudaError_t launch_binary_linear_wgmma(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                       int64_t k, const Epilogue& epilogue, void* out, FloatType out_type,
                                       const BinaryLinearTuning& tuning, cudaStream_t stream) {
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
  // sm_90a code (BITCOMPILE_SM90A, device_common.cuh), which runs on 9.0 only; sm_100 has no wgmma
  if (!BITCOMPILE_SM90A || device.major != 9 || device.minor != 0) return cudaErrorNotSupported;
  switch (out_type) {
    case FloatType::kFloat32:
      return binary_linear_persistent_tile(x_bits, w_bits, m_rows, n_rows, k, epilogue, static_cast<float*>(out),
                                           tuning, device.sm_count, stream);
    case FloatType::kFloat16:
      return binary_linear_persistent_tile(x_bits, w_bits, m_rows, n_rows, k, epilogue, static_cast<__half*>(out),
                                           tuning, device.sm_count, stream);
    case FloatType::kBFloat16:
      return binary_linear_persistent_tile(x_bits, w_bits, m_rows, n_rows, k, epilogue,
                                           static_cast<__nv_bfloat16*>(out), tuning, device.sm_count, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace bitcompile
