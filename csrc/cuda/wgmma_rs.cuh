// The RS-form wgmma block of the W1A16-style kernels (binary_weight_wgmma.cu: sign bits; apot_wgmma.cu: 4-bit APoT
// codes): A = 64 output features x 16 k expanded into registers by a weight format, B = BN rows of x in shared memory
// (128-byte swizzle, cp.async ring), fp32 accumulators, cluster split-K through DSMEM, the Epilogue. The design is
// binary_weight_wgmma.cu's header comment; what differs between the kernels is the Weights policy of wgmma_rs_block:
//   kTileBytes                                   bytes of one feature's weights in a 64-k tile (in the stage)
//   Word                                         the element type of the weights in global memory (w)
//   row_stride(k)                                Words a feature (a row of w)
//   load<kFeatures, kThreads>(w, stride, w_area, j, n0, n_rows, tid)  this thread's cp.async copies of tile j
//   expand<SLABS>(w_lane, t, a)                  the A registers a[slab][k16 step][4] of a tile from the stage;
//                                                w_lane: this lane's row g of its first slab in the stage's W area
// Also here: the RS wgmma wrappers, the cp.async helpers, store_accumulators / finish_tile (shared with the
// warp-specialized kernel), the K split and a generic launcher. Torch-free.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "device_common.cuh"
#include "wgmma_common.cuh"

// WGMMA_SERIALIZE=1 (debug builds): wgmma.wait_group(0) + __syncthreads after every tile, i.e. no overlap of
// tiles: a result that changes with it points at the pipeline (a race), not at the fragment / swizzle layout.
#ifndef WGMMA_SERIALIZE
#define WGMMA_SERIALIZE 0
#endif

namespace bitcompile {
namespace cuda {

#if BC_WGMMA_ENABLED  // the device helpers of the kernel body (sm_90a code only)
// ---- wgmma.mma_async RS wrappers: D (fp32, BN / 2 registers) += A (4 registers) * B (descriptor) ----------------
// Operands after the descriptor: scale-d = 1 (accumulate: D starts zeroed), imm-scale-a = 1, imm-scale-b = 1,
// imm-trans-b = 0 (B K-major). One a (type, N): wgmma_rs_Bf16_n32 ... wgmma_rs_F16_n256; A_B: the operand numbers of
// A's 4 registers and B's descriptor after the N / 2 accumulators.
#define BC_WGMMA_RS_ONE(NAME, PTX, N, REGS, ACC, A_B)                                                             \
  __device__ __forceinline__ void wgmma_rs_##NAME##_n##N(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) { \
    asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " {" REGS "}, " A_B ", 1, 1, 1, 0;\n" \
                 : ACC("+f")                                                                                     \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));                                     \
  }
#define BC_WGMMA_RS_TYPES(N, REGS, ACC, A_B)           \
  BC_WGMMA_RS_ONE(Bf16, "bf16", N, REGS, ACC, A_B) \
  BC_WGMMA_RS_ONE(F16, "f16", N, REGS, ACC, A_B)
BC_WGMMA_RS_TYPES(32, BC_WG_REGS16, BC_WG_ACC16, "{%16, %17, %18, %19}, %20")
BC_WGMMA_RS_TYPES(64, BC_WG_REGS32, BC_WG_ACC32, "{%32, %33, %34, %35}, %36")
BC_WGMMA_RS_TYPES(128, BC_WG_REGS64, BC_WG_ACC64, "{%64, %65, %66, %67}, %68")
BC_WGMMA_RS_TYPES(192, BC_WG_REGS96, BC_WG_ACC96, "{%96, %97, %98, %99}, %100")
BC_WGMMA_RS_TYPES(256, BC_WG_REGS128, BC_WG_ACC128, "{%128, %129, %130, %131}, %132")
#undef BC_WGMMA_RS_TYPES
#undef BC_WGMMA_RS_ONE

