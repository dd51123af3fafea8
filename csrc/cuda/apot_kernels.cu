// APoT CUDA kernels (SPEC.md 2.5). Torch-free: see apot_kernels.cuh for the contract of each launcher.
//
// - pack_nibbles, dequantize_weight, code_row_sums: simple elementwise / one-warp-a-row kernels.
// - linear_small_batch: the bandwidth-bound GEMV-style kernel for batches of <= 16 rows. Each warp
//   owns 4 output rows; a block stages 1024 columns of up to 8 rows of x in shared memory as fp32
//   (so W is read once per 8 rows of x), each lane reads 16 packed bytes of each of its warp's
//   4 weight rows (coalesced across the warp) and decodes them through the level table in
//   shared memory; one x value serves 4 weight rows and one decoded weight serves 8 x rows.
// - linear_int: a 64-wide tiled integer GEMM (plain int32 multiply-adds), exact by construction:
//   int32 partial sums are flushed into int64 before they can overflow (how often follows from
//   max|N|, found by each block from the table, no host sync), tables with huge numerators take
//   int64 products instead.
#include "apot_kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

namespace bitcompile {
namespace apot {
namespace {

constexpr int kThreads = 256;

using ::bitcompile::from_float;
using ::bitcompile::to_float;

// Blocks for a grid-stride loop over `items`.
unsigned int grid_for(int64_t items) {
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(blocks < 65536 ? blocks : 65536);
}

// The level table in shared memory, 256 entries, 0 beyond the table's 2**bits.
template <typename T>
__device__ __forceinline__ void load_table(T* levels, const T* table, int table_size) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) levels[i] = i < table_size ? table[i] : T(0);
}

// ---------------------------------------------------------------------------------------------
// pack_nibbles: out[r, j] = codes[r, 2j] | codes[r, 2j + 1] << 4 (0 past the end of an odd row).
// ---------------------------------------------------------------------------------------------
__global__ void pack_nibbles_kernel(const uint8_t* __restrict__ codes, int64_t rows, int64_t k, int64_t width,
                                    uint8_t* __restrict__ out) {
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, j = 2 * (i - r * width);
    const uint8_t low = codes[r * k + j];
    const uint8_t high = j + 1 < k ? codes[r * k + j + 1] : 0;
    out[i] = static_cast<uint8_t>(low | (high << 4));
  }
}

// ---------------------------------------------------------------------------------------------
// dequantize_weight: out[r, j] = alpha[r] * levels[code[r, j]]; blocks stride over rows (y) and
// a row's bytes (x), one thread a packed byte; an even k stores a nibble pair as one access.
// ---------------------------------------------------------------------------------------------
template <typename T>
struct alignas(2 * sizeof(T)) Pair {
  T first, second;
};

template <typename T, bool kNibbles>
__global__ void dequantize_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t k, int64_t row_bytes,
                                  const float* __restrict__ code_values, int table_size,
                                  const float* __restrict__ alpha, int64_t alpha_count, T* __restrict__ out) {
  __shared__ float levels[256];
  load_table(levels, code_values, table_size);
  __syncthreads();
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float a = alpha[alpha_count == 1 ? 0 : r];
    const uint8_t* row = w + r * row_bytes;
    T* out_row = out + r * k;
    for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < row_bytes;
         b += int64_t(gridDim.x) * blockDim.x) {
      const uint8_t byte = row[b];
      if (kNibbles) {
        const int64_t j = 2 * b;
        const T low = from_float<T>(levels[byte & 15] * a);
        if (j + 1 >= k) {
          out_row[j] = low;  // an odd row's last byte: the high nibble is padding
        } else if (k % 2 == 0) {
          *reinterpret_cast<Pair<T>*>(out_row + j) = Pair<T>{low, from_float<T>(levels[byte >> 4] * a)};
        } else {
          out_row[j] = low;
          out_row[j + 1] = from_float<T>(levels[byte >> 4] * a);
        }
      } else {
        out_row[b] = from_float<T>(levels[byte] * a);
      }
    }
  }
}

