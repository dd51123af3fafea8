// pack_signs: binarize and pack rows of x into sign bits (SPEC 2.1), also the activation packing inside
// binary_linear and binary_conv2d. Torch-free (launcher in binary_kernels.cuh).
//
// pack_signs_vector_kernel (k % 32 == 0, k > 1024, 16-byte aligned x): 16-byte loads, kPackUnroll a lane in flight;
//   the lanes of one word OR their bits together with shuffles.
// pack_signs_kernel (any k): one warp packs one word per __ballot_sync (lane j reads value 32*w + j, so the
//   ballot is the word in the storage format, LSB first).
// Both: 1-8 warps share a row (more for long rows, all in one block); the same pass writes the second bit plane of
// torch.sign inputs (x < 0), mean|x| of each row (binary_linear's row_scale), reduced in a fixed order
// (deterministic), and the popcount of each row's plus_bits (binary_linear's x_popcounts: the W1A1 wgmma kernel
// then does not count x's rows itself): each warp counts the words it writes, the warps of a row add theirs through
// shared memory as for mean|x| (no atomics, nothing to zero first).
// pack_signs_rows_kernel (k % 32 == 0, k <= 1024, 16-byte aligned x: conv activations, one row a pixel): the
//   matrix as one stream of 16-byte vectors; a block takes a tile of whole rows (the most that fit in 256 x 4
//   vectors), thread t loads vectors t, t + 256, t + 512, t + 768 of the tile (every load instruction reads 512
//   contiguous bytes a warp, 4 in flight a thread), the 32 / V lanes of a word OR their bits with shuffles.
//   Grid-stride over the tiles, the grid sized to the resident blocks. mean|x|: each lane sums its V values in
//   order, the lanes of a word in a fixed shuffle tree, then one thread a row adds its word sums in order
//   (deterministic, and independent of the grid). Popcounts the same way: the writer of a word keeps its popcount
//   in shared memory, one thread a row adds them.
// The popcount path is a template flag (POPC) of each kernel: launches without row_popcounts run code without it.
// What counting costs (H100, harness rotating graph us, without / with, 2026-12-05): bf16 512 x 8192 4.93 / 5.30,
// 4096 x 8192 25.90 / 26.06, fp16 4099 x 1024 (short-row kernel) 4.77 / 5.50; the W1A1 GEMM it feeds (N = K = 8192,
// bf16 out) 15.67 -> 13.86 at M = 512 and 71.24 -> 69.95 at 4096.
// All three let the next launch on the stream start early (launch_dependents: binary_linear's and the conv's
// kernels are launched dependent and wait for the bits with griddepcontrol.wait). Launched dependent themselves
// (launch_pack_signs' `dependent`), they read x at once and wait for the grid before them only at their end, so that
// their completion implies its (the conv's D_t table, launch_conv_tap_table_first).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "device_common.cuh"

