// The warp-specialized SS-form wgmma block of apot_wgmma.cu at large tiles: the producer warpgroup turns the stage's
// weights into x's type in shared memory, so the consumers' wgmmas read both operands from shared memory (as cuBLAS's
// do) and no expansion sits on their path. Why: in wgmma_ws.cuh's RS-form block the consumers expand A in registers
// between their wgmmas; with apot's 4-bit table lookups (~3 instructions a weight) ncu put ~30% of their stall
// samples on HGMMAs waiting for their A registers (H100, M = 1024, 8192^2: 225.6 us, SM 65.8%, where the sign-bit
// kernel's cheap expansion runs at 85.6%, 174.5 us).
//
// ---- Roles (384 threads: warps 0-7 two consumer warpgroups, warps 8-11 the producer warpgroup) -----------------
// Loader (lane 0 of warp 8): for each 64-k tile of its K slice waits until the stage is free (empty[s]), posts the
//   stage's bytes on loaded[s] (arrive.expect_tx) and issues two TMA copies: x, one box of BN rows x 64 k in the
//   128-byte swizzle (what the B descriptor reads; rows past M zero-filled), and W, one box of 128 features x
//   Weights::kSsFeatureBytes bytes, unswizzled (features past N zero-filled).
// Expanders (warps 9-11, 96 threads): wait loaded[s]; the stage's A is 128 features x 64 k of x's type, K-major in the
//   128-byte swizzle (8 16-byte chunks a feature, chunk c of feature f at f * 128 + 16 (c ^ (f % 8)), the layout TMA
//   writes x in); thread e writes chunks e, e + 96, ... (Weights::ss_chunk: chunk c's 8 values from the stage's W),
//   then fence.proxy.async (its generic writes, before the wgmmas' async-proxy reads), __syncwarp, and lane 0 of each
//   warp arrives on ready[s].
// Consumers (warpgroup wg = 0, 1: features 64 wg .. 64 wg + 63): wait loaded[s] and ready[s]; 4 wgmmas m64nBNk16
//   (A: 64 rows of the stage's A from row 64 wg, B: the x box, both + 32 bytes a k16 step), one commit group a tile;
//   wait_group(1): tile i - 1's group is complete, and lane 0 of each consumer warp arrives on empty[(i - 1) % S].
//   After the loop: wait_group(0), Weights::finish, named barrier 1, the fp32 tile (aliasing the ring: every copy and
//   expansion was consumed), store_accumulators and finish_tile (wgmma_rs.cuh), the producer warpgroup joining the two
//   cluster barriers of a K split.
//
// ---- Protocol (S stages, tile i of the slice in stage s = i % S, round r = i / S) --------------------------------
//   loaded[s] count 1: the loader's arrive.expect_tx (x and W bytes) + the two TMAs' complete_tx.
//   ready[s]  count 3: lane 0 of each expander warp.
//   empty[s]  count 8: lane 0 of each consumer warp, once tile i's wgmmas are complete (during tile i + 1).
//   loader: for i >= S waits empty[s] parity (r - 1) & 1; at the end waits for its last S tiles' loaded phases.
//   expanders: wait loaded[s] parity r & 1 (round r's W; the A they overwrite was read by round r - 1's wgmmas,
//   complete before empty[s], before the loader's copies of round r). Consumers: loaded[s] and ready[s], parity r & 1.
//
// ---- Budgets --------------------------------------------------------------------------------------------------
//   A stage: x BN x 128 bytes + A 16 KiB + W 128 x kSsFeatureBytes, rounded to 1024: BN = 256 52 KiB (4 stages),
//   192 44 KiB (5), 128 36 KiB (6). Registers: 168 at entry; setmaxnreg: producer warpgroup 56 (the expanders' table
//   and a chunk's temporaries), consumers 224 (BN / 2 accumulators, no A registers): 56 + 224 + 224 = 504 <= 512.
//   Tensor time a tile: 4 x 2 x BN / 2 clk (BN = 256: 1024 clk); expansion a tile: 1024 chunks over 3 warps, ~11
//   chunks a thread of ~26 instructions (apot: 12 prmt, 8 selector ops, LDS, STS.128, address): ~290 issue slots
//   of each expander warp's sub-partition.
// Torch-free.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "device_common.cuh"
#include "wgmma_common.cuh"
#include "wgmma_rs.cuh"

