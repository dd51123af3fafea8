// binary_weight_linear for few rows of x (decoding, M <= 32) on Hopper's b1 wgmma: x as 24 fixed-point bit planes a
// row, W's sign bits as they are, wgmma.mma_async m64nNk256 .b1 AND.POPC with both operands staged by TMA. Torch-free;
// sm_90a code (BITCOMPILE_SM90A). launch_binary_weight_linear (binary_weight_linear.cu) calls it.
//
// ---- Math ------------------------------------------------------------------------------------------------------
// x_row_planes_kernel scales row m of x by 2^shift_m from the row's largest |x| (|xq| < 2^22, xq = rint(x 2^shift))
// and writes the P = 24 two's-complement bit planes of xq as rows 24 m + p of a bit matrix of K columns (the layout
// of W's packed rows), with the sum of xq over every 1024-k stage. For a K slice of stages,
//   sum_k x[k] s(w[k]) = 2^-shift (2 sum_p coef_p popc(w & plane_p) - sum_k xq[k]),  coef_p = 2^p, coef_23 = -2^23,
// exactly: the popcounts come from the tensor cores as s32, the combination in int64 / fp64 once a slice (not once a
// chunk as binary_weight_planes' 512-value chunks, whose per-chunk scale costs ~50 integer operations a row and
// chunk: the reason that kernel loses from M = 4 on). A value of at least 2^-14 of its row's largest |x| is exact
// (bf16; fp16: 2^-11), a smaller one is rounded by at most 2^-23 of the largest: the error of the whole dot is at
// most K 2^-23 max|x| |alpha|, the order of fp32 summation's own bound.
//
// ---- Tiles -----------------------------------------------------------------------------------------------------
// A block: 128 SLABS features (2 consumer warpgroups of SLABS 64-feature slabs; A = W rows, 64 a wgmma) x MR rows of
// x (B = their 24 MR plane rows, in kSub wgmmas of N = 24 MR / kSub <= 192). A stage is 1024 k: 128 bytes a row of
// both operands (one 128-byte swizzle span, the K-major SW128 layout of binary_linear_wgmma.cu, whose header has the
// descriptor details), 4 k256 steps. Accumulators: SLABS x 12 MR s32 a thread.
// Roles (384 threads, as wgmma_ws.cuh): warps 0-7 consumers, warp 8 lane 0 the producer (TMA), warp 9 reads the
// slice's stage sums and row shifts while the consumers run, warps 10-11 only take part in the cluster barriers. K
// is split over a cluster of `slices` blocks, reduced through DSMEM (finish_tile, wgmma_rs.cuh).
// Dependent launch: the GEMM kernel starts while x_row_planes_kernel runs, issues its first S stages' W copies,
// then waits (griddepcontrol.wait) for the planes. x_row_planes_kernel is launched dependent too, but waits for the
// previous grid before it lets the GEMM kernel start, so everything before it on the stream (W included) is complete
// when the GEMM kernel starts.
//
// ---- Protocol (S stages; tile i of the slice in stage s = i % S) --------------------------------------------------
//   full[s] count 1: the producer's arrive.expect_tx (the whole stage: W box + plane boxes; out-of-bound box
//           elements are zero-filled and counted), completed by the TMA copies.
//   empty[s] count 8: lane 0 of each consumer warp, once the stage's wgmmas are complete (wait_group 1 after the
//           next stage's commit).
//   The last tile of a slice is never released. After the loop: wait_group 0, named barrier 2 (256 consumers and
//   warp 9, which arrives once its sums and shifts are in shared memory), the fp32 tile aliases the ring.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "binary_weight_wgmma.cuh"
#include "device_common.cuh"
#include "wgmma_common.cuh"
#include "wgmma_rs.cuh"

