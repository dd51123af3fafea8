// APoT kernels for the CPU (SPEC.md 2.5): pack_codes, apot_linear, apot_linear_int, apot_conv2d.
//
// Storage (ops.py): codes along the reduction dimension, two a byte (element 2j in the low nibble,
// 2j+1 in the high one) for bits <= 4, one a byte above. Weights stay packed; the kernels decode
// them through the code table (`code_values[c]`, the level of code c relative to alpha).
// A code outside the table (possible only in a hand-made w_packed with codes >= 2**bits) reads as
// level 0 rather than reading past the table.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "checks.h"
#include "inference_autograd.h"

// SIMD level of the small-batch apot_linear kernel (-march=native picks it): AVX-512 (F + BW),
// else AVX2 + FMA, else the scalar loop. BITCOMPILE_APOT_FORCE_AVX2 builds the AVX2 kernel on an
// AVX-512 machine (for testing it).
#if defined(__AVX512F__) && defined(__AVX512BW__) && !defined(BITCOMPILE_APOT_FORCE_AVX2)
#define BITCOMPILE_APOT_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define BITCOMPILE_APOT_AVX2 1
#endif

namespace {

using bitcompile::packed_code_bytes;
using bitcompile::with_last_dim;

// Batches up to this many rows take the small-batch kernel (codes decoded in registers); larger ones decode blocks
// of W and use the BLAS GEMM (at::mm), then the faster (2026-12-05 table at apot_linear).
constexpr int64_t kSmallBatchRows = 32;
// Rows of x up to which the GEMM path has BLAS write y.T, past them y (2026-12-05, interleaved, fp32 = 1): M = 512
// y.T / y 1.02 / 0.99 (4096^2), 1.05 / 0.99 (4096 x 11008), 1.04 / 1.06 (11008 x 4096); M = 1024 0.96 / 1.02,
// 1.05 / 1.08, 0.90 / 0.97; M = 64 y.T 1.44 / 1.22 / 1.51, y 0.65 / 1.03 / 1.16.
constexpr int64_t kGemmTransposedMaxRows = 512;
// Bytes of reordered x a small-batch tile sweeps at a time (a block of x rows, small_batch_run).
constexpr int64_t kXBlockBytes = int64_t(256) << 10;
// Bytes of decoded fp32 weight per block on the GEMM path (the packed weight is what is stored;
// the decoded block is a per-call temporary of bounded size).
constexpr int64_t kDecodeBlockBytes = int64_t(4) << 20;

// Work units (about one code decoded or one multiply-add, vectorized) a parallel chunk must hold
// at least: ~10 us of work. A parallel region waits for its slowest thread, and on a busy machine
// a thread can start a scheduler time slice (ms) late, far longer than a small call takes on one
// thread, so small calls stay on the calling thread.
constexpr int64_t kMinParallelWork = int64_t(1) << 19;
// The same for the scalar loops (decode to memory, int32 dots): ~10 us.
constexpr int64_t kMinParallelScalarWork = int64_t(1) << 15;

// Grain (in items) so that a chunk holds at least `min_work` units.
inline int64_t grain_for(int64_t work_per_item, int64_t min_work) {
  return std::max<int64_t>(1, (min_work + work_per_item - 1) / std::max<int64_t>(1, work_per_item));
}

// The code table copied into 256 entries, zero beyond 2**bits, so any byte indexes it safely.
template <typename T>
std::array<T, 256> padded_table(const at::Tensor& table) {
  std::array<T, 256> levels{};
  auto contiguous = table.contiguous();
  const T* data = contiguous.data_ptr<T>();
  for (int64_t i = 0; i < contiguous.numel(); ++i) levels[i] = data[i];
  return levels;
}

// Row of packed codes -> k values levels[code] * scale.
template <typename T>
inline void decode_row(const uint8_t* row, int64_t k, int64_t bits, const T* levels, T scale, T* out) {
  if (bits <= 4) {
    const int64_t pairs = k / 2;
    for (int64_t j = 0; j < pairs; ++j) {
      const uint8_t byte = row[j];
      out[2 * j] = levels[byte & 15] * scale;
      out[2 * j + 1] = levels[byte >> 4] * scale;
    }
    if (k % 2) out[k - 1] = levels[row[pairs] & 15] * scale;
  } else {
    for (int64_t j = 0; j < k; ++j) out[j] = levels[row[j]] * scale;
  }
}

// fp32 dot product; 16 independent accumulators so the compiler vectorizes it (AVX2 or AVX-512).
inline float dot(const float* a, const float* b, int64_t k) {
  float lanes[16] = {};
  int64_t j = 0;
  for (; j + 16 <= k; j += 16)
    for (int l = 0; l < 16; ++l) lanes[l] += a[j + l] * b[j + l];
  float sum = 0.f;
  for (int l = 0; l < 16; ++l) sum += lanes[l];
  for (; j < k; ++j) sum += a[j] * b[j];
  return sum;
}

// decode_row for fp32, vectorized: natural column order (nibbles unpacked and interleaved in
// bytes first), levels by a permute of the table in registers (16 entries; 32 with bits = 5 on
// AVX-512, where a byte >= 32 reads as 0 through the mask) or a gather from the 256 entries.
inline void decode_row_float(const uint8_t* row, int64_t k, int64_t bits, const float* levels, float scale,
                             float* out) {
  int64_t j = 0;  // columns done
#if defined(BITCOMPILE_APOT_AVX512)
  const __m512 factor = _mm512_set1_ps(scale);
  if (bits <= 4) {
    const __m512 table = _mm512_loadu_ps(levels);
    const __m128i nibble = _mm_set1_epi8(15);
    for (; j + 32 <= k; j += 32) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + j / 2));
      const __m128i low = _mm_and_si128(bytes, nibble), high = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
      const __m512i first = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(low, high));
      const __m512i second = _mm512_cvtepu8_epi32(_mm_unpackhi_epi8(low, high));
      _mm512_storeu_ps(out + j, _mm512_mul_ps(_mm512_permutexvar_ps(first, table), factor));
      _mm512_storeu_ps(out + j + 16, _mm512_mul_ps(_mm512_permutexvar_ps(second, table), factor));
    }
  } else if (bits == 5) {
    const __m512 low = _mm512_loadu_ps(levels), high = _mm512_loadu_ps(levels + 16);
    for (; j + 16 <= k; j += 16) {
      const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + j)));
      const __m512 v =
          _mm512_maskz_permutex2var_ps(_mm512_cmplt_epu32_mask(codes, _mm512_set1_epi32(32)), low, codes, high);
      _mm512_storeu_ps(out + j, _mm512_mul_ps(v, factor));
    }
  } else {
    for (; j + 16 <= k; j += 16) {
      const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + j)));
      _mm512_storeu_ps(out + j, _mm512_mul_ps(_mm512_i32gather_ps(codes, levels, 4), factor));
    }
  }