// The same for rows of a multiple of 4 packed bytes (4-byte aligned): one 4-byte load and 8
// (nibbles) or 4 (bytes) outputs a thread, stored as 8-byte vectors.
template <typename T, bool kNibbles>
__global__ void dequantize_words_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t k, int64_t row_words,
                                        const float* __restrict__ code_values, int table_size,
                                        const float* __restrict__ alpha, int64_t alpha_count, T* __restrict__ out) {
  constexpr int kOutputs = kNibbles ? 8 : 4;
  constexpr int kStores = kOutputs * sizeof(T) / 8;  // 8-byte stores
  __shared__ float levels[256];
  load_table(levels, code_values, table_size);
  __syncthreads();
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float a = alpha[alpha_count == 1 ? 0 : r];
    const uint32_t* row = reinterpret_cast<const uint32_t*>(w) + r * row_words;
    T* out_row = out + r * k;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < row_words;
         i += int64_t(gridDim.x) * blockDim.x) {
      const uint32_t word = __ldg(row + i);
      union {
        T values[kOutputs];
        uint2 vectors[kStores];
      } decoded;
#pragma unroll
      for (int j = 0; j < kOutputs; ++j)
        decoded.values[j] = from_float<T>(levels[kNibbles ? (word >> (4 * j)) & 15 : (word >> (8 * j)) & 255] * a);
      uint2* target = reinterpret_cast<uint2*>(out_row + i * kOutputs);
#pragma unroll
      for (int v = 0; v < kStores; ++v) target[v] = decoded.vectors[v];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// linear_small_batch
// ---------------------------------------------------------------------------------------------
constexpr int kWarps = 8;          // warps a block
constexpr int kRowsPerWarp = 4;    // weight rows (outputs) a warp
constexpr int kTileK = 1024;       // columns of x staged in shared memory per step
constexpr int kMaxBatch = 8;       // rows of x a launch

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Code j of a 16-byte chunk (j is a compile-time constant after unrolling).
template <bool kNibbles>
__device__ __forceinline__ int code_at(const uint4& chunk, int j) {
  if (kNibbles) return (word_of(chunk, j / 8) >> ((j % 8) * 4)) & 15;
  return (word_of(chunk, j / 4) >> ((j % 4) * 8)) & 255;
}

// 16 bytes of a packed row from `offset` (a multiple of 16); bytes past the row read as 0.
__device__ __forceinline__ uint4 load_chunk(const uint8_t* row, int64_t offset, int64_t row_bytes,
                                            bool vector_loads) {
  if (vector_loads && offset + 16 <= row_bytes) return __ldg(reinterpret_cast<const uint4*>(row + offset));
  uint32_t words[4] = {0, 0, 0, 0};
#pragma unroll
  for (int i = 0; i < 16; ++i)
    if (offset + i < row_bytes) words[i / 4] |= uint32_t(__ldg(row + offset + i)) << (8 * (i % 4));
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// kBatch: rows of x this instantiation holds (>= m); the rows past m are zeros and not stored.
template <typename T, int kBatch, bool kNibbles>
__global__ void __launch_bounds__(kWarps * 32)
    linear_small_batch_kernel(const T* __restrict__ x, int m, int64_t k, const uint8_t* __restrict__ w, int64_t n,
                              int64_t row_bytes, bool vector_loads, const float* __restrict__ code_values,
                              int table_size, const float* __restrict__ alpha, int64_t alpha_count,
                              const float* __restrict__ bias, T* __restrict__ y, int64_t split_columns,
                              float* __restrict__ partial, int64_t partial_stride) {
  constexpr int kPerChunk = kNibbles ? 32 : 16;  // codes in 16 bytes
  constexpr int kCodesPerByte = kNibbles ? 2 : 1;
  // One pad float after every chunk's worth of columns: lane l reads column l * kPerChunk + j,
  // a stride of kPerChunk + 1 (odd) floats, so the 32 lanes hit 32 different banks.
  constexpr int kPadded = kTileK + kTileK / kPerChunk;
  __shared__ float xs[kBatch][kPadded];
  __shared__ float levels[256];
  load_table(levels, code_values, table_size);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + warp) * kRowsPerWarp;
  float acc[kRowsPerWarp][kBatch];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int i = 0; i < kBatch; ++i) acc[r][i] = 0.f;

  // This block's columns: split blockIdx.y of K (split_columns is a multiple of kTileK).
  const int64_t k_begin = int64_t(blockIdx.y) * split_columns;
  const int64_t k_end = k_begin + split_columns < k ? k_begin + split_columns : k;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kTileK) {
    __syncthreads();  // the previous tile is used up (and the table is in place)
    for (int i = threadIdx.x; i < kBatch * kTileK; i += blockDim.x) {
      const int r = i / kTileK, c = i % kTileK;
      const int64_t column = k0 + c;
      // x is 0 past m and past k: codes there (padding nibbles, other rows) contribute nothing.
      xs[r][c + c / kPerChunk] = (r < m && column < k) ? to_float(x[int64_t(r) * k + column]) : 0.f;
    }
    __syncthreads();
    for (int c0 = lane * kPerChunk; c0 < kTileK && k0 + c0 < k; c0 += 32 * kPerChunk) {
      const int64_t offset = (k0 + c0) / kCodesPerByte;
      uint4 chunk[kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int64_t row = row0 + r;
        chunk[r] = row < n ? load_chunk(w + row * row_bytes, offset, row_bytes, vector_loads) : make_uint4(0, 0, 0, 0);
      }
      const int base = c0 + c0 / kPerChunk;
#pragma unroll
      for (int j = 0; j < kPerChunk; ++j) {
        float xv[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) xv[i] = xs[i][base + j];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          const float level = levels[code_at<kNibbles>(chunk[r], j)];
#pragma unroll
          for (int i = 0; i < kBatch; ++i) acc[r][i] = fmaf(level, xv[i], acc[r][i]);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      float v = acc[r][i];
#pragma unroll
      for (int shift = 16; shift > 0; shift >>= 1) v += __shfl_xor_sync(0xffffffffu, v, shift);
      acc[r][i] = v;
    }
  }
  if (lane == 0 && partial) {  // K split over blocks: store the partial sums, finish_split_k adds them up
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t row = row0 + r;
      if (row >= n) continue;
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
        if (i < m) partial[blockIdx.y * partial_stride + int64_t(i) * n + row] = acc[r][i];
    }
  } else if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t row = row0 + r;
      if (row >= n) continue;
      const float a = alpha[alpha_count == 1 ? 0 : row];
      const float b = bias ? bias[row] : 0.f;
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
        if (i < m) y[int64_t(i) * n + row] = from_float<T>(acc[r][i] * a + b);
    }
  }
}