template <typename T, int BN>
struct WgmmaRs;
#define BC_WGMMA_RS(TYPE, NAME, N)                                                                   \
  template <>                                                                                       \
  struct WgmmaRs<TYPE, N> {                                                                         \
    static __device__ __forceinline__ void run(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc) { \
      wgmma_rs_##NAME##_n##N(d, a, desc);                                                           \
    }                                                                                               \
  };
BC_WGMMA_RS(__nv_bfloat16, Bf16, 32)
BC_WGMMA_RS(__nv_bfloat16, Bf16, 64)
BC_WGMMA_RS(__nv_bfloat16, Bf16, 128)
BC_WGMMA_RS(__nv_bfloat16, Bf16, 192)
BC_WGMMA_RS(__nv_bfloat16, Bf16, 256)
BC_WGMMA_RS(__half, F16, 32)
BC_WGMMA_RS(__half, F16, 64)
BC_WGMMA_RS(__half, F16, 128)
BC_WGMMA_RS(__half, F16, 192)
BC_WGMMA_RS(__half, F16, 256)
#undef BC_WGMMA_RS

// Keeps the compiler from moving reads / writes of an accumulator across the asm statements around it (the
// wgmma asm's "+f" says the value is ready at issue; it is only ready after wgmma.wait_group).
__device__ __forceinline__ void fence_operand(float& v) { asm volatile("" : "+f"(v)::"memory"); }

__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_8(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif  // BC_WGMMA_ENABLED

#if BC_WGMMA_ENABLED
// The end of a block (both kernels), in two parts.
// store_accumulators: a consumer thread's accumulators (warpgroup wg's SLABS slabs of 64 features x BN rows, the
// wgmma D fragment) -> the fp32 tile partial[BN][kStride] in shared memory. The caller has made `partial` free (no
// wgmma or copy still reading or writing it).
template <int BN, int SLABS, int kStride>
__device__ __forceinline__ void store_accumulators(float* const partial, const float (&acc)[SLABS][BN / 2], int wg,
                                                   int warp, int g, int t) {
  constexpr int kAcc = BN / 2;
  // Accumulator (i) of slab `slab`: feature 64 (SLABS wg + slab) + 16 warp + g + 8 ((i >> 1) & 1),
  // x row 8 (i >> 2) + 2t + (i & 1) (the wgmma D fragment, as mma.sync's C per 8-column block).
#pragma unroll
  for (int slab = 0; slab < SLABS; ++slab)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int feature = 64 * (SLABS * wg + slab) + 16 * warp + g + 8 * ((i >> 1) & 1);
      const int row = 8 * (i >> 2) + 2 * t + (i & 1);
      partial[row * kStride + feature] = acc[slab][i];
    }
}