#elif defined(BITCOMPILE_APOT_AVX2)
  const __m256 factor = _mm256_set1_ps(scale);
  if (bits <= 4) {
    const __m256 t0 = _mm256_loadu_ps(levels), t1 = _mm256_loadu_ps(levels + 8);
    const __m128i nibble = _mm_set1_epi8(15);
    for (; j + 32 <= k; j += 32) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + j / 2));
      const __m128i low = _mm_and_si128(bytes, nibble), high = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
      const __m128i ordered[2] = {_mm_unpacklo_epi8(low, high), _mm_unpackhi_epi8(low, high)};
      for (int h = 0; h < 2; ++h)
        for (int q = 0; q < 2; ++q) {
          const __m256i codes = _mm256_cvtepu8_epi32(q ? _mm_srli_si128(ordered[h], 8) : ordered[h]);
          const __m256 v = _mm256_blendv_ps(_mm256_permutevar8x32_ps(t0, codes), _mm256_permutevar8x32_ps(t1, codes),
                                            _mm256_castsi256_ps(_mm256_slli_epi32(codes, 28)));
          _mm256_storeu_ps(out + j + 16 * h + 8 * q, _mm256_mul_ps(v, factor));
        }
    }
  } else {
    for (; j + 8 <= k; j += 8) {
      const __m256i codes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + j)));
      _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_i32gather_ps(levels, codes, 4), factor));
    }
  }
#endif
  if (bits <= 4) {
    for (; j < k; ++j) out[j] = levels[(row[j >> 1] >> ((j & 1) * 4)) & 15] * scale;
  } else {
    for (; j < k; ++j) out[j] = levels[row[j]] * scale;
  }
}

// alpha[n] * code_values[code[n, k]] for rows [row0, row0 + rows) of the packed weight, fp32.
// Weight rows row0 .. row0 + rows - 1 decoded to fp32, alpha applied, into `out` (contiguous, rows x k).
void decode_weight_into(const at::Tensor& w_packed, int64_t row0, int64_t rows, int64_t k, int64_t bits,
                        const std::array<float, 256>& levels, const at::Tensor& alpha, at::Tensor& out) {
  const uint8_t* w = w_packed.data_ptr<uint8_t>();
  const int64_t row_bytes = w_packed.size(1);
  const float* alpha_data = alpha.data_ptr<float>();
  const bool per_row = alpha.numel() > 1;
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows, grain_for(k, kMinParallelWork), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = row0 + r;
      decode_row_float(w + n * row_bytes, k, bits, levels.data(), alpha_data[per_row ? n : 0], o + r * k);
    }
  });
}

at::Tensor decode_weight(const at::Tensor& w_packed, int64_t row0, int64_t rows, int64_t k, int64_t bits,
                         const std::array<float, 256>& levels, const at::Tensor& alpha) {
  auto out = at::empty({rows, k}, at::TensorOptions().dtype(at::kFloat));
  decode_weight_into(w_packed, row0, rows, k, bits, levels, alpha, out);
  return out;
}

// ---------------------------------------------------------------------------------------------
// pack_codes
// ---------------------------------------------------------------------------------------------
at::Tensor pack_codes_cpu(const at::Tensor& codes, int64_t bits) {
  bitcompile::check_pack_codes(codes, bits);
  const int64_t k = codes.size(-1);
  const int64_t width = packed_code_bytes(k, bits);
  const auto sizes = with_last_dim(codes.sizes(), width);
  auto out = at::empty(sizes, codes.options().dtype(at::kByte));
  auto flat = codes.reshape({-1, k}).contiguous();
  const int64_t rows = flat.size(0);
  if (rows == 0) return out;
  uint8_t* o = out.data_ptr<uint8_t>();
  const int64_t limit = int64_t(1) << bits;
  AT_DISPATCH_INTEGRAL_TYPES(codes.scalar_type(), "bitcompile::pack_codes", [&] {
    const scalar_t* c = flat.data_ptr<scalar_t>();
    // Range first (one pass), so a bad code raises before anything is written.
    int64_t low = 0, high = 0;
    for (int64_t i = 0; i < rows * k; ++i) {
      low = std::min<int64_t>(low, static_cast<int64_t>(c[i]));
      high = std::max<int64_t>(high, static_cast<int64_t>(c[i]));
    }
    BITCOMPILE_CHECK(low >= 0 && high < limit, "bitcompile::pack_codes: code out of range for bits=", bits, ": got ",
                low < 0 ? low : high, ", codes must be in 0..", limit - 1);
    at::parallel_for(0, rows, grain_for(k, kMinParallelScalarWork), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* row = c + r * k;
        uint8_t* packed = o + r * width;
        if (bits > 4) {
          for (int64_t j = 0; j < k; ++j) packed[j] = static_cast<uint8_t>(row[j]);
        } else {
          for (int64_t j = 0; j < k / 2; ++j)
            packed[j] = static_cast<uint8_t>(row[2 * j] | (row[2 * j + 1] << 4));
          if (k % 2) packed[k / 2] = static_cast<uint8_t>(row[k - 1]);  // high nibble 0
        }
      }
    });
  });
  return out;
}

