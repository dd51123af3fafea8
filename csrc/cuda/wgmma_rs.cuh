// The RS-form wgmma pieces of the W1A16-style kernels (binary_weight_wgmma.cu: sign bits; apot_wgmma.cu: 4-bit APoT
// codes), under wgmma_ws.cuh's warp-specialized block: the RS wgmma wrappers (A = 64 output features x 16 k in
// registers, B = BN rows of x in shared memory through a 128-byte-swizzle descriptor, fp32 D), the cp.async helpers,
// the end of a block (store_accumulators, finish_tile: the fp32 tile, cluster split-K through DSMEM, the Epilogue)
// and the K split (split_k_slices, prepare_wgmma_launch). The operands' roles and layouts are binary_weight_wgmma.cu's
// header comment. (Until 2026-12-04 an all-threads block lived here too, a cp.async ring that every thread fed; the
// warp-specialized block beat it at every M the ops send to wgmma, and it was deleted: benchmarks/NOTES.md.)
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

// WGMMA_SERIALIZE=1 (debug builds): wgmma_ws.cuh's consumers keep no wgmma step in flight while the next is expanded:
// a result that changes with it points at the pipeline (a race), not at the fragment / swizzle layout.
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

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_8(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

#endif  // BC_WGMMA_ENABLED

#if BC_WGMMA_ENABLED
// The end of a block, in two parts.
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

constexpr int kWgmmaMaxSlices = ClusterRoom::kLargest;  // a portable cluster

// Blocks in one wave of a grid of clusters of `size` blocks, one block an SM: the SMs, or fewer where clusters of
// that size leave SMs idle (cluster_room; 0 where that cluster is refused).
inline int64_t wave_blocks(int64_t size, int sm_count, const ClusterRoom& room) {
  if (size <= 1) return sm_count;
  return room.of(size) < sm_count ? room.of(size) : sm_count;
}

// Split K (a cluster of at most 8 blocks, at most one slice a 128-k tile): as asked, cut to the largest cluster the
// device co-schedules with the kernel; else the most slices, of any count 2 to 8, whose grid of `blocks` tiles x
// slices stays within one wave (wave_blocks: H200 clusters of 4 hold 120 blocks, not 132; N = K = 4096, M = 256, the
// (256, 1) tile's 32 blocks x 4 slices took 43.9 us in two waves, x 2 slices 32.7 in one). Not only powers of two:
// 32 blocks x 3 slices fill 96 SMs where x 2 fill 64 and x 4 take two waves (H200, graph us, 2026-12-04,
// pending/odd_slices.sweep: 4096 x 11008 W1A16 M = 32 (32, 1) 27.4 -> 20.4, M = 96 (128, 1) 37.0 -> 28.2; apot4 M = 32
// 45.8 -> 32.8, M = 96 56.6 -> 41.2; 4096^2 W1A16 M = 32 12.7 -> 10.5).
inline int64_t split_k_slices(int64_t blocks, int64_t total_tiles, int sm_count, const ClusterRoom& room,
                              int slices_wanted) {
  const int64_t most = total_tiles < kWgmmaMaxSlices ? total_tiles : kWgmmaMaxSlices;
  if (slices_wanted > 0) {
    int64_t slices = slices_wanted < most ? slices_wanted : most;
    while (slices > 1 && room.of(slices) == 0) --slices;
    return slices > 1 ? slices : 1;
  }
  int64_t slices = 1;
  for (int64_t s = 2; s <= most; ++s) {
    if (blocks * s <= wave_blocks(s, sm_count, room)) slices = s;
  }
  return slices;
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

}  // namespace cuda
}  // namespace bitcompile
