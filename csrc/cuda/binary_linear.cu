// binary_linear (W1A1, s(x) in {-1, +1}) on the b1 tensor cores with mma.sync (sm_80 on). Torch-free (launcher in
// binary_kernels.cuh). On sm_90 the launcher first tries the wgmma kernel (binary_linear_wgmma.cu), which serves
// every shape with ceil(k / 32) % 4 == 0 and 16-byte aligned bases; these kernels serve the rest there.
//
//
// binary_linear_mma_kernel (s(x) in {-1, +1}): b1 tensor cores, mma.sync.m16n8k256 AND.POPC (XOR.POPC
//   is emulated on Hopper, 7x slower). With a = bits of x, b = bits of w, pa/pb their popcounts:
//       s(x).s(w) = K - 2 * hamming(a, b) = K - 2 * (pa + pb - 2 * popc(a & b)).
//   Tail bits and zero-filled out-of-range words add nothing to popc(a & b), pa or pb, so any K works.
//   pa and pb are popcounts of the very fragments fed to the MMA (each lane counts its words, a shuffle
//   sums the 4 lanes of a row), so no separate pass over x or w is needed.
//   Tiling: block tile BM x BN (BM = 16/64/128 chosen by M, BN = 128) over 512 bits of K a stage,
//   shared memory rows padded to 24 words, the next stage prefetched into registers while the
//   tensor cores work on the current one; each warp owns (BM / WARPS_M) x (BN / WARPS_N).
//   Fragment layout of m16n8k256 .b1 (PTX ISA, "Matrix Fragments for mma.m16n8k256", 9.7.14.5.13),
//   groupID g = lane >> 2, threadID_in_group t = lane & 3, each register 32 consecutive k:
//       A: a0 = row g,   k 32t..32t+31      a1 = row g+8, k 32t..        (the ISA text prints
//          a2 = row g,   k 128+32t..        a3 = row g+8, k 128+32t..     "+ i" for a1: the figure
//       B: b0 = col g,   k 32t..            b1 = col g,   k 128+32t..     and the a3 line say i & 31)
//       C: c0, c1 = row g, cols 2t, 2t+1    c2, c3 = row g+8, cols 2t, 2t+1
//   The sum over k does not care which k a bit stands for as long as A and B agree, so each lane
//   feeds words 2t and 2t+1 of the 8-word (256-bit) step into (a0, a2) / (a1, a3) / (b0, b1): one
//   aligned 8-byte shared load per fragment pair, A and B permuted identically.
//
// binary_linear_mma_kernel serves M <= 64 and rows that do not allow 16-byte copies;
// binary_linear_mma_pipelined_kernel (below) the rest.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mma_b1.cuh"