// y[i, j] = (sum over splits of partial[s, i, j]) * alpha[j] + bias[j].
template <typename T>
__global__ void finish_split_k_kernel(const float* __restrict__ partial, int splits, int64_t m, int64_t n,
                                      const float* __restrict__ alpha, int64_t alpha_count,
                                      const float* __restrict__ bias, T* __restrict__ y) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) sum += partial[s * total + i];
    const int64_t column = i % n;
    y[i] = from_float<T>(sum * alpha[alpha_count == 1 ? 0 : column] + (bias ? bias[column] : 0.f));
  }
}

constexpr int64_t kTargetBlocks = 1024;  // enough blocks in flight to hide the load latency

// Blocks along K: 1 when the output rows alone give kTargetBlocks blocks, else up to one a tile.
int64_t split_count(int64_t k, int64_t n) {
  const int64_t row_blocks = (n + kWarps * kRowsPerWarp - 1) / (kWarps * kRowsPerWarp);
  const int64_t tiles = (k + kTileK - 1) / kTileK;
  int64_t splits = (kTargetBlocks + row_blocks - 1) / row_blocks;
  if (splits > tiles) splits = tiles;
  if (splits > 65535) splits = 65535;
  if (splits < 1) splits = 1;
  const int64_t tiles_per_split = (tiles + splits - 1) / splits;
  return (tiles + tiles_per_split - 1) / tiles_per_split;
}

