// CUDA kernels of the binary ops. Torch-free (DESIGN.md "Tests"): launchers take raw pointers, sizes
// and a stream and return a cudaError_t; csrc/cuda/binary_ops.cpp is the torch binding.
//
// Design
// ------
// pack_signs_kernel: one warp packs one word per __ballot_sync (lane j reads value 32*w + j, so
//   the ballot is the word in the storage format, LSB first). 1-8 warps share a row (more for long
//   rows); the same pass writes the second bit plane of torch.sign inputs (x < 0) and mean|x| of
//   each row (binary_linear's row_scale), reduced in a fixed order (deterministic).
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
// binary_conv2d_mma_kernel (default for binary_conv2d and binary_linear with sign_zero): implicit GEMM on the
//   b1 tensor cores, rows = output pixels, two activation bit planes (s(x) = +1 / -1) gathered per tap, two
//   AND.POPC accumulators, or one plane for s(x) in {-1, +1} with per-tap weight popcounts; see its section. binary_weight_linear_tc_kernel (default for binary_weight_linear
//   up to 256 rows): bf16/fp16 mma.sync with the +-1 weights expanded from bits in registers, every weight
//   word read once per 32 rows of x; see its section. The kernels below them are the legacy paths
//   (BITCOMPILE_CUDA_LEGACY=1 in binary_ops.cpp).
//
// binary_conv2d_kernel: popcounts on the CUDA cores (also binary_linear with sign_zero, as a 1x1 conv).
//   A block owns 64 output pixels x 64 output channels, a thread a 4 x 4 register tile; for each tap
//   the block stages 32 words of channels of the 64 input pixels and 64 weight rows in shared memory.
//   Per tap:  s(x).s(w) = C - 2 * popc(a ^ w)                       (x bits a, XOR on the ALU is native)
//             = popc((p & w) | (n & ~w)) - popc((p & ~w) | (n & w))   (sign_zero: planes p = x>0, n = x<0)
//   A padded tap is evaluated as if s(x) were +1 there (the channel mask as its word) and multiplied by
//   pad_value: 0 (zero padding), or +-1 (an explicit F.pad(s(x), value=+-1) folded into the conv).
//
// binary_weight_linear_kernel: GEMV style. A warp owns 4 output rows, each lane one packed word of
//   each; 1-8 rows of x (up to 1024 k at a time) sit in shared memory as fp32, laid out [m][bit][word]
//   so that a warp reads 32 consecutive floats. Each bit becomes +-1.0f (two integer ops, shared by all
//   rows of x) and one FFMA per row of x. M > 8 runs as several row blocks (W is re-read from L2).
//
// All outputs: y = dot [* mean|x| per row] [* scale] [+ bias] in fp32, rounded once to the output type.
//
// binary_linear_mma_pipelined_kernel (default for binary_linear at M > 64, K % 128 == 0): the same MMA math
// on a 4-stage cp.async pipeline, row popcounts once per copied vector; see its section.
//
// Left for the speed issue (benchmarks/NOTES.md): wgmma b1 (BGMMA, ~15.5 POPS measured vs 10.2 for
// mma.sync) with TMA loads and an mbarrier pipeline; a cp.async pipeline for the conv implicit GEMM (its
// gather is a zero-filled 16-byte copy in the one-plane form) and a tap-packed layout for small C; fusing
// the activation packing into the GEMM for small M; vectorized epilogue stores.

#include "binary_kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cooperative_groups.h>

#include <climits>
#include <type_traits>

// The warp-level instructions of the tensor-core kernels (mma.sync b1 AND.POPC m16n8k256, bf16/fp16
// m16n8k16, cp.async) need sm_80. Built for an older GPU, those kernels hold a trap instead and are never
// launched: the bindings send every op to the CUDA-core kernels there (binary_ops.cpp,
// tensor_cores_usable()). Thread-block clusters (sm_90) are guarded the same way.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define BITCOMPILE_PRE_AMPERE_DEVICE 1
#endif