namespace bitcompile {
namespace cuda {
namespace {

constexpr int kPackThreads = 256;
constexpr int kPackWarps = kPackThreads / 32;
constexpr int kPackUnroll = 4;  // words a warp has in flight

// The end of pack_signs_kernel and pack_signs_vector_kernel: each warp's mean |x| sum and popcount (both already
// summed over the warp's lanes) handed through shared memory to lane 0 of the row's first warp, which adds the row's
// warps in order (deterministic) and writes mean |x| and the popcount. Every thread of the block calls it.
template <bool POPC>
__device__ __forceinline__ void row_totals(bool mean, float warp_abs_sum, int warp_ones, float* partial_sums,
                                           int* partial_counts, int64_t row, int64_t rows, int64_t k, int part,
                                           int row_in_block, int warps_per_row, float* row_mean_abs,
                                           int32_t* row_popcounts) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    if (mean) partial_sums[warp] = warp_abs_sum;
    if (POPC) partial_counts[warp] = warp_ones;
  }
  __syncthreads();
  if (row < rows && part == 0 && lane == 0) {
    if (mean) {
      float total = 0.f;
      for (int i = 0; i < warps_per_row; ++i) total += partial_sums[row_in_block * warps_per_row + i];
      row_mean_abs[row] = total / static_cast<float>(k);
    }
    if (POPC) {
      int count = 0;
      for (int i = 0; i < warps_per_row; ++i) count += partial_counts[row_in_block * warps_per_row + i];
      row_popcounts[row] = count;
    }
  }
}

template <typename T, bool SIGN_ZERO, bool POPC>
__global__ __launch_bounds__(kPackThreads) void pack_signs_kernel(const T* __restrict__ x, int64_t rows, int64_t k,
                                                                  int64_t words, int warps_per_row,
                                                                  uint32_t* __restrict__ plus_bits,
                                                                  uint32_t* __restrict__ minus_bits,
                                                                  float* __restrict__ row_mean_abs,
                                                                  int32_t* __restrict__ row_popcounts) {
  launch_dependents();  // the consumer of the bits (launched dependent) may start; it waits for this grid
  __shared__ float partial_sums[kPackWarps];
  __shared__ int partial_counts[POPC ? kPackWarps : 1];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int rows_per_block = kPackWarps / warps_per_row;
  const int row_in_block = warp / warps_per_row;
  const int part = warp % warps_per_row;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * rows_per_block + row_in_block;

  float abs_sum = 0.f;
  int ones = 0;  // POPC: 1 bits of the plus words this warp wrote (every lane holds the ballots, so every lane counts)
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
          if (POPC) ones += __popc(plus);
          if (lane == u) {
            plus_bits[row * words + first + u] = plus;
            if (SIGN_ZERO) minus_bits[row * words + first + u] = minus;
          }
        }
      }
    }
  }
  const bool mean = row_mean_abs != nullptr;  // uniform over the block
  if (mean || POPC) {
    if (mean) abs_sum = warp_sum(abs_sum);
    row_totals<POPC>(mean, abs_sum, ones, partial_sums, partial_counts, row, rows, k, part, row_in_block,
                     warps_per_row, row_mean_abs, row_popcounts);
  }
  wait_for_prerequisite_grid();  // launched dependent: this grid completes after the one before it (at once if not)
}

// Bit j of the result: bit 2j of m0..m3's low halves and 2j + 1 of their high halves, from four packed 16-bit
// compare masks (0xFFFF for true): m_i holds values 2i (low half) and 2i + 1 (high half).
__device__ __forceinline__ uint32_t mask_bits(uint32_t m0, uint32_t m1, uint32_t m2, uint32_t m3) {
  const uint32_t t = (m0 & 0x00020001u) | (m1 & 0x00080004u) | (m2 & 0x00200010u) | (m3 & 0x00800040u);
  return (t | (t >> 16)) & 0xFFu;
}

template <typename T>
struct Pair;  // two 16-bit values of one 32-bit word
template <>
struct Pair<__half> {
  using type = __half2;
  static __device__ __forceinline__ type zero() { return __float2half2_rn(0.f); }
};
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type zero() { return __float2bfloat162_rn(0.f); }
};

// The sign bits of the 16 / sizeof(T) values of one 16-byte vector, bit j for value j (SPEC 2.1: bit 1 for
// x >= 0, so -0 gives 1 and NaN 0; with torch.sign semantics the planes x > 0 and x < 0), and, with ABS, their |x|
// added to abs_sum in order. 16-bit values are compared two at a time (HSET2-style masks: 4 compares and 6 bit
// operations a vector, where a compare and a shift-or per value converted to fp32 took ~4x the instructions).
// Shared by the two vector kernels.
template <typename T, bool SIGN_ZERO, bool ABS>
__device__ __forceinline__ void vector_signs(uint4 raw, uint32_t& plus, uint32_t& minus, float& abs_sum) {
  constexpr int V = 16 / sizeof(T);
  union {
    uint4 vector;
    T values[V];
  } unpacked;
  unpacked.vector = raw;
  if (ABS) {
#pragma unroll
    for (int j = 0; j < V; ++j) abs_sum += fabsf(to_float(unpacked.values[j]));
  }
  if constexpr (sizeof(T) == 2) {
    using P = typename Pair<T>::type;
    const P zero = Pair<T>::zero();
    const P* pairs = reinterpret_cast<const P*>(&unpacked.vector);
    uint32_t gt[4], lt[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const P pair = pairs[i];
      gt[i] = SIGN_ZERO ? __hgt2_mask(pair, zero) : __hge2_mask(pair, zero);
      lt[i] = SIGN_ZERO ? __hlt2_mask(pair, zero) : 0u;
    }
    plus = mask_bits(gt[0], gt[1], gt[2], gt[3]);
    minus = SIGN_ZERO ? mask_bits(lt[0], lt[1], lt[2], lt[3]) : 0u;
  } else {
    plus = 0;
    minus = 0;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float value = to_float(unpacked.values[j]);
      plus |= static_cast<uint32_t>(SIGN_ZERO ? value > 0.f : value >= 0.f) << j;
      if (SIGN_ZERO) minus |= static_cast<uint32_t>(value < 0.f) << j;
    }
  }
}

