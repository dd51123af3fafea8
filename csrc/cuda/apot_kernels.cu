// APoT CUDA kernels (SPEC.md 2.5). Torch-free: see apot_kernels.cuh for the contract of each launcher.
//
// - pack_nibbles, dequantize_weight, code_row_sums: simple elementwise / one-warp-a-row kernels.
// - linear_small_batch: the GEMV-style kernel for up to 16 rows of 16-bit x a launch (8 of fp32: two
//   B fragments, 8 rows each, meet every A fragment), bound by streaming W once and by its
//   shared-memory table lookups (about one wavefront per 32 weights). Integral tables (every level
//   an integer multiple of one base: the APoT schemes) take pair_product: the integers in x's type
//   (bf16 or fp16; fp16 for fp32 x), exact, one MMA a step for two weight rows, half the lookup
//   bytes (H200, 2026-12-02, apot4 N = K = 8192, rotating graph: M = 1 / 8 / 16 19.1 / 21.1 / 41.8
//   -> 17.6 / 19.2 / 37.6 us; apot.sweep 0 rows failed); bf16 x on a bf16 MMA skips the per-chunk
//   scaling into fp16 (2026-12-04: ~110 of a 4-tile chunk's ~550 instructions, M = 1 17.78 ->
//   17.54 us), and 16 rows a launch read W once for M = 9-16 (M = 16 37.96 -> 25.14 us, M = 9
//   36.27 -> 22.48, 16384^2 M = 16 122.0 -> 90.4; pending/apot_rows16.sweep). Otherwise W is decoded
//   into fp16 hi + lo parts of the levels (scaled by 2^tw: 22 significant bits) and multiplied on
//   the tensor cores (mma m16n8k16, fp32 accumulation), so one decode serves every row of x. The
//   mma's 16 rows are 8 weight rows as hi parts and as lo parts, so a byte of nibbles is one PRMT
//   (its address) and one 8-byte lookup {hi pair, lo pair} that lands as an A register pair, in a
//   64 KiB table with a copy per lane (no bank conflicts). A warp holds up to 4 tiles of 16 weight
//   rows; each lane streams 16 bytes of 2 rows a chunk (a 4-lane group: 64 contiguous bytes of a
//   row) into registers a chunk ahead (an L2 prefetch two chunks ahead as well cost 6-11%: H200,
//   2026-12-04, below). x is pulled into L1 a chunk ahead and loaded as mma B registers: fp16 as it
//   is, bf16 as it is against an integral table and else scaled by a power of two per (128 columns,
//   row of x) so fp16 holds it exactly, fp32 as scaled fp16 hi + lo (two mmas a step). A chunk's mma sums (8 or 16 mma adds) are unscaled
//   into fp32 totals. The 8 warps of a block split K and are summed in shared memory; blocks along
//   K form a cluster summed through distributed shared memory in rank order (deterministic; without
//   clusters: a workspace and a finish kernel). Rows that are not whole 16-byte pieces (or an
//   unaligned W) take a byte-load variant with one tile a warp.
// - linear_int: a 64-wide tiled integer GEMM (plain int32 multiply-adds), exact by construction:
//   int32 partial sums are flushed into int64 before they can overflow (how often follows from
//   max|N|, found by each block from the table, no host sync), tables with huge numerators take
//   int64 products instead.
#include "apot_kernels.cuh"
#include "device_common.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

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
// linear_small_batch (design at the top of the file).
// ---------------------------------------------------------------------------------------------
constexpr int kGemvWarps = 8;
constexpr int kGemvThreads = kGemvWarps * 32;
constexpr int kGroupRows = 8;    // rows of x a B fragment: the n = 8 of mma m16n8k16 (16-bit x: 2 a launch)
constexpr int kMaxSplits = 8;    // blocks along K (a portable cluster)
constexpr int kChunkBytes = 64;  // bytes of a weight row that a 4-lane group reads per chunk (16 a lane)
// Decode table: row `code byte` of 256 bytes holds 32 copies of the entry, lane l's at l * 8 (pairs of
// nibble codes: {hi, lo} fp16x2) or l * 4 (byte codes: {hi, lo} fp16), so a warp's lookups never
// share a bank and the address is one PRMT (byte << 8 | l * 8). Then the 256 codes' {hi, lo} words.
constexpr int kTableBytes = 256 * 256;
constexpr int kSmemBytes = kTableBytes + 256 * 4 + 16 * 4;  // + the codes' {hi, lo}, warp maxima, the shift

template <typename T>
struct SmallBatchArgs {
  const T* x;       // this launch's rows of x [m, k]
  T* y;             // [m, n]
  const uint8_t* w;
  const float* code_values;
  const float* alpha;
  const float* bias;
  float* partial;  // K split without clusters: [splits, partial_stride] of unscaled sums, else null
  int64_t k, n, row_bytes, chunks, alpha_count, partial_stride;
  int m, table_size, splits, tiles;
  bool x_vector, cluster;
};

// 2^e as a float, e in [-126, 127].
__device__ __forceinline__ float pow2(int e) { return __int_as_float((127 + e) << 23); }

// The shift t that puts the largest |v| (biased fp32 / bf16 exponent e) in [2^14, 2^15) of fp16:
// 126 for a zero or subnormal max, -114 for inf / nan.
__device__ __forceinline__ int scale_shift(uint32_t e) { return min(141 - static_cast<int>(e), 126); }

__device__ __forceinline__ uint32_t u32_of(__half2 v) {
  uint32_t r;
  memcpy(&r, &v, 4);
  return r;
}
__device__ __forceinline__ __nv_bfloat162 bf162_of(uint32_t v) {
  __nv_bfloat162 r;
  memcpy(&r, &v, 4);
  return r;
}

// 16 bytes of W (read once: no L1 allocation); zeros where !valid. Predicated, so no branch splits the
// loop. No L2 prefetch size hint: a 256-byte one fetched a warp's whole K range of a row (4 chunks at
// N = K = 8192) with its first load, so all of W was asked of DRAM at once and every warp waited for
// nearly all of it before its first chunk.
// A coherent load, not ld.global.nc: ptxas moves .nc loads across bar.sync, and sank the first chunk's
// loads below build_table's barriers (W did not start streaming until the table's levels had arrived).
__device__ __forceinline__ uint4 load_stream16(const uint8_t* p, bool valid) {
  uint4 v;
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n"
      " mov.b32 %3, 0;\n @p ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(static_cast<int>(valid)));
  return v;
}

