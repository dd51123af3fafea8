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
//   M = 1..256 (BN = 128): 13.4-14.4 us graph (mma.sync kernels: 20.7-30.0); M = 512 (BN = 256): 24.0 / 20.4 (54.4
//   / 36.0); M = 4096: 151.7 / 148.7 (321.4 / 318.0), 3.6 POPS of ~15.5. ncu at M = 4096: issue slots 28%, 0.39
//   eligible warps a scheduler, DRAM 17% (the 128 MiB fp32 output): the non-persistent grid's per-tile prologue
//   (ring fill) and epilogue are not overlapped with MMA (next: a persistent tile loop).
// Debugging: -DBITCOMPILE_WGMMA_WATCHDOG turns every mbarrier wait into a ~4 s watchdog that traps (a protocol
//   bug then fails the launch instead of hanging); off by default, a trap kills the CUDA context.
#include <cuda.h>  // CUtensorMap and its enums only: the encoder is fetched through cudaGetDriverEntryPointByVersion
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudaTypedefs.h>

#include <cstdio>

#include "device_common.cuh"
#include "wgmma_common.cuh"

namespace bitcompile {
namespace cuda {
namespace {

constexpr int kWgBM = 128;             // rows of x a block (2 consumer warpgroups x 64)
constexpr int kWgBKWords = 32;         // words of K a stage (1024 bits)
constexpr int kWgRowBytes = kWgBKWords * 4;  // 128: one swizzle span
constexpr int kWgThreads = 384;        // producer warpgroup + 2 consumer warpgroups
constexpr int kWgPopWarps = 3;         // warps 1-3 of the producer warpgroup
[[maybe_unused]] constexpr int kWgPopThreads = kWgPopWarps * 32;
[[maybe_unused]] constexpr int kWgEmptyArrivals = 8 + kWgPopWarps;  // consumer warps + popcount warps, one arrival each
[[maybe_unused]] constexpr int kWgKSteps = kWgBKWords * 32 / 256;     // wgmma k256 steps a stage: 4
[[maybe_unused]] constexpr int kWgStepBytes = 256 / 8;                // 32 bytes of a row a k step

template <int BN>
struct WgConfig {
  static_assert(BN == 128 || BN == 256, "BN");
  static constexpr int kStages = BN == 256 ? 4 : 6;
  static_assert(kStages >= 2, "the consumers release stage kb - 1 after issuing kb: one stage would deadlock");
  static constexpr int kBytesA = kWgBM * kWgRowBytes;  // 16384
  static constexpr int kBytesB = BN * kWgRowBytes;
  static constexpr int kStageBytes = kBytesA + kBytesB;
  static_assert(kBytesA % 1024 == 0 && kStageBytes % 1024 == 0, "boxes must stay 1024-byte aligned (SW128)");
  static constexpr int kPopOffset = kStages * kStageBytes;
  static constexpr int kRows = kWgBM + BN;  // pop[0..127] = pa of A rows, pop[128..] = pb of B rows
  static constexpr int kBarOffset = kPopOffset + kRows * 4;
  static_assert(kBarOffset % 8 == 0, "mbarrier alignment");
  static constexpr int kSmemBytes = kBarOffset + 2 * kStages * 8 + 1024;  // + slack to round the base up to 1024
};

// ---- PTX wrappers (sm_90a) ----------------------------------------------------------------------------------
[[maybe_unused]] __device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if BC_WGMMA_ENABLED
// Pins the accumulators at this point of the instruction stream: the compiler may neither move their reads above
// a wgmma.wait_group nor copy them between in-flight wgmmas.
template <int R>
__device__ __forceinline__ void fence_accumulators(int (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
// ---- wgmma b1 AND.POPC, both operands from shared memory; scale-d = 1 (D += A.B, accumulators zeroed first) ----
// D[64 x 128] += popc(A[64 x 256] & B[128 x 256]) over one k256 step; 64 s32 accumulators a thread.
__device__ __forceinline__ void wgmma_and_popc_n128(int (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k256.s32.b1.b1.and.popc "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, 1;\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
        "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
        "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
        "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
        "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
      : "l"(desc_a), "l"(desc_b)
      : "memory");
}

// D[64 x 256] += popc(A[64 x 256] & B[256 x 256]) over one k256 step; 128 s32 accumulators a thread.
__device__ __forceinline__ void wgmma_and_popc_n256(int (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k256.s32.b1.b1.and.popc "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      " %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      " %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      " %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      " %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, 1;\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
        "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
        "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
        "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
        "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]),
        "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]),
        "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]),
        "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]),
        "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]),
        "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]), "+r"(d[103]),
        "+r"(d[104]), "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]), "+r"(d[110]), "+r"(d[111]),
        "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]), "+r"(d[117]), "+r"(d[118]), "+r"(d[119]),
        "+r"(d[120]), "+r"(d[121]), "+r"(d[122]), "+r"(d[123]), "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])
      : "l"(desc_a), "l"(desc_b)
      : "memory");
}

template <int BN>
__device__ __forceinline__ void wgmma_and_popc(int (&d)[BN / 2], uint64_t desc_a, uint64_t desc_b) {
  if constexpr (BN == 256) {
    wgmma_and_popc_n256(d, desc_a, desc_b);
  } else {
    wgmma_and_popc_n128(d, desc_a, desc_b);
  }
}
#endif  // BC_WGMMA_ENABLED

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

// One block = one 128 x BN output tile (layout, protocol: top of the file). pair_stores: columns 2t, 2t + 1 in one 8-byte (fp32)
// or 4-byte (fp16 / bf16) store (n_rows even, out aligned to two elements).
template <int BN, typename OutT>
__global__ __launch_bounds__(kWgThreads, 1) void binary_linear_wgmma_kernel(
    const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b, int64_t m_rows,
    int64_t n_rows, int64_t words, int64_t k, int64_t m_tiles, Epilogue ep, OutT* __restrict__ out,
    int pair_stores) {
#if BC_WGMMA_ENABLED
  using Cfg = WgConfig<BN>;
  constexpr int S = Cfg::kStages;
  extern __shared__ uint8_t wg_smem_raw[];
  // SW128 needs 1024-byte aligned boxes: round the dynamic shared memory base up (kSmemBytes has the slack).
  uint8_t* smem = wg_smem_raw + ((1024 - (shared_address(wg_smem_raw) & 1023)) & 1023);
  int* pop = reinterpret_cast<int*>(smem + Cfg::kPopOffset);
  const uint32_t smem_base = shared_address(smem);
  const uint32_t full_bar = smem_base + Cfg::kBarOffset;  // full[s] at full_bar + 8 s
  const uint32_t empty_bar = full_bar + 8 * S;            // empty[s] at empty_bar + 8 s

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  // Tile origins: recomputed where needed rather than held across the consumers' mainloop (registers).
  const int m_tile = static_cast<int>(blockIdx.x % static_cast<unsigned>(m_tiles));
  const int n_tile = static_cast<int>(blockIdx.x / static_cast<unsigned>(m_tiles));
  const int kblocks = static_cast<int>(ceil_div(words, kWgBKWords));  // words < 2^26 (k <= INT_MAX)

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, kWgEmptyArrivals);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();

  if (warp < 4) {
    // ---- producer warpgroup ----
    if (warp == 0) {
      if (lane == 0) {
        int s = 0;
        uint32_t phase = 0;  // of round kb / S
        for (int kb = 0; kb < kblocks; ++kb) {
          if (kb >= S) mbar_wait(empty_bar + 8 * s, phase ^ 1u, 0, kb);  // round kb / S - 1 released it
          const uint32_t stage = smem_base + s * Cfg::kStageBytes;
          mbar_arrive_expect_tx(full_bar + 8 * s, Cfg::kStageBytes);  // TMA counts zero-filled OOB bytes too
          tma_load_2d(stage, &map_a, kb * kWgBKWords, m_tile * kWgBM, full_bar + 8 * s);
          tma_load_2d(stage + Cfg::kBytesA, &map_b, kb * kWgBKWords, n_tile * BN, full_bar + 8 * s);
          if (++s == S) {
            s = 0;
            phase ^= 1u;
          }
        }
      }
      __syncwarp();
    } else {
      // Row popcounts. Thread p counts rows p, p + 96, ... of the stage (A rows 0..127, then B rows); rows are
      // 128 contiguous bytes whatever the swizzle, but lane-consecutive rows read the physical chunk q ^ (r % 8)
      // so that the 8 lanes of a quarter warp hit 8 different 16-byte bank groups.
      const int p = tid - 32;
      const int tail_kb = static_cast<int>((words - 1) / kWgBKWords);
      const int tail_word = static_cast<int>((words - 1) % kWgBKWords);  // logical word of the stage
      const uint32_t tail_stray = ~valid_bits(k, words - 1);              // w's bits past K in that word
      constexpr int kRowsPerPopThread = (Cfg::kRows + kWgPopThreads - 1) / kWgPopThreads;
      int count[kRowsPerPopThread];
#pragma unroll
      for (int i = 0; i < kRowsPerPopThread; ++i) count[i] = 0;
      int s = 0;
      uint32_t phase = 0;
      for (int kb = 0; kb < kblocks; ++kb) {
        mbar_wait(full_bar + 8 * s, phase, 1, kb);
        const uint8_t* stage = smem + s * Cfg::kStageBytes;
#pragma unroll
        for (int i = 0; i < kRowsPerPopThread; ++i) {
          const int r = p + i * kWgPopThreads;
          if (r < Cfg::kRows) {
            const uint8_t* row = stage + r * kWgRowBytes;
            int c = 0;
#pragma unroll
            for (int q = 0; q < kWgRowBytes / 16; ++q) {
              const uint4 v = *reinterpret_cast<const uint4*>(row + ((q ^ (r & 7)) * 16));
              c += __popc(v.x) + __popc(v.y) + __popc(v.z) + __popc(v.w);
            }
            if (r >= kWgBM && kb == tail_kb && tail_stray != 0) {  // B row: drop stray tail bits from pb
              const uint32_t last = *reinterpret_cast<const uint32_t*>(
                  row + (((tail_word >> 2) ^ (r & 7)) * 16) + (tail_word & 3) * 4);
              c -= __popc(last & tail_stray);
            }
            count[i] += c;
          }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty_bar + 8 * s);
        if (++s == S) {
          s = 0;
          phase ^= 1u;
        }
      }
#pragma unroll
      for (int i = 0; i < kRowsPerPopThread; ++i) {
        const int r = p + i * kWgPopThreads;
        if (r < Cfg::kRows) pop[r] = count[i];
      }
    }
    __syncthreads();  // pop[] complete (pairs with the consumers' barrier below)
    return;
  }

  // ---- consumer warpgroups ----
  const int wg = warp / 4 - 1;  // 0: tile rows 0-63, 1: rows 64-127
  int acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0;
  int s = 0, previous_s = S - 1;  // stage of kb and of kb - 1
  uint32_t phase = 0;
  for (int kb = 0; kb < kblocks; ++kb) {
    mbar_wait(full_bar + 8 * s, phase, 2, kb);
    const uint32_t a_start = smem_base + s * Cfg::kStageBytes + wg * (64 * kWgRowBytes);
    const uint32_t b_start = smem_base + s * Cfg::kStageBytes + Cfg::kBytesA;
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < kWgKSteps; ++j) {
      wgmma_and_popc<BN>(acc, sw128_descriptor(a_start + j * kWgStepBytes), sw128_descriptor(b_start + j * kWgStepBytes));
    }
    wgmma_commit();
    wgmma_wait<1>();  // the wgmmas of kb - 1 are complete: their stage may be refilled
    fence_accumulators(acc);
    if (kb > 0) {
      __syncwarp();
      if (lane == 0) mbar_arrive(empty_bar + 8 * previous_s);
    }
    previous_s = s;
    if (++s == S) {
      s = 0;
      phase ^= 1u;
    }
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  __syncthreads();  // pop[] complete

  // ---- epilogue: thread rows r0 = 64 wg + 16 (warp % 4) + lane / 4 and r0 + 8, columns 8i + 2 (lane % 4) + 0/1 ----
  const int64_t m0 = static_cast<int64_t>(m_tile) * kWgBM;
  const int64_t n0 = static_cast<int64_t>(n_tile) * BN;
  const int r0 = wg * 64 + (warp & 3) * 16 + (lane >> 2);
  const int c_lane = 2 * (lane & 3);
  const bool vector_ok = pair_stores != 0;  // host: n_rows even and out aligned to two elements
  int64_t pa[2];
  float factor[2];
  bool row_ok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t m = m0 + r0 + 8 * h;
    row_ok[h] = m < m_rows;
    pa[h] = pop[r0 + 8 * h];
    factor[h] = row_ok[h] ? row_factor(ep, m) : 0.f;
  }
#pragma unroll
  for (int i = 0; i < BN / 8; ++i) {
    const int c = 8 * i + c_lane;
    const int64_t n = n0 + c;
    if (n >= n_rows) continue;
    const bool both = n + 1 < n_rows;
    const int64_t pb0 = pop[kWgBM + c], pb1 = pop[kWgBM + c + 1];
    const float scale0 = column_scale(ep, n), bias0 = column_bias(ep, n);
    const float scale1 = both ? column_scale(ep, n + 1) : 0.f, bias1 = both ? column_bias(ep, n + 1) : 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!row_ok[h]) continue;
      const int64_t m = m0 + r0 + 8 * h;
      const int64_t and0 = acc[4 * i + 2 * h], and1 = acc[4 * i + 2 * h + 1];
      // s(x).s(w) = K - 2 * (pa + pb - 2 * popc(a & b))
      const float v0 = epilogue_value(static_cast<float>(k - 2 * (pa[h] + pb0 - 2 * and0)), factor[h], scale0, bias0);
      const float v1 = epilogue_value(static_cast<float>(k - 2 * (pa[h] + pb1 - 2 * and1)), factor[h], scale1, bias1);
      store_pair(out + m * n_rows + n, v0, v1, both, vector_ok);
    }
  }
#else
  __trap();  // built for another target: the launcher refuses without sm_90a code on a 9.0 device
#endif
}

// [rows, words] uint32 K-contiguous packed bits, box = 32 words x box_rows, SWIZZLE_128B, zero OOB fill.
bool encode_operand_map(CUtensorMap* map, const uint32_t* bits, int64_t rows, int64_t words, int box_rows) {
  return encode_sw128_map(map, CU_TENSOR_MAP_DATA_TYPE_UINT32, bits, rows, words, words * 4, kWgBKWords, box_rows);
}

template <int BN, typename OutT>
cudaError_t binary_linear_wgmma_typed(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                      int64_t k, const Epilogue& ep, OutT* out, cudaStream_t stream) {
  const int64_t words = ceil_div(k, 32);
  CUtensorMap map_a, map_b;
  if (!encode_operand_map(&map_a, x_bits, m_rows, words, kWgBM) ||
      !encode_operand_map(&map_b, w_bits, n_rows, words, BN)) {
    return cudaErrorNotSupported;
  }
  const int64_t m_tiles = ceil_div(m_rows, kWgBM);
  const int64_t blocks = m_tiles * ceil_div(n_rows, BN);
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  auto kernel = binary_linear_wgmma_kernel<BN, OutT>;
  static unsigned long long smem_devices = 0;
  const cudaError_t error = allow_dynamic_smem(kernel, WgConfig<BN>::kSmemBytes, smem_devices);
  if (error != cudaSuccess) return error;
  const int pair_stores = n_rows % 2 == 0 && reinterpret_cast<uintptr_t>(out) % (2 * sizeof(OutT)) == 0;
  kernel<<<static_cast<unsigned>(blocks), kWgThreads, WgConfig<BN>::kSmemBytes, stream>>>(
      map_a, map_b, m_rows, n_rows, words, k, m_tiles, ep, out, pair_stores);
  return cudaGetLastError();
}

// Tile width: BN = 256 (half the L2 -> shared traffic per op of BN = 128) once its tiles about fill the GPU, else
// BN = 128 for twice the blocks (H200, N = K = 8192: M <= 256 runs 30% faster on BN = 128, M >= 512 20-50% slower).
template <typename OutT>
cudaError_t binary_linear_wgmma_tile(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                     int64_t k, const Epilogue& ep, OutT* out, int tile_n, int sm_count,
                                     cudaStream_t stream) {
  if (tile_n == 0) tile_n = ceil_div(m_rows, kWgBM) * ceil_div(n_rows, 256) * 8 >= int64_t{sm_count} * 7 ? 256 : 128;
  if (tile_n == 128) return binary_linear_wgmma_typed<128>(x_bits, w_bits, m_rows, n_rows, k, ep, out, stream);
  return binary_linear_wgmma_typed<256>(x_bits, w_bits, m_rows, n_rows, k, ep, out, stream);
}

}  // namespace