// ---------------------------------------------------------------------------------------------
// apot_linear: y = x @ (alpha[n] * code_values[code]).T + bias, fp32 accumulation.
// ---------------------------------------------------------------------------------------------
// Timings (2026-11-30, 2-core AMD EPYC Zen 4 shared with other builds, load average 1.7-2.1;
// medians of 100-200 calls, us; x = randn(M, K) fp32, random codes, per-row alpha, no bias;
// fp32 = F.linear on the float weight; before = the decode-a-row-then-dot loop, grain 32768/k):
//
//   OMP_NUM_THREADS=1            fp32 |  before apot3/4/5   |  after apot3/4/5
//   K=1024 N=2816 M=1             231 |  1033  1033  1813   |    95    95   107
//   K=1024 N=2816 M=4             932 |  1468  1458  2246   |   313   302   350
//   K=1024 N=2816 M=16           1656 |  3283  3279  4034   |  1663  1651  1894
//   K=4096 N=4096 M=1            4197 |  6103  5995 10718   |   507   510   636
//   K=4096 N=4096 M=4            8012 |  9246  9161 13815   |  2180  2215  3206
//   K=4096 N=4096 M=16          13240 | 22019 21962 26590   |  8676  8671 10612
//   OMP_NUM_THREADS=2
//   K=1024 N=2816 M=1             222 |  7992  7989  7995*  |    67    67    69
//   K=1024 N=2816 M=4             943 |  7998  7999  7998*  |   159   163   183
//   K=1024 N=2816 M=16           1490 |  8000  7996  8000*  |   957   620   749
//   K=4096 N=4096 M=1            4235 |  3141  3019  5825   |   255   255   292
//   K=4096 N=4096 M=4            8378 |  4814  4684  7205   |   844   833  1010
//   K=4096 N=4096 M=16           8566 | 24356 24016 13347   |  3522  3439  4295
//   * ~8 ms: a descheduled OpenMP thread (chunks of a few us); now chunks are >= ~10 us.
// Run to run (other engineers' builds) the after M=16 rows varied: 1.2-1.7 ms (K=1024) and
// 6.8-8.7 ms (4096 x 4096) with one thread; M = 1 stayed within a few us.
//
// M = 1 with one thread: 2.1-2.4x faster than fp32 at K=1024 (1.44 MB of nibbles vs 11.5 MB of
// fp32, both from L3; the nibble kernel is bound by its ~6 vector ops per 32 codes), 6.6-8.2x
// at 4096 x 4096 (fp32 reads 64 MB from DRAM). The AVX2 kernel (built here with
// BITCOMPILE_APOT_FORCE_AVX2, 1 thread, M = 1): K=1024 apot3/4/5 202/200/338 (fp32 ~210),
// 4096 x 4096 1149/1200/2186 (fp32 ~3900): on AVX2 the two permutes + blend per 8 codes bound it.
// M > 16 (GEMM path: vectorized decode + at::mm), K=1024 N=2816 M=17: ~1.9 ms, fp32 ~1.9 ms
// (the scalar decode made it 2.6 ms).
//
// 2026-12-05, the same machine, 2 threads, apot4; small-batch kernel, GEMM path and fp32 F.linear interleaved in one
// process (9 rounds, medians, us). Before: the GEMM path from 17 rows, each block's product written to a temporary
// and copied into y's columns: 0.53-0.90x of fp32 at M = 32, 0.60-0.96x at 4096 x 11008 M = 17-256; the small-batch
// kernel swept all of x for each tile of weight rows (0.52x of fp32 at M = 1024, 4096^2). Now the small-batch
// kernel takes x in blocks of rows (kXBlockBytes) and the GEMM path writes y.T's rows from one reused decode buffer:
//   N x K         M:   16            24            32            48            64
//   4096 x 4096      3622/4723     6353/6656     6838/7242    10611/10176   17060/12766   (small / GEMM path)
//                     fp32 8517         9083         10716        13684         16029
//   2816 x 1024       666/787       952/1227     1293/1310     2035/1784     3166/2302    fp32 1208 .. 2648
//   4096 x 11008     9092/12564   13553/19881   18884/25816   35113/35330   35734/44674   fp32 20626 .. 53975
//   11008 x 4096     9488/12047   17086/18430   18834/19474   27460/27087   37050/34370   fp32 29404 .. 53158
// The small-batch kernel wins or ties up to M = 32 at every shape, the GEMM path from 48 at most: kSmallBatchRows
// = 32. Both paths are at least fp32's speed at every row (GEMM path 4096^2: M = 128 1.10x, 256 1.04x), where the
// old GEMM path was below it from 17 rows on. Run to run, single rows moved by up to 20% (a shared 2-core machine).
// The AVX2 kernel (BITCOMPILE_APOT_FORCE_AVX2, same machine) crosses over at 32 too: 4096^2 M = 32 8492 / 8492,
// 4096 x 11008 M = 24 16490 / 20363, M = 32 24792 / 21813.

// ---- small-batch kernel (M <= kSmallBatchRows) ------------------------------------------------
// Each weight row is decoded in registers, a block of codes at a time, straight from the packed
// bytes: the code table sits in vector registers and a permute by the codes gives their levels
// (AVX-512: vpermps on the 16-entry table for nibbles, vpermt2ps on 32 entries for bits = 5, a
// gather for bits 6..8; AVX2: two vpermps + a blend on bit 3 for nibbles, a gather for bytes).
// Nibbles are decoded without unpacking: one load gives 32-bit lanes of 8 nibbles, and lane l of
// the s-th vector (codes >> 4s, the permute reads the low bits) is the code of column 8l + s. x
// is first copied with every block's columns in the decoder's order (Decoder::column), zero
// past k; a row's last, partial block is decoded from a zero-padded copy, so no scalar tail.
// A tile of R weight rows x MB rows of x keeps R * MB accumulators; the x loads are shared by the
// R rows and each decoded vector by the MB rows. alpha[n] (and bias) scale the finished fp32 sum.
#if defined(BITCOMPILE_APOT_AVX512)
using Vec = __m512;
using Seen = __m512i;  // OR of the code bytes decoded (Byte32Decoder<false> only)
constexpr int kLanes = 16;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(Vec v) { return _mm512_reduce_add_ps(v); }