namespace bitcompile {
namespace cuda {
namespace {

template <int BM, int BN, int WARPS_M, int WARPS_N, int VW, typename OutT>
__global__ __launch_bounds__(WARPS_M* WARPS_N * 32) void binary_linear_mma_kernel(
    const uint32_t* __restrict__ x_bits, const uint32_t* __restrict__ w_bits, int64_t m_rows, int64_t n_rows,
    int64_t words, int64_t k, int64_t m_tiles, Epilogue ep, OutT* __restrict__ out) {
  constexpr int kThreads = WARPS_M * WARPS_N * 32;
  constexpr int kWarpRows = BM / WARPS_M;  // rows of x per warp
  constexpr int kWarpCols = BN / WARPS_N;  // rows of w (output columns) per warp
  constexpr int MT = kWarpRows / 16;       // m16 tiles per warp
  constexpr int NT = kWarpCols / 8;        // n8 tiles per warp
  static_assert(MT * 16 * WARPS_M == BM && NT * 8 * WARPS_N == BN, "tile shape");
  constexpr int kVecsPerRow = kMmaStageWords / VW;
  constexpr int kVecsA = BM * kVecsPerRow;
  constexpr int kVecsB = BN * kVecsPerRow;
  constexpr int kLoadsA = (kVecsA + kThreads - 1) / kThreads;
  constexpr int kLoadsB = (kVecsB + kThreads - 1) / kThreads;

  __shared__ __align__(16) uint32_t a_tile[BM * kMmaRowStride];
  __shared__ __align__(16) uint32_t b_tile[BN * kMmaRowStride];

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_m = warp / WARPS_N;
  const int warp_n = warp % WARPS_N;
  const int group = lane >> 2;            // groupID of the PTX fragment tables
  const int thread_in_group = lane & 3;   // threadID_in_group
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) % m_tiles) * BM;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) / m_tiles) * BN;
  const uint32_t last_bits = valid_bits(k, words - 1);

  Words<VW> next_a[kLoadsA];
  Words<VW> next_b[kLoadsB];
  // Global -> registers: stage `stage` of the A (x) and B (w) tiles; rows and words past the end are 0.
  auto load_stage = [&](int64_t stage) {
#pragma unroll
    for (int i = 0; i < kLoadsA; ++i) {
      const int e = tid + i * kThreads;
      const int64_t row = m0 + e / kVecsPerRow;
      const int64_t word = stage * kMmaStageWords + (e % kVecsPerRow) * VW;
      if (e < kVecsA && row < m_rows && word < words) {
        next_a[i].load(x_bits + row * words + word);
      } else {
        next_a[i].zero();
      }
    }
#pragma unroll
    for (int i = 0; i < kLoadsB; ++i) {
      const int e = tid + i * kThreads;
      const int64_t row = n0 + e / kVecsPerRow;
      const int64_t word = stage * kMmaStageWords + (e % kVecsPerRow) * VW;
      if (e < kVecsB && row < n_rows && word < words) {
        next_b[i].load(w_bits + row * words + word);
        next_b[i].mask_tail(word, words, last_bits);  // pb must not count stray tail bits
      } else {
        next_b[i].zero();
      }
    }
  };
  auto store_stage = [&]() {
#pragma unroll
    for (int i = 0; i < kLoadsA; ++i) {
      const int e = tid + i * kThreads;
      if (e < kVecsA) next_a[i].store(&a_tile[(e / kVecsPerRow) * kMmaRowStride + (e % kVecsPerRow) * VW]);
    }
#pragma unroll
    for (int i = 0; i < kLoadsB; ++i) {
      const int e = tid + i * kThreads;
      if (e < kVecsB) next_b[i].store(&b_tile[(e / kVecsPerRow) * kMmaRowStride + (e % kVecsPerRow) * VW]);
    }
  };

  int acc[MT][NT][4];
  int pop_a[MT][2];  // popcount of rows g and g+8 of each m tile, this lane's words only
  int pop_b[NT];     // popcount of column g of each n tile, this lane's words only
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    pop_a[mt][0] = pop_a[mt][1] = 0;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0;
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) pop_b[nt] = 0;

  const int64_t stages = ceil_div(words, kMmaStageWords);
  load_stage(0);
  store_stage();
  __syncthreads();
  for (int64_t stage = 0; stage < stages; ++stage) {
    if (stage + 1 < stages) load_stage(stage + 1);  // in flight while the tensor cores work
#pragma unroll
    for (int step = 0; step < kMmaStageWords / 8; ++step) {  // 256 bits = 8 words per MMA
      // Words 2t, 2t+1 of the step: (a0, a2) from row g, (a1, a3) from row g+8, (b0, b1) from column g.
      // Row stride 24 words: the 8-byte loads of a half warp (g = 0..3 or 4..7, t = 0..3) hit 16
      // distinct bank pairs.
      const int word = step * 8 + 2 * thread_in_group;
      uint32_t a_frag[MT][4];
      uint32_t b_frag[NT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int row = warp_m * kWarpRows + mt * 16 + group;
        const uint2 top = *reinterpret_cast<const uint2*>(&a_tile[row * kMmaRowStride + word]);
        const uint2 bottom = *reinterpret_cast<const uint2*>(&a_tile[(row + 8) * kMmaRowStride + word]);
        a_frag[mt][0] = top.x;
        a_frag[mt][1] = bottom.x;
        a_frag[mt][2] = top.y;
        a_frag[mt][3] = bottom.y;
        pop_a[mt][0] += __popc(top.x) + __popc(top.y);
        pop_a[mt][1] += __popc(bottom.x) + __popc(bottom.y);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int col = warp_n * kWarpCols + nt * 8 + group;
        const uint2 pair = *reinterpret_cast<const uint2*>(&b_tile[col * kMmaRowStride + word]);
        b_frag[nt][0] = pair.x;
        b_frag[nt][1] = pair.y;
        pop_b[nt] += __popc(pair.x) + __popc(pair.y);
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_and_popc(acc[mt][nt], a_frag[mt], b_frag[nt]);
      }
    }
    __syncthreads();
    if (stage + 1 < stages) {
      store_stage();
      __syncthreads();
    }
  }

  // Row popcounts: the 4 lanes of a group together saw every word of their rows.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      pop_a[mt][h] += __shfl_xor_sync(kFullMask, pop_a[mt][h], 1);
      pop_a[mt][h] += __shfl_xor_sync(kFullMask, pop_a[mt][h], 2);
    }
  }
  int pop_cols[NT][2];  // popcounts of this lane's output columns 2t and 2t+1
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    int total = pop_b[nt];
    total += __shfl_xor_sync(kFullMask, total, 1);
    total += __shfl_xor_sync(kFullMask, total, 2);
    // Column c of the tile was counted by the lanes of group c, lanes 4c..4c+3.
    pop_cols[nt][0] = __shfl_sync(kFullMask, total, (2 * thread_in_group) * 4);
    pop_cols[nt][1] = __shfl_sync(kFullMask, total, (2 * thread_in_group + 1) * 4);
  }

  // The factors of this lane's output rows (g, g+8 of each m tile) and columns (2t, 2t+1 of each n tile).
  float row_factors[MT][2], col_scales[NT][2], col_biases[NT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + warp_m * kWarpRows + mt * 16 + group + 8 * h;
      row_factors[mt][h] = m < m_rows ? row_factor(ep, m) : 0.f;
    }
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t n = n0 + warp_n * kWarpCols + nt * 8 + 2 * thread_in_group + e;
      col_scales[nt][e] = n < n_rows ? column_scale(ep, n) : 0.f;
      col_biases[nt][e] = n < n_rows ? column_bias(ep, n) : 0.f;
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // c0, c1: row g; c2, c3: row g+8
      const int64_t m = m0 + warp_m * kWarpRows + mt * 16 + group + 8 * h;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {  // columns 2t, 2t+1
          const int64_t n = n0 + warp_n * kWarpCols + nt * 8 + 2 * thread_in_group + e;
          // s(x).s(w) = K - 2 * hamming = K - 2 * (pa + pb - 2 * popc(a & b))
          const int64_t dot = k - 2 * (static_cast<int64_t>(pop_a[mt][h]) + pop_cols[nt][e] -
                                       2 * static_cast<int64_t>(acc[mt][nt][2 * h + e]));
          if (m < m_rows && n < n_rows) {
            out[m * n_rows + n] = from_float<OutT>(epilogue_value(static_cast<float>(dot), row_factors[mt][h],
                                                                  col_scales[nt][e], col_biases[nt][e]));
          }
        }
      }
    }
  }
}