namespace bitcompile {
namespace cuda {
namespace {

constexpr int kRowPlanes = 24;           // planes a row of x
constexpr int kRowPlanesNonFinite = 1000;  // row_shift of a row with an Inf or NaN: its outputs become NaN
constexpr int kPwStageWords = 32;        // 1024 k a stage: 128 bytes a row
constexpr int kPwMaxStages = 2048;       // K <= 2^21
constexpr int kXRowPlanesThreads = 1024;  // 32 warps: warp w takes word w of each of the block's stages
constexpr int kXRowBlocksPerRow = 16;    // x_row_planes_kernel's blocks a row at most (each reads the whole row)

// The workspace, each part from a 16-byte boundary: planes [24 M][words] u32, row_shift [M] int, stage sums
// [M][stages] int64. One layout gives both the parts and the bytes (workspace may be null for the bytes alone).
struct PlanesWgmmaWorkspace {
  uint32_t* planes;
  int* row_shift;
  long long* stage_sums;
  size_t bytes;
};
inline PlanesWgmmaWorkspace planes_wgmma_workspace(void* workspace, int64_t m_rows, int64_t k) {
  const int64_t words = ceil_div(k, 32), stages = ceil_div(words, kPwStageWords);
  auto round16 = [](int64_t bytes) { return static_cast<size_t>(ceil_div(bytes, 16) * 16); };
  const size_t shift_at = round16(kRowPlanes * m_rows * words * 4), sums_at = shift_at + round16(m_rows * 4);
  const uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
  return {reinterpret_cast<uint32_t*>(base), reinterpret_cast<int*>(base + shift_at),
          reinterpret_cast<long long*>(base + sums_at), sums_at + static_cast<size_t>(m_rows * stages) * 8};
}

// A block a 1024-k stage of a row of x, or a few where the row has more than kXRowBlocksPerRow stages (grid:
// ceil(stages / stages_per_block) x rows). Every block first finds the row's largest |x| (and whether all are
// finite) over the whole row: K 2-byte reads from L2, 16 bytes a thread a load where rows are 16-byte aligned (so
// at most kXRowBlocksPerRow reads of each row); then, for each of its stages j, lane i of warp w takes value
// 1024 j + 32 w + i: a 32 x 32 bit transpose (lane p < 24 stores plane p's word) and the stage's sum of xq. (One
// block a row, looping over all the stages, put ~8 of those rounds in series on the M = 1 critical path at K = 8192.)
template <typename T>
__global__ __launch_bounds__(kXRowPlanesThreads) void x_row_planes_kernel(const T* __restrict__ x, int k, int words,
                                                                          int stages, int stages_per_block,
                                                                          uint32_t* __restrict__ planes,
                                                                          int* __restrict__ row_shift,
                                                                          long long* __restrict__ stage_sums) {
  static_assert(sizeof(T) == 2, "bf16 / fp16 x");
  wait_for_prerequisite_grid();  // the previous grid (launched dependent): before x is read or the workspace written
  launch_dependents();           // the GEMM kernel may start: it waits for this grid before reading the planes
  __shared__ uint32_t warp_largest[32];  // bits of each warp's largest |x|
  __shared__ int warp_sum[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t m = blockIdx.y;
  const T* row = x + m * k;
  float largest = 0.f;
  bool finite = true;
  if (k % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0) {
    for (int i = threadIdx.x * 8; i < k; i += kXRowPlanesThreads * 8) {
      union {
        uint4 vector;
        T values[8];
      } piece;
      piece.vector = *reinterpret_cast<const uint4*>(row + i);
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        const float value = to_float(piece.values[v]);
        largest = fmaxf(largest, fabsf(value));  // NaN: fmaxf keeps the other operand; `finite` marks the row
        finite = finite && isfinite(value);
      }
    }
  } else {
    for (int i = threadIdx.x; i < k; i += kXRowPlanesThreads) {
      const float value = to_float(row[i]);
      largest = fmaxf(largest, fabsf(value));
      finite = finite && isfinite(value);
    }
  }
  // largest >= 0 (fmaxf drops NaN), so its bits order as its values: one redux.sync a warp, not five shuffles
  const uint32_t warp_bits = __reduce_max_sync(kFullMask, __float_as_uint(largest));
  if (lane == 0) warp_largest[warp] = warp_bits;
  const bool all_finite = __syncthreads_and(finite) != 0;  // also publishes warp_largest
  largest = __uint_as_float(__reduce_max_sync(kFullMask, warp_largest[lane]));
  // |xq| < 2^(P-2): largest < 2^e, shift = P - 2 - e, kept where 2^shift is a normal float.
  int e = 0;
  (void)frexpf(largest, &e);
  int shift = kRowPlanes - 2 - e;
  shift = shift > 126 ? 126 : (shift < -126 ? -126 : shift);
  const float factor = __int_as_float((shift + 127) << 23);
  // Stages j0, j0 + 1, ... of the block (stages_per_block of them: at most kXRowBlocksPerRow blocks a row).
  const int j0 = blockIdx.x * stages_per_block, j1 = min(stages, j0 + stages_per_block);
  for (int j = j0; j < j1; ++j) {
    const int word = j * kPwStageWords + warp;
    const int kk = word * 32 + lane;
    const float v = kk < k ? to_float(row[kk]) : 0.f;
    const int q = all_finite ? __float2int_rn(v * factor) : 0;
    const uint32_t plane_word = transpose_bits(static_cast<uint32_t>(q), lane);  // lane p: plane p's word
    if (word < words && lane < kRowPlanes) planes[(m * kRowPlanes + lane) * words + word] = plane_word;
    const int sum = __reduce_add_sync(kFullMask, q);  // |sum| < 32 * 2^22
    if (lane == 0) warp_sum[warp] = sum;
    __syncthreads();
    if (warp == 0) {  // 32 warp sums of |.| < 2^27 may pass 2^31: summed as high and low 16-bit parts, exactly
      const int part = warp_sum[lane];
      const int high = __reduce_add_sync(kFullMask, part >> 16), low = __reduce_add_sync(kFullMask, part & 0xffff);
      if (lane == 0) stage_sums[m * stages + j] = static_cast<long long>(high) * 65536 + low;
    }
    __syncthreads();  // warp_sum is reused by the next stage
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) row_shift[m] = all_finite ? shift : kRowPlanesNonFinite;
}

template <int MR, int SLABS>
struct PwShape {
  static constexpr int kConsumerThreads = 256;
  static constexpr int kThreads = kConsumerThreads + 128;
  static constexpr int kFeatures = 128 * SLABS;
  static constexpr int kPlaneRows = kRowPlanes * MR;
  static constexpr int kSub = MR > 8 ? 2 : 1;             // wgmmas a slab a k step (N <= 192 each)
  static constexpr int kN = kPlaneRows / kSub;            // 24, 48, 96 or 192
  static constexpr int kRowsPerSub = MR / kSub;
  static constexpr int kWBytes = kFeatures * 128;
  static constexpr int kStageBytes = (kFeatures + kPlaneRows) * 128;  // a multiple of 1024 (boxes 1024-aligned)
  static constexpr int kPartialStride = kFeatures + 4;
  static constexpr int kPartialBytes = MR * kPartialStride * 4;
  static constexpr int kStagesFit = (227 * 1024 - 1024 - 256) / kStageBytes;
  static constexpr int kStages = kStagesFit > 8 ? 8 : kStagesFit;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr int kBarOffset = kRingBytes > kPartialBytes ? kRingBytes : kPartialBytes;
  static constexpr size_t kSmemBytes = kBarOffset + 16 * kStages + 1024;
  static_assert(kStages >= 2, "ring depth");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static_assert(kN % 24 == 0 && kN <= 192, "a row's planes in one wgmma");
  static_assert(SLABS * kPlaneRows / 2 <= 192, "accumulators");
};


// The GEMM kernel (the header's Tiles and Protocol). Grid: x = feature blocks x slices (a cluster of `slices` along
// x), y = groups of MR rows of x.
template <typename T, int MR, int SLABS>
__global__ void __launch_bounds__(384, 1)
    binary_weight_planes_wgmma_kernel(const __grid_constant__ CUtensorMap map_w,
                                      const __grid_constant__ CUtensorMap map_p,
                                      const int* __restrict__ row_shift, const long long* __restrict__ stage_sums,
                                      int m_rows, int n_rows, int stages_total, int slices, Epilogue ep,
                                      T* __restrict__ out) {
#if BC_WGMMA_ENABLED
  using Shape = PwShape<MR, SLABS>;
  constexpr int S = Shape::kStages, kFeatures = Shape::kFeatures, kSub = Shape::kSub, kN = Shape::kN;
  extern __shared__ uint8_t smem_raw[];
  __shared__ double slice_x_sum[MR];  // sum of xq over the slice, a row
  __shared__ int slice_shift[MR];
  const uint32_t raw_address = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw_address + 1023u) & ~1023u;
  uint8_t* const smem = smem_raw + (base - raw_address);
  const uint32_t full_bar = base + Shape::kBarOffset, empty_bar = full_bar + 8 * S;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rank = static_cast<int>(blockIdx.x) % slices;
  const int per_slice = (stages_total + slices - 1) / slices;
  const int stage_begin = rank * per_slice;
  const int tiles = max(0, min(stages_total, stage_begin + per_slice) - stage_begin);
  const int n0 = static_cast<int>(blockIdx.x / slices) * kFeatures;
  const int m0 = static_cast<int>(blockIdx.y) * MR;