struct NibbleDecoder {  // bits <= 4: a 64-byte load = 128 codes, 8 vectors
  static constexpr int kVectors = 8;
  static constexpr int64_t kCodes = 128, kBytes = 64;
  static int64_t column(int64_t t) { return 8 * (t % kLanes) + t / kLanes; }
  __m512 table;
  explicit NibbleDecoder(const float* levels) : table(_mm512_loadu_ps(levels)) {}
  inline void operator()(const uint8_t* src, Vec* v, Seen& /*seen*/) const {
    const __m512i codes = _mm512_loadu_si512(src);
    v[0] = _mm512_permutexvar_ps(codes, table);
    v[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), table);
    v[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 8), table);
    v[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 12), table);
    v[4] = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 16), table);
    v[5] = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 20), table);
    v[6] = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 24), table);
    v[7] = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 28), table);
  }
};

// bits = 5: the 32-entry table in two registers (vpermt2ps, which reads a lane's low 5 bits). As
// for nibbles, no unpacking: a 64-byte load gives 32-bit lanes of 4 codes, lane l of the s-th
// vector (codes >> 8s) is the code of column 4l + s. A code >= 32 must read as 0: the unmasked
// decoder (kMasked = false) ORs the bytes it reads into `seen`, and a tile that met such a code
// (only a hand-made w_packed has one) is computed again with the masked permute.
template <bool kMasked>
struct Byte32Decoder {
  static constexpr int kVectors = 4;
  static constexpr int64_t kCodes = 64, kBytes = 64;
  static int64_t column(int64_t t) { return 4 * (t % kLanes) + t / kLanes; }
  __m512 low, high;
  explicit Byte32Decoder(const float* levels) : low(_mm512_loadu_ps(levels)), high(_mm512_loadu_ps(levels + 16)) {}
  template <bool kOther>
  explicit Byte32Decoder(const Byte32Decoder<kOther>& other) : low(other.low), high(other.high) {}
  inline Vec one(__m512i codes) const {
    if constexpr (kMasked)
      return _mm512_maskz_permutex2var_ps(_mm512_testn_epi32_mask(codes, _mm512_set1_epi32(0xE0)), low, codes, high);
    return _mm512_permutex2var_ps(low, codes, high);
  }
  inline void operator()(const uint8_t* src, Vec* v, Seen& seen) const {
    const __m512i codes = _mm512_loadu_si512(src);
    if constexpr (!kMasked) seen = _mm512_or_si512(seen, codes);
    v[0] = one(codes);
    v[1] = one(_mm512_srli_epi32(codes, 8));
    v[2] = one(_mm512_srli_epi32(codes, 16));
    v[3] = one(_mm512_srli_epi32(codes, 24));
  }
};

struct ByteGatherDecoder {  // bits 6..8: gather from the 256-entry padded table
  static constexpr int kVectors = 2;
  static constexpr int64_t kCodes = 32, kBytes = 32;
  static int64_t column(int64_t t) { return t; }
  const float* levels;
  explicit ByteGatherDecoder(const float* l) : levels(l) {}
  inline Vec one(const uint8_t* p) const {
    const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_i32gather_ps(codes, levels, 4);
  }
  inline void operator()(const uint8_t* src, Vec* v, Seen& /*seen*/) const {
    v[0] = one(src);
    v[1] = one(src + 16);
  }
};
#elif defined(BITCOMPILE_APOT_AVX2)
using Vec = __m256;
using Seen = __m256i;  // OR of the code bytes decoded (Byte32Decoder only)
constexpr int kLanes = 8;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(Vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// bits <= 4: a 32-byte load = 64 codes, 8 vectors; entries 0..7 / 8..15 in two registers,
// vpermps reads a code's low 3 bits and the blend its bit 3 (shifted up to the sign bit).
struct NibbleDecoder {
  static constexpr int kVectors = 8;
  static constexpr int64_t kCodes = 64, kBytes = 32;
  static int64_t column(int64_t t) { return 8 * (t % kLanes) + t / kLanes; }
  __m256 low, high;
  explicit NibbleDecoder(const float* levels) : low(_mm256_loadu_ps(levels)), high(_mm256_loadu_ps(levels + 8)) {}
  template <int S>
  inline Vec nibble(__m256i codes) const {
    const __m256i index = _mm256_srli_epi32(codes, 4 * S);
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(low, index), _mm256_permutevar8x32_ps(high, index),
                            _mm256_castsi256_ps(_mm256_slli_epi32(codes, 28 - 4 * S)));
  }
  inline void operator()(const uint8_t* src, Vec* v, Seen& /*seen*/) const {
    const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    v[0] = nibble<0>(codes);
    v[1] = nibble<1>(codes);
    v[2] = nibble<2>(codes);
    v[3] = nibble<3>(codes);
    v[4] = nibble<4>(codes);
    v[5] = nibble<5>(codes);
    v[6] = nibble<6>(codes);
    v[7] = nibble<7>(codes);
  }
};

// bits = 5: the 32 entries in four registers, vpermps on the low 3 bits, blends on bits 3 and 4;
// a 32-byte load gives lanes of 4 codes, lane l of the s-th vector (codes >> 8s) is the code of
// column 4l + s. As on AVX-512, the bytes read are ORed into `seen` and a tile that met a code
// >= 32 is computed again with the gather (which reads it as 0).
struct Byte32Decoder {
  static constexpr int kVectors = 4;
  static constexpr int64_t kCodes = 32, kBytes = 32;
  static int64_t column(int64_t t) { return 4 * (t % kLanes) + t / kLanes; }
  __m256 t0, t1, t2, t3;
  explicit Byte32Decoder(const float* levels)
      : t0(_mm256_loadu_ps(levels)), t1(_mm256_loadu_ps(levels + 8)), t2(_mm256_loadu_ps(levels + 16)),
        t3(_mm256_loadu_ps(levels + 24)) {}
  inline Vec one(__m256i codes) const {
    const __m256 bit3 = _mm256_castsi256_ps(_mm256_slli_epi32(codes, 28));
    const __m256 low = _mm256_blendv_ps(_mm256_permutevar8x32_ps(t0, codes), _mm256_permutevar8x32_ps(t1, codes), bit3);
    const __m256 high = _mm256_blendv_ps(_mm256_permutevar8x32_ps(t2, codes), _mm256_permutevar8x32_ps(t3, codes), bit3);
    return _mm256_blendv_ps(low, high, _mm256_castsi256_ps(_mm256_slli_epi32(codes, 27)));
  }
  inline void operator()(const uint8_t* src, Vec* v, Seen& seen) const {
    const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    seen = _mm256_or_si256(seen, codes);
    v[0] = one(codes);
    v[1] = one(_mm256_srli_epi32(codes, 8));
    v[2] = one(_mm256_srli_epi32(codes, 16));
    v[3] = one(_mm256_srli_epi32(codes, 24));
  }
};