template <int BM, int BN, int WARPS_M, int WARPS_N, typename OutT>
cudaError_t binary_linear_mma_config(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                     int64_t k, const Epilogue& ep, OutT* out, cudaStream_t stream) {
  const int64_t words = ceil_div(k, 32);
  const int64_t m_tiles = ceil_div(m_rows, BM);
  const int64_t blocks = m_tiles * ceil_div(n_rows, BN);
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  const bool aligned = words % 4 == 0 && reinterpret_cast<uintptr_t>(x_bits) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(w_bits) % 16 == 0;
  constexpr int kThreads = WARPS_M * WARPS_N * 32;
  if (aligned) {
    binary_linear_mma_kernel<BM, BN, WARPS_M, WARPS_N, 4, OutT><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        x_bits, w_bits, m_rows, n_rows, words, k, m_tiles, ep, out);
  } else {
    binary_linear_mma_kernel<BM, BN, WARPS_M, WARPS_N, 1, OutT><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        x_bits, w_bits, m_rows, n_rows, words, k, m_tiles, ep, out);
  }
  return cudaGetLastError();
}

template <typename OutT>
cudaError_t binary_linear_mma_typed(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                    int64_t k, const Epilogue& ep, OutT* out, cudaStream_t stream) {
  // Small M (decoding, small batches): fewer wasted rows per tile.
  if (m_rows <= 16) return binary_linear_mma_config<16, 128, 1, 8, OutT>(x_bits, w_bits, m_rows, n_rows, k, ep, out, stream);
  if (m_rows <= 64) return binary_linear_mma_config<64, 128, 2, 4, OutT>(x_bits, w_bits, m_rows, n_rows, k, ep, out, stream);
  return binary_linear_mma_config<128, 128, 2, 4, OutT>(x_bits, w_bits, m_rows, n_rows, k, ep, out, stream);
}