namespace bitcompile {
namespace cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------
using ::bitcompile::from_float;
using ::bitcompile::to_float;

// Bits of word `word` that hold one of the `k` real values (the rest are tail bits).
__host__ __device__ __forceinline__ uint32_t valid_bits(int64_t k, int64_t word) {
  const int64_t left = k - word * 32;
  return left >= 32 ? 0xffffffffu : (left <= 0 ? 0u : (1u << left) - 1u);
}

// y = dot [* row_factor[row]] [* scale] [+ bias[col]]  (SPEC 2.2-2.4, fp32). The factors are read
// once per row / column of a thread's tile; absent ones are 1 and 0 (exact).
__device__ __forceinline__ float row_factor(const Epilogue& ep, int64_t row) {
  return ep.row_factor != nullptr ? ep.row_factor[row] : 1.f;
}
__device__ __forceinline__ float column_scale(const Epilogue& ep, int64_t col) {
  return ep.scale != nullptr ? ep.scale[ep.scale_count == 1 ? 0 : col] : 1.f;
}
__device__ __forceinline__ float column_bias(const Epilogue& ep, int64_t col) {
  return ep.bias != nullptr ? ep.bias[col] : 0.f;
}
__device__ __forceinline__ float epilogue_value(float dot, float factor, float scale, float bias) {
  return dot * factor * scale + bias;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------------------------
// pack_signs: binarize + pack, one word per warp ballot
// ---------------------------------------------------------------------------------------------
constexpr int kPackThreads = 256;
constexpr int kPackWarps = kPackThreads / 32;
constexpr int kPackUnroll = 4;  // words a warp has in flight

template <typename T, bool SIGN_ZERO>
__global__ __launch_bounds__(kPackThreads) void pack_signs_kernel(const T* __restrict__ x, int64_t rows, int64_t k,
                                                                  int64_t words, int warps_per_row,
                                                                  uint32_t* __restrict__ plus_bits,
                                                                  uint32_t* __restrict__ minus_bits,
                                                                  float* __restrict__ row_mean_abs) {
  __shared__ float partial_sums[kPackWarps];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int rows_per_block = kPackWarps / warps_per_row;
  const int row_in_block = warp / warps_per_row;
  const int part = warp % warps_per_row;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * rows_per_block + row_in_block;

  float abs_sum = 0.f;
  if (row < rows) {  // uniform over the warp
    const T* x_row = x + row * k;
    for (int64_t first = static_cast<int64_t>(part) * kPackUnroll; first < words;
         first += static_cast<int64_t>(warps_per_row) * kPackUnroll) {
      float value[kPackUnroll];
      bool real[kPackUnroll];
#pragma unroll
      for (int u = 0; u < kPackUnroll; ++u) {
        const int64_t index = (first + u) * 32 + lane;
        real[u] = index < k;
        value[u] = real[u] ? to_float(x_row[index]) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kPackUnroll; ++u) {
        abs_sum += fabsf(value[u]);
        if (first + u < words) {  // uniform over the warp
          // SPEC 2.1: bit 1 for x >= 0; with torch.sign semantics the planes x > 0 and x < 0.
          const uint32_t plus = __ballot_sync(kFullMask, real[u] && (SIGN_ZERO ? value[u] > 0.f : value[u] >= 0.f));
          uint32_t minus = 0;
          if (SIGN_ZERO) minus = __ballot_sync(kFullMask, real[u] && value[u] < 0.f);
          if (lane == u) {
            plus_bits[row * words + first + u] = plus;
            if (SIGN_ZERO) minus_bits[row * words + first + u] = minus;
          }
        }
      }
    }
  }
  if (row_mean_abs != nullptr) {  // uniform over the block
    abs_sum = warp_sum(abs_sum);
    if (lane == 0) partial_sums[warp] = abs_sum;
    __syncthreads();
    if (row < rows && part == 0 && lane == 0) {
      float total = 0.f;
      for (int i = 0; i < warps_per_row; ++i) total += partial_sums[row_in_block * warps_per_row + i];
      row_mean_abs[row] = total / static_cast<float>(k);
    }
  }
}

// The same with 16-byte loads (8 bf16/fp16 or 4 fp32 values a lane, kPackUnroll loads in flight: 2 KB a
// warp instead of 256 bytes), for k % 32 == 0 and a 16-byte aligned x: the lanes of one word OR their
// bits together with shuffles. binary_linear at large M spends a pass over x here.
template <typename T, bool SIGN_ZERO>
__global__ __launch_bounds__(kPackThreads) void pack_signs_vector_kernel(const T* __restrict__ x, int64_t rows,
                                                                         int64_t k, int warps_per_row,
                                                                         uint32_t* __restrict__ plus_bits,
                                                                         uint32_t* __restrict__ minus_bits,
                                                                         float* __restrict__ row_mean_abs) {
  constexpr int V = 16 / sizeof(T);         // values a lane loads at once
  constexpr int kLanesPerWord = 32 / V;
  __shared__ float partial_sums[kPackWarps];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int rows_per_block = kPackWarps / warps_per_row;
  const int row_in_block = warp / warps_per_row;
  const int part = warp % warps_per_row;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * rows_per_block + row_in_block;
  const int64_t words = k / 32;

  float abs_sum = 0.f;
  if (row < rows) {  // uniform over the warp
    const uint4* x_row = reinterpret_cast<const uint4*>(x + row * k);
    const int64_t vectors = k / V;
    for (int64_t first = static_cast<int64_t>(part) * 32 * kPackUnroll; first < vectors;
         first += static_cast<int64_t>(warps_per_row) * 32 * kPackUnroll) {
      uint4 raw[kPackUnroll];
#pragma unroll
      for (int u = 0; u < kPackUnroll; ++u) {
        const int64_t index = first + u * 32 + lane;
        raw[u] = index < vectors ? __ldg(x_row + index) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kPackUnroll; ++u) {
        if (first + u * 32 >= vectors) break;  // uniform over the warp
        const int64_t index = first + u * 32 + lane;
        union {
          uint4 vector;
          T values[V];
        } unpacked;
        unpacked.vector = raw[u];
        uint32_t plus = 0, minus = 0;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float value = to_float(unpacked.values[j]);
          abs_sum += fabsf(value);  // 0 for the zero-filled vectors past the end
          // SPEC 2.1: bit 1 for x >= 0; with torch.sign semantics the planes x > 0 and x < 0.
          plus |= static_cast<uint32_t>(SIGN_ZERO ? value > 0.f : value >= 0.f) << j;
          if (SIGN_ZERO) minus |= static_cast<uint32_t>(value < 0.f) << j;
        }
        const bool real = index < vectors;
        plus = real ? plus << ((lane % kLanesPerWord) * V) : 0u;
        minus = real ? minus << ((lane % kLanesPerWord) * V) : 0u;
#pragma unroll
        for (int offset = 1; offset < kLanesPerWord; offset <<= 1) {
          plus |= __shfl_xor_sync(kFullMask, plus, offset);
          if (SIGN_ZERO) minus |= __shfl_xor_sync(kFullMask, minus, offset);
        }
        if (real && lane % kLanesPerWord == 0) {
          const int64_t word = index / kLanesPerWord;
          plus_bits[row * words + word] = plus;
          if (SIGN_ZERO) minus_bits[row * words + word] = minus;
        }
      }
    }
  }
  if (row_mean_abs != nullptr) {  // uniform over the block
    abs_sum = warp_sum(abs_sum);
    if (lane == 0) partial_sums[warp] = abs_sum;
    __syncthreads();
    if (row < rows && part == 0 && lane == 0) {
      float total = 0.f;
      for (int i = 0; i < warps_per_row; ++i) total += partial_sums[row_in_block * warps_per_row + i];
      row_mean_abs[row] = total / static_cast<float>(k);
    }
  }
}

template <typename T>
cudaError_t pack_signs_typed(const T* x, int64_t rows, int64_t k, bool sign_zero, uint32_t* plus_bits,
                             uint32_t* minus_bits, float* row_mean_abs, bool vector_loads, cudaStream_t stream) {
  const int64_t words = ceil_div(k, 32);
  if (vector_loads && k % 32 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    const int64_t rounds = ceil_div(k / (16 / static_cast<int64_t>(sizeof(T))), 32 * kPackUnroll);
    int warps_per_row = 1;  // more warps on a row only when each still gets two rounds
    while (warps_per_row < kPackWarps && static_cast<int64_t>(warps_per_row) * 2 < rounds) warps_per_row *= 2;
    const int64_t blocks = ceil_div(rows, kPackWarps / warps_per_row);
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    if (sign_zero) {
      pack_signs_vector_kernel<T, true><<<static_cast<unsigned>(blocks), kPackThreads, 0, stream>>>(
          x, rows, k, warps_per_row, plus_bits, minus_bits, row_mean_abs);
    } else {
      pack_signs_vector_kernel<T, false><<<static_cast<unsigned>(blocks), kPackThreads, 0, stream>>>(
          x, rows, k, warps_per_row, plus_bits, minus_bits, row_mean_abs);
    }
    return cudaGetLastError();
  }
  int warps_per_row = 1;  // more warps on a row only when each still gets two rounds of kPackUnroll words
  while (warps_per_row < kPackWarps && static_cast<int64_t>(warps_per_row) * kPackUnroll * 2 < words) warps_per_row *= 2;
  const int64_t blocks = ceil_div(rows, kPackWarps / warps_per_row);
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  if (sign_zero) {
    pack_signs_kernel<T, true><<<static_cast<unsigned>(blocks), kPackThreads, 0, stream>>>(
        x, rows, k, words, warps_per_row, plus_bits, minus_bits, row_mean_abs);
  } else {
    pack_signs_kernel<T, false><<<static_cast<unsigned>(blocks), kPackThreads, 0, stream>>>(
        x, rows, k, words, warps_per_row, plus_bits, minus_bits, row_mean_abs);
  }
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// binary_linear on b1 tensor cores
// ---------------------------------------------------------------------------------------------
constexpr int kMmaStageWords = 16;  // 512 bits of K per shared-memory stage (two k256 MMA steps)
constexpr int kMmaRowStride = 24;   // words per shared row: 16 + 8 padding, see fragment loads below

// D = popc(A & B) + C on a 16x8 tile, 256 bits of K (PTX ISA: mma, .b1 with .and.popc).
__device__ __forceinline__ void mma_and_popc(int (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef BITCOMPILE_PRE_AMPERE_DEVICE
  __trap();
#else
  asm("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// One global load of VW consecutive words (VW = 4: 16-byte loads, needs words % 4 == 0 and aligned bases).
template <int VW>
struct Words;
template <>
struct Words<1> {
  uint32_t v;
  __device__ __forceinline__ void load(const uint32_t* p) { v = __ldg(p); }
  __device__ __forceinline__ void zero() { v = 0; }
  __device__ __forceinline__ void mask_tail(int64_t first_word, int64_t words, uint32_t last_bits) {
    if (first_word == words - 1) v &= last_bits;
  }
  __device__ __forceinline__ void store(uint32_t* p) const { *p = v; }
  __device__ __forceinline__ void set(const uint32_t (&bits)[1]) { v = bits[0]; }
  __device__ __forceinline__ void invert_within(const uint32_t (&bits)[1]) { v = ~v & bits[0]; }
};
template <>
struct Words<4> {
  uint4 v;
  __device__ __forceinline__ void load(const uint32_t* p) { v = __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ void zero() { v = make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ void mask_tail(int64_t first_word, int64_t words, uint32_t last_bits) {
    if (first_word + 3 == words - 1) v.w &= last_bits;  // words % 4 == 0: the last word is a .w
  }
  __device__ __forceinline__ void store(uint32_t* p) const { *reinterpret_cast<uint4*>(p) = v; }
  __device__ __forceinline__ void set(const uint32_t (&bits)[4]) { v = make_uint4(bits[0], bits[1], bits[2], bits[3]); }
  __device__ __forceinline__ void invert_within(const uint32_t (&bits)[4]) {
    v = make_uint4(~v.x & bits[0], ~v.y & bits[1], ~v.z & bits[2], ~v.w & bits[3]);
  }
};

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

// binary_linear_mma_pipelined_kernel: the same math on a cp.async pipeline (kPipeStages shared-memory
// stages of 512 bits in flight, no register staging), 128 x 128 tiles, 8 warps of 64 x 32, and the row
// popcounts pa, pb taken once per loaded 16-byte vector by the thread that loaded it (instead of by every
// warp from its fragments: POPC is a quarter-rate instruction and bounded the kernel above). Needs
// words % 4 == 0 and 16-byte aligned bases; B's tail bits reach the tensor cores unmasked, where they meet
// x's zero tail bits, and are masked out of pb.
// Raises a kernel's dynamic shared memory limit once per device (a driver call on every launch costs
// microseconds, as much as a whole small GEMV). done_devices: a static of the launcher of this very kernel
// instantiation, bit d set once device d is done (racing callers both set it: harmless).
template <typename Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, size_t bytes, unsigned long long& done_devices) {
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return error;
  const unsigned long long bit = device < 64 ? (1ull << device) : 0ull;
  if (bit != 0 && (__atomic_load_n(&done_devices, __ATOMIC_ACQUIRE) & bit) != 0) return cudaSuccess;
  error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (error == cudaSuccess && bit != 0) __atomic_fetch_or(&done_devices, bit, __ATOMIC_RELEASE);
  return error;
}

constexpr int kPipeStages = 4;

__device__ __forceinline__ void cp_async_16(uint32_t* shared_dst, const uint32_t* global_src, bool fill) {
#ifdef BITCOMPILE_PRE_AMPERE_DEVICE
  __trap();
#else
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  const int src_bytes = fill ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global_src), "r"(src_bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifndef BITCOMPILE_PRE_AMPERE_DEVICE
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
#ifdef BITCOMPILE_PRE_AMPERE_DEVICE
  __trap();
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
#endif
}

// One shared-memory stage (kMmaStageWords words of K, rows kMmaRowStride words apart) through the b1
// tensor cores, for the pipelined kernels: this warp's MT x NT tiles, A from the MT * 16 rows at a_warp,
// B from the NT * 8 rows at b_warp. Fragment words as in binary_linear_mma_kernel: (a0, a2) row g,
// (a1, a3) row g + 8, (b0, b1) column g, words 2t and 2t + 1 of each 8-word step.
template <int MT, int NT>
__device__ __forceinline__ void mma_shared_stage(int (&acc)[MT][NT][4], const uint32_t* a_warp,
                                                 const uint32_t* b_warp, int group, int thread_in_group) {
#pragma unroll
  for (int step = 0; step < kMmaStageWords / 8; ++step) {
    const int word = step * 8 + 2 * thread_in_group;
    uint32_t a_frag[MT][4];
    uint32_t b_frag[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int row = mt * 16 + group;
      const uint2 top = *reinterpret_cast<const uint2*>(&a_warp[row * kMmaRowStride + word]);
      const uint2 bottom = *reinterpret_cast<const uint2*>(&a_warp[(row + 8) * kMmaRowStride + word]);
      a_frag[mt][0] = top.x;
      a_frag[mt][1] = bottom.x;
      a_frag[mt][2] = top.y;
      a_frag[mt][3] = bottom.y;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint2 pair = *reinterpret_cast<const uint2*>(&b_warp[(nt * 8 + group) * kMmaRowStride + word]);
      b_frag[nt][0] = pair.x;
      b_frag[nt][1] = pair.y;
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_and_popc(acc[mt][nt], a_frag[mt], b_frag[nt]);
    }
  }
}

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
cudaError_t binary_linear_mma_pipelined_typed(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows,
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

// ---------------------------------------------------------------------------------------------
// binary_conv2d (and binary_linear with sign_zero) as an implicit GEMM on b1 tensor cores
// ---------------------------------------------------------------------------------------------
// Rows = output pixels (batch, oh, ow), columns = output channels, K = taps x channel words (the
// w_packed layout). Two activation bit planes per row, gathered from the per-pixel packed words:
//   P = bit(s(x) = +1), N = bit(s(x) = -1) at in-bounds taps (N = ~P & real channels without sign_zero);
//   a padded tap is P = real channels (pad_value +1), N = real channels (-1), or neither (0).
// Then s(x).s(w) = sum_P s(w) - sum_N s(w) = (2 popc(P & B) - popc(P)) - (2 popc(N & B) - popc(N)),
// exact for any B tail bits since P and N are 0 outside real channels. Two mma.sync m16n8k256 AND.POPC
// accumulators a tile (P.B and N.B), row popcounts of P and N from the very fragments, as the binary_linear
// kernel (same fragment layout, same 24-word padded shared rows, next stage prefetched in registers).
// ONE_PLANE (s(x) in {-1, +1}, at most kOnePlaneMaxTaps taps): only P, 0 at padded taps, one accumulator.
// At an in-bounds tap N = ~P over the C real channels, so with pb_t = popc(B_t) over real channels and
// D_t = C - 2 pb_t (= -sum_c s(w)):  sum_c s(x) s(w) = 4 popc(P & B_t) - 2 popc(P) + D_t, and a padded tap
// gives pad_value * (-D_t). The block tabulates D_t of its columns; a row sums D_t over its in-bounds taps
// (all of them for interior pixels). Half the MMAs and accumulators of the two-plane form.
constexpr int kOnePlaneMaxTaps = 32;

template <int BM, int BN, int WARPS_M, int WARPS_N, int VW, bool SIGN_ZERO, bool ONE_PLANE, typename OutT>
__global__ __launch_bounds__(WARPS_M* WARPS_N * 32, 1) void binary_conv2d_mma_kernel(
    const uint32_t* __restrict__ plus_bits, const uint32_t* __restrict__ minus_bits,
    const uint32_t* __restrict__ w_bits, ConvShape shape, int64_t m_tiles, int64_t total_pixels, int channel_words,
    int reduction_words, Epilogue ep, OutT* __restrict__ out, bool out_channels_last) {
  constexpr int kThreads = WARPS_M * WARPS_N * 32;
  constexpr int kWarpRows = BM / WARPS_M;
  constexpr int kWarpCols = BN / WARPS_N;
  constexpr int MT = kWarpRows / 16;
  constexpr int NT = kWarpCols / 8;
  static_assert(MT * 16 * WARPS_M == BM && NT * 8 * WARPS_N == BN, "tile shape");
  constexpr int kVecsPerRow = kMmaStageWords / VW;
  constexpr int kVecsA = BM * kVecsPerRow;
  constexpr int kVecsB = BN * kVecsPerRow;
  constexpr int kLoadsA = (kVecsA + kThreads - 1) / kThreads;
  constexpr int kLoadsB = (kVecsB + kThreads - 1) / kThreads;

  __shared__ __align__(16) uint32_t plus_tile[BM * kMmaRowStride];
  static_assert(!(ONE_PLANE && SIGN_ZERO), "one plane needs s(x) in {-1, +1}");
  __shared__ __align__(16) uint32_t minus_tile[ONE_PLANE ? 4 : BM * kMmaRowStride];
  __shared__ __align__(16) uint32_t b_tile[BN * kMmaRowStride];
  __shared__ int tap_d[ONE_PLANE ? BN * kOnePlaneMaxTaps : 1];  // D_t of column c at [c * 32 + t]
  __shared__ int all_taps_d[ONE_PLANE ? BN : 1];                // sum over t of D_t
  __shared__ int64_t pixel_image[BM];  // first input pixel of the image, or -1 past the last output pixel
  __shared__ int pixel_top[BM];        // oh * stride_h - pad_h
  __shared__ int pixel_left[BM];       // ow * stride_w - pad_w

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_m = warp / WARPS_N;
  const int warp_n = warp % WARPS_N;
  const int group = lane >> 2;
  const int thread_in_group = lane & 3;
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) % m_tiles) * BM;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) / m_tiles) * BN;
  const int64_t out_plane = shape.out_height * shape.out_width;
  const int64_t n_rows = shape.out_channels;
  const int kernel_w = static_cast<int>(shape.kernel_w);
  const int height = static_cast<int>(shape.height);
  const int width = static_cast<int>(shape.width);

  for (int r = tid; r < BM; r += kThreads) {
    const int64_t p = m0 + r;
    if (p < total_pixels) {
      const int64_t image = p / out_plane;
      const int64_t rest = p % out_plane;
      pixel_image[r] = image * shape.height * shape.width;
      pixel_top[r] = static_cast<int>((rest / shape.out_width) * shape.stride_h - shape.pad_h);
      pixel_left[r] = static_cast<int>((rest % shape.out_width) * shape.stride_w - shape.pad_w);
    } else {
      pixel_image[r] = -1;
      pixel_top[r] = pixel_left[r] = 0;
    }
  }
  const int taps = static_cast<int>(shape.kernel_h * shape.kernel_w);
  if (ONE_PLANE) {
    for (int e = tid; e < BN * taps; e += kThreads) {
      const int c = e / taps;
      const int t = e - c * taps;
      const int64_t n = n0 + c;
      int count = 0;
      if (n < n_rows) {
        const uint32_t* row = w_bits + n * reduction_words + t * channel_words;
        for (int cw = 0; cw < channel_words; ++cw) count += __popc(__ldg(row + cw) & valid_bits(shape.channels, cw));
      }
      tap_d[c * kOnePlaneMaxTaps + t] = n < n_rows ? static_cast<int>(shape.channels) - 2 * count : 0;
    }
    __syncthreads();
    for (int c = tid; c < BN; c += kThreads) {
      int total = 0;
      for (int t = 0; t < taps; ++t) total += tap_d[c * kOnePlaneMaxTaps + t];
      all_taps_d[c] = total;
    }
  }
  __syncthreads();

  Words<VW> next_p[kLoadsA];
  Words<VW> next_n[kLoadsA];
  Words<VW> next_b[kLoadsB];
  auto load_stage = [&](int64_t stage) {
#pragma unroll
    for (int i = 0; i < kLoadsA; ++i) {
      const int e = tid + i * kThreads;
      const int r = e / kVecsPerRow;
      const int word = static_cast<int>(stage * kMmaStageWords) + (e % kVecsPerRow) * VW;
      next_p[i].zero();
      next_n[i].zero();
      if (e < kVecsA && word < reduction_words && pixel_image[r] >= 0) {
        // VW = 4 only when channel_words % 4 == 0: the four words share one tap.
        const int tap = word / channel_words;
        const int channel_word = word - tap * channel_words;
        const int iy = pixel_top[r] + (tap / kernel_w) * static_cast<int>(shape.dilation_h);
        const int ix = pixel_left[r] + (tap % kernel_w) * static_cast<int>(shape.dilation_w);
        uint32_t valid[VW];
#pragma unroll
        for (int j = 0; j < VW; ++j) valid[j] = valid_bits(shape.channels, channel_word + j);
        if (iy >= 0 && iy < height && ix >= 0 && ix < width) {
          const int64_t index = (pixel_image[r] + static_cast<int64_t>(iy) * width + ix) * channel_words + channel_word;
          next_p[i].load(plus_bits + index);
          if (ONE_PLANE) {
            // N is implied (epilogue)
          } else if (SIGN_ZERO) {
            next_n[i].load(minus_bits + index);
          } else {
            next_n[i] = next_p[i];
            next_n[i].invert_within(valid);
          }
        } else if (ONE_PLANE) {
          // padded tap: P = 0, the pad value enters through D_t in the epilogue
        } else if (shape.pad_value > 0) {
          next_p[i].set(valid);
        } else if (shape.pad_value < 0) {
          next_n[i].set(valid);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kLoadsB; ++i) {
      const int e = tid + i * kThreads;
      const int64_t row = n0 + e / kVecsPerRow;
      const int word = static_cast<int>(stage * kMmaStageWords) + (e % kVecsPerRow) * VW;
      if (e < kVecsB && row < n_rows && word < reduction_words) {
        next_b[i].load(w_bits + row * reduction_words + word);
      } else {
        next_b[i].zero();
      }
    }
  };
  auto store_stage = [&]() {
#pragma unroll
    for (int i = 0; i < kLoadsA; ++i) {
      const int e = tid + i * kThreads;
      if (e < kVecsA) {
        const int offset = (e / kVecsPerRow) * kMmaRowStride + (e % kVecsPerRow) * VW;
        next_p[i].store(&plus_tile[offset]);
        if (!ONE_PLANE) next_n[i].store(&minus_tile[offset]);
      }
    }
#pragma unroll
    for (int i = 0; i < kLoadsB; ++i) {
      const int e = tid + i * kThreads;
      if (e < kVecsB) next_b[i].store(&b_tile[(e / kVecsPerRow) * kMmaRowStride + (e % kVecsPerRow) * VW]);
    }
  };

  int acc_p[MT][NT][4], acc_n[MT][NT][4];
  int pop_p[MT][2], pop_n[MT][2];  // popcounts of rows g, g+8 of each m tile, this lane's words only
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    pop_p[mt][0] = pop_p[mt][1] = pop_n[mt][0] = pop_n[mt][1] = 0;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int c = 0; c < 4; ++c) acc_p[mt][nt][c] = acc_n[mt][nt][c] = 0;
    }
  }

  const int64_t stages = ceil_div(reduction_words, kMmaStageWords);
  load_stage(0);
  store_stage();
  __syncthreads();
  for (int64_t stage = 0; stage < stages; ++stage) {
    if (stage + 1 < stages) load_stage(stage + 1);
#pragma unroll
    for (int step = 0; step < kMmaStageWords / 8; ++step) {
      const int word = step * 8 + 2 * thread_in_group;
      uint32_t b_frag[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int col = warp_n * kWarpCols + nt * 8 + group;
        const uint2 pair = *reinterpret_cast<const uint2*>(&b_tile[col * kMmaRowStride + word]);
        b_frag[nt][0] = pair.x;
        b_frag[nt][1] = pair.y;
      }
#pragma unroll
      for (int plane = 0; plane < (ONE_PLANE ? 1 : 2); ++plane) {
        const uint32_t* a_tile = plane == 0 ? plus_tile : minus_tile;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const int row = warp_m * kWarpRows + mt * 16 + group;
          const uint2 top = *reinterpret_cast<const uint2*>(&a_tile[row * kMmaRowStride + word]);
          const uint2 bottom = *reinterpret_cast<const uint2*>(&a_tile[(row + 8) * kMmaRowStride + word]);
          const uint32_t a_frag[4] = {top.x, bottom.x, top.y, bottom.y};
          const int top_count = __popc(top.x) + __popc(top.y);
          const int bottom_count = __popc(bottom.x) + __popc(bottom.y);
          if (plane == 0) {
            pop_p[mt][0] += top_count;
            pop_p[mt][1] += bottom_count;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mma_and_popc(acc_p[mt][nt], a_frag, b_frag[nt]);
          } else {
            pop_n[mt][0] += top_count;
            pop_n[mt][1] += bottom_count;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mma_and_popc(acc_n[mt][nt], a_frag, b_frag[nt]);
          }
        }
      }
    }
    __syncthreads();
    if (stage + 1 < stages) {
      store_stage();
      __syncthreads();
    }
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      pop_p[mt][h] += __shfl_xor_sync(kFullMask, pop_p[mt][h], 1);
      pop_p[mt][h] += __shfl_xor_sync(kFullMask, pop_p[mt][h], 2);
      pop_n[mt][h] += __shfl_xor_sync(kFullMask, pop_n[mt][h], 1);
      pop_n[mt][h] += __shfl_xor_sync(kFullMask, pop_n[mt][h], 2);
    }
  }
  float col_scales[NT][2], col_biases[NT][2];
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
    for (int h = 0; h < 2; ++h) {
      const int local_row = warp_m * kWarpRows + mt * 16 + group + 8 * h;
      const int64_t p = m0 + local_row;
      if (p >= total_pixels) continue;
      const float factor = row_factor(ep, p);
      const int64_t image = p / out_plane;
      const int64_t position = p % out_plane;
      // ONE_PLANE: the taps of this pixel inside the image (bit t)
      uint32_t inside = 0;
      const uint32_t all_taps = taps >= 32 ? 0xffffffffu : (1u << taps) - 1u;
      if (ONE_PLANE) {
        for (int t = 0; t < taps; ++t) {
          const int iy = pixel_top[local_row] + (t / kernel_w) * static_cast<int>(shape.dilation_h);
          const int ix = pixel_left[local_row] + (t % kernel_w) * static_cast<int>(shape.dilation_w);
          inside |= static_cast<uint32_t>(iy >= 0 && iy < height && ix >= 0 && ix < width) << t;
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t n = n0 + warp_n * kWarpCols + nt * 8 + 2 * thread_in_group + e;
          if (n >= n_rows) continue;
          int dot;
          if (ONE_PLANE) {
            const int local_col = warp_n * kWarpCols + nt * 8 + 2 * thread_in_group + e;
            int inside_d = all_taps_d[local_col];
            if (inside != all_taps) {
              inside_d = 0;
              for (int t = 0; t < taps; ++t) inside_d += (inside >> t) & 1u ? tap_d[local_col * kOnePlaneMaxTaps + t] : 0;
            }
            // 4 popc(P & B) - 2 popc(P) + sum_in D_t - pad_value * sum_padded D_t
            dot = 4 * acc_p[mt][nt][2 * h + e] - 2 * pop_p[mt][h] + inside_d -
                  shape.pad_value * (all_taps_d[local_col] - inside_d);
          } else {
            // (2 popc(P & B) - popc(P)) - (2 popc(N & B) - popc(N))
            dot = 2 * acc_p[mt][nt][2 * h + e] - pop_p[mt][h] - 2 * acc_n[mt][nt][2 * h + e] + pop_n[mt][h];
          }
          const int64_t index = out_channels_last ? p * n_rows + n : (image * n_rows + n) * out_plane + position;
          out[index] = from_float<OutT>(epilogue_value(static_cast<float>(dot), factor, col_scales[nt][e], col_biases[nt][e]));
        }
      }
    }
  }
}