// The same with 16-byte loads (8 bf16/fp16 or 4 fp32 values a lane, kPackUnroll loads in flight: 2 KB a
// warp instead of 256 bytes), for k % 32 == 0 and a 16-byte aligned x: the lanes of one word OR their
// bits together with shuffles. binary_linear at large M spends a pass over x here.
template <typename T, bool SIGN_ZERO, bool MEAN, bool POPC>
__global__ __launch_bounds__(kPackThreads) void pack_signs_vector_kernel(const T* __restrict__ x, int64_t rows,
                                                                         int64_t k, int warps_per_row,
                                                                         uint32_t* __restrict__ plus_bits,
                                                                         uint32_t* __restrict__ minus_bits,
                                                                         float* __restrict__ row_mean_abs,
                                                                         int32_t* __restrict__ row_popcounts) {
  constexpr int V = 16 / sizeof(T);         // values a lane loads at once
  constexpr int kLanesPerWord = 32 / V;
  launch_dependents();  // the consumer of the bits (launched dependent) may start; it waits for this grid
  __shared__ float partial_sums[kPackWarps];
  __shared__ int partial_counts[POPC ? kPackWarps : 1];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int rows_per_block = kPackWarps / warps_per_row;
  const int row_in_block = warp / warps_per_row;
  const int part = warp % warps_per_row;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * rows_per_block + row_in_block;
  const int64_t words = k / 32;

  float abs_sum = 0.f;
  int ones = 0;  // POPC: 1 bits of the words this lane wrote
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
        uint32_t plus, minus;
        vector_signs<T, SIGN_ZERO, MEAN>(raw[u], plus, minus, abs_sum);  // |x| 0 for the zero-filled vectors
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
          if (POPC) ones += __popc(plus);
        }
      }
    }
  }
  if (MEAN || POPC) {
    if (MEAN) abs_sum = warp_sum(abs_sum);
    if (POPC) ones = __reduce_add_sync(kFullMask, ones);  // sm_80 (every kernel here needs it)
    row_totals<POPC>(MEAN, abs_sum, ones, partial_sums, partial_counts, row, rows, k, part, row_in_block,
                     warps_per_row, row_mean_abs, row_popcounts);
  }
  wait_for_prerequisite_grid();  // as above
}

// Rows of at most kShortRowWords words take pack_signs_rows_kernel.
constexpr int kShortRowWords = 32;
constexpr int kRowLoads = 4;  // 16-byte loads a thread has in flight per tile

template <typename T>
__host__ __device__ constexpr int tile_words() {
  return kPackThreads * kRowLoads / (32 / (16 / static_cast<int>(sizeof(T))));
}