// binary_linear_mma_pipelined_kernel (M > 64, 16-byte aligned rows of words % 4 == 0): the same math on a cp.async pipeline (kPipeStages shared-memory
// stages of 512 bits in flight, no register staging), 128 x 128 tiles, 8 warps of 64 x 32, and the row
// popcounts pa, pb taken once per loaded 16-byte vector by the thread that loaded it (instead of by every
// warp from its fragments: POPC is a quarter-rate instruction and bounded the kernel above). Needs
// words % 4 == 0 and 16-byte aligned bases; B's tail bits reach the tensor cores unmasked, where they meet
// x's zero tail bits, and are masked out of pb.
template <int BM, int BN, int WARPS_M, int WARPS_N, typename OutT>
__global__ __launch_bounds__(WARPS_M* WARPS_N * 32, 2) void binary_linear_mma_pipelined_kernel(
    const uint32_t* __restrict__ x_bits, const uint32_t* __restrict__ w_bits, int64_t m_rows, int64_t n_rows,
    int64_t words, int64_t k, int64_t m_tiles, Epilogue ep, OutT* __restrict__ out) {
  constexpr int kThreads = WARPS_M * WARPS_N * 32;
  constexpr int kWarpRows = BM / WARPS_M;
  constexpr int kWarpCols = BN / WARPS_N;
  constexpr int MT = kWarpRows / 16;
  constexpr int NT = kWarpCols / 8;
  static_assert(MT * 16 * WARPS_M == BM && NT * 8 * WARPS_N == BN, "tile shape");
  constexpr int kVecsPerRow = kMmaStageWords / 4;
  constexpr int kVecsA = BM * kVecsPerRow;
  constexpr int kVecsB = BN * kVecsPerRow;
  static_assert(kVecsA % kThreads == 0 && kVecsB % kThreads == 0, "whole vectors per thread");
  constexpr int kLoadsA = kVecsA / kThreads;
  constexpr int kLoadsB = kVecsB / kThreads;
  constexpr int kStageWordsA = BM * kMmaRowStride;
  constexpr int kStageWordsAll = (BM + BN) * kMmaRowStride;

  extern __shared__ __align__(16) uint32_t pipe_smem[];  // [kPipeStages][A rows, B rows][kMmaRowStride]
  int* row_pop_a = reinterpret_cast<int*>(pipe_smem + kPipeStages * kStageWordsAll);  // [BM]
  int* row_pop_b = row_pop_a + BM;                                                     // [BN]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_m = warp / WARPS_N;
  const int warp_n = warp % WARPS_N;
  const int group = lane >> 2;
  const int thread_in_group = lane & 3;
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) % m_tiles) * BM;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) / m_tiles) * BN;
  const uint32_t last_bits = valid_bits(k, words - 1);
  const int64_t stages = ceil_div(words, kMmaStageWords);

  for (int r = tid; r < BM + BN; r += kThreads) row_pop_a[r] = 0;  // row_pop_b follows row_pop_a

  // This thread's vectors: A vector e = tid + i * kThreads is row e / kVecsPerRow, words 4 (e % kVecsPerRow)..
  auto issue_stage = [&](int64_t stage) {
    if (stage < stages) {
      uint32_t* base = pipe_smem + (stage % kPipeStages) * kStageWordsAll;
#pragma unroll
      for (int i = 0; i < kLoadsA; ++i) {
        const int e = tid + i * kThreads;
        const int64_t row = m0 + e / kVecsPerRow;
        const int64_t word = stage * kMmaStageWords + (e % kVecsPerRow) * 4;
        const bool fill = row < m_rows && word < words;
        cp_async_16(base + (e / kVecsPerRow) * kMmaRowStride + (e % kVecsPerRow) * 4,
                    fill ? x_bits + row * words + word : x_bits, fill);
      }
#pragma unroll
      for (int i = 0; i < kLoadsB; ++i) {
        const int e = tid + i * kThreads;
        const int64_t row = n0 + e / kVecsPerRow;
        const int64_t word = stage * kMmaStageWords + (e % kVecsPerRow) * 4;
        const bool fill = row < n_rows && word < words;
        cp_async_16(base + kStageWordsA + (e / kVecsPerRow) * kMmaRowStride + (e % kVecsPerRow) * 4,
                    fill ? w_bits + row * words + word : w_bits, fill);
      }
    }
    cp_async_commit();  // every thread commits every time: the group count stays uniform
  };

  int acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0;
  }
  int pop_a[kLoadsA], pop_b[kLoadsB];  // popcounts of this thread's vectors' rows, summed over K