struct ByteGatherDecoder {  // bits 5..8: gather from the 256-entry padded table
  static constexpr int kVectors = 2;
  static constexpr int64_t kCodes = 16, kBytes = 16;
  static int64_t column(int64_t t) { return t; }
  const float* levels;
  explicit ByteGatherDecoder(const float* l) : levels(l) {}
  inline Vec one(const uint8_t* p) const {
    const __m256i codes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_i32gather_ps(levels, codes, 4);
  }
  inline void operator()(const uint8_t* src, Vec* v, Seen& /*seen*/) const {
    v[0] = one(src);
    v[1] = one(src + 8);
  }
};
// Byte32Decoder's fallback: its blocks and column order, levels by a gather (any byte).
struct Byte32GatherDecoder {
  static constexpr int kVectors = 4;
  static constexpr int64_t kCodes = 32, kBytes = 32;
  const float* levels;
  explicit Byte32GatherDecoder(const float* l) : levels(l) {}
  inline Vec one(__m256i codes) const {
    return _mm256_i32gather_ps(levels, _mm256_and_si256(codes, _mm256_set1_epi32(0xFF)), 4);
  }
  inline void operator()(const uint8_t* src, Vec* v, Seen&) const {
    const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    v[0] = one(codes);
    v[1] = one(_mm256_srli_epi32(codes, 8));
    v[2] = one(_mm256_srli_epi32(codes, 16));
    v[3] = one(_mm256_srli_epi32(codes, 24));
  }
};
#endif

struct SmallBatch {
  const uint8_t* w;
  int64_t row_bytes, k, n, m, bits;
  const float* x;        // [m, k] natural order
  const float* xs;       // [m, xs_stride]: blocks * kCodes columns in the decoder's order, zero past k
  int64_t xs_stride, full_blocks, blocks;  // blocks = full_blocks + (a partial last block ? 1 : 0)
  const float* levels;   // 256 entries
  const float* alpha;
  bool per_row;
  const float* bias;     // or nullptr
  float* y;              // [m, n]

  inline void store(int64_t j, int64_t i, float sum) const {
    float value = sum * alpha[per_row ? j : 0];
    if (bias) value += bias[j];
    y[i * n + j] = value;
  }
};

#if defined(BITCOMPILE_APOT_AVX512) || defined(BITCOMPILE_APOT_AVX2)
// acc[r][i] += decoded block of row r . x block of row i.
#if defined(__GNUC__)
#define BITCOMPILE_APOT_INLINE inline __attribute__((always_inline))
#else
#define BITCOMPILE_APOT_INLINE inline
#endif

// (Forced inline: as a call, GCC kept the accumulators in memory.)
template <int R, int MB, typename Decoder>
BITCOMPILE_APOT_INLINE void small_batch_step(const Decoder& decode, const uint8_t* const* src, const float* xb,
                                             int64_t xs_stride, Vec (&acc)[R][MB], Seen& seen) {
  for (int r = 0; r < R; ++r) {
    Vec v[Decoder::kVectors];
    decode(src[r], v, seen);
    for (int i = 0; i < MB; ++i)
      for (int s = 0; s < Decoder::kVectors; ++s)
        acc[r][i] = vfma(v[s], vload(xb + i * xs_stride + s * kLanes), acc[r][i]);
  }
}

// R weight rows from j0 x MB rows of x from i0. False (nothing stored) where an unmasked
// Byte32Decoder met a code >= 32.
template <int R, int MB, typename Decoder>
inline bool small_batch_tile(const SmallBatch& p, const Decoder& decode, int64_t j0, int64_t i0) {
  constexpr int64_t kCodes = Decoder::kCodes, kBytes = Decoder::kBytes;
  Vec acc[R][MB];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < MB; ++i) acc[r][i] = vzero();
  const uint8_t* src[R];
  const float* xs = p.xs + i0 * p.xs_stride;
  Seen seen{};
  // The next tile's rows (contiguous after these) are prefetched, R cache lines a block: with
  // only the hardware prefetchers, the loads from L3 were latency-bound (~22 GB/s, bits = 5).
  const char* next = reinterpret_cast<const char*>(p.w + (j0 + R) * p.row_bytes);
  constexpr int64_t kLinesPerBlock = R * ((kBytes + 63) / 64);
  for (int64_t b = 0; b < p.full_blocks; ++b) {
    for (int64_t l = 0; l < kLinesPerBlock; ++l) _mm_prefetch(next + (b * kLinesPerBlock + l) * 64, _MM_HINT_T0);
    for (int r = 0; r < R; ++r) src[r] = p.w + (j0 + r) * p.row_bytes + b * kBytes;
    small_batch_step<R, MB>(decode, src, xs + b * kCodes, p.xs_stride, acc, seen);
  }
  if (p.blocks > p.full_blocks) {  // the rows' last bytes, zero-padded to a block
    alignas(64) uint8_t padded[R][kBytes];
    const int64_t start = p.full_blocks * kBytes, count = p.row_bytes - start;
    for (int r = 0; r < R; ++r) {
      std::fill(padded[r], padded[r] + kBytes, uint8_t(0));
      std::copy(p.w + (j0 + r) * p.row_bytes + start, p.w + (j0 + r) * p.row_bytes + start + count, padded[r]);
      src[r] = padded[r];
    }
    small_batch_step<R, MB>(decode, src, xs + p.full_blocks * kCodes, p.xs_stride, acc, seen);
  }