template <int VW, bool SIGN_ZERO, bool ONE_PLANE, typename OutT>
cudaError_t binary_conv2d_mma_launch(const uint32_t* plus_bits, const uint32_t* minus_bits, const uint32_t* w_bits,
                                     const ConvShape& shape, const Epilogue& ep, OutT* out, bool out_channels_last,
                                     cudaStream_t stream) {
  constexpr int BM = 128, BN = 64, WARPS_M = 4, WARPS_N = 2;
  const int64_t total_pixels = shape.batch * shape.out_height * shape.out_width;
  const int64_t channel_words = ceil_div(shape.channels, 32);
  const int64_t reduction_words = shape.kernel_h * shape.kernel_w * channel_words;
  const int64_t m_tiles = ceil_div(total_pixels, BM);
  const int64_t blocks = m_tiles * ceil_div(shape.out_channels, BN);
  if (blocks > INT_MAX || reduction_words > INT_MAX / 2 || shape.height > INT_MAX / 4 || shape.width > INT_MAX / 4) {
    return cudaErrorInvalidValue;
  }
  binary_conv2d_mma_kernel<BM, BN, WARPS_M, WARPS_N, VW, SIGN_ZERO, ONE_PLANE, OutT>
      <<<static_cast<unsigned>(blocks), WARPS_M * WARPS_N * 32, 0, stream>>>(
          plus_bits, minus_bits, w_bits, shape, m_tiles, total_pixels, static_cast<int>(channel_words),
          static_cast<int>(reduction_words), ep, out, out_channels_last);
  return cudaGetLastError();
}