template <typename T, bool kNibbles>
cudaError_t launch_small_batch(const T* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, int64_t row_bytes,
                               const float* code_values, int table_size, const float* alpha, int64_t alpha_count,
                               const float* bias, T* y, float* workspace, cudaStream_t stream) {
  const int64_t rows_per_block = kWarps * kRowsPerWarp;
  const int64_t blocks = (n + rows_per_block - 1) / rows_per_block;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  const int64_t splits = split_count(k, n);
  const int64_t tiles = (k + kTileK - 1) / kTileK;
  const int64_t split_columns = (tiles + splits - 1) / splits * kTileK;
  if (splits > 1 && workspace == nullptr) return cudaErrorInvalidValue;
  float* partial = splits > 1 ? workspace : nullptr;
  const dim3 grid(static_cast<unsigned int>(blocks), static_cast<unsigned int>(splits));
  const bool vector_loads = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
  for (int64_t m0 = 0; m0 < m; m0 += kMaxBatch) {
    const int rows = static_cast<int>(m - m0 < kMaxBatch ? m - m0 : kMaxBatch);
    const T* xb = x + m0 * k;
    T* yb = y + m0 * n;
    float* pb = partial ? partial + m0 * n : nullptr;  // partial sums [splits, m, n]
#define BITCOMPILE_APOT_SMALL_BATCH(B)                                                                     \
  linear_small_batch_kernel<T, B, kNibbles><<<grid, kWarps * 32, 0, stream>>>(                           \
      xb, rows, k, w, n, row_bytes, vector_loads, code_values, table_size, alpha, alpha_count, bias, yb, \
      split_columns, pb, m * n)
    if (rows <= 1) {
      BITCOMPILE_APOT_SMALL_BATCH(1);
    } else if (rows <= 2) {
      BITCOMPILE_APOT_SMALL_BATCH(2);
    } else if (rows <= 4) {
      BITCOMPILE_APOT_SMALL_BATCH(4);
    } else {
      BITCOMPILE_APOT_SMALL_BATCH(8);
    }
#undef BITCOMPILE_APOT_SMALL_BATCH
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) return error;
  }
  if (partial) {
    finish_split_k_kernel<T><<<grid_for(m * n), kThreads, 0, stream>>>(partial, static_cast<int>(splits), m, n,
                                                                         alpha, alpha_count, bias, y);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// code_row_sums: row_sums[n] = sum_k N[code[n, k]], one warp a row.
// ---------------------------------------------------------------------------------------------
__global__ void code_row_sums_kernel(const uint8_t* __restrict__ w, int64_t n, int64_t k, int64_t row_bytes,
                                     bool nibbles, const int32_t* __restrict__ numerators, int table_size,
                                     int64_t* __restrict__ row_sums) {
  __shared__ int32_t levels[256];
  load_table(levels, numerators, table_size);
  __syncthreads();
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t row = int64_t(blockIdx.x) * warps + warp; row < n; row += int64_t(gridDim.x) * warps) {
    long long sum = 0;
    for (int64_t b = lane; b < row_bytes; b += 32) {
      const uint8_t byte = w[row * row_bytes + b];
      if (nibbles) {
        sum += levels[byte & 15];
        if (2 * b + 1 < k) sum += levels[byte >> 4];  // an odd row's padding nibble is no code
      } else {
        sum += levels[byte];
      }
    }
    for (int shift = 16; shift > 0; shift >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, shift);
    if (lane == 0) row_sums[row] = sum;
  }
}

// ---------------------------------------------------------------------------------------------
// linear_int: 256 threads as 16 x 16; a block computes kBlockM = 16 * kRows rows of q times 64
// outputs, thread (tx, ty) rows ty + 16 i and outputs tx + 16 j (conflict-free shared reads).
// ---------------------------------------------------------------------------------------------
constexpr int kIntTileN = 64;
constexpr int kIntTileK = 32;
constexpr int64_t kIntSmallBatchRows = 16;  // up to this many rows: 16-row tiles, else 64

// y = float(S * x_scale * alpha / denominator + bias), S = qn - z * row_sum in wrapping 64-bit
// arithmetic like the int64 reference, the rest in the reference's order, in double.
__device__ __forceinline__ float int_epilogue(long long qn, long long z, long long row_sum, float x_scale,
                                              float alpha, const float* bias, int64_t column, double denominator) {
  const long long sum = static_cast<long long>(static_cast<unsigned long long>(qn) -
                                               static_cast<unsigned long long>(z) *
                                                   static_cast<unsigned long long>(row_sum));
  double value = static_cast<double>(sum) * static_cast<double>(x_scale) * static_cast<double>(alpha) / denominator;
  if (bias) value += static_cast<double>(bias[column]);
  return static_cast<float>(value);
}