// 16 bytes of a weight row at `p` (byte `offset` of the row) by byte loads, zeros where !valid and past
// the row end: rows of any length and alignment.
__device__ __forceinline__ uint4 load_weight16(const uint8_t* p, bool valid, int64_t offset, int64_t row_bytes) {
  const int64_t rest = row_bytes - offset;
  const int left = !valid || rest <= 0 ? 0 : (rest < 16 ? static_cast<int>(rest) : 16);
  uint32_t words[4] = {0, 0, 0, 0};
#pragma unroll
  for (int i = 0; i < 16; ++i)
    if (i < left) words[i / 4] |= uint32_t(__ldg(p + i)) << (8 * (i % 4));
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// d (+)= a * b, mma m16n8k16, inputs of the type of the first argument (__half or __nv_bfloat16), fp32
// accumulation.
#define BC_SMALL_MMA(M, PTX)                                                                                      \
  __device__ __forceinline__ void mma_first(M, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { \
    asm("mma.sync.aligned.m16n8k16.row.col.f32." PTX "." PTX ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, " \
        "{%10, %10, %10, %10};"                                                                                  \
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                                         \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));                             \
  }                                                                                                              \
  __device__ __forceinline__ void mma_add(M, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {   \
    asm("mma.sync.aligned.m16n8k16.row.col.f32." PTX "." PTX ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, " \
        "{%0, %1, %2, %3};"                                                                                      \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                         \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                                        \
  }
BC_SMALL_MMA(__half, "f16")
BC_SMALL_MMA(__nv_bfloat16, "bf16")
#undef BC_SMALL_MMA

template <typename T, bool kNibbles>
struct Chunk {
  static constexpr int kCodes = kNibbles ? 32 : 16;               // codes in a lane's 16 bytes
  static constexpr int kColumns = 4 * kCodes;                      // columns of K a chunk
  static constexpr int kXWords = kCodes * int(sizeof(T)) / 4;      // a lane's x values as loaded
  static constexpr int kPairs = kCodes / 2;                        // B registers (fp16x2) a chunk
  static constexpr int kSteps = kCodes / 4;                        // mma k-steps a chunk
  static constexpr bool kSplitX = sizeof(T) == 4;                  // fp32 x as fp16 hi + lo
};

// The MMA's input type: bf16 x against an integral table multiplies as it is (build_table: the table's N in bf16);
// everything else in fp16 (fp16 x as it is, bf16 x scaled by a power of two, fp32 x split into hi + lo).
template <typename T, bool kIntegral>
using MmaType = std::conditional_t<kIntegral && std::is_same<T, __nv_bfloat16>::value, __nv_bfloat16, __half>;

// Row g of x, columns k0 .. k0 + kCodes - 1, raw (zeros past k and for rows past m).
template <typename T, bool kNibbles>
__device__ __forceinline__ void load_x(uint32_t (&xr)[Chunk<T, kNibbles>::kXWords], const T* x, int m, int64_t k,
                                       int g, int64_t k0, bool vector) {
  using C = Chunk<T, kNibbles>;
#pragma unroll
  for (int i = 0; i < C::kXWords; ++i) xr[i] = 0;
  if (g >= m) return;
  const T* src = x + int64_t(g) * k + k0;
  if (vector && k0 + C::kCodes <= k) {
#pragma unroll
    for (int v = 0; v < C::kXWords / 4; ++v) {
      const uint4 q = __ldg(reinterpret_cast<const uint4*>(src) + v);
      xr[4 * v] = q.x, xr[4 * v + 1] = q.y, xr[4 * v + 2] = q.z, xr[4 * v + 3] = q.w;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < C::kCodes; ++i) {
    if (k0 + i >= k) break;
    if (sizeof(T) == 4) {
      xr[i] = reinterpret_cast<const uint32_t*>(src)[i];
    } else {
      xr[i / 2] |= uint32_t(reinterpret_cast<const uint16_t*>(src)[i]) << (16 * (i % 2));
    }
  }
}

// x as mma B registers (MmaType<T, kIntegral> pairs, x pair j of the lane in register j: k-slots 2tig, 2tig+1 of
// step s are pair 2s, slots 2tig+8, 2tig+9 pair 2s + 1): as loaded where the MMA takes x's type, else scaled by 2^t
// per (chunk, row of x) with the 4 lanes of the row agreeing on t; f0, f1: 2^-t of the rows of x in the lane's D
// columns 2tig, 2tig+1.
template <typename T, bool kNibbles, bool kIntegral>
__device__ __forceinline__ void x_fragment(const uint32_t (&xr)[Chunk<T, kNibbles>::kXWords],
                                           uint32_t (&bh)[Chunk<T, kNibbles>::kPairs],
                                           uint32_t (&bl)[Chunk<T, kNibbles>::kPairs], float& f0, float& f1,
                                           int tig) {
  using C = Chunk<T, kNibbles>;
  if constexpr (std::is_same<T, MmaType<T, kIntegral>>::value) {  // exact as it is
#pragma unroll
    for (int j = 0; j < C::kPairs; ++j) bh[j] = xr[j];
    f0 = f1 = 1.f;
    return;
  } else {
    uint32_t e;
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      __nv_bfloat162 top = __habs2(bf162_of(xr[0]));
#pragma unroll
      for (int j = 1; j < C::kXWords; ++j) top = __hmax2(top, __habs2(bf162_of(xr[j])));
      uint32_t bits;
      memcpy(&bits, &top, 4);
      e = max((bits >> 7) & 0xffu, (bits >> 23) & 0xffu);
    } else {
      float top = 0.f;
#pragma unroll
      for (int j = 0; j < C::kXWords; ++j) top = fmaxf(top, fabsf(__uint_as_float(xr[j])));
      e = __float_as_uint(top) >> 23;
    }
    e = max(e, __shfl_xor_sync(0xffffffffu, e, 1));
    e = max(e, __shfl_xor_sync(0xffffffffu, e, 2));
    const int t = scale_shift(e);
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      const uint32_t s = uint32_t(127 + t) << 7;  // 2^t in bf16: exact products
      const __nv_bfloat162 scale = bf162_of(s | (s << 16));
#pragma unroll
      for (int j = 0; j < C::kPairs; ++j) {
        uint32_t v;
        const __nv_bfloat162 scaled = __hmul2(bf162_of(xr[j]), scale);
        memcpy(&v, &scaled, 4);
        bh[j] = u32_of(__floats2half2_rn(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u)));
      }
    } else {
      const float scale = pow2(t);
#pragma unroll
      for (int j = 0; j < C::kPairs; ++j) {
        const float a = __uint_as_float(xr[2 * j]) * scale, b = __uint_as_float(xr[2 * j + 1]) * scale;
        const __half2 hi = __floats2half2_rn(a, b);
        const float2 back = __half22float2(hi);
        bh[j] = u32_of(hi);
        bl[j] = u32_of(__floats2half2_rn(a - back.x, b - back.y));
      }
    }
    const float inverse = pow2(-t);
    f0 = __shfl_sync(0xffffffffu, inverse, 8 * tig);  // lane 4 * (2 tig): a lane of row 2 tig of x
    f1 = __shfl_sync(0xffffffffu, inverse, 8 * tig + 4);
  }
}

// Step s of a chunk: the A fragment times each group's B pairs 2s, 2s + 1 (and fp32 x's lo parts), into d[group]
// (s = 0 starts the sums).
template <typename M, bool kSplitX, int kGroups, int kPairs>
__device__ __forceinline__ void step_product(int s, const uint32_t (&a)[4], const uint32_t (&bh)[kGroups][kPairs],
                                             const uint32_t (&bl)[kGroups][kPairs], float (&d)[kGroups][4]) {
#pragma unroll
  for (int r = 0; r < kGroups; ++r) {
    if (s == 0) {
      mma_first(M(), d[r], a, bh[r][2 * s], bh[r][2 * s + 1]);
    } else {
      mma_add(M(), d[r], a, bh[r][2 * s], bh[r][2 * s + 1]);
    }
    if constexpr (kSplitX) mma_add(M(), d[r], a, bl[r][2 * s], bl[r][2 * s + 1]);
  }
}

// A 16-byte piece of one weight row (row g of the lane's group) times B over one chunk, into d. The
// mma's 16 rows are that piece's 8 rows (one a group) as hi parts (rows 0-7: a0a1, a4a5) and as lo
// parts (rows 8-15: a2a3, a6a7), so one 8-byte lookup {hi pair, lo pair} of a byte of nibbles is one
// register pair of A as it lands (no moves): d[r][0] + d[r][2], d[r][1] + d[r][3] are the row's sums for
// columns 8r + 2tig, 8r + 2tig + 1. Step s takes bytes 2s (k-slots 2tig, 2tig+1) and 2s + 1 (2tig+8, 2tig+9),
// that is codes 4s .. 4s+3 of the lane; byte codes: codes 4s .. 4s+3 of word s, 4-byte lookups
// {hi, lo} paired by PRMT.
template <typename T, bool kNibbles, int kGroups>
__device__ __forceinline__ void piece_product(const uint4& piece, const unsigned char* table, uint32_t lane_offset,
                                              const uint32_t (&bh)[kGroups][Chunk<T, kNibbles>::kPairs],
                                              const uint32_t (&bl)[kGroups][Chunk<T, kNibbles>::kPairs],
                                              float (&d)[kGroups][4]) {
  using C = Chunk<T, kNibbles>;
  const uint32_t words[4] = {piece.x, piece.y, piece.z, piece.w};
#pragma unroll
  for (int s = 0; s < C::kSteps; ++s) {
    uint32_t a[4];
    if constexpr (kNibbles) {
      const uint32_t word = words[s / 2];
      const int byte = (2 * s) % 4;
      const uint2 e0 = *reinterpret_cast<const uint2*>(table + __byte_perm(word, lane_offset, 0x5504u | (byte << 4)));
      const uint2 e1 =
          *reinterpret_cast<const uint2*>(table + __byte_perm(word, lane_offset, 0x5504u | ((byte + 1) << 4)));
      a[0] = e0.x, a[1] = e0.y, a[2] = e1.x, a[3] = e1.y;
    } else {
      uint32_t e[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        e[i] = *reinterpret_cast<const uint32_t*>(table + __byte_perm(words[s], lane_offset, 0x5504u | (i << 4)));
      a[0] = __byte_perm(e[0], e[1], 0x5410), a[1] = __byte_perm(e[0], e[1], 0x7632);
      a[2] = __byte_perm(e[2], e[3], 0x5410), a[3] = __byte_perm(e[2], e[3], 0x7632);
    }
    step_product<__half, C::kSplitX>(s, a, bh, bl, d);
  }
}

// Integral tables (build_table: every level an integer multiple N of one base, |N| <= 256 for bf16 x (the MMA in
// bf16, x as it is), 2048 otherwise (fp16), as the APoT schemes' alpha / D * N): the MMA takes N exact, so no lo
// part is needed and its 16 rows are two weight rows a group: rows 0-7 = row g (piece lo), rows 8-15 = row g + 8
// (piece hi). A 4-byte lookup {N(l), N(h)} of a byte of nibbles is one A register: a0a1 / a4a5 from lo's bytes
// 2s / 2s + 1, a2a3 / a6a7 from hi's. d[r][0], d[r][1] are row g's sums for columns 8r + 2tig, 8r + 2tig + 1,
// d[r][2], d[r][3] row g + 8's. Half the MMAs and half the lookup bytes of piece_product's two calls. Nibble codes
// only.
template <typename T, bool kNibbles, int kGroups>
__device__ __forceinline__ void pair_product(const uint4& lo, const uint4& hi, const unsigned char* table,
                                             uint32_t lane_offset,
                                             const uint32_t (&bh)[kGroups][Chunk<T, kNibbles>::kPairs],
                                             const uint32_t (&bl)[kGroups][Chunk<T, kNibbles>::kPairs],
                                             float (&d)[kGroups][4]) {
  using C = Chunk<T, kNibbles>;
  using M = MmaType<T, true>;
  if constexpr (kNibbles) {  // (byte codes never take an integral table: nothing to do for them)
    const uint32_t lo_words[4] = {lo.x, lo.y, lo.z, lo.w}, hi_words[4] = {hi.x, hi.y, hi.z, hi.w};
    auto entry = [&](uint32_t word, int byte) {
      return *reinterpret_cast<const uint32_t*>(table + __byte_perm(word, lane_offset, 0x5504u | (byte << 4)));
    };
#pragma unroll
    for (int s = 0; s < C::kSteps; ++s) {
      const int byte = (2 * s) % 4;
      const uint32_t a[4] = {entry(lo_words[s / 2], byte), entry(hi_words[s / 2], byte),
                             entry(lo_words[s / 2], byte + 1), entry(hi_words[s / 2], byte + 1)};
      step_product<M, C::kSplitX>(s, a, bh, bl, d);
    }
  }
}

// What the sums are multiplied by at the end (2^-tw, or an integral table's base), kept in shared memory past the
// table (a register across the loop would spill).
__device__ __forceinline__ float* table_unscale_slot(unsigned char* smem) {
  return reinterpret_cast<float*>(smem + kTableBytes + 256 * 4 + kGemvWarps * 4);
}

// Builds the decode table (kTableBytes) and stores what the sums are multiplied by at the end. Nibble codes whose
// table is integral (every level an integer N times the smallest nonzero |level|, |N| <= 256 for bf16 x, 2048
// otherwise, so that the MMA type holds N exactly, N base within 2^-22 of the level: the APoT schemes, whose levels
// are alpha / D * N, |N| <= 48 at 4 bits) get {N(l), N(h)} pairs of MmaType<T, true> (4 bytes a lane, pair_product)
// and the base; any other table its levels scaled by 2^tw (largest |level| in [2^14, 2^15)) split into fp16 hi +
// lo, 22 significant bits, exact products with fp16 x, and 2^-tw.
// Codes past the table read as level 0. Returns whether the table is integral (uniform). Ends with a barrier.
template <typename T, bool kNibbles>
__device__ __forceinline__ bool build_table(const float* code_values, int table_size, unsigned char* smem) {
  unsigned char* const table = smem;
  uint32_t* const codes = reinterpret_cast<uint32_t*>(smem + kTableBytes);  // {hi, lo} fp16 of each code (or N)
  uint32_t* const warp_max = codes + 256;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float level = static_cast<int>(threadIdx.x) < table_size ? code_values[threadIdx.x] : 0.f;
  const uint32_t size_bits = __float_as_uint(level) & 0x7fffffffu;
  const uint32_t top = __reduce_max_sync(0xffffffffu, size_bits);
  if (lane == 0) warp_max[warp] = top;
  __syncthreads();
  uint32_t block_top = warp_max[0];
#pragma unroll
  for (int i = 1; i < kGemvWarps; ++i) block_top = max(block_top, warp_max[i]);
  bool integral = false;
  float base = 0.f;
  if constexpr (kNibbles) {
    // the smallest nonzero |level| (positive floats order as their bits)
    const uint32_t low = __reduce_min_sync(0xffffffffu, size_bits != 0 ? size_bits : 0xffffffffu);
    __syncthreads();  // every warp has read warp_max
    if (lane == 0) warp_max[warp] = low;
    __syncthreads();
    uint32_t block_low = warp_max[0];
#pragma unroll
    for (int i = 1; i < kGemvWarps; ++i) block_low = min(block_low, warp_max[i]);
    base = __uint_as_float(block_low);
    const bool usable = block_low != 0xffffffffu && block_top < 0x7f800000u;  // a nonzero, finite table
    const float n = usable ? rintf(level / base) : 0.f;
    constexpr bool kBf16 = std::is_same<MmaType<T, true>, __nv_bfloat16>::value;
    const bool ok = usable && fabsf(n) <= (kBf16 ? 256.f : 2048.f) &&
                    fabsf(n * base - level) <= 2.384185791015625e-7f * fabsf(level);
    integral = __syncthreads_and(ok) != 0;
    if (integral)
      codes[threadIdx.x] = kBf16 ? uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(n)))
                                 : uint32_t(__half_as_ushort(__float2half_rn(n)));
  }
  if (!integral) {
    const int shift = scale_shift(block_top >> 23);
    base = pow2(-shift);
    const float scaled = level * pow2(shift);
    const __half hi = __float2half_rn(scaled);
    const __half lo = __float2half_rn(scaled - __half2float(hi));
    codes[threadIdx.x] = uint32_t(__half_as_ushort(hi)) | (uint32_t(__half_as_ushort(lo)) << 16);
  }
  if (threadIdx.x == 0) *table_unscale_slot(smem) = base;
  __syncthreads();
  if (kNibbles && integral) {  // byte h << 4 | l: {N(l) | N(h) << 16} at lane * 4; warp w writes l = w, w + 8
    const uint32_t low_a = codes[warp], low_b = codes[warp + 8];
    for (int h = 0; h < 16; ++h) {
      const uint32_t high = codes[h] << 16;
      *reinterpret_cast<uint32_t*>(table + (h * 16 + warp) * 256 + lane * 4) = low_a | high;
      *reinterpret_cast<uint32_t*>(table + (h * 16 + warp + 8) * 256 + lane * 4) = low_b | high;
    }
  } else if (kNibbles) {  // byte h << 4 | l: {hi(l) | hi(h) << 16, lo(l) | lo(h) << 16}; warp w writes l = w, w + 8
    const uint32_t low_a = codes[warp], low_b = codes[warp + 8];
    for (int h = 0; h < 16; ++h) {
      const uint32_t high = codes[h];
      *reinterpret_cast<uint2*>(table + (h * 16 + warp) * 256 + lane * 8) =
          make_uint2(__byte_perm(low_a, high, 0x5410), __byte_perm(low_a, high, 0x7632));
      *reinterpret_cast<uint2*>(table + (h * 16 + warp + 8) * 256 + lane * 8) =
          make_uint2(__byte_perm(low_b, high, 0x5410), __byte_perm(low_b, high, 0x7632));
    }
  } else {
    for (int b = warp; b < 256; b += kGemvWarps) *reinterpret_cast<uint32_t*>(table + b * 256 + lane * 4) = codes[b];
  }
  __syncthreads();
  return integral;
}