// binary_conv2d_pipelined_kernel: the one-plane implicit GEMM (s(x) in {-1, +1}, channel_words % 4 == 0) on
// the cp.async pipeline of binary_linear_mma_pipelined_kernel. The gather is a plain 16-byte copy: an
// in-bounds tap copies 4 channel words of the input pixel, a padded tap (P = 0 in the one-plane form) and
// anything past the end are zero-filled. Row popcounts of P once per copied vector; the epilogue is
// binary_conv2d_mma_kernel's one-plane epilogue.
template <int BM, int BN, int WARPS_M, int WARPS_N, typename OutT>
__global__ __launch_bounds__(WARPS_M* WARPS_N * 32, 2) void binary_conv2d_pipelined_kernel(
    const uint32_t* __restrict__ plus_bits, const uint32_t* __restrict__ w_bits, ConvShape shape, int64_t m_tiles,
    int64_t total_pixels, int channel_words, int reduction_words, Epilogue ep, OutT* __restrict__ out,
    bool out_channels_last) {
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

  extern __shared__ __align__(16) uint32_t conv_pipe_smem[];  // [kPipeStages][A rows, B rows][kMmaRowStride]
  __shared__ int64_t pixel_image[BM];
  __shared__ int pixel_top[BM];
  __shared__ int pixel_left[BM];
  __shared__ int row_pop[BM];
  __shared__ int tap_d[BN * kOnePlaneMaxTaps];
  __shared__ int all_taps_d[BN];

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_m = warp / WARPS_N;
  const int warp_n = warp % WARPS_N;
  const int group = lane >> 2;
  const int thread_in_group = lane & 3;
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) % m_tiles) * BM;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) / m_tiles) * BN;
  const int64_t out_plane = shape.out_height * shape.out_width;
  const int64_t n_rows = shape.out_channels;
  const int kernel_w = static_cast<int>(shape.kernel_w);
  const int height = static_cast<int>(shape.height);
  const int width = static_cast<int>(shape.width);
  const int dilation_h = static_cast<int>(shape.dilation_h);
  const int dilation_w = static_cast<int>(shape.dilation_w);
  const int taps = static_cast<int>(shape.kernel_h * shape.kernel_w);
  const int64_t stages = ceil_div(reduction_words, kMmaStageWords);

  for (int r = tid; r < BM; r += kThreads) {
    const int64_t p = m0 + r;
    row_pop[r] = 0;
    if (p < total_pixels) {
      const int64_t image = p / out_plane;
      const int64_t rest = p % out_plane;
      pixel_image[r] = image * shape.height * shape.width;
      pixel_top[r] = static_cast<int>((rest / shape.out_width) * shape.stride_h - shape.pad_h);
      pixel_left[r] = static_cast<int>((rest % shape.out_width) * shape.stride_w - shape.pad_w);
    } else {
      pixel_image[r] = -1;
      pixel_top[r] = pixel_left[r] = 0;
    }
  }
  for (int e = tid; e < BN * taps; e += kThreads) {  // D_t = C - 2 popc(B_t) over real channels
    const int c = e / taps;
    const int t = e - c * taps;
    const int64_t n = n0 + c;
    int count = 0;
    if (n < n_rows) {
      const uint32_t* row = w_bits + n * reduction_words + t * channel_words;
      for (int cw = 0; cw < channel_words; ++cw) count += __popc(__ldg(row + cw) & valid_bits(shape.channels, cw));
    }
    tap_d[c * kOnePlaneMaxTaps + t] = n < n_rows ? static_cast<int>(shape.channels) - 2 * count : 0;
  }
  __syncthreads();
  for (int c = tid; c < BN; c += kThreads) {
    int total = 0;
    for (int t = 0; t < taps; ++t) total += tap_d[c * kOnePlaneMaxTaps + t];
    all_taps_d[c] = total;
  }
  // (all_taps_d is read only in the epilogue, after the main loop's barriers)

  auto issue_stage = [&](int64_t stage) {
    if (stage < stages) {
      uint32_t* base = conv_pipe_smem + (stage % kPipeStages) * kStageWordsAll;
#pragma unroll
      for (int i = 0; i < kLoadsA; ++i) {
        const int e = tid + i * kThreads;
        const int r = e / kVecsPerRow;
        const int word = static_cast<int>(stage * kMmaStageWords) + (e % kVecsPerRow) * 4;
        const uint32_t* source = plus_bits;
        bool fill = false;
        if (word < reduction_words && pixel_image[r] >= 0) {
          const int tap = word / channel_words;  // channel_words % 4 == 0: the 4 words share one tap
          const int channel_word = word - tap * channel_words;
          const int iy = pixel_top[r] + (tap / kernel_w) * dilation_h;
          const int ix = pixel_left[r] + (tap % kernel_w) * dilation_w;
          if (iy >= 0 && iy < height && ix >= 0 && ix < width) {
            fill = true;
            source = plus_bits + (pixel_image[r] + static_cast<int64_t>(iy) * width + ix) * channel_words + channel_word;
          }
        }
        cp_async_16(base + r * kMmaRowStride + (e % kVecsPerRow) * 4, source, fill);
      }
#pragma unroll
      for (int i = 0; i < kLoadsB; ++i) {
        const int e = tid + i * kThreads;
        const int64_t row = n0 + e / kVecsPerRow;
        const int word = static_cast<int>(stage * kMmaStageWords) + (e % kVecsPerRow) * 4;
        const bool fill = row < n_rows && word < reduction_words;
        cp_async_16(base + kStageWordsA + (e / kVecsPerRow) * kMmaRowStride + (e % kVecsPerRow) * 4,
                    fill ? w_bits + row * reduction_words + word : w_bits, fill);
      }
    }
    cp_async_commit();
  };

  int acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0;
  }
  int pop[kLoadsA];
#pragma unroll
  for (int i = 0; i < kLoadsA; ++i) pop[i] = 0;

#pragma unroll
  for (int s = 0; s < kPipeStages - 1; ++s) issue_stage(s);
  for (int64_t stage = 0; stage < stages; ++stage) {
    cp_async_wait<kPipeStages - 2>();
    __syncthreads();
    issue_stage(stage + kPipeStages - 1);
    const uint32_t* a_tile = conv_pipe_smem + (stage % kPipeStages) * kStageWordsAll;
    const uint32_t* b_tile = a_tile + kStageWordsA;
#pragma unroll
    for (int i = 0; i < kLoadsA; ++i) {
      const int e = tid + i * kThreads;
      const uint4 v = *reinterpret_cast<const uint4*>(&a_tile[(e / kVecsPerRow) * kMmaRowStride + (e % kVecsPerRow) * 4]);
      pop[i] += __popc(v.x) + __popc(v.y) + __popc(v.z) + __popc(v.w);
    }
    mma_shared_stage<MT, NT>(acc, a_tile + warp_m * kWarpRows * kMmaRowStride, b_tile + warp_n * kWarpCols * kMmaRowStride,
                             group, thread_in_group);
  }
  cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < kLoadsA; ++i) atomicAdd(&row_pop[(tid + i * kThreads) / kVecsPerRow], pop[i]);
  __syncthreads();

  const uint32_t all_taps = taps >= 32 ? 0xffffffffu : (1u << taps) - 1u;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int local_row = warp_m * kWarpRows + mt * 16 + group + 8 * h;
      const int64_t p = m0 + local_row;
      if (p >= total_pixels) continue;
      const float factor = row_factor(ep, p);
      const int64_t image = p / out_plane;
      const int64_t position = p % out_plane;
      uint32_t inside = 0;  // the taps of this pixel inside the image (bit t)
      for (int t = 0; t < taps; ++t) {
        const int iy = pixel_top[local_row] + (t / kernel_w) * dilation_h;
        const int ix = pixel_left[local_row] + (t % kernel_w) * dilation_w;
        inside |= static_cast<uint32_t>(iy >= 0 && iy < height && ix >= 0 && ix < width) << t;
      }
      const int pop_p = row_pop[local_row];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int local_col = warp_n * kWarpCols + nt * 8 + 2 * thread_in_group + e;
          const int64_t n = n0 + local_col;
          if (n >= n_rows) continue;
          int inside_d = all_taps_d[local_col];
          if (inside != all_taps) {
            inside_d = 0;
            for (int t = 0; t < taps; ++t) inside_d += (inside >> t) & 1u ? tap_d[local_col * kOnePlaneMaxTaps + t] : 0;
          }
          // 4 popc(P & B) - 2 popc(P) + sum_in D_t - pad_value * sum_padded D_t
          const int dot = 4 * acc[mt][nt][2 * h + e] - 2 * pop_p + inside_d -
                          shape.pad_value * (all_taps_d[local_col] - inside_d);
          const int64_t index = out_channels_last ? p * n_rows + n : (image * n_rows + n) * out_plane + position;
          out[index] = from_float<OutT>(
              epilogue_value(static_cast<float>(dot), factor, column_scale(ep, n), column_bias(ep, n)));
        }
      }
    }
  }
}

template <typename OutT>
cudaError_t binary_conv2d_pipelined_launch(const uint32_t* plus_bits, const uint32_t* w_bits, const ConvShape& shape,
                                           const Epilogue& ep, OutT* out, bool out_channels_last, cudaStream_t stream) {
  constexpr int BM = 128, BN = 64, WARPS_M = 4, WARPS_N = 2;
  const int64_t total_pixels = shape.batch * shape.out_height * shape.out_width;
  const int64_t channel_words = ceil_div(shape.channels, 32);
  const int64_t reduction_words = shape.kernel_h * shape.kernel_w * channel_words;
  const int64_t m_tiles = ceil_div(total_pixels, BM);
  const int64_t blocks = m_tiles * ceil_div(shape.out_channels, BN);
  if (blocks > INT_MAX || reduction_words > INT_MAX / 2 || shape.height > INT_MAX / 4 || shape.width > INT_MAX / 4) {
    return cudaErrorInvalidValue;
  }
  constexpr size_t smem = static_cast<size_t>(kPipeStages) * (BM + BN) * kMmaRowStride * sizeof(uint32_t);
  auto kernel = binary_conv2d_pipelined_kernel<BM, BN, WARPS_M, WARPS_N, OutT>;
  static unsigned long long smem_devices = 0;
  const cudaError_t error = allow_dynamic_smem(kernel, smem, smem_devices);
  if (error != cudaSuccess) return error;
  kernel<<<static_cast<unsigned>(blocks), WARPS_M * WARPS_N * 32, smem, stream>>>(
      plus_bits, w_bits, shape, m_tiles, total_pixels, static_cast<int>(channel_words),
      static_cast<int>(reduction_words), ep, out, out_channels_last);
  return cudaGetLastError();
}

template <typename OutT>
cudaError_t binary_conv2d_mma_typed(const uint32_t* plus_bits, const uint32_t* minus_bits, const uint32_t* w_bits,
                                    const ConvShape& shape, const Epilogue& ep, OutT* out, bool out_channels_last,
                                    cudaStream_t stream) {
  const bool vec = ceil_div(shape.channels, 32) % 4 == 0 && reinterpret_cast<uintptr_t>(plus_bits) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(minus_bits) % 16 == 0 && reinterpret_cast<uintptr_t>(w_bits) % 16 == 0;
  const bool sign_zero = minus_bits != nullptr;
  const bool one_plane = !sign_zero && !shape.two_planes && shape.kernel_h * shape.kernel_w <= kOnePlaneMaxTaps;
  if (vec) {
    if (sign_zero) return binary_conv2d_mma_launch<4, true, false>(plus_bits, minus_bits, w_bits, shape, ep, out, out_channels_last, stream);
    if (one_plane && shape.pipelined) return binary_conv2d_pipelined_launch(plus_bits, w_bits, shape, ep, out, out_channels_last, stream);
    if (one_plane) return binary_conv2d_mma_launch<4, false, true>(plus_bits, minus_bits, w_bits, shape, ep, out, out_channels_last, stream);
    return binary_conv2d_mma_launch<4, false, false>(plus_bits, minus_bits, w_bits, shape, ep, out, out_channels_last, stream);
  }
  if (sign_zero) return binary_conv2d_mma_launch<1, true, false>(plus_bits, minus_bits, w_bits, shape, ep, out, out_channels_last, stream);
  if (one_plane) return binary_conv2d_mma_launch<1, false, true>(plus_bits, minus_bits, w_bits, shape, ep, out, out_channels_last, stream);
  return binary_conv2d_mma_launch<1, false, false>(plus_bits, minus_bits, w_bits, shape, ep, out, out_channels_last, stream);
}

// ---------------------------------------------------------------------------------------------
// binary_conv2d (and binary_linear with sign_zero) with popcounts on the CUDA cores
// ---------------------------------------------------------------------------------------------
constexpr int kConvThreads = 256;
constexpr int kConvPixels = 64;    // output pixels per block
constexpr int kConvChannels = 64;  // output channels per block
constexpr int kConvWords = 32;     // channel words staged per tap chunk
constexpr int kConvTile = 4;       // a thread's register tile: 4 pixels x 4 channels (stride 16)