// finish_tile: kThreads threads (tid 0 .. kThreads - 1) after store_accumulators: with slices > 1 the cluster's
// blocks each sum their share of the tile over the cluster's ranks in rank order (deterministic, through DSMEM); the
// Epilogue; y with 16-byte stores (8 features) where N % 8 == 0 and y is 16-byte aligned, else element by element.
// Rows past M / features past N are not written. kNamedBarrier: the kThreads are not the whole block; they meet at
// named barrier 1 (slices == 1), and the block's other threads must take part in the two cluster barriers
// (slices > 1) on their own.
template <typename T, int BN, int kFeatures, int kThreads, int kStride, bool kNamedBarrier = false>
__device__ __forceinline__ void finish_tile(const float* const partial, int tid, int rank, int slices, int64_t m0,
                                            int64_t n0, int m_rows, int n_rows, const Epilogue& ep, T* __restrict__ out) {
  namespace cg = cooperative_groups;
  if (slices > 1) {
    cg::this_cluster().sync();  // every block's partial tile is written
  } else if (kNamedBarrier) {
    asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
  } else {
    __syncthreads();
  }
  const bool vector_out = (n_rows % 8 == 0) && ((reinterpret_cast<uintptr_t>(out) & 15u) == 0);
  if (vector_out) {
    constexpr int kGroups = kFeatures / 8;  // 8 features (16 bytes of y) an item
    for (int index = rank * kThreads + tid; index < BN * kGroups; index += slices * kThreads) {
      const int row = index / kGroups, group = index % kGroups;
      const int64_t m = m0 + row, n = n0 + group * 8;
      if (m >= m_rows || n >= n_rows) continue;  // n % 8 == 0 and n_rows % 8 == 0: all 8 inside
      float sum[8];
      const int offset = row * kStride + group * 8;
      if (slices > 1) {
        for (int v = 0; v < 8; ++v) sum[v] = 0.f;
        for (int r = 0; r < slices; ++r) {  // rank order: deterministic
          const float* peer = cg::this_cluster().map_shared_rank(partial, r) + offset;
          const float4 p0 = *reinterpret_cast<const float4*>(peer), p1 = *reinterpret_cast<const float4*>(peer + 4);
          sum[0] += p0.x, sum[1] += p0.y, sum[2] += p0.z, sum[3] += p0.w;
          sum[4] += p1.x, sum[5] += p1.y, sum[6] += p1.z, sum[7] += p1.w;
        }
      } else {
        const float4 p0 = *reinterpret_cast<const float4*>(partial + offset),
                     p1 = *reinterpret_cast<const float4*>(partial + offset + 4);
        sum[0] = p0.x, sum[1] = p0.y, sum[2] = p0.z, sum[3] = p0.w;
        sum[4] = p1.x, sum[5] = p1.y, sum[6] = p1.z, sum[7] = p1.w;
      }
      const float factor = row_factor(ep, m);
      alignas(16) T values[8];
#pragma unroll
      for (int v = 0; v < 8; ++v)
        values[v] = from_float<T>(epilogue_value(sum[v], factor, column_scale(ep, n + v), column_bias(ep, n + v)));
      *reinterpret_cast<uint4*>(out + m * n_rows + n) = *reinterpret_cast<const uint4*>(values);
    }
  } else {
    for (int index = rank * kThreads + tid; index < BN * kFeatures; index += slices * kThreads) {
      const int row = index / kFeatures, f = index % kFeatures;
      const int64_t m = m0 + row, n = n0 + f;
      if (m >= m_rows || n >= n_rows) continue;
      const int offset = row * kStride + f;
      float sum = 0.f;
      if (slices > 1) {
        for (int r = 0; r < slices; ++r) sum += cg::this_cluster().map_shared_rank(partial, r)[offset];
      } else {
        sum = partial[offset];
      }
      out[m * n_rows + n] = from_float<T>(epilogue_value(sum, row_factor(ep, m), column_scale(ep, n), column_bias(ep, n)));
    }
  }
  if (slices > 1) cg::this_cluster().sync();  // no block leaves while a peer still reads its tile
}
#endif  // BC_WGMMA_ENABLED