// How a lane reads its 16 bytes of a weight row: rows of whole 16-byte pieces (vectors, streamed,
// a chunk ahead), or rows of any length and alignment (bytes: a kernel of its own, one tile, no
// prefetch, since its 16 registers a piece would otherwise be hoisted across tiles).
enum LoadPath { kLoadVector, kLoadBytes };

template <int kPath>
__device__ __forceinline__ uint4 load_piece(const uint8_t* p, bool valid, int64_t offset, int64_t row_bytes) {
  if (kPath == kLoadVector) return load_stream16(p, valid);  // in the row means all 16 bytes
  return load_weight16(p, valid, offset, row_bytes);
}

// Pulls row g of x, columns k0 .. k0 + kCodes - 1, into L1 (no registers held; load_x reads it a chunk
// later): a line a lane (64 bytes of 16-bit x, 128 of fp32: the group's lines).
template <typename T, bool kNibbles>
__device__ __forceinline__ void prefetch_x(const T* x, int m, int64_t k, int g, int64_t k0) {
  if (g < m && k0 < k) asm volatile("prefetch.global.L1 [%0];" ::"l"(x + int64_t(g) * k + k0));
}

// The main loop of a warp over its chunks [c_begin, c_end); W of chunk c + 1 is loaded while chunk c
// is decoded (each tile's registers are refilled as soon as they are read); x of chunk c + 1 is pulled
// into L1. W of chunk c + 2 was pulled into L2 beside it until 2026-12-04 (prefetch.global.L2, so that DRAM
// served the chunks in the order they are used): without it, H200, apot4 bf16 table=scheme, us in a rotating
// graph, best of 2 passes, same process: M = 1 8192^2 17.51 -> 15.75, 12288 x 4096 14.04 -> 12.56, 28672 x 8192
// 52.77 -> 48.59, 4096 x 11008 13.79 -> 13.39; M = 8 8192^2 19.32 -> 17.31; M = 16 8192^2 25.20 -> 24.20,
// 16384^2 90.32 -> 82.40, 4096 x 14336 23.53 -> 22.15; fp32 x M = 1 8192^2 22.80 -> 21.68; it lost only at M = 1
// 16384^2 (55.06 -> 58.64). Three or four chunks ahead lost everywhere (pending/apot_pf.sweep). ncu (M = 1, with
// it): the most-sampled stall was the loop's first instruction waiting on the memory pipe (long scoreboard, 12%
// of the samples), behind the chunk's 8 prefetches and 8 loads.
template <typename T, bool kNibbles, int kTiles, int kGroups, int kPath>
__device__ __forceinline__ void small_batch_loop(const SmallBatchArgs<T>& args, unsigned char* smem, int64_t row0,
                                                int64_t c_begin, int64_t c_end, float (&total)[kTiles][kGroups][4]) {
  using C = Chunk<T, kNibbles>;
  constexpr bool kPrefetch = kPath != kLoadBytes;
  const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const uint32_t lane_offset = kNibbles ? lane * 8 : lane * 4;
  const int64_t row_bytes = args.row_bytes;
  // Row g + r of the block (r = 16 t or 16 t + 8) is at base + r * row_bytes; it exists if r < rows_left.
  const uint8_t* const base = args.w + (row0 + g) * row_bytes + tig * 16;
  const int64_t rows_left = args.n - (row0 + g);
  uint4 w_lo[kTiles], w_hi[kTiles];  // rows g and g + 8 of each tile, the next chunk's
  if (kPrefetch) {
    const int64_t offset = c_begin * kChunkBytes + tig * 16;
    const bool in_row = c_begin < c_end && offset < row_bytes;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const uint8_t* p = base + int64_t(16 * t) * row_bytes + c_begin * kChunkBytes;
      w_lo[t] = load_piece<kPath>(p, in_row && 16 * t < rows_left, offset, row_bytes);
      w_hi[t] = load_piece<kPath>(p + 8 * row_bytes, in_row && 16 * t + 8 < rows_left, offset, row_bytes);
    }
  }