template <int kRows, bool kNibbles>
__global__ void __launch_bounds__(kThreads)
    linear_int_kernel(const uint8_t* __restrict__ q, int64_t m, int64_t k, const int64_t* __restrict__ zero_point,
                      const float* __restrict__ x_scale, const uint8_t* __restrict__ w, int64_t n, int64_t row_bytes,
                      const int32_t* __restrict__ numerators, int table_size, double denominator,
                      const float* __restrict__ alpha, int64_t alpha_count, const float* __restrict__ bias,
                      const int64_t* __restrict__ row_sums, float* __restrict__ y, int64_t split_columns,
                      long long* __restrict__ partial) {
  constexpr int kBlockM = 16 * kRows;
  __shared__ int32_t levels[256];
  __shared__ int32_t qs[kIntTileK][kBlockM + 1];
  __shared__ int32_t ws[kIntTileK][kIntTileN + 1];
  __shared__ unsigned long long max_abs;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  if (tid == 0) max_abs = 0;
  __syncthreads();
  load_table(levels, numerators, table_size);
  for (int i = tid; i < table_size; i += blockDim.x) {
    const long long v = numerators[i];
    atomicMax(&max_abs, static_cast<unsigned long long>(v < 0 ? -v : v));
  }
  __syncthreads();
  // A tile adds at most kIntTileK products q * N, |q * N| <= 255 * max|N|; `flush_every` tiles of
  // them fit an int32. Past that (max|N| > 2^31 / (255 * 32)) the block takes int64 products.
  const unsigned long long per_tile = 255ull * kIntTileK * (max_abs > 0 ? max_abs : 1ull);
  const bool wide = per_tile > static_cast<unsigned long long>(INT_MAX);
  const long long flush_every = wide ? 1 : static_cast<long long>(INT_MAX / per_tile);

  const int64_t m0 = int64_t(blockIdx.x) * kBlockM, n0 = int64_t(blockIdx.y) * kIntTileN;
  int32_t acc[kRows][4];
  long long total[kRows][4];
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0, total[i][j] = 0;
  long long tiles = 0;

  // This block's columns: split blockIdx.z of K (split_columns is a multiple of kIntTileK).
  const int64_t k_begin = int64_t(blockIdx.z) * split_columns;
  const int64_t k_end = k_begin + split_columns < k ? k_begin + split_columns : k;
  // Tiles are staged through registers: the loads of tile t + 1 are issued before the
  // multiply-adds of tile t, all of a thread's loads at once (independent, so they overlap).
  constexpr int kTileBytes = kNibbles ? kIntTileK / 2 : kIntTileK;  // packed bytes of a row in a tile
  constexpr int kWeightLoads = kIntTileN * kTileBytes / kThreads;
  constexpr int kInputLoads = kBlockM * kIntTileK / kThreads;
  uint8_t weight_bytes[kWeightLoads], input_bytes[kInputLoads];
  auto load_tile = [&](int64_t k0) {
#pragma unroll
    for (int l = 0; l < kWeightLoads; ++l) {
      const int i = tid + kThreads * l, r = i / kTileBytes, b = i % kTileBytes;
      const int64_t row = n0 + r, byte = (kNibbles ? k0 / 2 : k0) + b;
      weight_bytes[l] = (row < n && byte < row_bytes) ? __ldg(w + row * row_bytes + byte) : 0;
    }
#pragma unroll
    for (int l = 0; l < kInputLoads; ++l) {
      const int i = tid + kThreads * l, r = i / kIntTileK, c = i % kIntTileK;
      const int64_t row = m0 + r, column = k0 + c;
      input_bytes[l] = (row < m && column < k) ? __ldg(q + row * k + column) : 0;
    }
  };
  // Columns past k get q = 0 and N = 0 (an odd row's padding nibble is no code).
  auto store_tile = [&](int64_t k0) {
#pragma unroll
    for (int l = 0; l < kWeightLoads; ++l) {
      const int i = tid + kThreads * l, r = i / kTileBytes, b = i % kTileBytes;
      if (kNibbles) {
        ws[2 * b][r] = k0 + 2 * b < k ? levels[weight_bytes[l] & 15] : 0;
        ws[2 * b + 1][r] = k0 + 2 * b + 1 < k ? levels[weight_bytes[l] >> 4] : 0;
      } else {
        ws[b][r] = k0 + b < k ? levels[weight_bytes[l]] : 0;
      }
    }
#pragma unroll
    for (int l = 0; l < kInputLoads; ++l) {
      const int i = tid + kThreads * l;
      qs[i % kIntTileK][i / kIntTileK] = input_bytes[l];
    }
  };
  if (k_begin < k_end) load_tile(k_begin);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kIntTileK) {
    store_tile(k0);
    __syncthreads();
    if (k0 + kIntTileK < k_end) load_tile(k0 + kIntTileK);
    __syncthreads();
    if (!wide) {
#pragma unroll 8
      for (int c = 0; c < kIntTileK; ++c) {
        int32_t a[kRows], b[4];
#pragma unroll
        for (int i = 0; i < kRows; ++i) a[i] = qs[c][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = ws[c][tx + 16 * j];
#pragma unroll
        for (int i = 0; i < kRows; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
      }
      if (++tiles == flush_every) {
#pragma unroll
        for (int i = 0; i < kRows; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) total[i][j] += acc[i][j], acc[i][j] = 0;
        tiles = 0;
      }
    } else {
#pragma unroll 4
      for (int c = 0; c < kIntTileK; ++c) {
#pragma unroll
        for (int i = 0; i < kRows; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j)
            total[i][j] += static_cast<long long>(qs[c][ty + 16 * i]) * ws[c][tx + 16 * j];
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int64_t row = m0 + ty + 16 * i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t column = n0 + tx + 16 * j;
      if (row >= m || column >= n) continue;
      const long long qn = total[i][j] + acc[i][j];  // sum_k q * N over this block's columns
      if (partial) {  // K split over blocks: finish_int_split_k adds the splits up
        partial[blockIdx.z * m * n + row * n + column] = qn;
      } else {
        y[row * n + column] = int_epilogue(qn, *zero_point, row_sums[column], *x_scale,
                                           alpha[alpha_count == 1 ? 0 : column], bias, column, denominator);
      }
    }
  }
}

__global__ void finish_int_split_k_kernel(const long long* __restrict__ partial, int splits, int64_t m, int64_t n,
                                          const int64_t* __restrict__ zero_point, const float* __restrict__ x_scale,
                                          double denominator, const float* __restrict__ alpha, int64_t alpha_count,
                                          const float* __restrict__ bias, const int64_t* __restrict__ row_sums,
                                          float* __restrict__ y) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    unsigned long long qn = 0;  // integer sums: exact in any order
    for (int s = 0; s < splits; ++s) qn += static_cast<unsigned long long>(partial[s * total + i]);
    const int64_t column = i % n;
    y[i] = int_epilogue(static_cast<long long>(qn), *zero_point, row_sums[column], *x_scale,
                        alpha[alpha_count == 1 ? 0 : column], bias, column, denominator);
  }
}