// The all-threads kernel's block: WGS warpgroups of SLABS 64-feature slabs, BN rows of x, kTileBytes of weights a
// feature a 64-k tile (sign bits 8, nibble codes 32).
template <int BN, int WGS, int SLABS, int kTileBytes = 8>
struct WgmmaShape {
  static constexpr int kThreads = 128 * WGS;
  static constexpr int kFeatures = 64 * SLABS * WGS;            // features a block
  static constexpr int kXBytes = BN * 128;                      // x tile: BN rows x 64 k x 2 bytes
  static constexpr int kWBytes = kFeatures * kTileBytes;        // W tile
  static constexpr int kStageBytes = (kXBytes + kWBytes + 1023) / 1024 * 1024;
  static constexpr int kStagesFit = (200 * 1024) / kStageBytes;
  static constexpr int kStages = kStagesFit > 12 ? 12 : kStagesFit;
  static constexpr int kPartialStride = kFeatures + 4;          // floats a row of the fp32 tile (+4: no conflicts)
  static constexpr int kPartialBytes = BN * kPartialStride * 4;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr size_t kSmemBytes = (kRingBytes > kPartialBytes ? kRingBytes : kPartialBytes) + 1024;  // + align
  static_assert(SLABS * BN <= 256, "accumulators: SLABS * BN / 2 registers a thread");
  static_assert(kStages >= 4, "the ring needs tile i, i + 1 in flight and i - 2 draining");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

#if BC_WGMMA_ENABLED
// The whole block of the all-threads kernel (binary_weight_wgmma.cu's header: "Pipeline"): the cp.async ring of x
// tiles and weight tiles, A from weights.expand, RS wgmmas, then store_accumulators and finish_tile.
template <typename T, int BN, int WGS, int SLABS, typename Weights>
__device__ __forceinline__ void wgmma_rs_block(const T* __restrict__ x, const typename Weights::Word* __restrict__ w,
                                               Weights weights, int m_rows, int n_rows, int k, int slices,
                                               Epilogue ep, T* __restrict__ out) {
  using Shape = WgmmaShape<BN, WGS, SLABS, Weights::kTileBytes>;
  constexpr int kThreads = Shape::kThreads, kFeatures = Shape::kFeatures, kStages = Shape::kStages;
  constexpr int kAcc = BN / 2;
  extern __shared__ uint8_t smem_raw[];
  // 1024-byte aligned ring (the swizzle atoms); the generic pointer and the shared address move together.
  const uint32_t raw_address = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t ring_address = (raw_address + 1023u) & ~1023u;
  uint8_t* const ring = smem_raw + (ring_address - raw_address);

  const int tid = threadIdx.x;
  const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int rank = static_cast<int>(blockIdx.x) % slices;       // the cluster is `slices` blocks along x
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / slices) * kFeatures;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * BN;
  const int64_t w_stride = Weights::row_stride(k);              // Words a row of w
  const int total_tiles = k / 64;
  const int per_slice = (total_tiles + slices - 1) / slices;
  const int tile_begin = rank * per_slice;
  const int tile_end = min(total_tiles, tile_begin + per_slice);
  const int tiles = max(0, tile_end - tile_begin);

  // Copies of tile j (absolute k tile) into stage s: x rows (16-byte chunks, swizzled), then the weights.
  auto load_tile = [&](int j, int s) {
    const uint32_t stage = ring_address + static_cast<uint32_t>(s * Shape::kStageBytes);
#pragma unroll
    for (int i = 0; i < (BN * 8 + kThreads - 1) / kThreads; ++i) {
      const int index = i * kThreads + tid;
      if (BN * 8 % kThreads == 0 || index < BN * 8) {
        const int r = index >> 3, c = index & 7;
        const int64_t row = m0 + r;
        const bool inside = row < m_rows;
        const T* src = x + (inside ? row : 0) * static_cast<int64_t>(k) + j * 64 + c * 8;
        cp_async_16(stage + r * 128 + ((c ^ (r & 7)) << 4), src, inside ? 16u : 0u);
      }
    }
    weights.template load<kFeatures, kThreads>(w, w_stride, stage + Shape::kXBytes, j, n0, n_rows, tid);
  };

  float acc[SLABS][kAcc];
#pragma unroll
  for (int s = 0; s < SLABS; ++s)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[s][i] = 0.f;

  // Prologue: tiles 0 .. kStages - 3 in flight (one group each, empty past the end).
#pragma unroll
  for (int s = 0; s < kStages - 2; ++s) {
    if (s < tiles) load_tile(tile_begin + s, s);
    cp_async_commit();
  }