template <typename T, bool SIGN_ZERO, bool MEAN, bool POPC>
__global__ __launch_bounds__(kPackThreads) void pack_signs_rows_kernel(const T* __restrict__ x, int64_t rows, int k,
                                                                       int rows_per_tile, int64_t tiles,
                                                                       uint32_t* __restrict__ plus_bits,
                                                                       uint32_t* __restrict__ minus_bits,
                                                                       float* __restrict__ row_mean_abs,
                                                                       int32_t* __restrict__ row_popcounts) {
  constexpr int V = 16 / sizeof(T);  // values a vector
  constexpr int kLanesPerWord = 32 / V;
  constexpr int kTileWords = tile_words<T>();
  __shared__ float word_sums[MEAN ? kTileWords : 1];
  __shared__ int word_counts[POPC ? kTileWords : 1];
  launch_dependents();  // as above
  const int words = k / 32;
  const uint4* vectors = reinterpret_cast<const uint4*>(x);
  const int t = threadIdx.x;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t first_row = tile * rows_per_tile;
    const int live_rows = static_cast<int>(rows - first_row < rows_per_tile ? rows - first_row : rows_per_tile);
    const int live_vectors = live_rows * words * kLanesPerWord;
    const int64_t first_word = first_row * words;
    const uint4* tile_x = vectors + first_word * kLanesPerWord;
    uint4 raw[kRowLoads];
#pragma unroll
    for (int u = 0; u < kRowLoads; ++u) {
      const int v = u * kPackThreads + t;
      raw[u] = v < live_vectors ? __ldg(tile_x + v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kRowLoads; ++u) {
      if (u * kPackThreads >= live_vectors) break;  // uniform over the block
      const int v = u * kPackThreads + t;
      uint32_t plus, minus;
      float abs_sum = 0.f;
      vector_signs<T, SIGN_ZERO, MEAN>(raw[u], plus, minus, abs_sum);
      plus <<= (t % kLanesPerWord) * V;
      minus <<= (t % kLanesPerWord) * V;
#pragma unroll
      for (int offset = 1; offset < kLanesPerWord; offset <<= 1) {  // lanes of a word: t / kLanesPerWord
        plus |= __shfl_xor_sync(kFullMask, plus, offset);
        if (SIGN_ZERO) minus |= __shfl_xor_sync(kFullMask, minus, offset);
        if (MEAN) abs_sum += __shfl_xor_sync(kFullMask, abs_sum, offset);
      }
      if (v < live_vectors && t % kLanesPerWord == 0) {
        const int word = v / kLanesPerWord;
        plus_bits[first_word + word] = plus;
        if (SIGN_ZERO) minus_bits[first_word + word] = minus;
        if (MEAN) word_sums[word] = abs_sum;
        if (POPC) word_counts[word] = __popc(plus);
      }
    }
    if (MEAN || POPC) {  // uniform over the block
      __syncthreads();
      if (t < live_rows) {
        if (MEAN) {
          float total = 0.f;
          for (int w = 0; w < words; ++w) total += word_sums[t * words + w];
          row_mean_abs[first_row + t] = total / static_cast<float>(k);
        }
        if (POPC) {
          int count = 0;
          for (int w = 0; w < words; ++w) count += word_counts[t * words + w];
          row_popcounts[first_row + t] = count;
        }
      }
      __syncthreads();  // word_sums / word_counts are the next tile's
    }
  }
  wait_for_prerequisite_grid();  // as above
}

// Blocks of a kernel resident on one multiprocessor, asked once per kernel instantiation (racing callers
// both ask: harmless).
template <typename Kernel>
int resident_blocks(Kernel kernel, int& cached) {
  int blocks = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
  if (blocks > 0) return blocks;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kPackThreads, 0) != cudaSuccess || blocks < 1)
    blocks = 1;
  __atomic_store_n(&cached, blocks, __ATOMIC_RELEASE);
  return blocks;
}

// Calls f(std::bool_constant<flag>{}...) for the run-time flags: one kernel instantiation a combination.
template <bool... kFlags, typename F>
cudaError_t with_flags(F&& f) {
  return f(std::bool_constant<kFlags>{}...);
}
template <bool... kFlags, typename F, typename... Rest>
cudaError_t with_flags(F&& f, bool flag, Rest... rest) {
  return flag ? with_flags<kFlags..., true>(f, rest...) : with_flags<kFlags..., false>(f, rest...);
}

template <typename T, bool SIGN_ZERO, bool MEAN, bool POPC>
cudaError_t launch_rows(const T* x, int64_t rows, int64_t k, uint32_t* plus_bits, uint32_t* minus_bits,
                        float* row_mean_abs, int32_t* row_popcounts, cudaStream_t stream, bool dependent) {
  static int cached_blocks = 0;
  const auto kernel = pack_signs_rows_kernel<T, SIGN_ZERO, MEAN, POPC>;
  DeviceFacts device;
  const cudaError_t error = current_device_facts(device);
  if (error != cudaSuccess) return error;
  const int rows_per_tile = tile_words<T>() / static_cast<int>(k / 32);
  const int64_t tiles = ceil_div(rows, rows_per_tile);
  const int64_t resident = static_cast<int64_t>(device.sm_count) * resident_blocks(kernel, cached_blocks);
  const int64_t blocks = tiles < resident ? tiles : resident;
  const ClusterLaunch launch(dim3(static_cast<unsigned>(blocks)), kPackThreads, 0, 1, stream, dependent);
  return cudaLaunchKernelEx(&launch.config, kernel, x, rows, static_cast<int>(k), rows_per_tile, tiles, plus_bits,
                            minus_bits, row_mean_abs, row_popcounts);
}