#if defined(BITCOMPILE_APOT_AVX512)
  if constexpr (std::is_same_v<Decoder, Byte32Decoder<false>>) {
    if (_mm512_test_epi8_mask(seen, _mm512_set1_epi8(static_cast<char>(0xE0)))) return false;
  }
#else
  if constexpr (std::is_same_v<Decoder, Byte32Decoder>) {
    if (!_mm256_testz_si256(seen, _mm256_set1_epi8(static_cast<char>(0xE0)))) return false;
  }
#endif
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < MB; ++i) p.store(j0 + r, i0 + i, vsum(acc[r][i]));
  return true;
}

// R weight rows from j0 against rows [i_begin, i_end) of x: MB = 1 for one row of x, else groups of up to 4.
template <int R, bool kOneRow, typename Decoder>
inline bool small_batch_rows_of(const SmallBatch& p, const Decoder& decode, int64_t j0, int64_t i_begin,
                                int64_t i_end) {
  if constexpr (kOneRow) {
    return small_batch_tile<R, 1>(p, decode, j0, 0);
  } else {
    int64_t i0 = i_begin;
    for (; i0 + 4 <= i_end; i0 += 4)
      if (!small_batch_tile<R, 4>(p, decode, j0, i0)) return false;
    switch (i_end - i0) {
      case 1: return small_batch_tile<R, 1>(p, decode, j0, i0);
      case 2: return small_batch_tile<R, 2>(p, decode, j0, i0);
      case 3: return small_batch_tile<R, 3>(p, decode, j0, i0);
      default: return true;
    }
  }
}

// small_batch_rows_of; a tile the unmasked bits = 5 decoder gave up on is redone masked.
template <int R, bool kOneRow, typename Decoder>
inline void small_batch_rows(const SmallBatch& p, const Decoder& decode, int64_t j0, int64_t i_begin, int64_t i_end) {
  if (small_batch_rows_of<R, kOneRow>(p, decode, j0, i_begin, i_end)) return;
#if defined(BITCOMPILE_APOT_AVX512)
  if constexpr (std::is_same_v<Decoder, Byte32Decoder<false>>)
    small_batch_rows_of<R, kOneRow>(p, Byte32Decoder<true>(decode), j0, i_begin, i_end);
#else
  // Same block size and column order as Byte32Decoder, so the reordered x serves both.
  if constexpr (std::is_same_v<Decoder, Byte32Decoder>)
    small_batch_rows_of<R, kOneRow>(p, Byte32GatherDecoder(p.levels), j0, i_begin, i_end);
#endif
}

// One row of x: 8 weight rows a tile (8 independent FMA chains); more rows of x: 4 (AVX2: 2). A thread's weight
// rows meet x a block of rows at a time (kXBlockBytes of reordered x, a multiple of 4 rows), so that the x rows a
// tile reads come from the core's L2 whatever M is: without the blocks every tile swept all of x (2 MB at M = 128,
// K = 4096), and M = 1024 ran at 0.52x of fp32.
template <typename Decoder>
void small_batch_run(const SmallBatch& p, const float* levels) {
  const Decoder decode(levels);
#if defined(BITCOMPILE_APOT_AVX512)
  constexpr int kRows = 4;
#else
  constexpr int kRows = 2;
#endif
  constexpr int kRowsM1 = 8;
  const int64_t tile_rows = p.m == 1 ? kRowsM1 : kRows;
  const int64_t tiles = (p.n + tile_rows - 1) / tile_rows;
  const int64_t grain = grain_for(tile_rows * p.k * (p.m + 1), kMinParallelWork);
  const int64_t x_block_rows = std::max<int64_t>(4, kXBlockBytes / (4 * p.xs_stride) / 4 * 4);
  at::parallel_for(0, tiles, grain, [&](int64_t begin, int64_t end) {
    const int64_t j1 = std::min(p.n, end * tile_rows);
    int64_t j = begin * tile_rows;
    if (p.m == 1) {
      for (; j + kRowsM1 <= j1; j += kRowsM1) small_batch_rows<kRowsM1, true>(p, decode, j, 0, 1);
      for (; j < j1; ++j) small_batch_rows<1, true>(p, decode, j, 0, 1);
      return;
    }
    const int64_t j_first = j;
    for (int64_t i0 = 0; i0 < p.m; i0 += x_block_rows) {
      const int64_t i1 = std::min(p.m, i0 + x_block_rows);
      for (j = j_first; j + kRows <= j1; j += kRows) small_batch_rows<kRows, false>(p, decode, j, i0, i1);
      for (; j < j1; ++j) small_batch_rows<1, false>(p, decode, j, i0, i1);
    }
  });
}

// Every row of x copied with each block's columns in Decoder::column order, zero past k.
template <typename Decoder>
std::vector<float> reorder_x(const SmallBatch& p) {
  constexpr int64_t kCodes = Decoder::kCodes;
  std::vector<float> out(p.m * p.blocks * kCodes, 0.f);
  int64_t order[kCodes];
  for (int64_t t = 0; t < kCodes; ++t) order[t] = Decoder::column(t);
  for (int64_t i = 0; i < p.m; ++i) {
    const float* src = p.x + i * p.k;
    float* dst = out.data() + i * p.blocks * kCodes;
    for (int64_t b = 0; b < p.blocks; ++b)
      for (int64_t t = 0; t < kCodes; ++t) {
        const int64_t c = b * kCodes + order[t];
        dst[b * kCodes + t] = c < p.k ? src[c] : 0.f;
      }
  }
  return out;
}

template <typename Decoder>
void small_batch(SmallBatch& p) {
  constexpr int64_t kCodes = Decoder::kCodes;
  p.full_blocks = p.k / kCodes;
  p.blocks = (p.k + kCodes - 1) / kCodes;
  p.xs_stride = p.blocks * kCodes;
  const std::vector<float> xs = reorder_x<Decoder>(p);
  p.xs = xs.data();
  small_batch_run<Decoder>(p, p.levels);
}
#endif