template <typename OutT, bool SIGN_ZERO>
__global__ __launch_bounds__(kConvThreads) void binary_conv2d_kernel(
    const uint32_t* __restrict__ plus_bits, const uint32_t* __restrict__ minus_bits,
    const uint32_t* __restrict__ w_bits, ConvShape shape, int64_t pixel_tiles, Epilogue ep, OutT* __restrict__ out,
    bool out_channels_last) {
  // +1 word padding per row: a warp reading column w of 16 rows hits 16 banks.
  __shared__ uint32_t a_plus[kConvPixels][kConvWords + 1];
  __shared__ uint32_t a_minus[SIGN_ZERO ? kConvPixels : 1][kConvWords + 1];
  __shared__ uint32_t b_tile[kConvChannels][kConvWords + 1];
  __shared__ int64_t pixel_image[kConvPixels];  // batch index * H * W, or -1 past the last pixel
  __shared__ int64_t pixel_top[kConvPixels];    // oh * stride_h - pad_h
  __shared__ int64_t pixel_left[kConvPixels];   // ow * stride_w - pad_w

  const int tid = threadIdx.x;
  const int ty = tid / 16;  // pixels ty + 16 i
  const int tx = tid % 16;  // channels tx + 16 j
  const int64_t p0 = (static_cast<int64_t>(blockIdx.x) % pixel_tiles) * kConvPixels;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) / pixel_tiles) * kConvChannels;
  const int64_t out_plane = shape.out_height * shape.out_width;
  const int64_t total_pixels = shape.batch * out_plane;
  const int64_t channel_words = ceil_div(shape.channels, 32);
  const int64_t taps = shape.kernel_h * shape.kernel_w;
  const int channels = static_cast<int>(shape.channels);

  if (tid < kConvPixels) {
    const int64_t p = p0 + tid;
    if (p < total_pixels) {
      const int64_t image = p / out_plane;
      const int64_t rest = p % out_plane;
      pixel_image[tid] = image * shape.height * shape.width;
      pixel_top[tid] = (rest / shape.out_width) * shape.stride_h - shape.pad_h;
      pixel_left[tid] = (rest % shape.out_width) * shape.stride_w - shape.pad_w;
    } else {
      pixel_image[tid] = -1;
      pixel_top[tid] = pixel_left[tid] = 0;
    }
  }

  int acc[kConvTile][kConvTile];
#pragma unroll
  for (int i = 0; i < kConvTile; ++i) {
#pragma unroll
    for (int j = 0; j < kConvTile; ++j) acc[i][j] = 0;
  }

  for (int64_t tap = 0; tap < taps; ++tap) {
    const int64_t dy = (tap / shape.kernel_w) * shape.dilation_h;
    const int64_t dx = (tap % shape.kernel_w) * shape.dilation_w;
    int part[kConvTile][kConvTile];  // this tap's popcount sums
#pragma unroll
    for (int i = 0; i < kConvTile; ++i) {
#pragma unroll
      for (int j = 0; j < kConvTile; ++j) part[i][j] = 0;
    }
    for (int64_t first_word = 0; first_word < channel_words; first_word += kConvWords) {
      __syncthreads();  // the previous chunk is consumed (and the pixel table written)
      for (int e = tid; e < kConvPixels * kConvWords; e += kConvThreads) {
        const int p = e / kConvWords;
        const int w = e % kConvWords;
        const int64_t cw = first_word + w;
        uint32_t plus = 0, minus = 0;
        const int64_t image = pixel_image[p];
        if (image >= 0 && cw < channel_words) {
          const int64_t iy = pixel_top[p] + dy;
          const int64_t ix = pixel_left[p] + dx;
          if (iy >= 0 && iy < shape.height && ix >= 0 && ix < shape.width) {
            const int64_t index = (image + iy * shape.width + ix) * channel_words + cw;
            plus = __ldg(plus_bits + index);
            if (SIGN_ZERO) minus = __ldg(minus_bits + index);
          } else {
            plus = valid_bits(shape.channels, cw);  // padding: s(x) = +1 here, times pad_value below
          }
        }
        a_plus[p][w] = plus;
        if (SIGN_ZERO) a_minus[p][w] = minus;
      }
      for (int e = tid; e < kConvChannels * kConvWords; e += kConvThreads) {
        const int c = e / kConvWords;
        const int w = e % kConvWords;
        const int64_t oc = c0 + c;
        const int64_t cw = first_word + w;
        uint32_t bits = 0;
        if (oc < shape.out_channels && cw < channel_words) {
          bits = __ldg(w_bits + (oc * taps + tap) * channel_words + cw) & valid_bits(shape.channels, cw);
        }
        b_tile[c][w] = bits;
      }
      __syncthreads();
      const int words_here = static_cast<int>(channel_words - first_word < kConvWords ? channel_words - first_word
                                                                                      : kConvWords);
#pragma unroll 4
      for (int w = 0; w < words_here; ++w) {
        uint32_t a[kConvTile], an[kConvTile], b[kConvTile];
#pragma unroll
        for (int i = 0; i < kConvTile; ++i) {
          a[i] = a_plus[ty + 16 * i][w];
          if (SIGN_ZERO) an[i] = a_minus[ty + 16 * i][w];
        }
#pragma unroll
        for (int j = 0; j < kConvTile; ++j) b[j] = b_tile[tx + 16 * j][w];
#pragma unroll
        for (int i = 0; i < kConvTile; ++i) {
#pragma unroll
          for (int j = 0; j < kConvTile; ++j) {
            if (SIGN_ZERO) {
              // +1 where (x > 0, w = +1) or (x < 0, w = -1); -1 where the signs differ; 0 where x = 0.
              part[i][j] += __popc((a[i] & b[j]) | (an[i] & ~b[j])) - __popc((a[i] & ~b[j]) | (an[i] & b[j]));
            } else {
              part[i][j] += __popc(a[i] ^ b[j]);  // disagreements
            }
          }
        }
      }
    }
    // Fold the tap in: in-bounds taps count once, padded ones times pad_value.
#pragma unroll
    for (int i = 0; i < kConvTile; ++i) {
      const int p = ty + 16 * i;
      const int64_t iy = pixel_top[p] + dy;
      const int64_t ix = pixel_left[p] + dx;
      const bool inside = iy >= 0 && iy < shape.height && ix >= 0 && ix < shape.width;
      const int factor = inside ? 1 : shape.pad_value;
#pragma unroll
      for (int j = 0; j < kConvTile; ++j) {
        const int dot = SIGN_ZERO ? part[i][j] : channels - 2 * part[i][j];
        acc[i][j] += factor * dot;
      }
    }
  }

  float col_scales[kConvTile], col_biases[kConvTile];
#pragma unroll
  for (int j = 0; j < kConvTile; ++j) {
    const int64_t oc = c0 + tx + 16 * j;
    col_scales[j] = oc < shape.out_channels ? column_scale(ep, oc) : 0.f;
    col_biases[j] = oc < shape.out_channels ? column_bias(ep, oc) : 0.f;
  }
#pragma unroll
  for (int i = 0; i < kConvTile; ++i) {
    const int64_t p = p0 + ty + 16 * i;
    if (p >= total_pixels) continue;
    const int64_t image = p / out_plane;
    const int64_t position = p % out_plane;
    const float factor = row_factor(ep, p);
#pragma unroll
    for (int j = 0; j < kConvTile; ++j) {
      const int64_t oc = c0 + tx + 16 * j;
      if (oc >= shape.out_channels) continue;
      const int64_t index = out_channels_last ? p * shape.out_channels + oc
                                              : (image * shape.out_channels + oc) * out_plane + position;
      out[index] = from_float<OutT>(epilogue_value(static_cast<float>(acc[i][j]), factor, col_scales[j], col_biases[j]));
    }
  }
}

template <typename OutT>
cudaError_t binary_conv2d_typed(const uint32_t* plus_bits, const uint32_t* minus_bits, const uint32_t* w_bits,
                                const ConvShape& shape, const Epilogue& ep, OutT* out, bool out_channels_last,
                                cudaStream_t stream) {
  const int64_t pixel_tiles = ceil_div(shape.batch * shape.out_height * shape.out_width, kConvPixels);
  const int64_t blocks = pixel_tiles * ceil_div(shape.out_channels, kConvChannels);
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  if (minus_bits != nullptr) {
    binary_conv2d_kernel<OutT, true><<<static_cast<unsigned>(blocks), kConvThreads, 0, stream>>>(
        plus_bits, minus_bits, w_bits, shape, pixel_tiles, ep, out, out_channels_last);
  } else {
    binary_conv2d_kernel<OutT, false><<<static_cast<unsigned>(blocks), kConvThreads, 0, stream>>>(
        plus_bits, minus_bits, w_bits, shape, pixel_tiles, ep, out, out_channels_last);
  }
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// binary_weight_linear: x (float) times +-1 weights, GEMV style
// ---------------------------------------------------------------------------------------------
constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGemvRowsPerWarp = 4;               // output rows (w rows) per warp
constexpr int kGemvChunk = 32 * 32;               // k values staged per chunk: one word per lane
constexpr int kGemvRowsPerBlock = kGemvWarps * kGemvRowsPerWarp;

template <typename T, int MB>
__global__ __launch_bounds__(kGemvThreads) void binary_weight_linear_kernel(
    const T* __restrict__ x, const uint32_t* __restrict__ w_bits, int64_t m_rows, int64_t n_rows, int64_t k,
    int64_t words, int64_t m_blocks, Epilogue ep, T* __restrict__ out) {
  // x_chunk[m][j][w] = x[m0 + m, chunk_start + 32 w + j]: lane w reads word w's values, 33 breaks bank
  // conflicts of the transposing stores.
  __shared__ float x_chunk[MB][32][33];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) % m_blocks) * MB;
  const int64_t n_first =
      (static_cast<int64_t>(blockIdx.x) / m_blocks) * kGemvRowsPerBlock + warp * kGemvRowsPerWarp;

  float acc[MB][kGemvRowsPerWarp];
#pragma unroll
  for (int m = 0; m < MB; ++m) {
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r) acc[m][r] = 0.f;
  }

  const int64_t chunks = ceil_div(words, 32);
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t word = chunk * 32 + lane;
    uint32_t w_word[kGemvRowsPerWarp];  // issued before the x staging so both loads are in flight
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r) {
      const int64_t n = n_first + r;
      // Words past the end read as 0 (-1 signs) against x = 0: they add nothing; neither do tail bits.
      w_word[r] = (n < n_rows && word < words) ? __ldg(w_bits + n * words + word) : 0u;
    }
    __syncthreads();  // the previous chunk is consumed
    for (int e = tid; e < MB * kGemvChunk; e += kGemvThreads) {
      const int m = e / kGemvChunk;
      const int offset = e % kGemvChunk;
      const int64_t row = m0 + m;
      const int64_t column = chunk * kGemvChunk + offset;
      x_chunk[m][offset % 32][offset / 32] = (row < m_rows && column < k) ? to_float(x[row * k + column]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      float xv[MB];
#pragma unroll
      for (int m = 0; m < MB; ++m) xv[m] = x_chunk[m][j][lane];
#pragma unroll
      for (int r = 0; r < kGemvRowsPerWarp; ++r) {
        // s(w) as a float: +1.0f (0x3f800000) with the sign bit set where bit j of the word is 0.
        const float sign = __uint_as_float(0x3f800000u | ((~w_word[r] << (31 - j)) & 0x80000000u));
#pragma unroll
        for (int m = 0; m < MB; ++m) acc[m][r] = fmaf(xv[m], sign, acc[m][r]);
      }
    }
  }

#pragma unroll
  for (int m = 0; m < MB; ++m) {
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r) acc[m][r] = warp_sum(acc[m][r]);
  }
  if (lane == 0) {
#pragma unroll
    for (int m = 0; m < MB; ++m) {
#pragma unroll
      for (int r = 0; r < kGemvRowsPerWarp; ++r) {
        const int64_t row = m0 + m;
        const int64_t n = n_first + r;
        if (row < m_rows && n < n_rows) {
          out[row * n_rows + n] =
              from_float<T>(epilogue_value(acc[m][r], row_factor(ep, row), column_scale(ep, n), column_bias(ep, n)));
        }
      }
    }
  }
}