  if (tid == 0) init_stage_ring(full_bar, empty_bar, S, 1, 8);  // empty: the 8 consumer warps
  __syncthreads();
  namespace cg = cooperative_groups;

  if (warp >= 8) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (warp == 8 && lane == 0) {
      auto stage_address = [&](int s) { return base + static_cast<uint32_t>(s * Shape::kStageBytes); };
      auto load_planes = [&](int i) {
        const int s = i % S, j = stage_begin + i;
#pragma unroll
        for (int sub = 0; sub < kSub; ++sub)
          tma_load_2d(stage_address(s) + Shape::kWBytes + sub * kN * 128, &map_p, j * kPwStageWords,
                      kRowPlanes * m0 + sub * kN, full_bar + 8 * s);
      };
      // The first S stages' W before the wait (W is not the previous grid's output: header), their planes after.
      const int first = tiles < S ? tiles : S;
      for (int i = 0; i < first; ++i) {
        mbar_arrive_expect_tx(full_bar + 8 * i, Shape::kStageBytes);
        tma_load_2d(stage_address(i), &map_w, (stage_begin + i) * kPwStageWords, n0, full_bar + 8 * i);
      }
      wait_for_prerequisite_grid();
      for (int i = 0; i < first; ++i) load_planes(i);
      for (int i = S; i < tiles; ++i) {
        const int s = i % S;
        mbar_wait(empty_bar + 8 * s, ((i / S) - 1) & 1u, 0, i);
        mbar_arrive_expect_tx(full_bar + 8 * s, Shape::kStageBytes);
        tma_load_2d(stage_address(s), &map_w, (stage_begin + i) * kPwStageWords, n0, full_bar + 8 * s);
        load_planes(i);
      }
    }
    if (warp == 9) {  // while the consumers run: the slice's sum of xq and the shift of each row (x_row_planes')
      if (lane < MR) {
        wait_for_prerequisite_grid();
        const int64_t m = static_cast<int64_t>(m0) + lane;
        long long sum = 0;
        int shift = 0;
        if (m < m_rows) {
          for (int j = 0; j < tiles; ++j) sum += stage_sums[m * stages_total + stage_begin + j];
          shift = row_shift[m];
        }
        slice_x_sum[lane] = static_cast<double>(sum);  // |sum| < K 2^22 < 2^53: exact
        slice_shift[lane] = shift;
      }
      asm volatile("bar.arrive 2, %0;\n" ::"n"(Shape::kConsumerThreads + 32) : "memory");
    }
    if (slices > 1) {  // the two cluster barriers of finish_tile
      cg::this_cluster().sync();
      cg::this_cluster().sync();
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int wg = warp >> 2, g = lane >> 2, t = lane & 3;
    int acc[SLABS][kSub][kN / 2];
#pragma unroll
    for (int slab = 0; slab < SLABS; ++slab)
#pragma unroll
      for (int sub = 0; sub < kSub; ++sub)
#pragma unroll
        for (int v = 0; v < kN / 2; ++v) acc[slab][sub][v] = 0;
    for (int i = 0; i < tiles; ++i) {
      const int s = i % S;
      mbar_wait(full_bar + 8 * s, (i / S) & 1u, 1, i);
      const uint32_t stage = base + static_cast<uint32_t>(s * Shape::kStageBytes);
#pragma unroll
      for (int slab = 0; slab < SLABS; ++slab)
#pragma unroll
        for (int sub = 0; sub < kSub; ++sub) b1::fence_accumulators(acc[slab][sub]);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int slab = 0; slab < SLABS; ++slab) {
          const uint64_t desc_a = sw128_descriptor(stage + (64 * (SLABS * wg + slab)) * 128 + 32 * kk);
#pragma unroll
          for (int sub = 0; sub < kSub; ++sub) {
            const uint64_t desc_b = sw128_descriptor(stage + Shape::kWBytes + sub * kN * 128 + 32 * kk);
            b1::wgmma_and_popc<kN>(acc[slab][sub], desc_a, desc_b);
          }
        }
      }
      wgmma_commit();
#pragma unroll
      for (int slab = 0; slab < SLABS; ++slab)
#pragma unroll
        for (int sub = 0; sub < kSub; ++sub) b1::fence_accumulators(acc[slab][sub]);
      wgmma_wait<1>();  // stage i - 1's wgmmas are complete
      if (i > 0 && lane == 0) mbar_arrive(empty_bar + 8 * ((i - 1) % S));
    }
    wgmma_wait<0>();
#pragma unroll
    for (int slab = 0; slab < SLABS; ++slab)
#pragma unroll
      for (int sub = 0; sub < kSub; ++sub) b1::fence_accumulators(acc[slab][sub]);
    // Every consumer's wgmmas are complete (and with them every copy): the ring becomes the fp32 tile; warp 9's
    // slice sums and shifts are in.
    asm volatile("bar.sync 2, %0;\n" ::"n"(Shape::kConsumerThreads + 32) : "memory");
    float* const partial = reinterpret_cast<float*>(smem);
    // Row r of the tile: columns 24 r .. 24 r + 23 of plane sub-tile r / kRowsPerSub, i.e. 8-column groups
    // i0 + j (i0 = 3 (r % kRowsPerSub), j = 0..2); this lane holds planes p = 8 j + 2 t + e (e = 0, 1) of features
    // g (accumulators 4 i + e, h = 0) and g + 8 (4 i + 2 + e, h = 1). sum_p coef_p count_p of (r, h) is
    // sum_j 2^(8 j) part_j, part_j = sum over the quad's lanes t of 4^t (c_j0 + 2 c_j1) (the top plane, j = 2 t = 3
    // e = 1, negative): |part_j| <= 255 x the slice's k < 2^29, int32. The quad sums the parts of 4 (r, h) pairs at a
    // time, reduce-scatter (lane t keeps pair t: 3 shuffles a part, no branch), and each lane combines its own pair in
    // int64 / fp64 (exact), so the fp64 work is done once a pair, not by a quad's every lane. (The form before, a
    // pair's int64 sum, two fp64 shuffles and a t == 0 branch, took 2.27 us of M = 16 8192^2 and 4.7 of the 16-row
    // tiles by knockout; H100 graph us, before -> now: M = 16 8192^2 13.18 -> 12.03, M = 32 18.69 -> 16.36, 16384^2
    // M = 16 27.58 -> 25.32, 28672 x 8192 M = 32 58.32 -> 48.99, M = 3 10.68 -> 10.08.)
    const int lane_weight = 1 << (2 * t), top_weight = t == 3 ? -2 * lane_weight : 2 * lane_weight;
    const bool odd = (t & 1) != 0, high = (t & 2) != 0;
    auto quad_reduce_scatter = [&](const int(&v)[4]) {  // lane t: sum over the quad of v[t]
      const int a = (odd ? v[1] : v[0]) + __shfl_xor_sync(kFullMask, odd ? v[0] : v[1], 1);
      const int b = (odd ? v[3] : v[2]) + __shfl_xor_sync(kFullMask, odd ? v[2] : v[3], 1);
      return (high ? b : a) + __shfl_xor_sync(kFullMask, high ? a : b, 2);
    };
    constexpr int kPairs = 2 * MR;  // (r, h) pairs of a slab: pair q = 2 r + h
#pragma unroll
    for (int slab = 0; slab < SLABS; ++slab) {
#pragma unroll
      for (int q0 = 0; q0 < kPairs; q0 += 4) {
        int part[3];
#pragma unroll
        for (int j = 0; j < 3; ++j) {
          int v[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int q = q0 + u, r = q / 2, h = q % 2;
            if (q < kPairs) {
              const int sub = r / Shape::kRowsPerSub, i = 3 * (r % Shape::kRowsPerSub) + j;
              v[u] = acc[slab][sub][4 * i + 2 * h] * lane_weight +
                     acc[slab][sub][4 * i + 2 * h + 1] * (j == 2 ? top_weight : 2 * lane_weight);
            } else {
              v[u] = 0;  // MR = 1: two pairs, lanes 2 and 3 get none
            }
          }
          part[j] = quad_reduce_scatter(v);
        }
        const int q = q0 + t, r = q / 2, h = q % 2;
        if (kPairs % 4 == 0 || q < kPairs) {
          const long long count_sum = part[0] + part[1] * 256ll + part[2] * 65536ll;
          const int shift = slice_shift[r];
          const double dot = 2.0 * static_cast<double>(count_sum) - slice_x_sum[r];  // the slice's sum of xq s(w)
          const double unit = __longlong_as_double(static_cast<long long>(1023 - shift) << 52);  // 2^-shift
          const float value =
              shift == kRowPlanesNonFinite ? __int_as_float(0x7fc00000) : static_cast<float>(dot * unit);
          partial[r * Shape::kPartialStride + 64 * (SLABS * wg + slab) + 16 * (warp & 3) + g + 8 * h] = value;
        }
      }
    }
    finish_tile<T, MR, kFeatures, Shape::kConsumerThreads, Shape::kPartialStride, true>(
        partial, tid, rank, slices, m0, n0, m_rows, n_rows, ep, out);
  }
#else
  __trap();  // no sm_90a code: never launched (binary_weight_planes_wgmma_applies)
#endif
}