#pragma unroll
  for (int r = 0; r < kGroups; ++r)
    if (c_begin < c_end)
      prefetch_x<T, kNibbles>(args.x, args.m, args.k, g + 8 * r, c_begin * C::kColumns + tig * C::kCodes);
  const bool integral = build_table<T, kNibbles>(args.code_values, args.table_size, smem);  // the loads fly meanwhile
  const unsigned char* const table = smem;
  // The chunk loop, once for each kind of table (kIntegral: pair_product, one MMA a step for rows g and g + 8).
  auto chunks = [&](auto integral_tag) {
    constexpr bool kIntegral = decltype(integral_tag)::value;
    const uint32_t offset_in_row = kIntegral ? lane * 4 : lane_offset;  // the lane's copy in a table row
    for (int64_t c = c_begin; c < c_end; ++c) {
      uint32_t bh[kGroups][C::kPairs], bl[kGroups][C::kPairs];
      float f0[kGroups], f1[kGroups];
#pragma unroll
      for (int r = 0; r < kGroups; ++r) {
        uint32_t xr[C::kXWords];
        load_x<T, kNibbles>(xr, args.x, args.m, args.k, g + 8 * r, c * C::kColumns + tig * C::kCodes, args.x_vector);
        x_fragment<T, kNibbles, kIntegral>(xr, bh[r], bl[r], f0[r], f1[r], tig);
      }
      const bool more = c + 1 < c_end;
#pragma unroll
      for (int r = 0; r < kGroups; ++r)
        if (more)
          prefetch_x<T, kNibbles>(args.x, args.m, args.k, g + 8 * r, (c + 1) * C::kColumns + tig * C::kCodes);
      const int64_t offset = c * kChunkBytes + tig * 16, next = offset + kChunkBytes;
      const bool next_in_row = more && next < row_bytes;
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        if (t >= args.tiles) break;  // always false: a branch that keeps ptxas from interleaving tiles (registers)
        float da[kGroups][4], db[kGroups][4];  // rows g and g + 8 of the tile (kIntegral: both in da)
        if (kPrefetch) {
          if constexpr (kIntegral) {
            pair_product<T, kNibbles, kGroups>(w_lo[t], w_hi[t], table, offset_in_row, bh, bl, da);
          } else {
            piece_product<T, kNibbles, kGroups>(w_lo[t], table, offset_in_row, bh, bl, da);
            piece_product<T, kNibbles, kGroups>(w_hi[t], table, offset_in_row, bh, bl, db);
          }
          // Refilled once read (the lookups issued): no second copy of the 32 bytes.
          const uint8_t* p = base + int64_t(16 * t) * row_bytes + (c + 1) * kChunkBytes;
          w_lo[t] = load_piece<kPath>(p, next_in_row && 16 * t < rows_left, next, row_bytes);
          w_hi[t] = load_piece<kPath>(p + 8 * row_bytes, next_in_row && 16 * t + 8 < rows_left, next, row_bytes);
        } else {
          const uint8_t* p = base + int64_t(16 * t) * row_bytes + c * kChunkBytes;
          const uint4 lo = load_piece<kPath>(p, 16 * t < rows_left, offset, row_bytes);
          const uint4 hi = load_piece<kPath>(p + 8 * row_bytes, 16 * t + 8 < rows_left, offset, row_bytes);
          if constexpr (kIntegral) {
            pair_product<T, kNibbles, kGroups>(lo, hi, table, offset_in_row, bh, bl, da);
          } else {
            piece_product<T, kNibbles, kGroups>(lo, table, offset_in_row, bh, bl, da);
            piece_product<T, kNibbles, kGroups>(hi, table, offset_in_row, bh, bl, db);
          }
        }
#pragma unroll
        for (int r = 0; r < kGroups; ++r) {
          if constexpr (kIntegral) {
            total[t][r][0] = fmaf(da[r][0], f0[r], total[t][r][0]);  // row g
            total[t][r][1] = fmaf(da[r][1], f1[r], total[t][r][1]);
            total[t][r][2] = fmaf(da[r][2], f0[r], total[t][r][2]);  // row g + 8
            total[t][r][3] = fmaf(da[r][3], f1[r], total[t][r][3]);
          } else {
            total[t][r][0] = fmaf(da[r][0] + da[r][2], f0[r], total[t][r][0]);  // hi + lo
            total[t][r][1] = fmaf(da[r][1] + da[r][3], f1[r], total[t][r][1]);
            total[t][r][2] = fmaf(db[r][0] + db[r][2], f0[r], total[t][r][2]);
            total[t][r][3] = fmaf(db[r][1] + db[r][3], f1[r], total[t][r][3]);
          }
        }
      }
    }
  };
  if constexpr (kNibbles) {
    if (integral) {
      chunks(std::true_type{});
    } else {
      chunks(std::false_type{});
    }
  } else {
    chunks(std::false_type{});
  }
}