namespace bitcompile {
namespace cuda {

template <int BN, int kWFeatureBytes>
struct SsShape {
  static constexpr int kConsumerThreads = 256;           // two consumer warpgroups (warps 0-7)
  static constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup (warps 8-11)
  static constexpr int kExpanders = 96;                  // warps 9-11
  static constexpr int kRows = BN;                       // rows of x a block
  static constexpr int kFeatures = 128;                  // features a block (64 a consumer warpgroup)
  static constexpr int kSteps = 4;                       // k16 steps a stage (64 k)
  static constexpr int kXBytes = BN * 128;               // one TMA box: BN rows x 64 k
  static constexpr int kABytes = kFeatures * 128;        // A: 128 features x 64 k, 2-byte values
  static constexpr int kWBytes = kFeatures * kWFeatureBytes;
  static constexpr int kChunks = kFeatures * 8;          // 16-byte chunks of A a stage
  static constexpr int kStageBytes = (kXBytes + kABytes + kWBytes + 1023) / 1024 * 1024;
  static constexpr int kPartialStride = kFeatures + 4;   // floats a row of the fp32 tile (+4: no conflicts)
  static constexpr int kPartialBytes = BN * kPartialStride * 4;
  static constexpr int kStagesFit = (227 * 1024 - 1024 - 512) / kStageBytes;  // - alignment slack - barriers
  static constexpr int kStages = kStagesFit > 8 ? 8 : kStagesFit;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr int kBarOffset = kRingBytes > kPartialBytes ? kRingBytes : kPartialBytes;  // loaded, ready, empty
  static constexpr size_t kSmemBytes = kBarOffset + 24 * kStages + 1024;                      // + alignment slack
  static_assert(BN == 128 || BN == 192 || BN == 256, "an instantiated SS wgmma");
  static_assert(kStages >= 3, "ring depth");
  static_assert(kWFeatureBytes % 16 == 0, "a TMA box row: a multiple of 16 bytes");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

#if BC_WGMMA_ENABLED
// ---- wgmma.mma_async SS wrappers: D (fp32, BN / 2 registers) += A (descriptor) * B (descriptor) ------------------
// Operands after the descriptors: scale-d = 1, imm-scale-a = 1, imm-scale-b = 1, imm-trans-a = 0, imm-trans-b = 0
// (both K-major).
#define BC_WGMMA_SS_ONE(NAME, PTX, N, REGS, ACC, DESCS)                                                            \
  __device__ __forceinline__ void wgmma_ss_##NAME##_n##N(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b) {  \
    asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " {" REGS "}, " DESCS               \
                 ", 1, 1, 1, 0, 0;\n"                                                                              \
                 : ACC("+f")                                                                                       \
                 : "l"(desc_a), "l"(desc_b));                                                                      \
  }
#define BC_WGMMA_SS_TYPES(N, REGS, ACC, DESCS)        \
  BC_WGMMA_SS_ONE(Bf16, "bf16", N, REGS, ACC, DESCS) \
  BC_WGMMA_SS_ONE(F16, "f16", N, REGS, ACC, DESCS)
BC_WGMMA_SS_TYPES(128, BC_WG_REGS64, BC_WG_ACC64, "%64, %65")
BC_WGMMA_SS_TYPES(192, BC_WG_REGS96, BC_WG_ACC96, "%96, %97")
BC_WGMMA_SS_TYPES(256, BC_WG_REGS128, BC_WG_ACC128, "%128, %129")
#undef BC_WGMMA_SS_TYPES
#undef BC_WGMMA_SS_ONE

template <typename T, int BN>
__device__ __forceinline__ void wgmma_ss(float (&d)[BN / 2], uint64_t desc_a, uint64_t desc_b) {
  constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  if constexpr (BN == 256) {
    if constexpr (kBf16) wgmma_ss_Bf16_n256(d, desc_a, desc_b); else wgmma_ss_F16_n256(d, desc_a, desc_b);
  } else if constexpr (BN == 192) {
    if constexpr (kBf16) wgmma_ss_Bf16_n192(d, desc_a, desc_b); else wgmma_ss_F16_n192(d, desc_a, desc_b);
  } else {
    if constexpr (kBf16) wgmma_ss_Bf16_n128(d, desc_a, desc_b); else wgmma_ss_F16_n128(d, desc_a, desc_b);
  }
}

// The whole block (the header's Roles and Protocol), launched by wgmma_ss_launch with 384 threads, one block an SM.
// Weights: kSsFeatureBytes (a feature's W bytes in a 64-k tile), ss_chunk(w_stage, f, c) (the 8 values of chunk c of
// feature f, 2 a word, the lower k in the low half), finish(acc) (the accumulators' factor); make_weights() builds it
// (in the expanders and the consumers only). k % 64 == 0.
template <typename T, int BN, typename Weights, typename MakeWeights>
__device__ __forceinline__ void wgmma_ss_block(const CUtensorMap& map_x, const CUtensorMap& map_w,
                                               MakeWeights make_weights, int m_rows, int n_rows, int k, int slices,
                                               const Epilogue& ep, T* __restrict__ out) {
  using Shape = SsShape<BN, Weights::kSsFeatureBytes>;
  constexpr int S = Shape::kStages;
  constexpr int kProducerRegisters = 56, kConsumerRegisters = 224;
  extern __shared__ uint8_t smem_raw[];
  // 1024-byte aligned ring (the swizzle atoms); the generic pointer and the shared address move together.
  const uint32_t raw_address = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw_address + 1023u) & ~1023u;
  uint8_t* const smem = smem_raw + (base - raw_address);
  const uint32_t loaded_bar = base + Shape::kBarOffset;  // loaded[s] at loaded_bar + 8 s
  const uint32_t ready_bar = loaded_bar + 8 * S;
  const uint32_t empty_bar = ready_bar + 8 * S;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rank = static_cast<int>(blockIdx.x) % slices;  // the cluster is `slices` blocks along x
  const int total_tiles = k / 64;
  const int per_slice = (total_tiles + slices - 1) / slices;
  const int tile_begin = rank * per_slice;
  const int tiles = max(0, min(total_tiles, tile_begin + per_slice) - tile_begin);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / slices) * Shape::kFeatures;
  const int m0 = static_cast<int>(blockIdx.y) * BN;

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(loaded_bar + 8 * s, 1);
      mbar_init(ready_bar + 8 * s, 3);
      mbar_init(empty_bar + 8 * s, 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  namespace cg = cooperative_groups;

  if (warp >= 8) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (warp == 8) {
      if (lane == 0) {  // the loader
        int s = 0;
        uint32_t phase = 0;
        for (int i = 0; i < tiles; ++i) {
          if (i >= S) mbar_wait(empty_bar + 8 * s, phase ^ 1u, 0, i);  // round i / S - 1 released it
          const int j = tile_begin + i;
          const uint32_t stage = base + static_cast<uint32_t>(s * Shape::kStageBytes), loaded = loaded_bar + 8 * s;
          mbar_arrive_expect_tx(loaded, Shape::kXBytes + Shape::kWBytes);  // rows past M / N: zeros, counted
          tma_load_2d(stage, &map_x, j * 64, m0, loaded);
          tma_load_2d(stage + Shape::kXBytes + Shape::kABytes, &map_w, j * Weights::kSsFeatureBytes,
                      static_cast<int>(n0), loaded);
          if (++s == S) {
            s = 0;
            phase ^= 1u;
          }
        }
        for (int i = max(0, tiles - S); i < tiles; ++i) mbar_wait(loaded_bar + 8 * (i % S), (i / S) & 1u, 2, i);
      }
      __syncwarp();
    } else {  // the expanders
      const Weights weights = make_weights();
      const int e = tid - 288;
      int s = 0;
      uint32_t phase = 0;
      for (int i = 0; i < tiles; ++i) {
        mbar_wait(loaded_bar + 8 * s, phase, 3, i);
        uint8_t* const stage = smem + s * Shape::kStageBytes;
        const uint8_t* const w_stage = stage + Shape::kXBytes + Shape::kABytes;
        uint8_t* const a_stage = stage + Shape::kXBytes;
        constexpr int kRounds = (Shape::kChunks + Shape::kExpanders - 1) / Shape::kExpanders;
#pragma unroll
        for (int r = 0; r < kRounds; ++r) {
          const int q = e + r * Shape::kExpanders;
          if (Shape::kChunks % Shape::kExpanders == 0 || q < Shape::kChunks) {
            const int f = q >> 3, c = q & 7;
            *reinterpret_cast<uint4*>(a_stage + f * 128 + ((c ^ (f & 7)) << 4)) = weights.ss_chunk(w_stage, f, c);
          }
        }
        fence_proxy_async_shared();
        __syncwarp();
        if (lane == 0) mbar_arrive(ready_bar + 8 * s);
        if (++s == S) {
          s = 0;
          phase ^= 1u;
        }
      }
    }
    if (slices > 1) {  // the two cluster barriers of finish_tile
      cg::this_cluster().sync();
      cg::this_cluster().sync();
    }
  } else {
    // ---- consumer warpgroups ----
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
    const Weights weights = make_weights();
    const int wg = warp >> 2, g = lane >> 2, t = lane & 3;
    float acc[1][BN / 2];
#pragma unroll
    for (int v = 0; v < BN / 2; ++v) acc[0][v] = 0.f;
    int s = 0, previous_s = 0;
    uint32_t phase = 0;
    for (int i = 0; i < tiles; ++i) {
      mbar_wait(loaded_bar + 8 * s, phase, 1, i);
      mbar_wait(ready_bar + 8 * s, phase, 1, i);
      const uint32_t stage = base + static_cast<uint32_t>(s * Shape::kStageBytes);
      const uint32_t a_slab = stage + Shape::kXBytes + static_cast<uint32_t>(wg * 64 * 128);
#pragma unroll
      for (int v = 0; v < BN / 2; ++v) fence_operand(acc[0][v]);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Shape::kSteps; ++kk) {
        wgmma_ss<T, BN>(acc[0], sw128_descriptor(a_slab + 32 * kk), sw128_descriptor(stage + 32 * kk));
      }
      wgmma_commit();
#pragma unroll
      for (int v = 0; v < BN / 2; ++v) fence_operand(acc[0][v]);
      // WGMMA_SERIALIZE=1 (debug builds): no tile in flight, each stage released as soon as its wgmmas complete.
      wgmma_wait<WGMMA_SERIALIZE ? 0 : 1>();
#pragma unroll
      for (int v = 0; v < BN / 2; ++v) fence_operand(acc[0][v]);
      if (lane == 0 && (WGMMA_SERIALIZE || i > 0)) mbar_arrive(empty_bar + 8 * (WGMMA_SERIALIZE ? s : previous_s));
      previous_s = s;
      if (++s == S) {
        s = 0;
        phase ^= 1u;
      }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int v = 0; v < BN / 2; ++v) fence_operand(acc[0][v]);
    weights.finish(acc);
    // Every consumer's wgmmas are complete, and with them every copy and expansion into the ring: the ring becomes
    // the fp32 tile. Named barrier 1: the consumers only (the producer warpgroup may have left).
    asm volatile("bar.sync 1, %0;\n" ::"n"(Shape::kConsumerThreads) : "memory");
    float* const partial = reinterpret_cast<float*>(smem);
    store_accumulators<BN, 1, Shape::kPartialStride>(partial, acc, wg, warp & 3, g, t);
    finish_tile<T, BN, Shape::kFeatures, Shape::kConsumerThreads, Shape::kPartialStride, true>(
        partial, tid, rank, slices, static_cast<int64_t>(m0), n0, m_rows, n_rows, ep, out);
  }
}
#endif  // BC_WGMMA_ENABLED