template <typename T, int MB>
cudaError_t binary_weight_linear_rows(const T* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows, int64_t k,
                                      const Epilogue& ep, T* out, cudaStream_t stream) {
  const int64_t m_blocks = ceil_div(m_rows, MB);
  const int64_t blocks = m_blocks * ceil_div(n_rows, kGemvRowsPerBlock);
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  binary_weight_linear_kernel<T, MB><<<static_cast<unsigned>(blocks), kGemvThreads, 0, stream>>>(
      x, w_bits, m_rows, n_rows, k, ceil_div(k, 32), m_blocks, ep, out);
  return cudaGetLastError();
}

template <typename T>
cudaError_t binary_weight_linear_typed(const T* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows, int64_t k,
                                       const Epilogue& ep, T* out, cudaStream_t stream) {
  if (m_rows <= 1) return binary_weight_linear_rows<T, 1>(x, w_bits, m_rows, n_rows, k, ep, out, stream);
  if (m_rows <= 2) return binary_weight_linear_rows<T, 2>(x, w_bits, m_rows, n_rows, k, ep, out, stream);
  if (m_rows <= 4) return binary_weight_linear_rows<T, 4>(x, w_bits, m_rows, n_rows, k, ep, out, stream);
  return binary_weight_linear_rows<T, 8>(x, w_bits, m_rows, n_rows, k, ep, out, stream);
}

// ---------------------------------------------------------------------------------------------
// binary_weight_linear on bf16/fp16 tensor cores (M <= 32 rows of x a pass): one pass over W
// ---------------------------------------------------------------------------------------------
// mma.sync.m16n8k16 with A = 16 output features (rows of W, expanded from bits in registers) and
// B = 8 rows of x (from shared memory); C is [features][x rows], fp32 accumulation. Fragment layout
// (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), g = lane >> 2, t = lane & 3:
//   A: reg0 = (row g, k 2t, 2t+1)  reg1 = (row g+8, k 2t, 2t+1)  reg2 = (row g, k 2t+8, 2t+9)  reg3 = (row g+8, ...)
//   B: reg0 = (k 2t, 2t+1; col g)  reg1 = (k 2t+8, 2t+9; col g)
//   C: c0, c1 = (row g, cols 2t, 2t+1)  c2, c3 = (row g+8, cols 2t, 2t+1)
// The k slots of lane t (2t, 2t+1, 2t+8, 2t+9) are the same in A and B, so any assignment of real k to
// (step, t, slot) works if A and B use the same one. Lane t holds words 4t..4t+3 of a 512-bit chunk of
// its rows (one 16-byte load a row); step s = 8w + q of the chunk uses word w, shifted v = u << (14 - 2q):
//   slot 2t  <- bit 2q+1  (v bit 15)      slot 2t+8 <- bit 2q    (v bit 14)
//   slot 2t+1 <- bit 2q+17 (v bit 31)     slot 2t+9 <- bit 2q+16 (v bit 30)
// Odd bits become +-1 through the sign bit: (v & 0x80008000) ^ (-1, -1) (bit 1 -> +1.0, bit 0 -> -1.0,
// the same for bf16 0xBF80 and fp16 0xBC00). Even bits become {0, 2.0} with one AND: v & 0x40004000
// (2.0 is 0x4000 in both types), and 2 * bit(w) - 1 = s(w) needs minus the sum of x over even k, which
// the staging of x computes per row ("correction"). One shift serves two registers: 0.75 integer ops a
// weight, the cost that bounds this kernel (the tensor cores and W's bytes are cheaper).
// x in shared memory: for each word W and q the four values (x[2q+1], x[2q+17], x[2q], x[2q+16]) of
// that word as one 8-byte group, so a B fragment is one 8-byte load; groups ordered (chunk, w, q, t)
// so the four lanes t of a row read 32 consecutive bytes, rows padded by 32 bytes (no bank conflicts).
// fp32 x is split exactly into three bf16 parts (hi + mid + lo), three MMAs each; products with +-1
// and 2 are exact, the sums are fp32 as before. For fp32 x the even bits are exact +-1 too ((v << 1) &
// 0x80008000 ^ (-1, -1): one more shift and LOP3 against three MMAs) and there is no correction: with
// {0, 2.0} the accumulator grows like the sum of x over even k, and the tensor cores' truncating fp32
// accumulation loses ~1e-5 of that when x has one sign (a numpy model of the kernel, K = 8192 in one
// slice: 2.4e-5 for uniform x, 5.3e-6 for relu(randn); with +-1: 1.6e-7 and 6.5e-8).
// Split K: a cluster of `slices` blocks (K ranges) of one feature block reduces its partial tiles
// through distributed shared memory, in rank order (deterministic), and applies the epilogue.
constexpr int kTcWarps = 8;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcFeatures = kTcWarps * 32;  // output features per block: two m16 tiles per warp
constexpr int kTcChunkWords = 16;           // 512 k per chunk: lane t holds words 4t..4t+3
constexpr int kTcMaxSlices = 8;             // portable cluster size

template <typename MmaT>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef BITCOMPILE_PRE_AMPERE_DEVICE
  __trap();
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef BITCOMPILE_PRE_AMPERE_DEVICE
  __trap();
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// -1.0 in both halves (the sign bit flipped by a set weight bit gives +1.0).
template <typename MmaT>
struct MinusOnePair;
template <>
struct MinusOnePair<__nv_bfloat16> {
  static constexpr uint32_t value = 0xBF80BF80u;
};
template <>
struct MinusOnePair<__half> {
  static constexpr uint32_t value = 0xBC00BC00u;
};

// (v & 0x80008000) ^ minus_one as one LOP3 (0x6A = (a & b) ^ c). Written as C++, the two constants are two
// immediates and a SASS LOP3 takes one: ptxas splits it in two instructions, 33% more integer work here.
__device__ __forceinline__ uint32_t sign_pair(uint32_t v, uint32_t minus_one) {
  uint32_t result;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(result) : "r"(v), "n"(0x80008000), "r"(minus_one));
  return result;
}

__device__ __forceinline__ uint16_t mma_bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ uint16_t mma_bits(__half v) { return __half_as_ushort(v); }

// Part `part` of x as the MMA type: the value itself (PARTS = 1), or the exact three-way bf16 split of fp32.
template <typename MmaT, int PARTS>
__device__ __forceinline__ void split_value(float v, uint16_t (&bits)[PARTS]) {
  if constexpr (PARTS == 1) {
    bits[0] = mma_bits(from_float<MmaT>(v));  // exact: x already has this type
  } else {
    float rest = v;
#pragma unroll
    for (int p = 0; p < PARTS; ++p) {
      const __nv_bfloat16 piece = __float2bfloat16_rn(rest);
      bits[p] = __bfloat16_as_ushort(piece);
      rest -= __bfloat162float(piece);  // exact (Sterbenz-like: piece is rest rounded)
    }
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int w) {
  return w == 0 ? v.x : (w == 1 ? v.y : (w == 2 ? v.z : v.w));
}

// InT: x's type; MmaT: the tensor-core type (bf16 for fp32 x, in PARTS = 3 pieces); NB: n8 tiles (8 rows of
// x each); STAGE_CHUNKS: chunks of x staged in shared memory at a time; VEC: 16-byte W loads.
template <typename InT, typename MmaT, int PARTS, int NB, int STAGE_CHUNKS, bool VEC>
__global__ __launch_bounds__(kTcThreads, 2) void binary_weight_linear_tc_kernel(
    const InT* __restrict__ x, const uint32_t* __restrict__ w_bits, int64_t m_rows, int64_t n_rows, int64_t k,
    int64_t words, int slices, int64_t slice_chunks, Epilogue ep, InT* __restrict__ out) {
  constexpr int MB = NB * 8;                               // rows of x a block
  constexpr int kStageWords = STAGE_CHUNKS * kTcChunkWords;
  constexpr int kGroupsPerRow = kStageWords * 8;           // 8-byte groups of a staged row
  constexpr int kRowStride = kGroupsPerRow + 4;            // + 32 bytes: rows g, g+1 on other banks
  extern __shared__ __align__(16) unsigned char tc_smem[];
  uint2* x_stage = reinterpret_cast<uint2*>(tc_smem);      // [PARTS][MB][kRowStride]
  float* correction = reinterpret_cast<float*>(x_stage + PARTS * MB * kRowStride);  // [MB]
  float* partial = reinterpret_cast<float*>(tc_smem);      // [MB][kTcFeatures], after the main loop

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int slice = static_cast<int>(blockIdx.x % static_cast<unsigned>(slices));
  const int64_t n_block = (blockIdx.x / static_cast<unsigned>(slices)) * static_cast<int64_t>(kTcFeatures);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * MB;
  const int64_t total_chunks = ceil_div(words, kTcChunkWords);
  const int64_t chunk_begin = slice * slice_chunks;
  const int64_t chunk_end = chunk_begin + slice_chunks < total_chunks ? chunk_begin + slice_chunks : total_chunks;

  // This lane's four W rows: tile 0 rows g, g+8; tile 1 rows 16+g, 24+g.
  int64_t w_row[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) w_row[r] = n_block + warp * 32 + (r >> 1) * 16 + (r & 1) * 8 + g;

  // Words 4t..4t+3 of chunk c of the four rows; rows and words past the end read as 0 (x is 0 there too).
  auto load_chunk = [&](uint4 (&dst)[4], int64_t c) {
    const int64_t word = c * kTcChunkWords + 4 * t;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if (VEC) {
        dst[r] = (w_row[r] < n_rows && word < words) ? __ldg(reinterpret_cast<const uint4*>(w_bits + w_row[r] * words + word))
                                                    : make_uint4(0, 0, 0, 0);
      } else {
        uint32_t v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = (w_row[r] < n_rows && word + i < words) ? __ldg(w_bits + w_row[r] * words + word + i) : 0u;
        dst[r] = make_uint4(v[0], v[1], v[2], v[3]);
      }
    }
  };

  // The low parts of split fp32 x sum apart: their rounding stays relative to their own (small) size.
  float acc[2][NB][4], acc_low[2][NB][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int j = 0; j < NB; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mt][j][c] = acc_low[mt][j][c] = 0.f;
    }
  }
  // Sum of x over even k, rows warp + 8 i (fixed order: per lane, then a warp sum).
  float even_sum[NB];