// Block: kTiles 16-row tiles of W (rows row0 ..) times split `split` of K (of args.splits, a
// cluster when args.cluster) times kGroups groups of 8 rows of x (each A fragment meets kGroups B fragments); its 8
// warps take consecutive chunk ranges of that split. kBytes: the byte-load path (else rows of whole 16-byte pieces
// at 16-byte aligned addresses).
template <typename T, bool kNibbles, int kTiles, int kGroups, bool kBytes>
__global__ void __launch_bounds__(kGemvThreads, kBytes ? 1 : 2)  // bytes: no spills at 1 block an SM
    linear_small_batch_kernel(const SmallBatchArgs<T> args) {
  extern __shared__ __align__(16) unsigned char smem[];
  cuda::wait_for_prerequisite_grid();  // launched dependent (sm_90): everything it reads may be the previous grid's
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int split = static_cast<int>(blockIdx.x % args.splits);
  const int64_t row0 = int64_t(blockIdx.x / args.splits) * (16 * kTiles);
  const int64_t parts = int64_t(args.splits) * kGemvWarps, part_index = int64_t(split) * kGemvWarps + warp;
  const int64_t c_begin = part_index * args.chunks / parts, c_end = (part_index + 1) * args.chunks / parts;

  static_assert(kGroups == 1 || kGroups == 2, "8 or 16 rows of x a launch");
  float total[kTiles][kGroups][4];
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int r = 0; r < kGroups; ++r) total[t][r][0] = total[t][r][1] = total[t][r][2] = total[t][r][3] = 0.f;
  small_batch_loop<T, kNibbles, kTiles, kGroups, kBytes ? kLoadBytes : kLoadVector>(args, smem, row0, c_begin, c_end,
                                                                                    total);

  // Sum the 8 warps (fixed order), then the splits of K (rank order): deterministic.
  // D values of a warp: tile t, group r, lane l, register j at (t * kGroups + r) * 128 + l * 4 + j.
  constexpr int kElements = kTiles * kGroups * 128;
  // Output row and row of x of element i (register j of lane l: rows g, g + 8, columns 8 r + 2 tig, + 1).
  auto row_of = [&](int i) { return row0 + 16 * (i / (128 * kGroups)) + ((i >> 4) & 7) + 8 * ((i >> 1) & 1); };
  auto column_of = [&](int i) { return 8 * ((i >> 7) & (kGroups - 1)) + 2 * ((i >> 2) & 3) + (i & 1); };
  // In a cluster, block `split` finishes the cluster's sums of elements split * kElements / splits up to
  // (split + 1) * kElements / splits, at most one a thread (splits >= 2): its alpha and bias are read
  // here, their latency under the barriers below.
  static_assert(kElements <= 2 * kGemvThreads, "a cluster's block finishes at most one element a thread");
  const int mine = split * kElements / args.splits + static_cast<int>(threadIdx.x);
  const bool finishes = args.cluster && mine < (split + 1) * kElements / args.splits && row_of(mine) < args.n &&
                        column_of(mine) < args.m;
  const float mine_alpha = finishes ? args.alpha[args.alpha_count == 1 ? 0 : row_of(mine)] : 0.f;
  const float mine_bias = finishes && args.bias ? args.bias[row_of(mine)] : 0.f;
  __syncthreads();  // every warp is done with the table
  float* const sums = reinterpret_cast<float*>(smem);
  float* const block_sum = sums + kGemvWarps * kElements;
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int r = 0; r < kGroups; ++r)
      *reinterpret_cast<float4*>(sums + warp * kElements + (t * kGroups + r) * 128 + lane * 4) =
          make_float4(total[t][r][0], total[t][r][1], total[t][r][2], total[t][r][3]);
  __syncthreads();
  const float unscale = *table_unscale_slot(smem);
  auto store = [&](int i, float sum) {
    const int64_t row = row_of(i);
    const int column = column_of(i);
    const float a = args.alpha[args.alpha_count == 1 ? 0 : row];
    const float b = args.bias ? args.bias[row] : 0.f;
    args.y[int64_t(column) * args.n + row] = from_float<T>(sum * unscale * a + b);
  };
  for (int i = threadIdx.x; i < kElements; i += kGemvThreads) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kGemvWarps; ++w) sum += sums[w * kElements + i];
    if (args.cluster) {
      block_sum[i] = sum;
    } else if (row_of(i) < args.n && column_of(i) < args.m) {
      if (args.partial) {  // finish_split_k adds the splits up
        args.partial[split * args.partial_stride + int64_t(column_of(i)) * args.n + row_of(i)] = sum * unscale;
      } else {
        store(i, sum);
      }
    }
  }
  if (!args.cluster) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every block's sums are in its shared memory
  if (finishes) {  // the others' sums through DSMEM
    float sum = 0.f;
    for (int r = 0; r < args.splits; ++r) sum += cluster.map_shared_rank(block_sum, r)[mine];
    args.y[int64_t(column_of(mine)) * args.n + row_of(mine)] = from_float<T>(sum * unscale * mine_alpha + mine_bias);
  }
  // No block leaves while another still reads its shared memory. Relaxed arrive: the DSMEM reads are
  // done (their sums are stored) and nothing else needs ordering, so no MEMBAR.GPU waits for y's stores
  // (cluster.sync() releases).
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n barrier.cluster.wait.aligned;" ::: "memory");
#else
  __trap();  // clusters are sm_90's; the launcher does not ask for them elsewhere