#pragma unroll
  for (int i = 0; i < kLoadsA; ++i) pop_a[i] = 0;
#pragma unroll
  for (int i = 0; i < kLoadsB; ++i) pop_b[i] = 0;

#pragma unroll
  for (int s = 0; s < kPipeStages - 1; ++s) issue_stage(s);
  for (int64_t stage = 0; stage < stages; ++stage) {
    cp_async_wait<kPipeStages - 2>();  // this thread's copies of `stage` landed
    __syncthreads();                   // everyone's did; everyone finished stage - 1 (its buffer is free)
    issue_stage(stage + kPipeStages - 1);
    const uint32_t* a_tile = pipe_smem + (stage % kPipeStages) * kStageWordsAll;
    const uint32_t* b_tile = a_tile + kStageWordsA;
#pragma unroll
    for (int i = 0; i < kLoadsA; ++i) {
      const int e = tid + i * kThreads;
      const uint4 v = *reinterpret_cast<const uint4*>(&a_tile[(e / kVecsPerRow) * kMmaRowStride + (e % kVecsPerRow) * 4]);
      pop_a[i] += __popc(v.x) + __popc(v.y) + __popc(v.z) + __popc(v.w);  // x's tail bits are 0
    }
#pragma unroll
    for (int i = 0; i < kLoadsB; ++i) {
      const int e = tid + i * kThreads;
      uint4 v = *reinterpret_cast<const uint4*>(&b_tile[(e / kVecsPerRow) * kMmaRowStride + (e % kVecsPerRow) * 4]);
      if (stage * kMmaStageWords + (e % kVecsPerRow) * 4 + 3 == words - 1) v.w &= last_bits;  // stray tail bits
      pop_b[i] += __popc(v.x) + __popc(v.y) + __popc(v.z) + __popc(v.w);
    }
    mma_shared_stage<MT, NT>(acc, a_tile + warp_m * kWarpRows * kMmaRowStride, b_tile + warp_n * kWarpCols * kMmaRowStride,
                             group, thread_in_group);
  }
  cp_async_wait<0>();

  // Row popcounts: integer sums in shared memory (order-free, exact).
#pragma unroll
  for (int i = 0; i < kLoadsA; ++i) atomicAdd(&row_pop_a[(tid + i * kThreads) / kVecsPerRow], pop_a[i]);