// Launches an SS kernel `kernel` (parameters map_x, map_w, params, m_rows, n_rows, k, slices, ep, out; its block
// Shape) over ceil(N / 128) feature blocks x ceil(M / BN) row blocks, K split by split_k_slices on 128-k tiles (as
// wgmma_ws_launch: the same splits for the same tile). x: [m_rows, k] 2-byte elements, 16-byte aligned; w: [n_rows,
// w_row_bytes] bytes, 16-byte aligned, w_row_bytes a multiple of 16; k % 64 == 0.
template <typename Shape, auto kernel, typename T, typename Params>
cudaError_t wgmma_ss_launch(const T* x, const void* w, int64_t w_row_bytes, const Params& params, int64_t m_rows,
                            int64_t n_rows, int64_t k, const Epilogue& ep, T* out, int sm_count, int slices_wanted,
                            cudaStream_t stream) {
  constexpr int BN = Shape::kRows;
  const int64_t feature_blocks = ceil_div(n_rows, Shape::kFeatures);
  const int64_t row_blocks = ceil_div(m_rows, BN);
  if (k % 64 != 0 || row_blocks > 65535 || feature_blocks * kWgmmaMaxSlices > INT_MAX) return cudaErrorNotSupported;
  ClusterRoom room;
  cudaError_t error = prepare_wgmma_launch<Shape, kernel>(room);
  if (error != cudaSuccess) return error;
  const int64_t cluster = split_k_slices(feature_blocks * row_blocks, ceil_div(k, 128), sm_count, room, slices_wanted);
  CUtensorMap map_x, map_w;
  if (!encode_sw128_map(&map_x, CU_TENSOR_MAP_DATA_TYPE_UINT16, x, m_rows, k, k * 2, 64, BN) ||
      !encode_2d_map(&map_w, CU_TENSOR_MAP_DATA_TYPE_UINT8, w, n_rows, w_row_bytes, w_row_bytes,
                     Shape::kWBytes / Shape::kFeatures, Shape::kFeatures, CU_TENSOR_MAP_SWIZZLE_NONE)) {
    return cudaErrorNotSupported;
  }
  auto launch = [&](int64_t size) {
    const ClusterLaunch config(dim3(static_cast<unsigned>(feature_blocks * size), static_cast<unsigned>(row_blocks), 1),
                               Shape::kThreads, Shape::kSmemBytes, size, stream);
    return cudaLaunchKernelEx(&config.config, kernel, map_x, map_w, params, static_cast<int>(m_rows),
                              static_cast<int>(n_rows), static_cast<int>(k), static_cast<int>(size), ep, out);
  };
  error = launch(cluster);
  if (error != cudaSuccess && cluster > 1) {
    (void)cudaGetLastError();
    error = launch(1);  // a cluster refused all the same: one block a feature block, over the whole K
  }
  return error != cudaSuccess ? error : cudaGetLastError();
}

}  // namespace cuda
}  // namespace bitcompile