// One (MR, SLABS) instantiation: shared memory opt-in, cluster room, K split, tensor maps, the two launches.
template <typename T, int MR, int SLABS>
cudaError_t planes_wgmma_launch(const T* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows, int64_t k,
                                const Epilogue& ep, T* out, int sm_count, int slices_wanted,
                                const PlanesWgmmaWorkspace& ws, cudaStream_t stream) {
  using Shape = PwShape<MR, SLABS>;
  constexpr auto kernel = binary_weight_planes_wgmma_kernel<T, MR, SLABS>;
  const int64_t words = ceil_div(k, 32), stages = ceil_div(words, kPwStageWords);
  const int64_t feature_blocks = ceil_div(n_rows, Shape::kFeatures), row_groups = ceil_div(m_rows, MR);
  if (m_rows > 65535 || feature_blocks * kWgmmaMaxSlices > INT_MAX) return cudaErrorNotSupported;
  ClusterRoom room;
  cudaError_t error = prepare_wgmma_launch<Shape, kernel>(room);
  if (error != cudaSuccess) return error;
  const int64_t slices = split_k_slices(feature_blocks * row_groups, stages, sm_count, room, slices_wanted);
  CUtensorMap map_w, map_p;
  if (!encode_sw128_map(&map_w, CU_TENSOR_MAP_DATA_TYPE_UINT32, w_bits, n_rows, words, words * 4, kPwStageWords,
                        Shape::kFeatures) ||
      !encode_sw128_map(&map_p, CU_TENSOR_MAP_DATA_TYPE_UINT32, ws.planes, kRowPlanes * m_rows, words, words * 4,
                        kPwStageWords, Shape::kN)) {
    return cudaErrorNotSupported;
  }
  const int64_t stages_per_block = ceil_div(stages, kXRowBlocksPerRow);
  const dim3 row_grid(static_cast<unsigned>(ceil_div(stages, stages_per_block)), static_cast<unsigned>(m_rows));
  {
    // Launched dependent: its launch overlaps the previous kernel's tail; it waits for that grid before reading x or
    // writing the workspace, and lets the GEMM kernel start only then (so W, too, is complete by then).
    const ClusterLaunch row_launch(row_grid, kXRowPlanesThreads, 0, 1, stream, /*dependent=*/true);
    error = cudaLaunchKernelEx(&row_launch.config, x_row_planes_kernel<T>, x, static_cast<int>(k),
                               static_cast<int>(words), static_cast<int>(stages), static_cast<int>(stages_per_block),
                               ws.planes, ws.row_shift, ws.stage_sums);
    if (error != cudaSuccess) return error;
  }
  auto launch = [&](int64_t size) {
    const ClusterLaunch config(dim3(static_cast<unsigned>(feature_blocks * size), static_cast<unsigned>(row_groups), 1),
                               Shape::kThreads, Shape::kSmemBytes, size, stream, /*dependent=*/true);
    return cudaLaunchKernelEx(&config.config, kernel, map_w, map_p, static_cast<const int*>(ws.row_shift),
                              static_cast<const long long*>(ws.stage_sums), static_cast<int>(m_rows),
                              static_cast<int>(n_rows), static_cast<int>(stages), static_cast<int>(size), ep, out);
  };
  error = launch(slices);
  if (error != cudaSuccess && slices > 1) {
    (void)cudaGetLastError();
    error = launch(1);  // a cluster refused all the same: one block a feature block, over the whole K
  }
  return error != cudaSuccess ? error : cudaGetLastError();
}