#pragma unroll
  for (int i = 0; i < kLoadsB; ++i) atomicAdd(&row_pop_b[(tid + i * kThreads) / kVecsPerRow], pop_b[i]);
  __syncthreads();

  // Column by column: one scale and bias live at a time (registers go to the accumulators).
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int local_col = warp_n * kWarpCols + nt * 8 + 2 * thread_in_group + e;
      const int64_t n = n0 + local_col;
      if (n >= n_rows) continue;
      const float scale = column_scale(ep, n);
      const float bias = column_bias(ep, n);
      const int64_t pb = row_pop_b[local_col];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int local_row = warp_m * kWarpRows + mt * 16 + group + 8 * h;
          const int64_t m = m0 + local_row;
          if (m >= m_rows) continue;
          // s(x).s(w) = K - 2 * (pa + pb - 2 * popc(a & b))
          const int64_t dot = k - 2 * (row_pop_a[local_row] + pb - 2 * static_cast<int64_t>(acc[mt][nt][2 * h + e]));
          out[m * n_rows + n] = from_float<OutT>(epilogue_value(static_cast<float>(dot), row_factor(ep, m), scale, bias));
        }
      }
    }
  }
}

template <typename OutT>
cudaError_t binary_linear_typed(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows,
                                              int64_t n_rows, int64_t k, const Epilogue& ep, OutT* out,
                                              cudaStream_t stream) {
  constexpr int BM = 128, BN = 128, WARPS_M = 2, WARPS_N = 4;
  const int64_t words = ceil_div(k, 32);
  const bool aligned = words % 4 == 0 && reinterpret_cast<uintptr_t>(x_bits) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(w_bits) % 16 == 0;
  if (!aligned || m_rows <= 64) return binary_linear_mma_typed(x_bits, w_bits, m_rows, n_rows, k, ep, out, stream);
  const int64_t m_tiles = ceil_div(m_rows, BM);
  const int64_t blocks = m_tiles * ceil_div(n_rows, BN);
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  constexpr size_t smem = (static_cast<size_t>(kPipeStages) * (BM + BN) * kMmaRowStride + BM + BN) * sizeof(uint32_t);
  auto kernel = binary_linear_mma_pipelined_kernel<BM, BN, WARPS_M, WARPS_N, OutT>;
  static unsigned long long smem_devices = 0;
  const cudaError_t error = allow_dynamic_smem(kernel, smem, smem_devices);
  if (error != cudaSuccess) return error;
  kernel<<<static_cast<unsigned>(blocks), WARPS_M * WARPS_N * 32, smem, stream>>>(x_bits, w_bits, m_rows, n_rows, words,
                                                                                  k, m_tiles, ep, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t binary_linear_reads_popcounts(bool& reads) {
  DeviceFacts device;
  const cudaError_t error = current_device_facts(device);
  reads = error == cudaSuccess && wgmma_device(device);  // launch_binary_linear_wgmma's kernels read them
  return error;
}

cudaError_t launch_binary_linear(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                 int64_t k, const Epilogue& epilogue, void* out, FloatType out_type,
                                 const int32_t* x_popcounts, cudaStream_t stream, const BinaryLinearTuning* tuning) {
  if (!valid_sizes(m_rows, k) || n_rows < 0) return cudaErrorInvalidValue;
  if (m_rows == 0 || n_rows == 0) return cudaSuccess;
  const BinaryLinearTuning t = tuning != nullptr ? *tuning : BinaryLinearTuning{};
  if (t.kernel != 1) {  // Hopper: wgmma wherever it applies (H200: 2-3x the mma.sync kernels at every M measured)
    const cudaError_t error =
        launch_binary_linear_wgmma(x_bits, w_bits, m_rows, n_rows, k, epilogue, out, out_type, x_popcounts, t, stream);
    if (error != cudaErrorNotSupported || t.kernel == 2) return error;
  }
  // The mma.sync kernels count pa from the words their threads load anyway: x_popcounts (the wgmma kernel's) is not
  // read.
  switch (out_type) {
    case FloatType::kFloat32:
      return binary_linear_typed(x_bits, w_bits, m_rows, n_rows, k, epilogue, static_cast<float*>(out),
                                               stream);
    case FloatType::kFloat16:
      return binary_linear_typed(x_bits, w_bits, m_rows, n_rows, k, epilogue, static_cast<__half*>(out),
                                               stream);
    case FloatType::kBFloat16:
      return binary_linear_typed(x_bits, w_bits, m_rows, n_rows, k, epilogue,
                                               static_cast<__nv_bfloat16*>(out), stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace bitcompile