// Blocks along K for the integer kernel: enough blocks in flight, at least 8 tiles a split.
int64_t int_split_count(int64_t m, int64_t k, int64_t n) {
  const int64_t block_m = m <= kIntSmallBatchRows ? 16 : 64;
  const int64_t blocks = ((m + block_m - 1) / block_m) * ((n + kIntTileN - 1) / kIntTileN);
  const int64_t tiles = (k + kIntTileK - 1) / kIntTileK;
  int64_t splits = (1024 + blocks - 1) / blocks;
  if (splits > tiles / 8) splits = tiles / 8;
  if (splits > 65535) splits = 65535;
  if (splits < 1) splits = 1;
  const int64_t tiles_per_split = (tiles + splits - 1) / splits;
  return (tiles + tiles_per_split - 1) / tiles_per_split;
}

template <typename T>
cudaError_t dequantize_typed(const uint8_t* w, int64_t rows, int64_t k, int bits, const float* code_values,
                             const float* alpha, int64_t alpha_count, T* out, cudaStream_t stream) {
  const int64_t row_bytes = bits <= 4 ? (k + 1) / 2 : k;
  // About 2048 blocks in all, each looping over many rows: the table is loaded once a block.
  int64_t column_blocks = (row_bytes + kThreads - 1) / kThreads;
  if (column_blocks > 2048) column_blocks = 2048;
  int64_t row_blocks = (2048 + column_blocks - 1) / column_blocks;
  if (row_blocks > rows) row_blocks = rows;
  const dim3 grid(static_cast<unsigned int>(column_blocks), static_cast<unsigned int>(row_blocks));
  // Whole words: every byte of a row holds codes (even k for nibbles), rows 4-byte aligned.
  const bool words = row_bytes % 4 == 0 && (bits > 4 || k % 2 == 0) && reinterpret_cast<uintptr_t>(w) % 4 == 0;
  if (words) {
    int64_t word_blocks = (row_bytes / 4 + kThreads - 1) / kThreads;
    if (word_blocks > 2048) word_blocks = 2048;
    int64_t word_row_blocks = (2048 + word_blocks - 1) / word_blocks;
    if (word_row_blocks > rows) word_row_blocks = rows;
    const dim3 word_grid(static_cast<unsigned int>(word_blocks), static_cast<unsigned int>(word_row_blocks));
    if (bits <= 4) {
      dequantize_words_kernel<T, true><<<word_grid, kThreads, 0, stream>>>(w, rows, k, row_bytes / 4, code_values,
                                                                           1 << bits, alpha, alpha_count, out);
    } else {
      dequantize_words_kernel<T, false><<<word_grid, kThreads, 0, stream>>>(w, rows, k, row_bytes / 4, code_values,
                                                                            1 << bits, alpha, alpha_count, out);
    }
  } else if (bits <= 4) {
    dequantize_kernel<T, true><<<grid, kThreads, 0, stream>>>(w, rows, k, row_bytes, code_values, 1 << bits, alpha,
                                                                alpha_count, out);
  } else {
    dequantize_kernel<T, false><<<grid, kThreads, 0, stream>>>(w, rows, k, row_bytes, code_values, 1 << bits, alpha,
                                                                 alpha_count, out);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t small_batch_typed(const T* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, int bits,
                              const float* code_values, const float* alpha, int64_t alpha_count, const float* bias,
                              T* y, float* workspace, cudaStream_t stream) {
  const int64_t row_bytes = bits <= 4 ? (k + 1) / 2 : k;
  if (bits <= 4)
    return launch_small_batch<T, true>(x, m, k, w, n, row_bytes, code_values, 1 << bits, alpha, alpha_count, bias,
                                       y, workspace, stream);
  return launch_small_batch<T, false>(x, m, k, w, n, row_bytes, code_values, 1 << bits, alpha, alpha_count, bias, y,
                                      workspace, stream);
}

}  // namespace

cudaError_t pack_nibbles(const uint8_t* codes, int64_t rows, int64_t k, uint8_t* out, cudaStream_t stream) {
  const int64_t width = (k + 1) / 2;
  if (rows * width == 0) return cudaSuccess;
  pack_nibbles_kernel<<<grid_for(rows * width), kThreads, 0, stream>>>(codes, rows, k, width, out);
  return cudaGetLastError();
}

cudaError_t dequantize_weight(const uint8_t* w_packed, int64_t rows, int64_t k, int bits, const float* code_values,
                              const float* alpha, int64_t alpha_count, void* out, FloatType out_type,
                              cudaStream_t stream) {
  if (rows == 0 || k == 0) return cudaSuccess;
  if (bits < 1 || bits > 8) return cudaErrorInvalidValue;
  switch (out_type) {
    case FloatType::kFloat32:
      return dequantize_typed(w_packed, rows, k, bits, code_values, alpha, alpha_count, static_cast<float*>(out),
                              stream);
    case FloatType::kFloat16:
      return dequantize_typed(w_packed, rows, k, bits, code_values, alpha, alpha_count, static_cast<__half*>(out),
                              stream);
    case FloatType::kBFloat16:
      return dequantize_typed(w_packed, rows, k, bits, code_values, alpha, alpha_count,
                              static_cast<__nv_bfloat16*>(out), stream);
  }
  return cudaErrorInvalidValue;
}

int64_t linear_small_batch_workspace(int64_t m, int64_t k, int64_t n) {
  if (m == 0 || n == 0 || k < 1) return 0;
  const int64_t splits = split_count(k, n);
  return splits > 1 ? splits * m * n : 0;
}

cudaError_t linear_small_batch(const void* x, FloatType x_type, int64_t m, int64_t k, const uint8_t* w_packed,
                               int64_t n, int bits, const float* code_values, const float* alpha,
                               int64_t alpha_count, const float* bias, void* y, float* workspace,
                               cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  if (bits < 1 || bits > 8 || k < 1) return cudaErrorInvalidValue;
  switch (x_type) {
    case FloatType::kFloat32:
      return small_batch_typed(static_cast<const float*>(x), m, k, w_packed, n, bits, code_values, alpha,
                               alpha_count, bias, static_cast<float*>(y), workspace, stream);
    case FloatType::kFloat16:
      return small_batch_typed(static_cast<const __half*>(x), m, k, w_packed, n, bits, code_values, alpha,
                               alpha_count, bias, static_cast<__half*>(y), workspace, stream);
    case FloatType::kBFloat16:
      return small_batch_typed(static_cast<const __nv_bfloat16*>(x), m, k, w_packed, n, bits, code_values, alpha,
                               alpha_count, bias, static_cast<__nv_bfloat16*>(y), workspace, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t code_row_sums(const uint8_t* w_packed, int64_t n, int64_t k, int bits, const int32_t* numerators,
                          int64_t* row_sums, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (bits < 1 || bits > 8 || k < 1) return cudaErrorInvalidValue;
  const int64_t row_bytes = bits <= 4 ? (k + 1) / 2 : k;
  const int warps = kThreads / 32;
  const int64_t blocks = (n + warps - 1) / warps;
  code_row_sums_kernel<<<static_cast<unsigned int>(blocks < 65536 ? blocks : 65536), kThreads, 0, stream>>>(
      w_packed, n, k, row_bytes, bits <= 4, numerators, 1 << bits, row_sums);
  return cudaGetLastError();
}

int64_t linear_int_workspace(int64_t m, int64_t k, int64_t n) {
  if (m == 0 || n == 0 || k < 1) return 0;
  const int64_t splits = int_split_count(m, k, n);
  return splits > 1 ? splits * m * n : 0;
}

cudaError_t linear_int(const uint8_t* q, int64_t m, int64_t k, const int64_t* zero_point, const float* x_scale,
                       const uint8_t* w_packed, int64_t n, int bits, const int32_t* numerators, double denominator,
                       const float* alpha, int64_t alpha_count, const float* bias, const int64_t* row_sums,
                       float* y, int64_t* workspace, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  if (bits < 1 || bits > 8 || k < 1) return cudaErrorInvalidValue;
  const int64_t row_bytes = bits <= 4 ? (k + 1) / 2 : k;
  const int64_t column_blocks = (n + kIntTileN - 1) / kIntTileN;
  if (column_blocks > 65535) return cudaErrorInvalidValue;
  const bool small = m <= kIntSmallBatchRows;
  const int64_t block_m = small ? 16 : 64;
  const int64_t row_blocks = (m + block_m - 1) / block_m;
  if (row_blocks > INT_MAX) return cudaErrorInvalidValue;
  const int64_t splits = int_split_count(m, k, n);
  const int64_t tiles = (k + kIntTileK - 1) / kIntTileK;
  const int64_t split_columns = (tiles + splits - 1) / splits * kIntTileK;
  if (splits > 1 && workspace == nullptr) return cudaErrorInvalidValue;
  long long* partial = splits > 1 ? reinterpret_cast<long long*>(workspace) : nullptr;
  const dim3 grid(static_cast<unsigned int>(row_blocks), static_cast<unsigned int>(column_blocks),
                  static_cast<unsigned int>(splits));
#define BITCOMPILE_APOT_LINEAR_INT(ROWS, NIBBLES)                                                                 \
  linear_int_kernel<ROWS, NIBBLES><<<grid, kThreads, 0, stream>>>(q, m, k, zero_point, x_scale, w_packed, n,     \
                                                                  row_bytes, numerators, 1 << bits, denominator, \
                                                                  alpha, alpha_count, bias, row_sums, y,         \
                                                                  split_columns, partial)
  if (small) {
    if (bits <= 4) BITCOMPILE_APOT_LINEAR_INT(1, true); else BITCOMPILE_APOT_LINEAR_INT(1, false);
  } else {
    if (bits <= 4) BITCOMPILE_APOT_LINEAR_INT(4, true); else BITCOMPILE_APOT_LINEAR_INT(4, false);
  }
#undef BITCOMPILE_APOT_LINEAR_INT
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess || partial == nullptr) return error;
  finish_int_split_k_kernel<<<grid_for(m * n), kThreads, 0, stream>>>(partial, static_cast<int>(splits), m, n,
                                                                       zero_point, x_scale, denominator, alpha,
                                                                       alpha_count, bias, row_sums, y);
  return cudaGetLastError();
}

}  // namespace apot
}  // namespace bitcompile