#endif
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

using cuda::ClusterLaunch;
using cuda::current_device_facts;
using cuda::DeviceFacts;

// A kernel's shared memory opt-in (once a device), its blocks an SM and the cluster sizes (bit s:
// s blocks) the device can co-schedule with it.
struct KernelFacts {
  int blocks_per_sm = 1;
  unsigned cluster_sizes = 0;
};
template <typename Kernel>
cudaError_t kernel_facts(Kernel kernel, bool clusters, KernelFacts (&cache)[64], unsigned long long& known,
                         KernelFacts& facts) {
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return error;
  const unsigned long long bit = device < 64 ? 1ull << device : 0ull;
  if (bit != 0 && (__atomic_load_n(&known, __ATOMIC_ACQUIRE) & bit) != 0) {
    facts = cache[device];
    return cudaSuccess;
  }
  error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (error == cudaSuccess)
    error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&facts.blocks_per_sm, kernel, kGemvThreads, kSmemBytes);
  if (error != cudaSuccess) return error;
  facts.cluster_sizes = 0;
  for (int s = 2; clusters && s <= kMaxSplits; ++s) {
    const ClusterLaunch probe(dim3(static_cast<unsigned>(s)), kGemvThreads, kSmemBytes, s, nullptr);
    int count = 0;
    if (cudaOccupancyMaxActiveClusters(&count, kernel, &probe.config) == cudaSuccess && count > 0)
      facts.cluster_sizes |= 1u << s;
    else
      cudaGetLastError();  // a refused size is an answer, not an error
  }
  if (bit != 0) {
    cache[device] = facts;
    __atomic_fetch_or(&known, bit, __ATOMIC_RELEASE);
  }
  return cudaSuccess;
}

// Opts a kernel into kSmemBytes of shared memory, once a device.
template <typename Kernel>
cudaError_t allow_smem(Kernel kernel, unsigned long long& done) {
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return error;
  const unsigned long long bit = device < 64 ? 1ull << device : 0ull;
  if (bit != 0 && (__atomic_load_n(&done, __ATOMIC_ACQUIRE) & bit) != 0) return cudaSuccess;
  error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (error == cudaSuccess && bit != 0) __atomic_fetch_or(&done, bit, __ATOMIC_RELEASE);
  return error;
}

// Whether K may be split over `splits` blocks: 1 always, else bit `splits` of split_sizes (cluster sizes the
// device launches, or 2..8 through the workspace).
inline bool split_allowed(unsigned split_sizes, int splits) { return splits <= 1 || ((split_sizes >> splits) & 1u); }

struct SmallBatchPlan {
  int tiles = 1;   // 16-row tiles a block
  int splits = 1;  // blocks along K
};