// The tile plan. MR from the rows of x: the smallest of 1, 2, 4, 8, 16 holding them, except that more than 4 rows
// take the smallest tile of 4 or 8 rows whose blocks of 128 features still fit one wave (more blocks than the
// default tile, each over the whole K), or, past 16 rows, 8-row tiles where they pad fewer rows than 16-row ones.
// H200 graph us, default tile / the plan's: 8192^2 M = 8 11.54 / 10.76 (4 rows), M = 12 15.76 / 12.48 (8), M = 16
// 15.94 / 13.10 (8); 4096 x 11008 M = 8 11.35 / 10.79 (4), M = 12 14.30 (8) / 11.49 (4), M = 16 17.24 / 12.36 (4),
// M = 32 20.90 / 17.41 (8); 8192 x 28672 M = 16 30.70 / 27.61 (8), but M = 5 22.33 / 24.01 and M = 8 20.15 / 20.49
// (4: the losses measured; fitting them would mean a K bound from one shape). At 16384^2 M = 16,
// 128 blocks of 16 rows are already a wave: 27.45 (256-feature blocks of 8 rows 27.75). Past 16 rows, 8192^2 M = 20
// 19.65 / 18.22, M = 24 18.41 / 18.36; 16384^2 M = 20 63.75 / 50.49; 28672 x 8192 M = 20 64.70 / 49.53; M = 32, a
// tie in padding, 16: 8192^2 19.19 (8 rows 19.60), 16384^2 51.84 (52.52), 28672 x 8192 58.48 (61.28). Not at 4 rows:
// 2-row tiles lost at every shape tried (8192^2 M = 4 8.86 / 9.50, 4096 x 11008 9.39 / 9.72).
// tuning.rows_per_pass forces MR (the smallest of 1..16 holding it). Slabs: tuning.slabs (1 or 2; 0: 2 where MR < 16
// and blocks of 128 features would take more than one wave, e.g. 22016 x 4096, else 1).
template <typename T>
cudaError_t planes_wgmma_dispatch(const T* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows, int64_t k,
                                  const Epilogue& ep, T* out, int sm_count, const WeightLinearTuning& tuning,
                                  const PlanesWgmmaWorkspace& ws, cudaStream_t stream) {
  const int64_t wanted = tuning.rows_per_pass > 0 ? tuning.rows_per_pass : m_rows;
  int mr = wanted <= 1 ? 1 : wanted <= 2 ? 2 : wanted <= 4 ? 4 : wanted <= 8 ? 8 : 16;
  const int64_t feature_blocks = ceil_div(n_rows, 128);
  auto fits_wave = [&](int rows) { return feature_blocks * ceil_div(m_rows, rows) <= sm_count; };
  if (tuning.rows_per_pass <= 0 && m_rows > 4) {
    if (fits_wave(4)) {
      mr = 4;
    } else if (m_rows > 8 && (fits_wave(8) || ceil_div(m_rows, 8) * 8 < ceil_div(m_rows, 16) * 16)) {
      mr = 8;
    }
  }
  const bool past_wave = feature_blocks * ceil_div(m_rows, mr) > sm_count;
  const int slabs = tuning.slabs > 0 ? tuning.slabs : (mr < 16 && past_wave ? 2 : 1);
  if (slabs > 2 || (mr == 16 && slabs == 2)) return cudaErrorInvalidValue;
#define PW_CASE(MR, SLABS)                                                                                        \
  if (mr == MR && slabs == SLABS)                                                                                 \
    return planes_wgmma_launch<T, MR, SLABS>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, tuning.slices, ws, \
                                             stream);
  PW_CASE(1, 1) PW_CASE(1, 2) PW_CASE(2, 1) PW_CASE(2, 2) PW_CASE(4, 1) PW_CASE(4, 2) PW_CASE(8, 1) PW_CASE(8, 2)
  PW_CASE(16, 1)