#pragma unroll
  for (int i = 0; i < NB; ++i) even_sum[i] = 0.f;

  const uint32_t minus_one = MinusOnePair<MmaT>::value;

  uint4 current[4], next[4];
  if (chunk_begin < chunk_end) load_chunk(current, chunk_begin);
  for (int64_t c = chunk_begin; c < chunk_end; ++c) {
    const int local = static_cast<int>((c - chunk_begin) % STAGE_CHUNKS);
    if (local == 0) {
      __syncthreads();  // the previous stage is consumed
      // Warp w stages rows w + 8 i; lane e handles groups (word, q) = e, e + 32, ... of the stage.
      const int64_t k_stage = c * kTcChunkWords * 32;
      // Values of a later slice stay 0 here: this block's correction must cover its own k only.
      const int64_t k_limit = chunk_end * kTcChunkWords * 32 < k ? chunk_end * kTcChunkWords * 32 : k;
#pragma unroll
      for (int i = 0; i < NB; ++i) {
        const int r = warp + kTcWarps * i;
        const int64_t row = m0 + r;
        const InT* x_row = x + row * k;
        for (int e = lane; e < kGroupsPerRow; e += 32) {
          const int word = e >> 3;  // within the stage
          const int q = e & 7;
          const int64_t kb = k_stage + word * 32 + 2 * q;
          const int64_t ks[4] = {kb + 1, kb + 17, kb, kb + 16};
          float v[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) v[u] = (row < m_rows && ks[u] < k_limit) ? to_float(x_row[ks[u]]) : 0.f;
          if constexpr (PARTS != 3) even_sum[i] += v[2] + v[3];
          uint16_t bits[4][PARTS];
#pragma unroll
          for (int u = 0; u < 4; ++u) split_value<MmaT, PARTS>(v[u], bits[u]);
          // Group position: chunk, w = word % 4, q, t = (word % 16) / 4.
          const int position = ((((word >> 4) * 4 + (word & 3)) * 8 + q) * 4) + ((word & 15) >> 2);
#pragma unroll
          for (int p = 0; p < PARTS; ++p) {
            x_stage[(p * MB + r) * kRowStride + position] =
                make_uint2(static_cast<uint32_t>(bits[0][p]) | (static_cast<uint32_t>(bits[1][p]) << 16),
                           static_cast<uint32_t>(bits[2][p]) | (static_cast<uint32_t>(bits[3][p]) << 16));
          }
        }
      }
      __syncthreads();
    }
    if (c + 1 < chunk_end) load_chunk(next, c + 1);  // in flight during this chunk's math

#pragma unroll
    for (int s = 0; s < 32; ++s) {
      const int w = s >> 3;
      const int q = s & 7;
      uint32_t b[PARTS][NB][2];
#pragma unroll
      for (int p = 0; p < PARTS; ++p) {
#pragma unroll
        for (int j = 0; j < NB; ++j) {
          const uint2 pair = x_stage[(p * MB + 8 * j + g) * kRowStride + ((local * 4 + w) * 8 + q) * 4 + t];
          b[p][j][0] = pair.x;
          b[p][j][1] = pair.y;
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint32_t top = word_of(current[2 * mt], w) << (14 - 2 * q);
        const uint32_t bottom = word_of(current[2 * mt + 1], w) << (14 - 2 * q);
        // Even k: {0, 2.0} and the correction (one AND); fp32 x: exact +-1, bit 2q moved to the sign bit
        // (why: the section comment above).
        uint32_t even_top, even_bottom;
        if constexpr (PARTS == 3) {
          even_top = sign_pair(top << 1, minus_one);
          even_bottom = sign_pair(bottom << 1, minus_one);
        } else {
          even_top = top & 0x40004000u;
          even_bottom = bottom & 0x40004000u;
        }
        const uint32_t a[4] = {sign_pair(top, minus_one), sign_pair(bottom, minus_one), even_top, even_bottom};
#pragma unroll
        for (int j = 0; j < NB; ++j) mma_16816<MmaT>(acc[mt][j], a, b[0][j]);
#pragma unroll
        for (int p = 1; p < PARTS; ++p) {
#pragma unroll
          for (int j = 0; j < NB; ++j) mma_16816<MmaT>(acc_low[mt][j], a, b[p][j]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) current[r] = next[r];
  }

#pragma unroll
  for (int i = 0; i < NB; ++i) {
    const float total = warp_sum(even_sum[i]);
    if (lane == 0) correction[warp + kTcWarps * i] = total;
  }
  __syncthreads();  // x_stage is consumed, correction written
  // Partial tile [x row][feature] = acc - sum of x over even k.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int j = 0; j < NB; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int x_row = 8 * j + 2 * t + e;
          const int feature = warp * 32 + mt * 16 + 8 * h + g;
          const float low = PARTS > 1 ? acc_low[mt][j][2 * h + e] : 0.f;
          const float even_correction = PARTS == 3 ? 0.f : correction[x_row];
          partial[x_row * kTcFeatures + feature] = (acc[mt][j][2 * h + e] - even_correction) + low;
        }
      }
    }
  }

  if (slices > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap();  // clusters are Hopper's; the launcher passes slices = 1 on older GPUs
#else
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's partial tile is written
    const int rank = static_cast<int>(cluster.block_rank());
    for (int index = rank * kTcThreads + tid; index < MB * kTcFeatures; index += slices * kTcThreads) {
      const int64_t m = m0 + index / kTcFeatures;
      const int64_t n = n_block + index % kTcFeatures;
      if (m < m_rows && n < n_rows) {
        float sum = 0.f;
        for (int r = 0; r < slices; ++r) sum += cluster.map_shared_rank(partial, r)[index];  // rank order
        out[m * n_rows + n] = from_float<InT>(epilogue_value(sum, row_factor(ep, m), column_scale(ep, n), column_bias(ep, n)));
      }
    }
    cluster.sync();  // no block leaves while another still reads its shared memory
#endif
  } else {
    __syncthreads();
    for (int index = tid; index < MB * kTcFeatures; index += kTcThreads) {
      const int64_t m = m0 + index / kTcFeatures;
      const int64_t n = n_block + index % kTcFeatures;
      if (m < m_rows && n < n_rows) {
        out[m * n_rows + n] =
            from_float<InT>(epilogue_value(partial[index], row_factor(ep, m), column_scale(ep, n), column_bias(ep, n)));
      }
    }
  }
}

// A launch configuration with clusters of `slices` blocks along x (not copyable: config points at attribute).
struct ClusterLaunch {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attribute[1];

  ClusterLaunch(dim3 grid, size_t smem, int64_t slices, cudaStream_t stream) {
    config.gridDim = grid;
    config.blockDim = dim3(kTcThreads, 1, 1);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = static_cast<unsigned>(slices);
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// The largest cluster of at most `slices` blocks (a power of two <= 8) that the current device can
// co-schedule with this kernel's threads and shared memory; 1 where clusters are not supported (before
// sm_90). Asked up front (cudaOccupancyMaxActiveClusters, not a stream operation) rather than learned from
// a refused launch, which inside a CUDA-graph capture would invalidate the capture. Answers are cached in
// `known`, a static of the launcher of this kernel instantiation: for device d, bit 2i of known[d] says
// that a cluster of 2^(i+1) blocks was asked about, bit 2i+1 that it fits (racing callers set the same bits).
template <typename Kernel>
int64_t fitting_cluster(Kernel kernel, int64_t slices, size_t smem, unsigned (&known)[64]) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  for (; slices > 1; slices /= 2) {
    const int i = slices == 2 ? 0 : (slices == 4 ? 1 : 2);
    unsigned state = device < 64 ? __atomic_load_n(&known[device], __ATOMIC_ACQUIRE) : 0u;
    if (((state >> (2 * i)) & 1u) == 0) {  // first time on this device: ask (launches then only read `known`)
      int supported = 0, clusters = 0;
      bool fits = cudaDeviceGetAttribute(&supported, cudaDevAttrClusterLaunch, device) == cudaSuccess && supported != 0;
      if (fits) {
        const ClusterLaunch launch(dim3(static_cast<unsigned>(slices), 1, 1), smem, slices, nullptr);
        fits = cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config) == cudaSuccess && clusters > 0;
      }
      if (!fits) (void)cudaGetLastError();
      state = (1u << (2 * i)) | (fits ? 1u << (2 * i + 1) : 0u);
      if (device < 64) __atomic_fetch_or(&known[device], state, __ATOMIC_RELEASE);
    }
    if ((state >> (2 * i + 1)) & 1u) return slices;
  }
  return 1;
}

template <typename InT, typename MmaT, int PARTS, int NB, int STAGE_CHUNKS>
constexpr size_t tc_smem_bytes() {
  return static_cast<size_t>(PARTS) * NB * 8 * (STAGE_CHUNKS * kTcChunkWords * 8 + 4) * sizeof(uint2) +
         NB * 8 * sizeof(float);
}

template <typename InT, typename MmaT, int PARTS, int NB, int STAGE_CHUNKS, bool VEC>
cudaError_t binary_weight_linear_tc_launch(const InT* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                           int64_t k, const Epilogue& ep, InT* out, int sm_count, cudaStream_t stream) {
  constexpr int MB = NB * 8;
  constexpr size_t smem = tc_smem_bytes<InT, MmaT, PARTS, NB, STAGE_CHUNKS>();
  static_assert(smem >= static_cast<size_t>(MB) * kTcFeatures * sizeof(float), "partial tile aliases x_stage");
  const int64_t words = ceil_div(k, 32);
  const int64_t total_chunks = ceil_div(words, kTcChunkWords);
  const int64_t feature_blocks = ceil_div(n_rows, kTcFeatures);
  const int64_t row_blocks = ceil_div(m_rows, MB);
  if (row_blocks > 65535) return cudaErrorInvalidValue;
  // Split K until about two blocks an SM (the loads need warps in flight), at most a cluster of 8, rounding
  // down so that every block is resident at once (one wave: a second, partial wave would cost up to 50%).
  const int64_t wanted = 2 * static_cast<int64_t>(sm_count > 0 ? sm_count : 132) / (feature_blocks * row_blocks);
  int64_t slices = 1;  // a power of two (cluster shapes 1, 2, 4, 8); trailing slices may get no chunk
  while (slices * 2 <= wanted && slices * 2 <= kTcMaxSlices && slices * 2 <= total_chunks) slices *= 2;
  int64_t slice_chunks = ceil_div(total_chunks, slices);
  if (feature_blocks * slices > INT_MAX) return cudaErrorInvalidValue;

  auto kernel = binary_weight_linear_tc_kernel<InT, MmaT, PARTS, NB, STAGE_CHUNKS, VEC>;
  if (smem > 48 * 1024) {
    static unsigned long long smem_devices = 0;
    const cudaError_t error = allow_dynamic_smem(kernel, smem, smem_devices);
    if (error != cudaSuccess) return error;
  }
  if (slices > 1) {
    static unsigned cluster_sizes[64] = {};
    slices = fitting_cluster(kernel, slices, smem, cluster_sizes);
    slice_chunks = ceil_div(total_chunks, slices);
  }
  if (slices > 1) {
    const ClusterLaunch launch(dim3(static_cast<unsigned>(feature_blocks * slices), static_cast<unsigned>(row_blocks), 1),
                               smem, slices, stream);
    const cudaError_t error = cudaLaunchKernelEx(&launch.config, kernel, x, w_bits, m_rows, n_rows, k, words,
                                                 static_cast<int>(slices), slice_chunks, ep, out);
    if (error == cudaSuccess) return cudaGetLastError();
    (void)cudaGetLastError();  // refused all the same: fall back to one block per feature block
    slices = 1;
    slice_chunks = total_chunks;
  }
  kernel<<<dim3(static_cast<unsigned>(feature_blocks), static_cast<unsigned>(row_blocks), 1), kTcThreads, smem, stream>>>(
      x, w_bits, m_rows, n_rows, k, words, 1, slice_chunks, ep, out);
  return cudaGetLastError();
}

template <typename InT, typename MmaT, int PARTS, int NB, int STAGE_CHUNKS>
cudaError_t binary_weight_linear_tc_aligned(const InT* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                            int64_t k, const Epilogue& ep, InT* out, int sm_count, cudaStream_t stream) {
  const bool vec = ceil_div(k, 32) % 4 == 0 && reinterpret_cast<uintptr_t>(w_bits) % 16 == 0;
  if (vec) {
    return binary_weight_linear_tc_launch<InT, MmaT, PARTS, NB, STAGE_CHUNKS, true>(x, w_bits, m_rows, n_rows, k, ep,
                                                                                     out, sm_count, stream);
  }
  return binary_weight_linear_tc_launch<InT, MmaT, PARTS, NB, STAGE_CHUNKS, false>(x, w_bits, m_rows, n_rows, k, ep,
                                                                                    out, sm_count, stream);
}

// Rows of x a pass: 8 (M <= 8), 16, else 32 (bf16/fp16) or 16 (fp32: three parts, three times the staging).
template <typename InT>
cudaError_t binary_weight_linear_tc_typed(const InT* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                          int64_t k, const Epilogue& ep, InT* out, int sm_count, cudaStream_t stream) {
  if constexpr (std::is_same<InT, float>::value) {
    if (m_rows <= 8) return binary_weight_linear_tc_aligned<float, __nv_bfloat16, 3, 1, 1>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, stream);
    return binary_weight_linear_tc_aligned<float, __nv_bfloat16, 3, 2, 1>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, stream);
  } else {
    if (m_rows <= 8) return binary_weight_linear_tc_aligned<InT, InT, 1, 1, 2>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, stream);
    if (m_rows <= 16) return binary_weight_linear_tc_aligned<InT, InT, 1, 2, 2>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, stream);
    return binary_weight_linear_tc_aligned<InT, InT, 1, 4, 2>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, stream);
  }
}

// ---------------------------------------------------------------------------------------------
// dequantize_signs: W as s(w) * scale in x's type, for cuBLAS at large M
// ---------------------------------------------------------------------------------------------
constexpr int kDequantThreads = 256;