  // This lane's W rows within a stage's W area: feature 64 (SLABS wg + slab) + 16 warp + g (and + 8). The offset
  // from a stage is taken once here: computed inside the tile step, ptxas redid it (and the ring alignment) every
  // tile and the W1A16 all-threads kernel ran 5-7% slower (H200, eleventh session).
  const int w_row = 64 * SLABS * wg + 16 * warp + g;
  const uint8_t* const w_lane = ring + Shape::kXBytes + w_row * Weights::kTileBytes;
  // Tile i: steps 1-6 of the header's pipeline; its A fragments into `a`.
  auto tile_step = [&](int i, uint32_t (&a)[SLABS][4][4]) {
    const int s = i % kStages;
    cp_async_wait<kStages - 3>();  // this thread's copies of tile i
    fence_proxy_async_shared();    // ... visible to the async proxy (wgmma)
    __syncthreads();               // everyone's; and tile i - 2's wgmmas are complete in every warpgroup
    if (i + kStages - 2 < tiles) load_tile(tile_begin + i + kStages - 2, (i + kStages - 2) % kStages);
    cp_async_commit();

    const uint32_t stage = ring_address + static_cast<uint32_t>(s * Shape::kStageBytes);
    weights.template expand<SLABS>(w_lane + s * Shape::kStageBytes, t, a);
#pragma unroll
    for (int slab = 0; slab < SLABS; ++slab)
#pragma unroll
      for (int v = 0; v < kAcc; ++v) fence_operand(acc[slab][v]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int slab = 0; slab < SLABS; ++slab)
        WgmmaRs<T, BN>::run(acc[slab], a[slab][kk], sw128_descriptor(stage + 32 * kk));
    wgmma_commit();
#pragma unroll
    for (int slab = 0; slab < SLABS; ++slab)
#pragma unroll
      for (int v = 0; v < kAcc; ++v) fence_operand(acc[slab][v]);
#if WGMMA_SERIALIZE
    wgmma_wait<0>();
    __syncthreads();
#else
    wgmma_wait<1>();
#endif
  };
  // The A registers of tile i must not be written until a wait_group covering tile i's wgmmas (PTX ISA,
  // wgmma.wait_group: "Accessing ... the input register containing the fragments of matrix A of a wgmma.mma_async
  // instruction without first performing a wgmma.wait_group ... that waits on a wgmma-group including that
  // wgmma.mma_async instruction is undefined behavior"). Tile i is still in flight (wait_group(1)) while tile i + 1
  // expands its A, so consecutive tiles alternate between two register sets: a0 is rewritten only after the
  // wait_group(1) that follows a1's commit, which completes a0's group. (One array declared inside a rolled loop is
  // ONE set of PTX registers: ptxas gave no warning but the SASS rewrote the in-flight HGMMA's A registers, e.g.
  // LDS.64 R56 / LOP3 R56.. of tile i + 1 before the DEPBAR that retires tile i's HGMMA ... R56.) With the two sets
  // ptxas keeps them apart (the loop body has two A ranges, no C7510 / C7513, no added WARPGROUP.DEPBAR gsb0 0x0):
  // check a build with benchmarks/kernels/hgmma_a_check.py.
  uint32_t a0[SLABS][4][4], a1[SLABS][4][4];  // [slab][k16 step][register]
  int i = 0;
  for (; i + 1 < tiles; i += 2) {
    tile_step(i, a0);
    tile_step(i + 1, a1);
  }
  if (i < tiles) tile_step(i, a0);
  wgmma_wait<0>();
#pragma unroll
  for (int slab = 0; slab < SLABS; ++slab)
#pragma unroll
    for (int v = 0; v < kAcc; ++v) fence_operand(acc[slab][v]);
  weights.template finish<SLABS, kAcc>(acc);  // the weights' scale that the A registers left out (if any)
  cp_async_wait<0>();
  __syncthreads();  // every warpgroup's wgmmas and copies are done: the ring becomes the fp32 tile

  float* const partial = reinterpret_cast<float*>(ring);
  store_accumulators<BN, SLABS, Shape::kPartialStride>(partial, acc, wg, warp, g, t);
  finish_tile<T, BN, kFeatures, kThreads, Shape::kPartialStride>(partial, tid, rank, slices, m0, n0, m_rows, n_rows, ep,
                                                                  out);
}
#endif  // BC_WGMMA_ENABLED

constexpr int kWgmmaMaxSlices = 8;  // a portable cluster

// Blocks in one wave of a grid of clusters of `size` blocks, one block an SM: the SMs, or fewer where clusters of
// that size leave SMs idle (cluster_room; 0 where that cluster is refused).
inline int64_t wave_blocks(int64_t size, int sm_count, const ClusterRoom& room) {
  if (size <= 1) return sm_count;
  return room.of(size) < sm_count ? room.of(size) : sm_count;
}