#undef PW_CASE
  return cudaErrorInvalidValue;
}

}  // namespace

size_t binary_weight_planes_wgmma_workspace_bytes(int64_t m_rows, int64_t k) {
  if (m_rows < 1 || k < 1 || k > INT_MAX) return 0;
  return planes_wgmma_workspace(nullptr, m_rows, k).bytes;
}

bool binary_weight_planes_wgmma_applies(FloatType type, int64_t k) {
  if (!BITCOMPILE_SM90A || type == FloatType::kFloat32 || k <= 0 || ceil_div(k, 32) % 4 != 0 ||
      ceil_div(k, 32 * kPwStageWords) > kPwMaxStages) {
    return false;
  }
  DeviceFacts device;
  if (current_device_facts(device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return wgmma_device(device);
}

cudaError_t launch_binary_weight_planes_wgmma(const void* x, FloatType type, const uint32_t* w_bits, int64_t m_rows,
                                              int64_t n_rows, int64_t k, const Epilogue& epilogue, void* out,
                                              int sm_count, const WeightLinearTuning& tuning, void* workspace,
                                              size_t workspace_bytes, cudaStream_t stream) {
  const PlanesWgmmaWorkspace ws = planes_wgmma_workspace(workspace, m_rows, k);
  if (!binary_weight_planes_wgmma_applies(type, k) || workspace == nullptr || workspace_bytes < ws.bytes ||
      (reinterpret_cast<uintptr_t>(workspace) & 15u) != 0 ||
      (reinterpret_cast<uintptr_t>(w_bits) & 15u) != 0 || (reinterpret_cast<uintptr_t>(out) & 1u) != 0 ||
      n_rows > INT_MAX || m_rows * kRowPlanes > INT_MAX) {
    return cudaErrorNotSupported;
  }
  if (type == FloatType::kBFloat16) {
    return planes_wgmma_dispatch(static_cast<const __nv_bfloat16*>(x), w_bits, m_rows, n_rows, k, epilogue,
                                 static_cast<__nv_bfloat16*>(out), sm_count, tuning, ws, stream);
  }
  return planes_wgmma_dispatch(static_cast<const __half*>(x), w_bits, m_rows, n_rows, k, epilogue,
                               static_cast<__half*>(out), sm_count, tuning, ws, stream);
}

}  // namespace cuda
}  // namespace bitcompile