// Tiles a block and splits of K that minimise the busiest SM's shared-memory work (table lookups,
// about 1 wavefront per 32 weights, plus the 64 KiB table a block builds): the lookups, not the
// instructions, bound this kernel. An SM holding fewer blocks than it can hides less latency;
// splits without clusters cost a second kernel. Ties go to more tiles (x serves more rows), fewer splits.
// A cluster past 2 blocks costs a quarter more a doubling, 3 blocks counted as 4 (the fit: H200, apot4 bf16, alpha
// vector, us in a rotating graph, 2026-12-02, M = 1: 4096^2 (2, 2) 12.0 against (4, 4) 16.4 and (3, 3) 17.4;
// 4096 x 11008 (2, 2) 17.8 against (3, 3) 24.9 and (4, 4) 24.8, (2, 3) 24.1; 8192^2 (3, 3) 32.5 against (4, 2) 23.8;
// M = 4: 12.4 / 16.7, 19.0 / 25.8; the same plan at 11008 x 4096, 8192^2, 16384^2, 28672 x 8192, 8192 x 28672.
// Left: (2, 1) beat the plan's (4, 2) at M = 1 by 7-12% on 8192^2 and 28672 x 8192, but lost at M = 4 on
// 8192 x 28672 and at 11008 x 4096: no rule found yet).
SmallBatchPlan plan_small_batch(int64_t chunks, int64_t n, bool nibbles, int max_tiles, int sms, int blocks_per_sm,
                                unsigned split_sizes, bool finish_kernel) {
  SmallBatchPlan best;
  double best_cost = -1;
  const double row_chunk = nibbles ? 4 : 2, x_chunk = 16, table = 600;
  const int64_t full = blocks_per_sm < 2 ? blocks_per_sm : 2;
  for (int tiles = max_tiles; tiles >= 1; --tiles) {
    for (int splits = 1; splits <= kMaxSplits; ++splits) {
      if (!split_allowed(split_sizes, splits)) continue;
      const int64_t blocks = (n + 16 * tiles - 1) / (16 * tiles) * splits;
      if (blocks > INT_MAX) continue;
      const int64_t per_sm = (blocks + sms - 1) / sms;
      const int64_t per_warp = (chunks + kGemvWarps * splits - 1) / (kGemvWarps * splits);
      double cost = double(per_sm) * (16.0 * tiles * kGemvWarps * per_warp * row_chunk +
                                      kGemvWarps * per_warp * x_chunk + table);
      if (per_sm < full) cost *= 1.25;
      if (splits > 1 && finish_kernel) cost += 4000;
      for (int size = 2; size < splits; size *= 2) cost *= 1.25;  // 3 and 4: x1.25, 5-8: x1.25^2
      if (best_cost < 0 || cost < best_cost) {
        best_cost = cost;
        best.tiles = tiles;
        best.splits = splits;
      }
    }
  }
  // Past one wave a split of a short K loses to none, where the unsplit grid fills every SM (two blocks an SM; the
  // byte-load path, one block an SM, lost with it: 2560 x 10240 bf16 (1, 1) 60.4 / (1, 2) 52.8): the model above counts
  // the split blocks' work as shared evenly, but they run in more waves. Short: a warp holds <= 12 chunks of the
  // unsplit K (a long K's second wave overlaps the first's tail: the splits won at 5120 x 13824 and 6144 x 18432).
  // H200, us in a rotating graph, M = 1, alpha vector, this rule / the model's plan (2026-12-04, same process):
  // apot4 bf16 22016 x 4096 (3, 1) 25.6 / (3, 2) 31.2, 28672 x 8192 (4, 1) 52.7 / (4, 2) 58.1, 53248 x 8192 93.8 /
  // 96.0; apot4 fp32 14336 x 4096 24.2 / 32.0, 6144 x 4096 12.9 / 15.7, 6144^2 16.9 / 19.2, 18432 x 6144 40.1 / 47.7,
  // 5120 x 1280 7.7 / 11.3, 2560 x 10240 (1, 1) 18.4 / (1, 2) 20.0; apot5 14336 x 4096 30.5 / 35.9, 13824 x 5120
  // 36.1 / 40.6, 18432 x 6144 51.6 / 57.3, 6144 x 4096 16.4 / 17.6, 5120^2 19.2 / 19.7, 6144^2 22.2 / 22.3; M = 4 the
  // same way at every one of those shapes (2.0-27% faster; benchmarks/kernels/apot_plan_split.sweep).
  if (best.splits > 1) {
    const int64_t tile_blocks = (n + 16 * best.tiles - 1) / (16 * best.tiles);
    const int64_t per_sm = (tile_blocks * best.splits + sms - 1) / sms;
    const int64_t unsplit_per_sm = (tile_blocks + sms - 1) / sms;
    const int64_t unsplit_per_warp = (chunks + kGemvWarps - 1) / kGemvWarps;
    if (full >= 2 && per_sm > full && unsplit_per_sm >= full && unsplit_per_warp <= 12) best.splits = 1;
  }
  return best;
}

template <typename T, bool kNibbles, int kTiles, int kGroups, bool kBytes>
cudaError_t launch_small_batch_tiles(const SmallBatchArgs<T>& base, int64_t m, int64_t blocks, bool dependent,
                                     cudaStream_t stream) {
  auto kernel = linear_small_batch_kernel<T, kNibbles, kTiles, kGroups, kBytes>;
  static unsigned long long smem_done = 0;
  cudaError_t error = allow_smem(kernel, smem_done);
  if (error != cudaSuccess) return error;
  constexpr int kRows = kGroupRows * kGroups;
  for (int64_t m0 = 0; m0 < m; m0 += kRows) {
    SmallBatchArgs<T> args = base;
    args.m = static_cast<int>(m - m0 < kRows ? m - m0 : kRows);
    args.x = base.x + m0 * base.k;
    args.y = base.y + m0 * base.n;
    args.partial = base.partial ? base.partial + m0 * base.n : nullptr;
    const ClusterLaunch launch(dim3(static_cast<unsigned>(blocks)), kGemvThreads, kSmemBytes,
                               args.cluster ? args.splits : 1, stream, dependent);
    error = cudaLaunchKernelEx(&launch.config, kernel, args);
    if (error != cudaSuccess) return error;
  }
  return cudaSuccess;
}