template <typename T>
cudaError_t pack_signs_typed(const T* x, int64_t rows, int64_t k, bool sign_zero, uint32_t* plus_bits,
                             uint32_t* minus_bits, float* row_mean_abs, int32_t* row_popcounts, cudaStream_t stream,
                             bool dependent) {
  const int64_t words = ceil_div(k, 32);
  const bool aligned = k % 32 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const bool mean = row_mean_abs != nullptr, popc = row_popcounts != nullptr;
  if (aligned && words <= kShortRowWords) {
    return with_flags(
        [&](auto sign_zero_c, auto mean_c, auto popc_c) {
          return launch_rows<T, decltype(sign_zero_c)::value, decltype(mean_c)::value, decltype(popc_c)::value>(
              x, rows, k, plus_bits, minus_bits, row_mean_abs, row_popcounts, stream, dependent);
        },
        sign_zero, mean, popc);
  }
  if (aligned) {
    // Up to 8 warps a row while each gets a round of kPackUnroll loads. H200, us per call in a rotating graph,
    // bf16 k = 8192, m = 4096 / 512 / 64, against two rounds a warp: 18.7 / 4.45 / 2.6 against 19.05 / 4.8 / 3.5
    // (8 loads a round: 19.3 / 4.95 / 3.1 in one round, 20.1 / 5.85 / 4.5 in two).
    const int64_t rounds = ceil_div(k / (16 / static_cast<int64_t>(sizeof(T))), 32 * kPackUnroll);
    int warps_per_row = 1;
    while (warps_per_row < kPackWarps && warps_per_row < rounds) warps_per_row *= 2;
    const int64_t blocks = ceil_div(rows, kPackWarps / warps_per_row);
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    return with_flags(
        [&](auto sign_zero_c, auto mean_c, auto popc_c) {
          const ClusterLaunch launch(dim3(static_cast<unsigned>(blocks)), kPackThreads, 0, 1, stream, dependent);
          return cudaLaunchKernelEx(&launch.config,
                                    pack_signs_vector_kernel<T, decltype(sign_zero_c)::value, decltype(mean_c)::value,
                                                             decltype(popc_c)::value>,
                                    x, rows, k, warps_per_row, plus_bits, minus_bits, row_mean_abs, row_popcounts);
        },
        sign_zero, mean, popc);
  }
  int warps_per_row = 1;  // more warps on a row only when each still gets two rounds of kPackUnroll words
  while (warps_per_row < kPackWarps && static_cast<int64_t>(warps_per_row) * kPackUnroll * 2 < words) warps_per_row *= 2;
  const int64_t blocks = ceil_div(rows, kPackWarps / warps_per_row);
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  return with_flags(  // mean |x| is a run-time test in this kernel (uniform over the block)
      [&](auto sign_zero_c, auto popc_c) {
        const ClusterLaunch launch(dim3(static_cast<unsigned>(blocks)), kPackThreads, 0, 1, stream, dependent);
        return cudaLaunchKernelEx(&launch.config,
                                  pack_signs_kernel<T, decltype(sign_zero_c)::value, decltype(popc_c)::value>, x, rows,
                                  k, words, warps_per_row, plus_bits, minus_bits, row_mean_abs, row_popcounts);
      },
      sign_zero, popc);
}

}  // namespace

cudaError_t launch_pack_signs(const void* x, FloatType type, int64_t rows, int64_t k, bool sign_zero,
                              uint32_t* plus_bits, uint32_t* minus_bits, float* row_mean_abs, int32_t* row_popcounts,
                              cudaStream_t stream, bool dependent) {
  if (!valid_sizes(rows, k) || (sign_zero && minus_bits == nullptr)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  switch (type) {
    case FloatType::kFloat32:
      return pack_signs_typed(static_cast<const float*>(x), rows, k, sign_zero, plus_bits, minus_bits, row_mean_abs,
                              row_popcounts, stream, dependent);
    case FloatType::kFloat16:
      return pack_signs_typed(static_cast<const __half*>(x), rows, k, sign_zero, plus_bits, minus_bits,
                              row_mean_abs, row_popcounts, stream, dependent);
    case FloatType::kBFloat16:
      return pack_signs_typed(static_cast<const __nv_bfloat16*>(x), rows, k, sign_zero, plus_bits, minus_bits,
                              row_mean_abs, row_popcounts, stream, dependent);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace bitcompile