// y[m, n] (fp32, alpha and bias applied) for m <= kSmallBatchRows.
void apot_linear_small_batch(const at::Tensor& x2, const at::Tensor& w, int64_t k, int64_t bits,
                             const std::array<float, 256>& levels, const at::Tensor& alpha_f, const float* bias,
                             at::Tensor& y) {
  SmallBatch p{};
  p.w = w.data_ptr<uint8_t>();
  p.row_bytes = w.size(1);
  p.k = k;
  p.n = w.size(0);
  p.m = x2.size(0);
  p.bits = bits;
  p.x = x2.data_ptr<float>();
  p.levels = levels.data();
  p.alpha = alpha_f.data_ptr<float>();
  p.per_row = alpha_f.numel() > 1;
  p.bias = bias;
  p.y = y.data_ptr<float>();
#if defined(BITCOMPILE_APOT_AVX512)
  if (bits <= 4) small_batch<NibbleDecoder>(p);
  else if (bits == 5) small_batch<Byte32Decoder<false>>(p);
  else small_batch<ByteGatherDecoder>(p);
#elif defined(BITCOMPILE_APOT_AVX2)
  if (bits <= 4) small_batch<NibbleDecoder>(p);
  else if (bits == 5) small_batch<Byte32Decoder>(p);
  else small_batch<ByteGatherDecoder>(p);
#else
  // Scalar: decode one weight row at a time and dot it with every x row.
  const int64_t grain = grain_for(k * (p.m + 1), kMinParallelScalarWork);
  at::parallel_for(0, p.n, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> row(k);
    for (int64_t j = begin; j < end; ++j) {
      decode_row(p.w + j * p.row_bytes, k, bits, p.levels, 1.f, row.data());
      for (int64_t i = 0; i < p.m; ++i) p.store(j, i, dot(p.x + i * k, row.data(), k));
    }
  });
#endif
}

at::Tensor apot_linear_cpu(const at::Tensor& x, const at::Tensor& w_packed, int64_t in_features, int64_t bits,
                           const at::Tensor& code_values, const at::Tensor& alpha,
                           const std::optional<at::Tensor>& bias) {
  bitcompile::check_apot_linear("apot_linear", x, w_packed, in_features, bits, code_values, alpha, bias);
  const int64_t k = in_features;
  const int64_t n = w_packed.size(0);
  const auto out_sizes = with_last_dim(x.sizes(), n);
  auto x2 = x.reshape({-1, k}).to(at::kFloat).contiguous();
  const int64_t m = x2.size(0);
  if (m == 0 || n == 0) return at::zeros(out_sizes, x.options());

  auto w = w_packed.contiguous();
  auto alpha_f = bitcompile::as_float_vector(alpha);
  const auto levels = padded_table<float>(code_values);
  auto y = at::empty({m, n}, x2.options());

  if (m <= kSmallBatchRows) {
    auto bias_f = bias.has_value() ? bitcompile::as_float_vector(*bias) : at::Tensor();
    apot_linear_small_batch(x2, w, k, bits, levels, alpha_f, bias.has_value() ? bias_f.data_ptr<float>() : nullptr, y);
  } else {
    // GEMM path: decode blocks of weight rows to fp32 (alpha applied) into one buffer and hand each to BLAS. A block
    // is kDecodeBlockBytes of rows, and at least min(max(M, 256), 512) rows: every product packs all of x again, and
    // 95-row blocks (K = 11008) ran at 0.70-0.83x of fp32 from M = 512. Up to kGemmTransposedMaxRows rows of x BLAS
    // writes y.T's rows for a block (contiguous; y is a transposed copy at the end), past them y's columns through
    // a copy of the block's product. (at::mm_out straight into y's column view took 2-3x as long.)
    const int64_t least_rows = std::min<int64_t>(std::max<int64_t>(m, 256), 512);
    const int64_t block = std::min(n, std::max(kDecodeBlockBytes / (4 * k), least_rows));
    const bool transposed = m <= kGemmTransposedMaxRows;
    auto decoded = at::empty({block, k}, x2.options());
    auto y_t = transposed ? at::empty({n, m}, x2.options()) : at::Tensor();
    for (int64_t n0 = 0; n0 < n; n0 += block) {
      const int64_t rows = std::min(block, n - n0);
      auto part = decoded.narrow(0, 0, rows);
      decode_weight_into(w, n0, rows, k, bits, levels, alpha_f, part);
      if (transposed) {
        auto out_rows = y_t.narrow(0, n0, rows);
        at::mm_out(out_rows, part, x2.t());
      } else if (rows == n) {
        at::mm_out(y, x2, part.t());
      } else {
        y.narrow(1, n0, rows).copy_(at::mm(x2, part.t()));
      }
    }
    if (transposed) y.copy_(y_t.t());
    if (bias.has_value()) y.add_(bitcompile::as_float_vector(*bias));
  }
  return y.to(x.scalar_type()).reshape(out_sizes);
}

// ---------------------------------------------------------------------------------------------
// apot_linear_int: y = x_scale * alpha[n] / denominator * S[m, n] + bias,
// S = sum_k (q[m, k] - z) * N[code[n, k]] = sum_k q * N - z * sum_k N, exact.
// sum_k q * N is accumulated in int32 over chunks short enough never to overflow
// (chunk * 255 * max|N| < 2^31), and the chunks in int64; tables too large for that (max|N| >
// 2^31 / 255) take int64 products. The z term is int64 (wrapping like the int64 reference).
// ---------------------------------------------------------------------------------------------
int64_t centred_sum(const uint8_t* q, const int32_t* numerators, int64_t k, int64_t chunk) {
  int64_t total = 0;
  if (chunk == 0) {
    for (int64_t j = 0; j < k; ++j) total += static_cast<int64_t>(q[j]) * numerators[j];
    return total;
  }
  for (int64_t j0 = 0; j0 < k; j0 += chunk) {
    const int64_t j1 = std::min(k, j0 + chunk);
    int32_t partial = 0;
    for (int64_t j = j0; j < j1; ++j) partial += static_cast<int32_t>(q[j]) * numerators[j];
    total += partial;
  }
  return total;
}