template <typename T, bool kNibbles>
cudaError_t launch_small_batch(const T* x, int64_t m, int64_t k, const uint8_t* w, int64_t n, int64_t row_bytes,
                               const float* code_values, int table_size, const float* alpha, int64_t alpha_count,
                               const float* bias, T* y, float* workspace, cudaStream_t stream,
                               const SmallBatchTuning* tuning) {
  // Rows of x a launch: 16 for 16-bit x of more than 8 rows (two B fragments an A fragment: W read once for them;
  // H200, apot4 bf16 table=scheme, us in a rotating graph, two launches of 8 -> one of 16 (2026-12-04): M = 16
  // 8192^2 37.96 -> 25.14, 4096 x 11008 31.96 -> 19.24, 28672 x 8192 118.99 -> 89.90, 16384^2 122.00 -> 90.43,
  // M = 9 8192^2 36.27 -> 22.48), else 8. At most 2 tiles then (registers: 128 a thread at 2 blocks an SM).
  const bool two_groups = sizeof(T) == 2 && m > kGroupRows;
  // Tiles a warp: 4 where registers allow (nibbles, 16-bit x, 8 rows), else 2; 1 on the byte-load path.
  constexpr int kMaxTiles = kNibbles && sizeof(T) == 2 ? 4 : 2;
  const int max_tiles = two_groups ? 2 : kMaxTiles;
  const bool bytes = row_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0;
  DeviceFacts device;
  cudaError_t error = current_device_facts(device);
  if (error != cudaSuccess) return error;
  static KernelFacts cache[64];
  static unsigned long long known = 0;
  KernelFacts facts;
  error = kernel_facts(linear_small_batch_kernel<T, kNibbles, kMaxTiles, 1, false>, device.cluster_launch, cache,
                       known, facts);
  if (error != cudaSuccess) return error;
  const int64_t columns = kNibbles ? 128 : 64;
  const int64_t chunks = (k + columns - 1) / columns;
  // Without clusters K is split through the workspace (linear_small_batch_workspace gives room for it).
  const bool through_workspace = !device.cluster_launch && workspace != nullptr;
  const unsigned split_sizes = device.cluster_launch ? facts.cluster_sizes : (through_workspace ? 0x1feu : 0u);
  SmallBatchPlan plan =
      plan_small_batch(chunks, n, kNibbles, bytes ? 1 : max_tiles, device.sm_count > 0 ? device.sm_count : 1,
                       bytes ? 1 : facts.blocks_per_sm, split_sizes, through_workspace);  // bytes: 1 block an SM
  if (tuning != nullptr) {  // the harness's choice instead
    if (tuning->tiles > 0) {
      if (tuning->tiles > (bytes ? 1 : max_tiles)) return cudaErrorInvalidValue;
      plan.tiles = tuning->tiles;
    }
    if (tuning->splits > 0) {
      if (tuning->splits > kMaxSplits || !split_allowed(split_sizes, tuning->splits)) {
        return cudaErrorInvalidValue;
      }
      plan.splits = tuning->splits;
    }
  }
  const int64_t blocks = (n + 16 * plan.tiles - 1) / (16 * plan.tiles) * plan.splits;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  if (tuning != nullptr && tuning->taken != nullptr) {
    tuning->taken[0] = plan.tiles;
    tuning->taken[1] = plan.splits;
  }

  SmallBatchArgs<T> args;
  args.x = x;
  args.y = y;
  args.w = w;
  args.code_values = code_values;
  args.alpha = alpha;
  args.bias = bias;
  args.partial = plan.splits > 1 && !device.cluster_launch ? workspace : nullptr;
  args.k = k;
  args.n = n;
  args.row_bytes = row_bytes;
  args.chunks = chunks;
  args.alpha_count = alpha_count;
  args.partial_stride = m * n;
  args.m = 0;
  args.table_size = table_size;
  args.splits = plan.splits;
  args.tiles = 16;  // >= any kTiles (see small_batch_loop)
  args.x_vector = (k * int64_t(sizeof(T))) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  args.cluster = plan.splits > 1 && device.cluster_launch;
  // Launched dependent on sm_90: the launch overlaps the previous kernel's tail; the kernel waits for that grid first.
  // H200, us per call in a rotating graph, plain -> dependent (2026-12-04, same process, best of two passes), bf16
  // apot4 alpha vector: M = 1 12288 x 4096 14.17 -> 13.92, 4096^2 8.49 -> 8.34, 22016 x 4096 25.68 -> 25.43, 4096 x
  // 11008 14.14 -> 14.00, 8192^2 17.93 -> 17.77; M = 4 8192^2 18.28 -> 18.14, M = 8 4096^2 9.62 -> 9.38, M = 16 8192^2
  // 38.25 -> 37.92; fp32 x 8192^2 21.41 -> 21.22; the byte-load path 1000^2 5.94 -> 5.77.
  const bool dependent = device.major >= 9;
  // The kernel of kGroups 8-row groups a launch: tiles a block from the plan, at most kTop (2 with two groups).
  auto launch_groups = [&](auto groups) {
    constexpr int kGroups = decltype(groups)::value;
    constexpr int kTop = kGroups > 1 ? 2 : kMaxTiles;
    auto launch = [&](auto tiles, auto byte_loads) {
      return launch_small_batch_tiles<T, kNibbles, decltype(tiles)::value, kGroups, decltype(byte_loads)::value>(
          args, m, blocks, dependent, stream);
    };
    using std::integral_constant;
    if (bytes) return launch(integral_constant<int, 1>(), std::true_type());
    if (plan.tiles == 1) return launch(integral_constant<int, 1>(), std::false_type());
    if (plan.tiles == 2 || kTop == 2) return launch(integral_constant<int, 2>(), std::false_type());
    if (plan.tiles == 3) return launch(integral_constant<int, kTop == 4 ? 3 : 2>(), std::false_type());
    return launch(integral_constant<int, kTop>(), std::false_type());
  };
  constexpr int kWide = sizeof(T) == 2 ? 2 : 1;  // the groups of a 16-row launch (fp32 x: none)
  error = two_groups ? launch_groups(std::integral_constant<int, kWide>())
                     : launch_groups(std::integral_constant<int, 1>());
  if (error != cudaSuccess || args.partial == nullptr) return error;
  finish_split_k_kernel<T><<<grid_for(m * n), kThreads, 0, stream>>>(workspace, plan.splits, m, n, alpha, alpha_count,
                                                                       bias, y);
  return cudaGetLastError();
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
                              T* y, float* workspace, cudaStream_t stream, const SmallBatchTuning* tuning) {
  const int64_t row_bytes = bits <= 4 ? (k + 1) / 2 : k;
  if (bits <= 4)
    return launch_small_batch<T, true>(x, m, k, w, n, row_bytes, code_values, 1 << bits, alpha, alpha_count, bias,
                                       y, workspace, stream, tuning);
  return launch_small_batch<T, false>(x, m, k, w, n, row_bytes, code_values, 1 << bits, alpha, alpha_count, bias, y,
                                      workspace, stream, tuning);
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
  DeviceFacts device;
  if (current_device_facts(device) != cudaSuccess) {
    cudaGetLastError();
    return 0;  // the launch reports the error
  }
  return device.cluster_launch ? 0 : kMaxSplits * m * n;  // clusters sum split K on chip
}

cudaError_t linear_small_batch(const void* x, FloatType x_type, int64_t m, int64_t k, const uint8_t* w_packed,
                               int64_t n, int bits, const float* code_values, const float* alpha,
                               int64_t alpha_count, const float* bias, void* y, float* workspace,
                               cudaStream_t stream, const SmallBatchTuning* tuning) {
  if (m == 0 || n == 0) return cudaSuccess;
  if (bits < 1 || bits > 8 || k < 1) return cudaErrorInvalidValue;
  switch (x_type) {
    case FloatType::kFloat32:
      return small_batch_typed(static_cast<const float*>(x), m, k, w_packed, n, bits, code_values, alpha,
                               alpha_count, bias, static_cast<float*>(y), workspace, stream, tuning);
    case FloatType::kFloat16:
      return small_batch_typed(static_cast<const __half*>(x), m, k, w_packed, n, bits, code_values, alpha,
                               alpha_count, bias, static_cast<__half*>(y), workspace, stream, tuning);
    case FloatType::kBFloat16:
      return small_batch_typed(static_cast<const __nv_bfloat16*>(x), m, k, w_packed, n, bits, code_values, alpha,
                               alpha_count, bias, static_cast<__nv_bfloat16*>(y), workspace, stream, tuning);
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