// One thread a packed word: 32 values; 16-byte stores when the row length allows them.
template <typename T>
__global__ __launch_bounds__(kDequantThreads) void dequantize_signs_kernel(const uint32_t* __restrict__ w_bits,
                                                                           int64_t n_rows, int64_t k, int64_t words,
                                                                           const float* __restrict__ scale,
                                                                           int64_t scale_count, T* __restrict__ out) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kDequantThreads + threadIdx.x;
  if (index >= n_rows * words) return;
  const int64_t row = index / words;
  const int64_t word = index % words;
  const float magnitude = scale != nullptr ? scale[scale_count == 1 ? 0 : row] : 1.f;
  const T plus = from_float<T>(magnitude);
  const T minus = from_float<T>(-magnitude);
  const uint32_t bits = __ldg(w_bits + index);
  T* dst = out + row * k + word * 32;
  constexpr int kPerVector = 16 / sizeof(T);
  const bool whole = word * 32 + 32 <= k && k % kPerVector == 0;
  if (whole) {
#pragma unroll
    for (int v = 0; v < 32 / kPerVector; ++v) {
      union {
        uint4 vector;
        T values[kPerVector];
      } pack;
#pragma unroll
      for (int j = 0; j < kPerVector; ++j) pack.values[j] = (bits >> (v * kPerVector + j)) & 1u ? plus : minus;
      reinterpret_cast<uint4*>(dst)[v] = pack.vector;
    }
  } else {
    for (int j = 0; j < 32 && word * 32 + j < k; ++j) dst[j] = (bits >> j) & 1u ? plus : minus;
  }
}

template <typename T>
cudaError_t dequantize_signs_typed(const uint32_t* w_bits, int64_t n_rows, int64_t k, const float* scale,
                                   int64_t scale_count, T* out, cudaStream_t stream) {
  const int64_t words = ceil_div(k, 32);
  const int64_t blocks = ceil_div(n_rows * words, kDequantThreads);
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0) return cudaErrorInvalidValue;
  dequantize_signs_kernel<T><<<static_cast<unsigned>(blocks), kDequantThreads, 0, stream>>>(w_bits, n_rows, k, words,
                                                                                            scale, scale_count, out);
  return cudaGetLastError();
}

bool valid_sizes(int64_t rows, int64_t k) { return rows >= 0 && k >= 1 && k <= INT_MAX; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launchers (binary_kernels.cuh)
// ---------------------------------------------------------------------------------------------
cudaError_t launch_pack_signs(const void* x, FloatType type, int64_t rows, int64_t k, bool sign_zero,
                              uint32_t* plus_bits, uint32_t* minus_bits, float* row_mean_abs, cudaStream_t stream,
                              bool vector_loads) {
  if (!valid_sizes(rows, k) || (sign_zero && minus_bits == nullptr)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  switch (type) {
    case FloatType::kFloat32:
      return pack_signs_typed(static_cast<const float*>(x), rows, k, sign_zero, plus_bits, minus_bits, row_mean_abs,
                              vector_loads, stream);
    case FloatType::kFloat16:
      return pack_signs_typed(static_cast<const __half*>(x), rows, k, sign_zero, plus_bits, minus_bits,
                              row_mean_abs, vector_loads, stream);
    case FloatType::kBFloat16:
      return pack_signs_typed(static_cast<const __nv_bfloat16*>(x), rows, k, sign_zero, plus_bits, minus_bits,
                              row_mean_abs, vector_loads, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_binary_linear_mma(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                     int64_t k, const Epilogue& epilogue, void* out, FloatType out_type,
                                     cudaStream_t stream) {
  if (!valid_sizes(m_rows, k) || n_rows < 0) return cudaErrorInvalidValue;
  if (m_rows == 0 || n_rows == 0) return cudaSuccess;
  switch (out_type) {
    case FloatType::kFloat32:
      return binary_linear_mma_typed(x_bits, w_bits, m_rows, n_rows, k, epilogue, static_cast<float*>(out), stream);
    case FloatType::kFloat16:
      return binary_linear_mma_typed(x_bits, w_bits, m_rows, n_rows, k, epilogue, static_cast<__half*>(out), stream);
    case FloatType::kBFloat16:
      return binary_linear_mma_typed(x_bits, w_bits, m_rows, n_rows, k, epilogue, static_cast<__nv_bfloat16*>(out),
                                     stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_binary_linear_mma_pipelined(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows,
                                               int64_t n_rows, int64_t k, const Epilogue& epilogue, void* out,
                                               FloatType out_type, cudaStream_t stream) {
  if (!valid_sizes(m_rows, k) || n_rows < 0) return cudaErrorInvalidValue;
  if (m_rows == 0 || n_rows == 0) return cudaSuccess;
  switch (out_type) {
    case FloatType::kFloat32:
      return binary_linear_mma_pipelined_typed(x_bits, w_bits, m_rows, n_rows, k, epilogue, static_cast<float*>(out),
                                               stream);
    case FloatType::kFloat16:
      return binary_linear_mma_pipelined_typed(x_bits, w_bits, m_rows, n_rows, k, epilogue, static_cast<__half*>(out),
                                               stream);
    case FloatType::kBFloat16:
      return binary_linear_mma_pipelined_typed(x_bits, w_bits, m_rows, n_rows, k, epilogue,
                                               static_cast<__nv_bfloat16*>(out), stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_binary_conv2d(const uint32_t* plus_bits, const uint32_t* minus_bits, const uint32_t* w_bits,
                                 const ConvShape& shape, const Epilogue& epilogue, void* out, FloatType out_type,
                                 bool out_channels_last, cudaStream_t stream) {
  if (shape.batch < 0 || shape.channels < 1 || shape.channels > INT_MAX || shape.out_channels < 0 ||
      shape.kernel_h < 1 || shape.kernel_w < 1 || shape.pad_value < -1 || shape.pad_value > 1) {
    return cudaErrorInvalidValue;
  }
  if (shape.batch == 0 || shape.out_channels == 0 || shape.out_height <= 0 || shape.out_width <= 0) return cudaSuccess;
  switch (out_type) {
    case FloatType::kFloat32:
      return binary_conv2d_typed(plus_bits, minus_bits, w_bits, shape, epilogue, static_cast<float*>(out),
                                 out_channels_last, stream);
    case FloatType::kFloat16:
      return binary_conv2d_typed(plus_bits, minus_bits, w_bits, shape, epilogue, static_cast<__half*>(out),
                                 out_channels_last, stream);
    case FloatType::kBFloat16:
      return binary_conv2d_typed(plus_bits, minus_bits, w_bits, shape, epilogue, static_cast<__nv_bfloat16*>(out),
                                 out_channels_last, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_binary_weight_linear(const void* x, FloatType type, const uint32_t* w_bits, int64_t m_rows,
                                        int64_t n_rows, int64_t k, const Epilogue& epilogue, void* out,
                                        cudaStream_t stream) {
  if (!valid_sizes(m_rows, k) || n_rows < 0) return cudaErrorInvalidValue;
  if (m_rows == 0 || n_rows == 0) return cudaSuccess;
  switch (type) {
    case FloatType::kFloat32:
      return binary_weight_linear_typed(static_cast<const float*>(x), w_bits, m_rows, n_rows, k, epilogue,
                                        static_cast<float*>(out), stream);
    case FloatType::kFloat16:
      return binary_weight_linear_typed(static_cast<const __half*>(x), w_bits, m_rows, n_rows, k, epilogue,
                                        static_cast<__half*>(out), stream);
    case FloatType::kBFloat16:
      return binary_weight_linear_typed(static_cast<const __nv_bfloat16*>(x), w_bits, m_rows, n_rows, k, epilogue,
                                        static_cast<__nv_bfloat16*>(out), stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_binary_conv2d_mma(const uint32_t* plus_bits, const uint32_t* minus_bits, const uint32_t* w_bits,
                                     const ConvShape& shape, const Epilogue& epilogue, void* out, FloatType out_type,
                                     bool out_channels_last, cudaStream_t stream) {
  if (shape.batch < 0 || shape.channels < 1 || shape.channels > INT_MAX || shape.out_channels < 0 ||
      shape.kernel_h < 1 || shape.kernel_w < 1 || shape.pad_value < -1 || shape.pad_value > 1) {
    return cudaErrorInvalidValue;
  }
  if (shape.batch == 0 || shape.out_channels == 0 || shape.out_height <= 0 || shape.out_width <= 0) return cudaSuccess;
  // The implicit-GEMM kernels keep pixel offsets and dot products in 32 bits. Geometry beyond that (a huge
  // padding, stride or dilation whose offsets would wrap into the image; taps x channels >= 2^29, where
  // 4 * popc(...) overflows) goes to the CUDA-core kernel, which does this math in int64.
  constexpr int64_t kOffsetLimit = INT_MAX / 4;
  const bool wide_geometry = shape.pad_h + (shape.kernel_h - 1) * shape.dilation_h > kOffsetLimit ||
                             shape.pad_w + (shape.kernel_w - 1) * shape.dilation_w > kOffsetLimit ||
                             (shape.out_height - 1) * shape.stride_h > kOffsetLimit ||
                             (shape.out_width - 1) * shape.stride_w > kOffsetLimit ||
                             shape.kernel_h * shape.kernel_w * ceil_div(shape.channels, 32) * 32 >= (int64_t{1} << 29);
  if (wide_geometry) {
    return launch_binary_conv2d(plus_bits, minus_bits, w_bits, shape, epilogue, out, out_type, out_channels_last,
                                stream);
  }
  switch (out_type) {
    case FloatType::kFloat32:
      return binary_conv2d_mma_typed(plus_bits, minus_bits, w_bits, shape, epilogue, static_cast<float*>(out),
                                     out_channels_last, stream);
    case FloatType::kFloat16:
      return binary_conv2d_mma_typed(plus_bits, minus_bits, w_bits, shape, epilogue, static_cast<__half*>(out),
                                     out_channels_last, stream);
    case FloatType::kBFloat16:
      return binary_conv2d_mma_typed(plus_bits, minus_bits, w_bits, shape, epilogue, static_cast<__nv_bfloat16*>(out),
                                     out_channels_last, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_binary_weight_linear_tc(const void* x, FloatType type, const uint32_t* w_bits, int64_t m_rows,
                                           int64_t n_rows, int64_t k, const Epilogue& epilogue, void* out, int sm_count,
                                           cudaStream_t stream) {
  if (!valid_sizes(m_rows, k) || n_rows < 0) return cudaErrorInvalidValue;
  if (m_rows == 0 || n_rows == 0) return cudaSuccess;
  switch (type) {
    case FloatType::kFloat32:
      return binary_weight_linear_tc_typed(static_cast<const float*>(x), w_bits, m_rows, n_rows, k, epilogue,
                                           static_cast<float*>(out), sm_count, stream);
    case FloatType::kFloat16:
      return binary_weight_linear_tc_typed(static_cast<const __half*>(x), w_bits, m_rows, n_rows, k, epilogue,
                                           static_cast<__half*>(out), sm_count, stream);
    case FloatType::kBFloat16:
      return binary_weight_linear_tc_typed(static_cast<const __nv_bfloat16*>(x), w_bits, m_rows, n_rows, k, epilogue,
                                           static_cast<__nv_bfloat16*>(out), sm_count, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_dequantize_signs(const uint32_t* w_bits, int64_t n_rows, int64_t k, const float* scale,
                                    int64_t scale_count, void* out, FloatType type, cudaStream_t stream) {
  if (!valid_sizes(n_rows, k)) return cudaErrorInvalidValue;
  if (n_rows == 0) return cudaSuccess;
  switch (type) {
    case FloatType::kFloat32:
      return dequantize_signs_typed(w_bits, n_rows, k, scale, scale_count, static_cast<float*>(out), stream);
    case FloatType::kFloat16:
      return dequantize_signs_typed(w_bits, n_rows, k, scale, scale_count, static_cast<__half*>(out), stream);
    case FloatType::kBFloat16:
      return dequantize_signs_typed(w_bits, n_rows, k, scale, scale_count, static_cast<__nv_bfloat16*>(out), stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace bitcompile