// Longest run of products q * N (q <= 255) whose int32 sum cannot overflow; 0: use int64 products.
int64_t int32_chunk(int64_t max_abs_numerator) {
  const int64_t limit = std::numeric_limits<int32_t>::max();
  const int64_t per_product = 255 * std::max<int64_t>(1, max_abs_numerator);
  return per_product > limit ? 0 : limit / per_product;
}

at::Tensor apot_linear_int_cpu(const at::Tensor& q_x, const at::Tensor& x_scale, const at::Tensor& x_zero_point,
                               const at::Tensor& w_packed, int64_t in_features, int64_t bits,
                               const at::Tensor& code_numerators, double denominator, const at::Tensor& alpha,
                               const std::optional<at::Tensor>& bias) {
  bitcompile::check_apot_linear_int(q_x, x_scale, x_zero_point, w_packed, in_features, bits, code_numerators,
                                    denominator, alpha, bias);

  const int64_t k = in_features;
  const int64_t n = w_packed.size(0);
  const auto out_sizes = with_last_dim(q_x.sizes(), n);
  auto q2 = q_x.reshape({-1, k}).contiguous();
  const int64_t m = q2.size(0);
  auto y = at::empty({m, n}, q_x.options().dtype(at::kFloat));
  if (m == 0 || n == 0) return y.reshape(out_sizes);

  // The zero point as an integer (truncated like the reference's .to(int64)).
  const int64_t zero_point = x_zero_point.reshape({-1}).to(at::kLong).item<int64_t>();
  const double scale = bitcompile::as_float_vector(x_scale).item<float>();
  const auto numerators = padded_table<int32_t>(code_numerators);
  int64_t max_abs = 0;
  for (int32_t v : numerators) max_abs = std::max<int64_t>(max_abs, std::llabs(static_cast<int64_t>(v)));
  const int64_t chunk = int32_chunk(max_abs);

  auto w = w_packed.contiguous();
  auto alpha_f = bitcompile::as_float_vector(alpha);
  auto bias_f = bias.has_value() ? bitcompile::as_float_vector(*bias) : at::Tensor();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const int64_t row_bytes = w.size(1);
  const uint8_t* qp = q2.data_ptr<uint8_t>();
  const float* ap = alpha_f.data_ptr<float>();
  const bool per_row = alpha_f.numel() > 1;
  const float* bp = bias.has_value() ? bias_f.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, n, grain_for(k * (m + 1), kMinParallelScalarWork), [&](int64_t begin, int64_t end) {
    std::vector<int32_t> row(k);
    for (int64_t j = begin; j < end; ++j) {
      decode_row<int32_t>(wp + j * row_bytes, k, bits, numerators.data(), 1, row.data());
      int64_t row_sum = 0;
      for (int64_t t = 0; t < k; ++t) row_sum += row[t];
      const uint64_t z_term = static_cast<uint64_t>(zero_point) * static_cast<uint64_t>(row_sum);
      const double factor = static_cast<double>(ap[per_row ? j : 0]);
      for (int64_t i = 0; i < m; ++i) {
        const int64_t qn = centred_sum(qp + i * k, row.data(), k, chunk);
        const int64_t sum = static_cast<int64_t>(static_cast<uint64_t>(qn) - z_term);
        // The reference's order: sums * x_scale * alpha / denominator + bias, in float64.
        double value = static_cast<double>(sum) * scale * factor / denominator;
        if (bp) value += bp[j];
        yp[i * n + j] = static_cast<float>(value);
      }
    }
  });
  return y.reshape(out_sizes);
}

// ---------------------------------------------------------------------------------------------
// apot_conv2d: y = conv2d(x, alpha * code_values[code]) + bias. The conv is compute-bound: decode
// the (small) weight to x's dtype and let oneDNN / ATen run it; the stored weight stays packed.
// Codes are those of W.permute(0, 2, 3, 1).reshape(OC, KH*KW*C), packed row-wise.
// ---------------------------------------------------------------------------------------------
at::Tensor apot_conv2d_cpu(const at::Tensor& x, const at::Tensor& w_packed, int64_t in_channels,
                           at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                           at::IntArrayRef dilation, int64_t bits, const at::Tensor& code_values,
                           const at::Tensor& alpha, const std::optional<at::Tensor>& bias) {
  const auto g = bitcompile::check_apot_conv2d(x, w_packed, in_channels, kernel_size, stride, padding, dilation,
                                               bits, code_values, alpha, bias);
  const int64_t out_channels = w_packed.size(0);
  const int64_t reduction = in_channels * g.kernel_h * g.kernel_w;

  const auto memory_format = x.suggest_memory_format();
  auto alpha_f = bitcompile::as_float_vector(alpha);
  auto decoded = decode_weight(w_packed.contiguous(), 0, out_channels, reduction, bits,
                               padded_table<float>(code_values), alpha_f);
  auto weight = decoded.view({out_channels, g.kernel_h, g.kernel_w, in_channels})
                    .permute({0, 3, 1, 2})
                    .to(x.scalar_type())
                    .contiguous(memory_format);
  auto y = at::conv2d(x, weight, std::nullopt, stride, padding, dilation, 1);
  if (bias.has_value()) y.add_(bitcompile::as_float_vector(*bias).view({1, -1, 1, 1}));
  return y.contiguous(memory_format);
}

}  // namespace

TORCH_LIBRARY_IMPL(bitcompile, CPU, m) {
  m.impl("pack_codes", &pack_codes_cpu);
  m.impl("apot_linear", &apot_linear_cpu);
  m.impl("apot_linear_int", &apot_linear_int_cpu);
  m.impl("apot_conv2d", &apot_conv2d_cpu);
}

// No gradient, and no Python on the way to the kernel (inference_autograd.h).
TORCH_LIBRARY_IMPL(bitcompile, AutogradCPU, m) {
  bitcompile::register_inference_autograd(m, {"pack_codes", "apot_linear", "apot_linear_int", "apot_conv2d"});
}