// Split K (a power of two, a cluster of at most 8, at most one slice a k tile): as asked, or while the grid of
// `blocks` tiles x slices stays within one wave (wave_blocks: H200 clusters of 4 hold 120 blocks, not 132; N = K =
// 4096, M = 256, the (256, 1) tile's 32 blocks x 4 slices took 43.9 us in two waves, x 2 slices 32.7 in one). Cut to
// the largest cluster the device co-schedules with the kernel.
inline int64_t split_k_slices(int64_t blocks, int64_t total_tiles, int sm_count, const ClusterRoom& room,
                              int slices_wanted) {
  int64_t slices = 1;
  while (slices * 2 <= kWgmmaMaxSlices && slices * 2 <= total_tiles &&
         (slices_wanted > 0 ? slices * 2 <= slices_wanted : blocks * slices * 2 <= wave_blocks(slices * 2, sm_count, room))) {
    slices *= 2;
  }
  return room.largest_within(slices);
}

// Readies the wgmma kernel `kernel` (block Shape) for its launches: the dynamic shared memory limit raised (once a
// device), then the room the device has for its clusters (cluster_room). The template takes the kernel itself, so its
// statics are that kernel's.
template <typename Shape, auto kernel>
cudaError_t prepare_wgmma_launch(ClusterRoom& room) {
  static unsigned long long smem_devices = 0;
  const cudaError_t error = allow_dynamic_smem(kernel, Shape::kSmemBytes, smem_devices);
  if (error != cudaSuccess) return error;
  static ClusterRoomCache rooms = {};
  room = cluster_room(kernel, Shape::kThreads, Shape::kSmemBytes, rooms);
  return cudaSuccess;
}

// Launches an all-threads kernel `kernel` (parameters x, w, m_rows, n_rows, k, slices, ep, out; its block Shape) over
// ceil(N / FEAT) feature blocks x ceil(M / BN) row blocks, K split by split_k_slices (a cluster the device fits,
// one wave by cluster_room; one block a feature block where a cluster is refused all the same).
template <typename Shape, auto kernel, typename T, typename W>
cudaError_t wgmma_rs_launch(const T* x, W w, int64_t m_rows, int64_t n_rows, int64_t k, const Epilogue& ep, T* out,
                            int sm_count, int slices_wanted, cudaStream_t stream) {
  constexpr int BN = Shape::kXBytes / 128;
  const int64_t feature_blocks = ceil_div(n_rows, Shape::kFeatures);
  const int64_t row_blocks = ceil_div(m_rows, BN);
  const int64_t total_tiles = k / 64;
  if (row_blocks > 65535 || feature_blocks * kWgmmaMaxSlices > INT_MAX) return cudaErrorNotSupported;
  ClusterRoom room;
  cudaError_t error = prepare_wgmma_launch<Shape, kernel>(room);
  if (error != cudaSuccess) return error;
  const int64_t slices = split_k_slices(feature_blocks * row_blocks, total_tiles, sm_count, room, slices_wanted);
  auto launch = [&](int64_t cluster) {
    const ClusterLaunch config(dim3(static_cast<unsigned>(feature_blocks * cluster), static_cast<unsigned>(row_blocks), 1),
                               Shape::kThreads, Shape::kSmemBytes, cluster, stream);
    return cudaLaunchKernelEx(&config.config, kernel, x, w, static_cast<int>(m_rows), static_cast<int>(n_rows),
                              static_cast<int>(k), static_cast<int>(cluster), ep, out);
  };
  error = launch(slices);
  if (error != cudaSuccess && slices > 1) {
    (void)cudaGetLastError();  // a cluster refused all the same: one block a feature block, over the whole K
    error = launch(1);
  }
  return error != cudaSuccess ? error : cudaGetLastError();
}

}  // namespace cuda
}  // namespace bitcompile