cudaError_t launch_binary_linear_wgmma(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                       int64_t k, const Epilogue& epilogue, void* out, FloatType out_type, int tile_n,
                                       cudaStream_t stream) {
  if (tile_n != 0 && tile_n != 128 && tile_n != 256) return cudaErrorInvalidValue;
  const int64_t words = ceil_div(k, 32);
  // TMA: row stride a multiple of 16 bytes, 16-byte aligned bases, 32-bit coordinates.
  if (words % 4 != 0 || reinterpret_cast<uintptr_t>(x_bits) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(w_bits) % 16 != 0 || m_rows > INT_MAX || n_rows > INT_MAX) {
    return cudaErrorNotSupported;
  }
  DeviceFacts device;
  const cudaError_t error = current_device_facts(device);
  if (error != cudaSuccess) return error;
  // sm_90a code (BITCOMPILE_SM90A, device_common.cuh), which runs on 9.0 only; sm_100 has no wgmma
  if (!BITCOMPILE_SM90A || device.major != 9 || device.minor != 0) return cudaErrorNotSupported;
  switch (out_type) {
    case FloatType::kFloat32:
      return binary_linear_wgmma_tile(x_bits, w_bits, m_rows, n_rows, k, epilogue, static_cast<float*>(out), tile_n,
                                      device.sm_count, stream);
    case FloatType::kFloat16:
      return binary_linear_wgmma_tile(x_bits, w_bits, m_rows, n_rows, k, epilogue, static_cast<__half*>(out), tile_n,
                                      device.sm_count, stream);
    case FloatType::kBFloat16:
      return binary_linear_wgmma_tile(x_bits, w_bits, m_rows, n_rows, k, epilogue, static_cast<__nv_bfloat16*>(out),
                                      tile_n, device.sm_count, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace bitcompile
