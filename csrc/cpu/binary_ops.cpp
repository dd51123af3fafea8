// CPU kernels of the binary ops (SPEC 2.1-2.4): pack_signs, binary_linear, binary_weight_linear,
// binary_conv2d. Schemas and fake kernels are in bitcompile/ops.py, the Autograd kernel in
// inference_autograd.h; the float64 math these kernels reproduce is in bitcompile/reference.py.
//
// Layout of the work:
// - x is converted to contiguous fp32 rows once (fp16/bf16 convert exactly) and packed here with
//   the stored sign format (bit j of int32 word w = value 32*w + j, 1 for x >= 0, tail bits 0).
// - binary_linear is an XOR/popcount GEMM (binary_gemm). binary_conv2d is the same GEMM done
//   implicitly: the input packed once, one row of C/32 words per pixel, in an image grown by the
//   padding; each output pixel reads its taps at fixed word offsets in w_packed's [KH, KW, C/32]
//   order, with no patch matrix.
// - binary_gemm's rows are padded to an even number of int32 words so its loops run on 64-bit
//   words; the conv's run on 32-bit words, 16 (8) output channels a vector (with AVX2 both operands
//   in nibble planes, so that an XOR indexes the popcount lookup as it stands).
// - torch.sign zeros (sign_zero) use a second bit plane `nonzero`; only rows that have a zero take
//   the masked path. The conv's zero padding reads as -1 and its dots are corrected per pattern of
//   padded taps.
// - binary_gemm's micro-kernel is picked by what the compiler targets (-march=native): with
//   AVX-512 VPOPCNTDQ and M >= 4, a panel kernel with 8 outputs a vector (no horizontal sums);
//   otherwise 4 or 8 words a vector (VPOPCNTDQ, or AVX2 nibble lookups), or POPCNT for short rows.
// - binary_weight_linear looks up, with AVX-512, the signed sums of every 4 values of an x row
//   (a 16-entry table) by the 4 weight bits of 16 output rows at once (vpermps); without it, it
//   expands weight bits to +-1.0 vectors shared by a few x rows and accumulates with FMA, in fp32.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "checks.h"
#include "inference_autograd.h"
#include "weight_memo.h"

// The panel GEMM (binary_gemm_panels) needs VPOPCNTDQ, and DQ/VL for its vector epilogue.
#if defined(__AVX512VPOPCNTDQ__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define BITCOMPILE_AVX512_PANELS 1
#endif

namespace bitcompile {
namespace {

// ------------------------------------------------------------------------------------------------
// Packing
// ------------------------------------------------------------------------------------------------

// The low `count` bits set (count in 1..32): the valid bits of a row's last word.
inline uint32_t low_bits(int64_t count) { return count >= 32 ? 0xFFFFFFFFu : (uint32_t(1) << count) - 1; }

inline int64_t round_up_even(int64_t words) { return words + (words & 1); }

// Bit j of the result = predicate(x[j]) for 32 floats; predicate is x >= 0, or x != 0 for NONZERO.
// NaN gives 0 for x >= 0 and 1 for x != 0, as the scalar comparisons do.
template <bool NONZERO>
inline uint32_t pack32(const float* x) {
#if defined(__AVX512F__)
  const __m512 zero = _mm512_setzero_ps(), low = _mm512_loadu_ps(x), high = _mm512_loadu_ps(x + 16);
  constexpr int predicate = NONZERO ? _CMP_NEQ_UQ : _CMP_GE_OQ;
  return uint32_t(_mm512_cmp_ps_mask(low, zero, predicate)) | uint32_t(_mm512_cmp_ps_mask(high, zero, predicate)) << 16;
#elif defined(__AVX2__)
  const __m256 zero = _mm256_setzero_ps();
  uint32_t bits = 0;
  for (int chunk = 0; chunk < 4; ++chunk) {
    __m256 v = _mm256_loadu_ps(x + 8 * chunk);
    __m256 hit = NONZERO ? _mm256_cmp_ps(v, zero, _CMP_NEQ_UQ) : _mm256_cmp_ps(v, zero, _CMP_GE_OQ);
    bits |= uint32_t(_mm256_movemask_ps(hit)) << (8 * chunk);
  }
  return bits;
#else
  uint32_t bits = 0;
  for (int j = 0; j < 32; ++j) bits |= uint32_t(NONZERO ? x[j] != 0.0f : x[j] >= 0.0f) << j;
  return bits;
#endif
}

// One row of k floats into packed_words(k) words; the tail bits of the last word stay 0.
template <bool NONZERO>
inline void pack_row(const float* x, int64_t k, uint32_t* out) {
  const int64_t full = k / 32;
  for (int64_t w = 0; w < full; ++w) out[w] = pack32<NONZERO>(x + 32 * w);
  if (k % 32) {
    uint32_t bits = 0;
    for (int64_t j = 0; j < k % 32; ++j) {
      float v = x[32 * full + j];
      bits |= uint32_t(NONZERO ? v != 0.0f : v >= 0.0f) << j;
    }
    out[full] = bits;
  }
}

// The words of an int32 tensor as uint32 (nullptr for an undefined tensor).
inline const uint32_t* words_of(const at::Tensor& t) {
  return t.defined() ? reinterpret_cast<const uint32_t*>(t.data_ptr<int32_t>()) : nullptr;
}

inline int32_t popcount_words(const uint32_t* words, int64_t count) {
  int32_t total = 0;
  for (int64_t w = 0; w < count; ++w) total += __builtin_popcount(words[w]);
  return total;
}

// Packed rows of a float matrix [R, K]: sign bits, and with `with_nonzero` the x != 0 plane, the
// number of nonzeros per row and a per-row "has a zero" flag. Row stride `stride32` int32 words.
struct PackedRows {
  at::Tensor bits;           // int32 [R, stride32]
  at::Tensor nonzero;        // int32 [R, stride32] or undefined
  at::Tensor nonzero_count;  // int32 [R] or undefined
  at::Tensor has_zero;       // uint8 [R] or undefined
};

// Storage of PackedRows for `rows` rows of `stride32` words; zeroed when the packer ORs bits in
// (or leaves padding words beyond the packed ones).
PackedRows allocate_packed_rows(int64_t rows, int64_t stride32, bool with_nonzero, const at::TensorOptions& options,
                                bool zeroed) {
  const auto int_options = options.dtype(at::kInt);
  const auto words = [&](std::initializer_list<int64_t> size) {
    return zeroed ? at::zeros(size, int_options) : at::empty(size, int_options);
  };
  PackedRows packed;
  packed.bits = words({rows, stride32});
  if (with_nonzero) {
    packed.nonzero = words({rows, stride32});
    packed.nonzero_count = at::empty({rows}, int_options);
    packed.has_zero = at::empty({rows}, options.dtype(at::kByte));
  }
  return packed;
}

// One row of k floats: its signs into `bits` and, with `nonzero` (sign_zero), its x != 0 plane, how many values are
// nonzero and whether one is zero.
inline void pack_row_planes(const float* x, int64_t k, uint32_t* bits, uint32_t* nonzero, int32_t* nonzero_count,
                            uint8_t* has_zero) {
  pack_row<false>(x, k, bits);
  if (!nonzero) return;
  pack_row<true>(x, k, nonzero);
  *nonzero_count = popcount_words(nonzero, packed_words(k));
  *has_zero = *nonzero_count != k;
}

PackedRows pack_rows(const at::Tensor& rows, int64_t stride32, bool with_nonzero) {
  const int64_t r = rows.size(0), k = rows.size(1);
  PackedRows packed = allocate_packed_rows(r, stride32, with_nonzero, rows.options(), /*zeroed=*/true);
  const float* x = rows.data_ptr<float>();
  auto* bits = reinterpret_cast<uint32_t*>(packed.bits.data_ptr<int32_t>());
  auto* nonzero = with_nonzero ? reinterpret_cast<uint32_t*>(packed.nonzero.data_ptr<int32_t>()) : nullptr;
  int32_t* nonzero_count = with_nonzero ? packed.nonzero_count.data_ptr<int32_t>() : nullptr;
  uint8_t* has_zero = with_nonzero ? packed.has_zero.data_ptr<uint8_t>() : nullptr;
  at::parallel_for(0, r, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      if (with_nonzero)
        pack_row_planes(x + i * k, k, bits + i * stride32, nonzero + i * stride32, nonzero_count + i, has_zero + i);
      else
        pack_row_planes(x + i * k, k, bits + i * stride32, nullptr, nullptr, nullptr);
  });
  return packed;
}

// The same packing (one row per pixel, packed along the channels) read straight from an NCHW
// fp32 tensor, without transposing the floats: a channel plane is read contiguously and its
// signs OR-ed into the words of 64 pixels at a time (the compiler vectorizes over pixels).
PackedRows pack_pixels_nchw(const at::Tensor& x, bool with_nonzero) {
  const int64_t batch = x.size(0), channels = x.size(1), pixels = x.size(2) * x.size(3);
  const int64_t words = packed_words(channels), rows = batch * pixels;
  constexpr int64_t kChunk = 64;
  const int64_t chunks = (pixels + kChunk - 1) / kChunk;
  PackedRows packed = allocate_packed_rows(rows, words, with_nonzero, x.options(), /*zeroed=*/false);
  const float* data = x.data_ptr<float>();
  auto* bits = reinterpret_cast<uint32_t*>(packed.bits.data_ptr<int32_t>());
  auto* nonzero = with_nonzero ? reinterpret_cast<uint32_t*>(packed.nonzero.data_ptr<int32_t>()) : nullptr;
  int32_t* nonzero_count = with_nonzero ? packed.nonzero_count.data_ptr<int32_t>() : nullptr;
  uint8_t* has_zero = with_nonzero ? packed.has_zero.data_ptr<uint8_t>() : nullptr;
  at::parallel_for(0, batch * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / chunks, first = (task % chunks) * kChunk, count = std::min(kChunk, pixels - first);
      for (int64_t w = 0; w < words; ++w) {
        uint32_t sign_word[kChunk] = {}, nonzero_word[kChunk] = {};
        for (int64_t c = 32 * w; c < std::min(channels, 32 * w + 32); ++c) {
          const float* plane = data + (b * channels + c) * pixels + first;
          const int shift = int(c % 32);
          for (int64_t p = 0; p < count; ++p) sign_word[p] |= uint32_t(plane[p] >= 0.0f) << shift;
          if (with_nonzero)
            for (int64_t p = 0; p < count; ++p) nonzero_word[p] |= uint32_t(plane[p] != 0.0f) << shift;
        }
        const int64_t row0 = b * pixels + first;
        for (int64_t p = 0; p < count; ++p) bits[(row0 + p) * words + w] = sign_word[p];
        if (with_nonzero)
          for (int64_t p = 0; p < count; ++p) nonzero[(row0 + p) * words + w] = nonzero_word[p];
      }
      for (int64_t p = 0; with_nonzero && p < count; ++p) {
        const int64_t row = b * pixels + first + p;
        const int32_t ones = popcount_words(nonzero + row * words, words);
        nonzero_count[row] = ones;
        has_zero[row] = ones != channels;
      }
    }
  });
  return packed;
}

// x [..., K] (any float dtype, any strides) as contiguous fp32 [M, K].
at::Tensor float_rows(const at::Tensor& x, int64_t k) { return x.reshape({-1, k}).to(at::kFloat).contiguous(); }

// w_packed [N, W] as contiguous int32 rows of an even stride (zero word appended when W is odd),
// 8-byte aligned, so that rows read as 64-bit words. Each row is made of groups of `group_words`
// words (one group for a linear, one per tap for a conv) holding `group_values` signs: the bits
// past them are 0 when pack_signs made the weight, and they never contribute (the reference
// ignores them), so a weight with stray tail bits is cleaned in a copy.
at::Tensor weight_rows(const at::Tensor& w_packed2d, int64_t group_words, int64_t group_values) {
  const int64_t n = w_packed2d.size(0), words = w_packed2d.size(1);
  at::Tensor w = w_packed2d.contiguous();
  const uint32_t stray = group_values % 32 ? ~low_bits(group_values % 32) : 0;
  const uint32_t* given = words_of(w);
  bool clean = true;
  for (int64_t i = group_words - 1; stray && i < n * words; i += group_words) clean = clean && !(given[i] & stray);
  if (!clean) {
    w = w.clone();
    auto* data = reinterpret_cast<uint32_t*>(w.data_ptr<int32_t>());
    for (int64_t i = group_words - 1; i < n * words; i += group_words) data[i] &= ~stray;
  }
  if (words % 2 == 0 && reinterpret_cast<uintptr_t>(w.data_ptr()) % 8 == 0) return w;
  at::Tensor padded = at::zeros({n, round_up_even(words)}, w.options());
  padded.narrow(1, 0, words).copy_(w);
  return padded;
}

// ------------------------------------------------------------------------------------------------
// Epilogue shared by the linear and conv kernels
// ------------------------------------------------------------------------------------------------

// out = acc [* row_factor[m]] [* scale[n or 0]] [+ bias[n]], in fp32.
struct Epilogue {
  at::Tensor scale_vec, bias_vec;  // keep the fp32 copies alive
  const float* row_factor = nullptr;
  const float* scale = nullptr;
  int64_t scale_stride = 0;  // 0: one scale for all outputs, 1: one per output
  const float* bias = nullptr;

  Epilogue(const std::optional<at::Tensor>& scale_in, const std::optional<at::Tensor>& bias_in) {
    if (scale_in.has_value()) {
      scale_vec = as_float_vector(*scale_in);
      scale = scale_vec.data_ptr<float>();
      scale_stride = scale_vec.numel() > 1 ? 1 : 0;
    }
    if (bias_in.has_value()) {
      bias_vec = as_float_vector(*bias_in);
      bias = bias_vec.data_ptr<float>();
    }
  }

  inline float apply(float acc, int64_t m, int64_t n) const {
    float out = acc;
    if (row_factor) out *= row_factor[m];
    if (scale) out *= scale[n * scale_stride];
    if (bias) out += bias[n];
    return out;
  }
};

// Where output (m, n) of a linear goes: a row-major [M, N] matrix.
struct Output {
  float* data;
  int64_t row_stride;

  static Output matrix(float* data, int64_t n) { return {data, n}; }
  float* row(int64_t m) const { return data + m * row_stride; }
};

// Splits an [M, N] output into blocks and runs fn(m0, m1, n0, n1) on them in parallel, in chunks
// of at least kMinParallelWork units (`work_per_output` units an output; a unit is about one
// 64-bit word-dot of a vector popcount, ~10 us in all): a parallel region waits for its slowest
// thread, and on a busy machine a thread can start a scheduler time slice (ms) late, far longer
// than a small GEMM takes on one thread.
constexpr int64_t kMinParallelWork = int64_t(1) << 18;

// The threads take runs of consecutive blocks, so the order decides their shares. Row by row (a row of blocks
// keeps its x rows in cache), a short last row of blocks is a thread's share of next to nothing: with 2 row blocks
// (M = 33 over 32-row blocks) one thread did all the work, twice the time of M = 32. Where the rows do not split
// evenly and there are fewer than kRowOrderMinRowBlocks row blocks the order is column by column, every column
// holding the short block once (2 threads, 4096 x 11008: binary_weight_linear M = 33 31956 -> 16817 us, against
// 16161 at M = 32; binary_linear 4096^2 M = 65 1299 -> 699). Row by row it stays elsewhere: column by column lost
// 5% at binary_weight_linear M = 1024 (187.0 against 198.3 ms), where the short row is 1/32 of the work.
constexpr int64_t kRowOrderMinRowBlocks = 16;

template <typename Fn>
void for_each_block(int64_t m, int64_t n, int64_t block_m, int64_t block_n, int64_t work_per_output, const Fn& fn) {
  const int64_t blocks_m = (m + block_m - 1) / block_m, blocks_n = (n + block_n - 1) / block_n;
  const int64_t blocks = blocks_m * blocks_n, work = std::max<int64_t>(1, m * n * work_per_output);
  const int64_t grain = std::max<int64_t>(1, (kMinParallelWork * blocks + work - 1) / work);
  const bool by_rows = m % block_m == 0 || blocks_m >= kRowOrderMinRowBlocks;
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t row = by_rows ? block / blocks_n : block % blocks_m;
      const int64_t column = by_rows ? block % blocks_n : block / blocks_m;
      const int64_t m0 = row * block_m, n0 = column * block_n;
      fn(m0, std::min(m, m0 + block_m), n0, std::min(n, n0 + block_n));
    }
  });
}

// Runs tile<R, C>(m, n) over [m0, m1) x [n0, n1): full ROWS x COLS tiles, single rows/columns at the edges.
template <int ROWS, int COLS, typename Tile>
inline void tile_block(int64_t m0, int64_t m1, int64_t n0, int64_t n1, const Tile& tile) {
  for (int64_t m = m0; m < m1;) {
    const bool full_m = m1 - m >= ROWS;
    for (int64_t n = n0; n < n1;) {
      const bool full_n = n1 - n >= COLS;
      if (full_m && full_n) tile.template run<ROWS, COLS>(m, n);
      else if (full_m) tile.template run<ROWS, 1>(m, n);
      else if (full_n) tile.template run<1, COLS>(m, n);
      else tile.template run<1, 1>(m, n);
      n += full_n ? COLS : 1;
    }
    m += full_m ? ROWS : 1;
  }
}

// ------------------------------------------------------------------------------------------------
// XOR/popcount GEMM: count[i][j] = sum_w popcount((a_i[w] ^ b_j[w]) [& nz_i[w]]) over 64-bit words
// ------------------------------------------------------------------------------------------------
// Micro-kernels with one interface: POPCNT on 64-bit words (any x86-64 build), and a vector one,
// AVX-512 VPOPCNTDQ on 8 words at a time or AVX2 nibble lookups on 4, where the compiler targets
// them. The vector ones pay a horizontal sum per output, so short rows go to the scalar one.
struct ScalarPopcount {
  static constexpr int kRows = 2, kCols = 4;  // 8 accumulators + 6 operands fit the 16 GPRs

  template <int MR, int NR, bool MASKED>
  static inline void tile(const uint64_t* const* a, const uint64_t* const* nz, const uint64_t* const* b,
                          int64_t words, int64_t (&count)[MR][NR]) {
    int64_t acc[MR][NR] = {};
    for (int64_t w = 0; w < words; ++w) {
      uint64_t bv[NR];
      for (int j = 0; j < NR; ++j) bv[j] = b[j][w];
      for (int i = 0; i < MR; ++i) {
        const uint64_t av = a[i][w], mask = MASKED ? nz[i][w] : ~uint64_t(0);
        for (int j = 0; j < NR; ++j) acc[i][j] += __builtin_popcountll((av ^ bv[j]) & mask);
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) count[i][j] = acc[i][j];
  }
};

#ifdef __AVX512VPOPCNTDQ__
constexpr int64_t kVectorPopcountMinWords = 16;

struct VectorPopcount {
  static constexpr int kRows = 4, kCols = 4;  // 16 zmm accumulators of 32

  template <int MR, int NR, bool MASKED>
  static inline void tile(const uint64_t* const* a, const uint64_t* const* nz, const uint64_t* const* b,
                          int64_t words, int64_t (&count)[MR][NR]) {
    __m512i acc[MR][NR];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_si512();
    // 8 words a step; the last step loads only the words left (masked loads read nothing beyond).
    for (int64_t w = 0; w < words; w += 8) {
      const __mmask8 lanes = words - w >= 8 ? __mmask8(0xFF) : __mmask8((1u << (words - w)) - 1);
      __m512i bv[NR];
      for (int j = 0; j < NR; ++j) bv[j] = _mm512_maskz_loadu_epi64(lanes, b[j] + w);
      for (int i = 0; i < MR; ++i) {
        const __m512i av = _mm512_maskz_loadu_epi64(lanes, a[i] + w);
        const __m512i mask = MASKED ? _mm512_maskz_loadu_epi64(lanes, nz[i] + w) : _mm512_setzero_si512();
        for (int j = 0; j < NR; ++j) {
          __m512i diff = _mm512_xor_si512(av, bv[j]);
          if (MASKED) diff = _mm512_and_si512(diff, mask);
          acc[i][j] = _mm512_add_epi64(acc[i][j], _mm512_popcnt_epi64(diff));
        }
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) count[i][j] = _mm512_reduce_add_epi64(acc[i][j]);
  }
};
#endif

#if defined(__AVX2__) && !defined(__AVX512VPOPCNTDQ__)
constexpr int64_t kVectorPopcountMinWords = 8;

// AVX2 has no vector popcount: each byte's count is the sum of two 16-entry nibble lookups
// (vpshufb), byte counts add up for up to 31 steps of 4 words (8 a step, 248 < 256) and are then
// widened to 64-bit lanes (vpsadbw). About 2 vector ops a word-dot, against 3 for POPCNT.
struct VectorPopcount {
  static constexpr int kRows = 2, kCols = 3;  // 6 byte accumulators + operands of 16 ymm

  static inline __m256i byte_popcount(__m256i v, __m256i nibble_counts, __m256i low_nibble) {
    const __m256i low = _mm256_and_si256(v, low_nibble);
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(v, 4), low_nibble);
    return _mm256_add_epi8(_mm256_shuffle_epi8(nibble_counts, low), _mm256_shuffle_epi8(nibble_counts, high));
  }

  template <int MR, int NR, bool MASKED>
  static inline void tile(const uint64_t* const* a, const uint64_t* const* nz, const uint64_t* const* b,
                          int64_t words, int64_t (&count)[MR][NR]) {
    const __m256i nibble_counts =
        _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4);
    const __m256i low_nibble = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
    const int64_t vector_words = words / 4 * 4;
    __m256i total[MR][NR];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) total[i][j] = zero;
    for (int64_t start = 0; start < vector_words; start += 4 * 31) {
      const int64_t stop = std::min(vector_words, start + 4 * 31);
      __m256i bytes[MR][NR];
      for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j) bytes[i][j] = zero;
      for (int64_t w = start; w < stop; w += 4) {
        __m256i bv[NR];
        for (int j = 0; j < NR; ++j) bv[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[j] + w));
        for (int i = 0; i < MR; ++i) {
          const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i] + w));
          const __m256i mask = MASKED ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(nz[i] + w)) : zero;
          for (int j = 0; j < NR; ++j) {
            __m256i diff = _mm256_xor_si256(av, bv[j]);
            if (MASKED) diff = _mm256_and_si256(diff, mask);
            bytes[i][j] = _mm256_add_epi8(bytes[i][j], byte_popcount(diff, nibble_counts, low_nibble));
          }
        }
      }
      for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j) total[i][j] = _mm256_add_epi64(total[i][j], _mm256_sad_epu8(bytes[i][j], zero));
    }
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) {
        alignas(32) int64_t lanes[4];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total[i][j]);
        int64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
        for (int64_t w = vector_words; w < words; ++w)  // the last 0-3 words
          sum += __builtin_popcountll((a[i][w] ^ b[j][w]) & (MASKED ? nz[i][w] : ~uint64_t(0)));
        count[i][j] = sum;
      }
  }
};
#endif

// The A side of binary_gemm: packed rows with an even word stride, and (when some row has zeros
// that must count 0) the nonzero plane with its per-row counts and flags.
struct BitMatrix {
  const uint64_t* bits;
  const uint64_t* nonzero = nullptr;  // null: no row is masked
  const int32_t* nonzero_count = nullptr;
  const uint8_t* masked = nullptr;
  int64_t words64;  // row stride and length in 64-bit words
  int64_t valid;    // number of real values a row holds (K, or taps * C for the conv)
};

template <typename Kernel>
struct BinaryGemmTile {
  const BitMatrix& a;
  const uint64_t* b;
  const Epilogue& epilogue;
  const Output& out;

  template <int MR, int NR>
  void run(int64_t m0, int64_t n0) const {
    const uint64_t *a_rows[MR], *nz_rows[MR], *b_rows[NR];
    bool masked = false;
    for (int i = 0; i < MR; ++i) {
      a_rows[i] = a.bits + (m0 + i) * a.words64;
      nz_rows[i] = a.nonzero ? a.nonzero + (m0 + i) * a.words64 : nullptr;
      masked = masked || (a.masked && a.masked[m0 + i]);
    }
    for (int j = 0; j < NR; ++j) b_rows[j] = b + (n0 + j) * a.words64;
    int64_t count[MR][NR];
    if (masked) Kernel::template tile<MR, NR, true>(a_rows, nz_rows, b_rows, a.words64, count);
    else Kernel::template tile<MR, NR, false>(a_rows, nz_rows, b_rows, a.words64, count);
    for (int i = 0; i < MR; ++i) {
      // Standard row: dot = K - 2 popc(a ^ b). Masked: dot = popc(nz) - 2 popc((a ^ b) & nz); for
      // a tile mixing both kinds, nz of a row without zeros is all valid bits, so both agree.
      const int64_t ones = masked ? a.nonzero_count[m0 + i] : a.valid;
      float* row = out.row(m0 + i);
      for (int j = 0; j < NR; ++j) {
        const int64_t dot = ones - 2 * count[i][j];
        row[n0 + j] = epilogue.apply(float(dot), m0 + i, n0 + j);
      }
    }
  }
};

template <typename Kernel>
void binary_gemm_with(const BitMatrix& a, int64_t m, const uint64_t* b, int64_t n, const Epilogue& epilogue,
                      const Output& out) {
  const BinaryGemmTile<Kernel> tile{a, b, epilogue, out};
  for_each_block(m, n, 64, 64, a.words64, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    tile_block<Kernel::kRows, Kernel::kCols>(m0, m1, n0, n1, tile);
  });
}

#ifdef BITCOMPILE_AVX512_PANELS
// d[j] = word j of rows r[0..7] (an 8 x 8 transpose of 64-bit words: 24 shuffles).
inline void transpose_8x8(const __m512i (&r)[8], __m512i (&d)[8]) {
  __m512i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm512_unpacklo_epi64(r[i], r[i + 1]);      // words 0, 2, 4, 6 of rows i, i + 1
    t[i + 1] = _mm512_unpackhi_epi64(r[i], r[i + 1]);  // words 1, 3, 5, 7
  }
  for (int h = 0; h < 8; h += 4) {  // rows h .. h + 3
    u[h] = _mm512_shuffle_i64x2(t[h], t[h + 2], 0x88);          // words 0, 4
    u[h + 1] = _mm512_shuffle_i64x2(t[h], t[h + 2], 0xdd);      // words 2, 6
    u[h + 2] = _mm512_shuffle_i64x2(t[h + 1], t[h + 3], 0x88);  // words 1, 5
    u[h + 3] = _mm512_shuffle_i64x2(t[h + 1], t[h + 3], 0xdd);  // words 3, 7
  }
  d[0] = _mm512_shuffle_i64x2(u[0], u[4], 0x88);
  d[4] = _mm512_shuffle_i64x2(u[0], u[4], 0xdd);
  d[2] = _mm512_shuffle_i64x2(u[1], u[5], 0x88);
  d[6] = _mm512_shuffle_i64x2(u[1], u[5], 0xdd);
  d[1] = _mm512_shuffle_i64x2(u[2], u[6], 0x88);
  d[5] = _mm512_shuffle_i64x2(u[2], u[6], 0xdd);
  d[3] = _mm512_shuffle_i64x2(u[3], u[7], 0x88);
  d[7] = _mm512_shuffle_i64x2(u[3], u[7], 0xdd);
}

// For many rows of x, B is re-laid in panels of 8 rows interleaved word by word,
// panel[p][w][lane] = b[8p + lane][w] (0 past N): one 512-bit load holds word w of 8 outputs, the
// popcounts add up per lane, and no output pays a horizontal sum.
at::Tensor interleave_panels(const uint64_t* b, int64_t n, int64_t words) {
  const int64_t panels = (n + 7) / 8;
  at::Tensor out = at::empty({panels * words * 8}, at::TensorOptions().dtype(at::kLong));
  auto* dst = reinterpret_cast<uint64_t*>(out.data_ptr<int64_t>());
  // By 8 x 8 blocks transposed in registers (rows past N read as zeros); chunks of 2^16 words a thread.
  at::parallel_for(0, panels, std::max<int64_t>(1, kMinParallelWork / 4 / (8 * words)), [&](int64_t begin,
                                                                                           int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t w0 = 0; w0 < words; w0 += 8) {
        const int64_t count = std::min<int64_t>(8, words - w0);
        const __mmask8 inside = __mmask8((1u << count) - 1);
        __m512i rows[8], columns[8];
        for (int i = 0; i < 8; ++i)
          rows[i] = 8 * p + i < n ? _mm512_maskz_loadu_epi64(inside, b + (8 * p + i) * words + w0)
                                  : _mm512_setzero_si512();
        transpose_8x8(rows, columns);
        for (int64_t j = 0; j < count; ++j) _mm512_storeu_si512(dst + (p * words + w0 + j) * 8, columns[j]);
      }
  });
  return out;
}

struct PanelGemmTile {
  static constexpr int kRows = 4, kPanels = 4;  // 16 zmm accumulators: 4 rows x 32 outputs

  const BitMatrix& a;
  const uint64_t* panels;
  const Epilogue& epilogue;
  const Output& out;
  int64_t n;

  template <int MR, int NP>
  void run(int64_t m0, int64_t p0) const {
    bool masked = false;
    for (int i = 0; i < MR; ++i) masked = masked || (a.masked && a.masked[m0 + i]);
    if (masked) compute<MR, NP, true>(m0, p0);
    else compute<MR, NP, false>(m0, p0);
  }

  template <int MR, int NP, bool MASKED>
  void compute(int64_t m0, int64_t p0) const {
    const int64_t words = a.words64;
    const uint64_t *a_rows[MR], *nz_rows[MR], *panel[NP];
    for (int i = 0; i < MR; ++i) {
      a_rows[i] = a.bits + (m0 + i) * words;
      nz_rows[i] = MASKED ? a.nonzero + (m0 + i) * words : nullptr;
    }
    for (int q = 0; q < NP; ++q) panel[q] = panels + (p0 + q) * words * 8;
    __m512i acc[MR][NP];
    for (int i = 0; i < MR; ++i)
      for (int q = 0; q < NP; ++q) acc[i][q] = _mm512_setzero_si512();
    for (int64_t w = 0; w < words; ++w) {
      __m512i bv[NP];
      for (int q = 0; q < NP; ++q) bv[q] = _mm512_loadu_si512(panel[q] + 8 * w);
      for (int i = 0; i < MR; ++i) {
        const __m512i av = _mm512_set1_epi64(int64_t(a_rows[i][w]));
        const __m512i mask = MASKED ? _mm512_set1_epi64(int64_t(nz_rows[i][w])) : _mm512_setzero_si512();
        for (int q = 0; q < NP; ++q) {
          __m512i diff = _mm512_xor_si512(av, bv[q]);
          if (MASKED) diff = _mm512_and_si512(diff, mask);
          acc[i][q] = _mm512_add_epi64(acc[i][q], _mm512_popcnt_epi64(diff));
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      // dot = K - 2 popc(a ^ b), or popc(nz) - 2 popc((a ^ b) & nz) (see BinaryGemmTile)
      const int64_t ones = MASKED ? a.nonzero_count[m0 + i] : a.valid;
      for (int q = 0; q < NP; ++q) {
        const int64_t col = 8 * (p0 + q);
        const __mmask8 lanes = n - col >= 8 ? __mmask8(0xFF) : __mmask8((1u << (n - col)) - 1);
        store8(m0 + i, col, lanes, _mm512_sub_epi64(_mm512_set1_epi64(ones), _mm512_slli_epi64(acc[i][q], 1)));
      }
    }
  }

  // Epilogue::apply on 8 outputs (m, col .. col + 7) at once, lanes past N masked off; with small
  // K the per-output epilogue would otherwise cost more than the popcounts.
  void store8(int64_t m, int64_t col, __mmask8 lanes, __m512i dot) const {
    __m256 value = _mm512_cvtepi64_ps(dot);
    if (epilogue.row_factor) value = _mm256_mul_ps(value, _mm256_set1_ps(epilogue.row_factor[m]));
    if (epilogue.scale)
      value = _mm256_mul_ps(value, epilogue.scale_stride ? _mm256_maskz_loadu_ps(lanes, epilogue.scale + col)
                                                          : _mm256_set1_ps(epilogue.scale[0]));
    if (epilogue.bias) value = _mm256_add_ps(value, _mm256_maskz_loadu_ps(lanes, epilogue.bias + col));
    _mm256_mask_storeu_ps(out.row(m) + col, lanes, value);
  }
};

void binary_gemm_panels(const BitMatrix& a, int64_t m, const uint64_t* b, int64_t n, const Epilogue& epilogue,
                        const Output& out) {
  const at::Tensor panels = interleave_panels(b, n, a.words64);
  const PanelGemmTile tile{a, reinterpret_cast<const uint64_t*>(panels.data_ptr<int64_t>()), epilogue, out, n};
  // Blocks of 64 rows x 8 panels (64 outputs).
  for_each_block(m, (n + 7) / 8, 64, 8, 8 * a.words64, [&](int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
    tile_block<PanelGemmTile::kRows, PanelGemmTile::kPanels>(m0, m1, p0, p1, tile);
  });
}
#endif

// out(m, n) = epilogue(dot(s(a_m), s(b_n))), b: N rows of a.words64 64-bit words.
void binary_gemm(const BitMatrix& a, int64_t m, const uint64_t* b, int64_t n, const Epilogue& epilogue,
                 const Output& out) {
#ifdef BITCOMPILE_AVX512_PANELS
  // Re-laying B (8 x 8 register transposes) pays from 20 rows: the panels against the row kernel at M = 20, 2
  // threads (2-core Intel VM, 2026-12-05) 1.21x at N = K = 4096, 1.18x at 2048, 0.99x at N = 1024 K = 4096; at 16
  // rows 0.78-1.09x, at 24 1.05-1.35x. (Re-laid word by word, as before, M = 24 at 4096^2 took 690-764 us, now ~500.)
  if (m >= 20) return binary_gemm_panels(a, m, b, n, epilogue, out);
#endif
#if defined(__AVX512VPOPCNTDQ__) || defined(__AVX2__)
  if (a.words64 >= kVectorPopcountMinWords) return binary_gemm_with<VectorPopcount>(a, m, b, n, epilogue, out);
#endif
  binary_gemm_with<ScalarPopcount>(a, m, b, n, epilogue, out);
}

BitMatrix bit_matrix(const PackedRows& rows, int64_t valid) {
  BitMatrix a;
  a.bits = reinterpret_cast<const uint64_t*>(rows.bits.data_ptr<int32_t>());
  a.words64 = rows.bits.size(1) / 2;
  a.valid = valid;
  if (rows.nonzero.defined()) {
    a.nonzero = reinterpret_cast<const uint64_t*>(rows.nonzero.data_ptr<int32_t>());
    a.nonzero_count = rows.nonzero_count.data_ptr<int32_t>();
    a.masked = rows.has_zero.data_ptr<uint8_t>();
  }
  return a;
}

// ------------------------------------------------------------------------------------------------
// Sign-weight dot: acc[i][j] = sum_k x_i[k] * (bit k of w_j ? +1 : -1), fp32, x zero padded to 32
// ------------------------------------------------------------------------------------------------
#if defined(__AVX512F__)
// With AVX-512, by table lookups, 16 weight rows a vector. For every 4 values v0..v3 of an x row (a group), the
// 16 sums
//   table[c] = ((c & 1 ? v0 : -v0) + (c & 2 ? v1 : -v1)) + ((c & 4 ? v2 : -v2) + (c & 8 ? v3 : -v3))
// fill one zmm (two roundings a sum, as any fp32 order has). A weight row's 4 bits of the group, a nibble, pick its
// signed sum: vpermps looks up 16 weight rows at once, their nibbles in the 16 lanes of an index vector. That is 64
// multiply-adds a lookup and an add, against 16 a FMA where the bits are expanded to +-1.0 (the kernel without
// AVX-512, below, which this one replaced). The lanes need word w of 16 weight rows: a 16 x 16 transpose of the
// rows' words, a block of 16 words at a time. vpermps bounds it (~0.5 a cycle on Zen 4). The op on the 2-core
// Zen 4 CI machine, against the FMA kernel in the same process: 4096^2 M = 1 289 -> 126 us, M = 16 2902 -> 1542,
// M = 512 93.3 -> 46.8 ms; 1.7-2.5x at every M and decode shape measured (2048^2 to 11008 x 4096).
constexpr int kLutCols = 16;   // weight rows (outputs) a vector, one a lane
constexpr int kLutWords = 16;  // weight words a transposed block
constexpr int kLutRows = 4;    // x rows a tile: they share the block's transposed words and index shifts (a
                                // remainder of 2-3 rows: a 2-row tile, then 1)
constexpr int64_t kLutTableFloats = 128;  // table floats a weight word: 8 groups of 16
// Tables of at most this many bytes are built at a time (16 bytes a value of x: 64 KiB a row at K = 4096).
constexpr int64_t kLutTableChunkBytes = int64_t(4) << 20;

// The tables of one x row of `words` words (32 * words values, zero padded): 8 * words groups of 16 floats.
inline void build_sign_tables(const float* x, int64_t words, float* tables) {
  // lane c: +1 where bit b of c is set, else -1
  const __m512 s0 = _mm512_setr_ps(-1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1);
  const __m512 s1 = _mm512_setr_ps(-1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1);
  const __m512 s2 = _mm512_setr_ps(-1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1);
  const __m512 s3 = _mm512_setr_ps(-1, -1, -1, -1, -1, -1, -1, -1, 1, 1, 1, 1, 1, 1, 1, 1);
  for (int64_t group = 0; group < 8 * words; ++group) {
    const float* v = x + 4 * group;
    const __m512 p01 = _mm512_fmadd_ps(s1, _mm512_set1_ps(v[1]), _mm512_mul_ps(s0, _mm512_set1_ps(v[0])));
    const __m512 p23 = _mm512_fmadd_ps(s3, _mm512_set1_ps(v[3]), _mm512_mul_ps(s2, _mm512_set1_ps(v[2])));
    _mm512_storeu_ps(tables + 16 * group, _mm512_add_ps(p01, p23));
  }
}

// r[j] = 16 words of weight row j  ->  r[q] lane j = word q of row j.
inline void transpose_16x16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {  // 128-bit blocks: rows 4 b .. 4 b + 3 of block b
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
  }
}

// acc[i] lane j += the dot of one weight word (lane j: 32 signs of weight row j) with the 32 values of x row i whose
// tables start at tables[i] + offset: 8 lookups, one a nibble.
// The nibbles go in pairs, even into acc[i][0] and odd into acc[i][1]: with one nibble a trip, acc[i][nibble & 1]
// is an index gcc 12 did not resolve (it left the loop rolled), and the accumulators lived on the stack, a load and
// a store around every add. The op on 2 threads of this Xeon (AVX-512), against the build before in another
// process, interleaved: 4096^2 M = 4 787-935 -> 401-513 us, M = 256 50.7-59.6 -> 29.7-33.1 ms, M = 1024 185-187 ->
// 122 ms (0.70x -> 1.09-1.24x fp32 F.linear); binary_weight_conv2d B = 8 C = 128 28x28 11.2-12.8 -> 6.3-6.8 ms.
template <int MR>
inline void lut_word(__m512i word, const float* const* tables, int64_t offset, __m512 (&acc)[MR][2]) {
  for (int nibble = 0; nibble < 8; nibble += 2) {
    // vpermps reads the low 4 bits of each lane
    const __m512i even = _mm512_srli_epi32(word, 4 * nibble), odd = _mm512_srli_epi32(word, 4 * nibble + 4);
    for (int i = 0; i < MR; ++i) {
      const float* table = tables[i] + offset + 16 * nibble;
      acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_permutexvar_ps(even, _mm512_loadu_ps(table)));
      acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_permutexvar_ps(odd, _mm512_loadu_ps(table + 16)));
    }
  }
}

// acc[i] lane j += sum over `count` words (from the block's first) of row j's signs times x row i, by lookups.
template <int MR, int COUNT>
inline void lut_words(const __m512i (&r)[16], const float* const* tables, int count, __m512 (&acc)[MR][2]) {
  const int words = COUNT ? COUNT : count;
  for (int q = 0; q < words; ++q) lut_word<MR>(r[q], tables, kLutTableFloats * q, acc);
}

// out[i][j] = dot of x row i (its tables) and the signs of weight row n0 + j, j < cols (lanes past cols: unused).
// `next`: the next tile's weight rows, `next_lines` cache lines of them, prefetched on the way.
template <int MR>
inline void lut_tile(const float* const* tables, const uint32_t* w, int64_t words, int64_t n0, int64_t cols,
                     const char* next, int64_t next_lines, float (*out)[kLutCols]) {
  __m512 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  const float* block_tables[MR];
  for (int64_t w0 = 0; w0 < words; w0 += kLutWords) {
    const int count = int(std::min<int64_t>(kLutWords, words - w0));
    const __mmask16 present = count == kLutWords ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
    // The next tile's rows (contiguous, up to `words` lines), a line a word of this block: a tile's 16 rows are 16
    // streams of a few lines each (K = 4096: 8), which the hardware prefetchers did not keep up with. Weights not in
    // cache (copies of 96 MB cycled), M = 1, us: 2048^2 79.7 -> 49.7, 4096^2 284.4 -> 154.8, 4096 x 11008 477.1 ->
    // 379.6; M = 4 4096^2 587.0 -> 512.8; in cache unchanged.
    for (int64_t line = w0; line < std::min<int64_t>(w0 + count, next_lines); ++line)
      _mm_prefetch(next + 64 * line, _MM_HINT_T0);
    __m512i r[16];
    for (int j = 0; j < kLutCols; ++j)
      r[j] = j < cols ? _mm512_maskz_loadu_epi32(present, w + (n0 + j) * words + w0) : _mm512_setzero_si512();
    transpose_16x16(r);
    for (int i = 0; i < MR; ++i) block_tables[i] = tables[i] + kLutTableFloats * w0;
    if (count == kLutWords) lut_words<MR, kLutWords>(r, block_tables, count, acc);
    else lut_words<MR, 0>(r, block_tables, count, acc);
  }
  for (int i = 0; i < MR; ++i) _mm512_storeu_ps(out[i], _mm512_add_ps(acc[i][0], acc[i][1]));
}

// out = epilogue(x [m, 32 * words] (zero padded) @ s(w [n, words]).T).
void sign_lut_linear(const float* x, int64_t m, const uint32_t* w, int64_t n, int64_t words, const Epilogue& epilogue,
                     const Output& output) {
  const int64_t row_floats = kLutTableFloats * words;
  const int64_t chunk = std::max<int64_t>(kLutRows, kLutTableChunkBytes / (4 * row_floats) / kLutRows * kLutRows);
  const at::Tensor tables = at::empty({std::min(m, chunk), row_floats}, at::TensorOptions().dtype(at::kFloat));
  float* const table_data = tables.data_ptr<float>();
  for (int64_t c0 = 0; c0 < m; c0 += chunk) {
    const int64_t rows = std::min(chunk, m - c0);
    at::parallel_for(0, rows, std::max<int64_t>(1, 2048 / words), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        build_sign_tables(x + (c0 + i) * 32 * words, words, table_data + i * row_floats);
    });
    // A weight word costs 32 multiply-adds, about 10 word-dots of the popcount kernels (~1 cycle a core). With 6,
    // 1024^2 M = 1 stayed on one thread: 18.4 -> 14.0 us at 10; 16 split 256 x 1024 M = 4 too early (17.0 -> 19.7).
    for_each_block(rows, n, 16, 64, 10 * words, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
      for (int64_t i = m0; i < m1;) {
        const int64_t tile_rows = m1 - i >= kLutRows ? kLutRows : m1 - i >= 2 ? 2 : 1;
        for (int64_t col = n0; col < n1; col += kLutCols) {
          const int64_t cols = std::min<int64_t>(kLutCols, n1 - col);
          const int64_t next_rows = std::min<int64_t>(kLutCols, n - col - kLutCols);
          const char* next = next_rows > 0 ? reinterpret_cast<const char*>(w + (col + kLutCols) * words) : nullptr;
          const int64_t next_lines = next_rows > 0 ? (next_rows * words + 15) / 16 : 0;
          float acc[kLutRows][kLutCols];
          const float* row_tables[kLutRows];
          for (int r = 0; r < tile_rows; ++r) row_tables[r] = table_data + (i + r) * row_floats;
          if (tile_rows == kLutRows) lut_tile<kLutRows>(row_tables, w, words, col, cols, next, next_lines, acc);
          else if (tile_rows == 2) lut_tile<2>(row_tables, w, words, col, cols, next, next_lines, acc);
          else lut_tile<1>(row_tables, w, words, col, cols, next, next_lines, acc);
          for (int r = 0; r < tile_rows; ++r) {
            float* row = output.row(c0 + i + r);
            for (int64_t j = 0; j < cols; ++j) row[col + j] = epilogue.apply(acc[r][j], c0 + i + r, col + j);
          }
        }
        i += tile_rows;
      }
    });
  }
}
#else
// Without AVX-512: the weight bits are expanded to +-1.0 vectors once per weight row and word, and shared by the
// MR rows of x; then each x row costs one FMA per 16 (8) values, as a dense fp32 GEMM does, and
// x * +-1 + acc rounds exactly like acc +- x.
#if defined(__AVX2__)
constexpr int kSignRows = 3, kSignCols = 3;  // 9 accumulators + 3 x vectors + signs of 16 ymm

// The 8 lanes of +-1.0 of every weight byte (+1 where a bit is set), 8 KiB that stay in L1: one
// load expands 8 weight bits, cheaper than building the vector from the bits.
struct SignTable {
  alignas(32) float values[256][8];
  SignTable() {
    for (int byte = 0; byte < 256; ++byte)
      for (int lane = 0; lane < 8; ++lane) values[byte][lane] = (byte >> lane & 1) ? 1.0f : -1.0f;
  }
};

inline const SignTable& sign_table() {
  static const SignTable table;  // built once, thread-safe (C++11 statics)
  return table;
}

template <int MR, int NR>
inline void sign_dot_tile(const float* const* x, const uint32_t* const* w, int64_t words, float (&out)[MR][NR]) {
  const SignTable& table = sign_table();
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t word = 0; word < words; ++word) {
    for (int chunk = 0; chunk < 4; ++chunk) {
      __m256 xv[MR];
      for (int i = 0; i < MR; ++i) xv[i] = _mm256_loadu_ps(x[i] + 32 * word + 8 * chunk);
      for (int j = 0; j < NR; ++j) {
        const __m256 sign = _mm256_load_ps(table.values[(w[j][word] >> (8 * chunk)) & 0xFF]);
        for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], sign, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      __m128 sum = _mm_add_ps(_mm256_castps256_ps128(acc[i][j]), _mm256_extractf128_ps(acc[i][j], 1));
      sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
      sum = _mm_add_ss(sum, _mm_shuffle_ps(sum, sum, 1));
      out[i][j] = _mm_cvtss_f32(sum);
    }
}
#else
constexpr int kSignRows = 1, kSignCols = 4;

template <int MR, int NR>
inline void sign_dot_tile(const float* const* x, const uint32_t* const* w, int64_t words, float (&out)[MR][NR]) {
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float acc = 0.0f;
      for (int64_t k = 0; k < 32 * words; ++k) acc += (w[j][k / 32] >> (k % 32) & 1) ? x[i][k] : -x[i][k];
      out[i][j] = acc;
    }
}
#endif

struct SignDotTile {
  const float* x;     // [M, 32 * words], zero padded
  const uint32_t* w;  // [N, words]
  int64_t words;
  const Epilogue& epilogue;
  const Output& out;

  template <int MR, int NR>
  void run(int64_t m0, int64_t n0) const {
    const float* x_rows[MR];
    const uint32_t* w_rows[NR];
    for (int i = 0; i < MR; ++i) x_rows[i] = x + (m0 + i) * 32 * words;
    for (int j = 0; j < NR; ++j) w_rows[j] = w + (n0 + j) * words;
    float acc[MR][NR];
    sign_dot_tile<MR, NR>(x_rows, w_rows, words, acc);
    for (int i = 0; i < MR; ++i) {
      float* row = out.row(m0 + i);
      for (int j = 0; j < NR; ++j) row[n0 + j] = epilogue.apply(acc[i][j], m0 + i, n0 + j);
    }
  }
};
#endif

// ------------------------------------------------------------------------------------------------
// Ops
// ------------------------------------------------------------------------------------------------

// pack_signs: int32 word w of a row holds bit j = (x[32 w + j] >= 0); tail bits 0.
at::Tensor pack_signs_cpu(const at::Tensor& x) {
  check_float_input("pack_signs", x);
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) >= 1, "bitcompile::pack_signs: x must have a non-empty last dimension");
  const int64_t k = x.size(-1), words = packed_words(k);
  const auto sizes = with_last_dim(x.sizes(), words);
  PackedRows packed = pack_rows(float_rows(x, k), words, /*with_nonzero=*/false);
  return packed.bits.view(sizes);
}

// binary_linear: y = (s(x) @ s(W).T) [* mean|x| per row] * scale + bias; dot exact, epilogue fp32.
at::Tensor binary_linear_cpu(const at::Tensor& x, const at::Tensor& w_packed, int64_t in_features,
                             const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& bias,
                             bool sign_zero, bool row_scale) {
  const char* op = "binary_linear";
  check_binary_linear(op, x, w_packed, in_features, scale, bias);
  const int64_t k = in_features, n = w_packed.size(0);
  const auto out_sizes = with_last_dim(x.sizes(), n);
  const at::Tensor rows = float_rows(x, k);
  const int64_t m = rows.size(0);
  at::Tensor out = at::empty({m, n}, rows.options());
  if (m > 0 && n > 0) {
    const at::Tensor weight = weight_rows(w_packed, w_packed.size(1), k);
    const PackedRows packed = pack_rows(rows, weight.size(1), sign_zero);
    Epilogue epilogue(scale, bias);
    at::Tensor row_mean;
    if (row_scale) {  // mean |x| over K, summed in float64 (XNOR-Net's beta)
      row_mean = rows.abs().mean(-1, /*keepdim=*/false, at::kDouble).to(at::kFloat).contiguous();
      epilogue.row_factor = row_mean.data_ptr<float>();
    }
    binary_gemm(bit_matrix(packed, k), m, reinterpret_cast<const uint64_t*>(weight.data_ptr<int32_t>()), n, epilogue,
                Output::matrix(out.data_ptr<float>(), n));
  }
  return out.view(out_sizes).to(x.scalar_type());
}

// binary_weight_linear: y = x @ (s(W) * scale).T + bias, fp32 accumulation.
at::Tensor binary_weight_linear_cpu(const at::Tensor& x, const at::Tensor& w_packed, int64_t in_features,
                                    const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& bias) {
  const char* op = "binary_weight_linear";
  check_binary_linear(op, x, w_packed, in_features, scale, bias);
  const int64_t k = in_features, n = w_packed.size(0), words = packed_words(k);
  const auto out_sizes = with_last_dim(x.sizes(), n);
  const at::Tensor rows = float_rows(x, k);
  const int64_t m = rows.size(0);
  at::Tensor out = at::empty({m, n}, rows.options());
  if (m > 0 && n > 0) {
    // Zero padding to whole words: the tail bits of W then multiply zeros.
    const at::Tensor padded = 32 * words == k ? rows : at::constant_pad_nd(rows, {0, 32 * words - k}, 0).contiguous();
    const at::Tensor weight = w_packed.contiguous();
    const Epilogue epilogue(scale, bias);
    const Output output = Output::matrix(out.data_ptr<float>(), n);
    const uint32_t* w = words_of(weight);
#if defined(__AVX512F__)
    sign_lut_linear(padded.data_ptr<float>(), m, w, n, words, epilogue, output);
#else
    const SignDotTile tile{padded.data_ptr<float>(), w, words, epilogue, output};
    // A weight word costs 32 multiply-adds, about 16 word-dots of the popcount kernels.
    for_each_block(m, n, 32, 64, 16 * words, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
      tile_block<kSignRows, kSignCols>(m0, m1, n0, n1, tile);
    });
#endif
  }
  return out.view(out_sizes).to(x.scalar_type());
}

// ------------------------------------------------------------------------------------------------
// binary_conv2d: an implicit XOR/popcount GEMM over the packed, padded input
// ------------------------------------------------------------------------------------------------
// The input is packed once, one row of C/32 words per pixel, into an image grown by the padding
// whose border pixels hold pad_value's signs (all valid bits for +1, none for -1 and 0). Output
// pixel (b, oh, ow) reads tap (kh, kw) at a fixed word offset from its first pixel: no patch
// matrix, no branch per tap. Under zero padding the output pixels are grouped in boxes whose
// valid taps are the same rectangle (ConvBox), and a box's rows loop over those taps only: a
// padded tap costs nothing and needs no correction (at 14x14, 3x3, 9% of the taps). Padding of
// +-1 reads the border pixels (one box, every tap). Rows with a zero under sign_zero take the
// masked path (nonzero plane, 0 there).
// The weights are re-laid in panels of kLanes output channels interleaved word by word,
// panel[p][k][lane] = w[kLanes p + lane][k] (0 past OC): one vector holds word k of kLanes
// outputs, the popcounts add up per lane, and no output pays a horizontal sum.
#if defined(__AVX512VPOPCNTDQ__) && defined(__AVX512BW__)
struct ConvLanes {  // AVX-512 VPOPCNTDQ: 16 outputs a vector
  // 24 accumulators, 4 panel words and a broadcast of the 32 zmm (30 masked). 6 rows against 4: 1.02-1.05x
  // (B = 1..16, C = 64..512, 2 threads, 2026-12-05), the tile's own costs spread over more outputs.
  static constexpr int kLanes = 16, kRows = 6, kPanels = 4, kFlushSteps = 0;
  static constexpr int kSplit = 1;
  using Vec = __m512i;
  static Vec zero() { return _mm512_setzero_si512(); }
  static Vec load(const uint32_t* p) { return _mm512_loadu_si512(p); }
  static Vec broadcast(uint32_t v) { return _mm512_set1_epi32(int(v)); }
  static Vec count(Vec acc, const Vec (&diff)[kSplit]) { return _mm512_add_epi32(acc, _mm512_popcnt_epi32(diff[0])); }
  static Vec flush(Vec total, Vec acc) { return _mm512_add_epi32(total, acc); }

  // Epilogue::apply on the 16 outputs (m, col .. col + 15), lanes past N masked off.
  static void store(Vec total, int32_t ones, const Epilogue& epilogue, float* row, int64_t col, int64_t n) {
    const __mmask16 lanes = n - col >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - col)) - 1);
    __m512i dot = _mm512_sub_epi32(_mm512_set1_epi32(ones), _mm512_slli_epi32(total, 1));
    __m512 value = _mm512_cvtepi32_ps(dot);
    if (epilogue.scale)
      value = _mm512_mul_ps(value, epilogue.scale_stride ? _mm512_maskz_loadu_ps(lanes, epilogue.scale + col)
                                                          : _mm512_set1_ps(epilogue.scale[0]));
    if (epilogue.bias) value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(lanes, epilogue.bias + col));
    _mm512_mask_storeu_ps(row + col, lanes, value);
  }

  // store on NP * 16 contiguous outputs col .. of a row, all inside N: no lane masks, and the epilogue's pointers
  // read once (stores through `row` may alias them, so store() reads them again for every vector: ~8% of the conv
  // at B = 8, C = 128, 14x14, 2026-12-05).
  template <int NP>
  static void store_row(const Vec (&total)[NP], int32_t ones, const Epilogue& epilogue, float* row, int64_t col) {
    const float* scale = epilogue.scale;
    const float* bias = epilogue.bias;
    const bool per_column = epilogue.scale_stride != 0;
    for (int q = 0; q < NP; ++q) {
      __m512i dot = _mm512_sub_epi32(_mm512_set1_epi32(ones), _mm512_slli_epi32(total[q], 1));
      __m512 value = _mm512_cvtepi32_ps(dot);
      if (scale)
        value = _mm512_mul_ps(value, per_column ? _mm512_loadu_ps(scale + col + 16 * q) : _mm512_set1_ps(*scale));
      if (bias) value = _mm512_add_ps(value, _mm512_loadu_ps(bias + col + 16 * q));
      _mm512_storeu_ps(row + col + 16 * q, value);
    }
  }
};
#else
// Epilogue::apply lane by lane on dot = ones - 2 count (the conv has no row factor).
inline void store_lanes(const int32_t* counts, int lanes, int32_t ones, const Epilogue& epilogue, float* row,
                        int64_t col, int64_t n) {
  for (int lane = 0; lane < lanes && col + lane < n; ++lane) {
    const int32_t dot = ones - 2 * counts[lane];
    row[col + lane] = epilogue.apply(float(dot), 0, col + lane);
  }
}
// ConvLanes::store_row (NP * kLanes contiguous outputs of a row, all inside N) for the lanes with no faster one:
// store() a vector at a time.
template <typename Lanes>
struct StoreRowByVectors {
  template <int NP, typename Vec>
  static void store_row(const Vec (&total)[NP], int32_t ones, const Epilogue& epilogue, float* row, int64_t col) {
    constexpr int64_t lanes = Lanes::kLanes;
    for (int q = 0; q < NP; ++q)
      Lanes::store(total[q], ones, epilogue, row, col + lanes * q, col + lanes * NP);
  }
};
#if defined(__AVX2__)
// AVX2: 8 outputs a vector, byte counts from nibble lookups widened every 31 steps. The operands are laid out
// in nibble planes (kSplit = 2: word w as w & 0x0F0F0F0F, then (w >> 4) & 0x0F0F0F0F), so that the XOR of two
// planes is a lookup index as it stands: 2 shuffles and 2 adds a vector, no masks or shifts per accumulator.
struct ConvLanes : StoreRowByVectors<ConvLanes> {
  static constexpr int kLanes = 8, kRows = 2, kPanels = 3, kFlushSteps = 31;  // 31 * 8 < 256 per byte
  static constexpr int kSplit = 2;
  using Vec = __m256i;
  static Vec zero() { return _mm256_setzero_si256(); }
  static Vec load(const uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static Vec broadcast(uint32_t v) { return _mm256_set1_epi32(int(v)); }
  static Vec count(Vec acc, const Vec (&diff)[kSplit]) {
    const __m256i nibble_counts =
        _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4);
    return _mm256_add_epi8(_mm256_add_epi8(acc, _mm256_shuffle_epi8(nibble_counts, diff[0])),
                           _mm256_shuffle_epi8(nibble_counts, diff[1]));
  }
  // The 4 byte counts of each 32-bit lane of `bytes` added to `total`.
  static Vec flush(Vec total, Vec bytes) {
    const __m256i pairs = _mm256_maddubs_epi16(bytes, _mm256_set1_epi8(1));
    return _mm256_add_epi32(total, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  static void store(Vec total, int32_t ones, const Epilogue& epilogue, float* row, int64_t col, int64_t n) {
    alignas(32) int32_t counts[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(counts), total);
    store_lanes(counts, 8, ones, epilogue, row, col, n);
  }
};
#else
struct ConvLanes : StoreRowByVectors<ConvLanes> {  // POPCNT: one output a lane
  static constexpr int kLanes = 1, kRows = 2, kPanels = 4, kFlushSteps = 0;  // 8 accumulators of 16 GPRs
  static constexpr int kSplit = 1;
  using Vec = uint32_t;
  static Vec zero() { return 0; }
  static Vec load(const uint32_t* p) { return *p; }
  static Vec broadcast(uint32_t v) { return v; }
  static Vec count(Vec acc, const Vec (&diff)[kSplit]) { return acc + uint32_t(__builtin_popcount(diff[0])); }
  static Vec flush(Vec total, Vec acc) { return total + acc; }
  static void store(Vec total, int32_t ones, const Epilogue& epilogue, float* row, int64_t col, int64_t n) {
    const int32_t counts[1] = {int32_t(total)};
    store_lanes(counts, 1, ones, epilogue, row, col, n);
  }
};
#endif
#endif

// Counts popc((a ^ b) [& nz]) of MR output pixels (row pointers into the padded input) over the taps `taps` (tap t
// at word offset tap_offsets[t] from a row's pointer, at t * tap_words words of a panel's lane) against NP weight
// panels, per lane; every packed word is kSplit words of the layouts.
template <int MR, int NP, bool MASKED>
inline void conv_counts(const uint32_t* const* a, const uint32_t* const* nz, const int64_t* tap_offsets,
                        const int32_t* taps, int64_t tap_count, int64_t tap_words, const uint32_t* const* panels,
                        ConvLanes::Vec (&total)[MR][NP]) {
  using L = ConvLanes;
  constexpr int S = L::kSplit;
  L::Vec acc[MR][NP];
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < NP; ++q) acc[i][q] = total[i][q] = L::zero();
  [[maybe_unused]] int steps = 0;
  for (int64_t j = 0; j < tap_count; ++j) {
    const int64_t t = taps[j], offset = tap_offsets[t];
    const uint32_t* b[NP];
    for (int q = 0; q < NP; ++q) b[q] = panels[q] + t * tap_words * S * L::kLanes;
    for (int64_t w = offset; w < offset + tap_words * S; w += S) {
      L::Vec bv[NP][S];
      for (int q = 0; q < NP; ++q) {
        for (int s = 0; s < S; ++s) bv[q][s] = L::load(b[q] + s * L::kLanes);
        b[q] += L::kLanes * S;
      }
      for (int i = 0; i < MR; ++i) {
        L::Vec av[S];
        [[maybe_unused]] L::Vec mask[S];
        for (int s = 0; s < S; ++s) {
          av[s] = L::broadcast(a[i][w + s]);
          if constexpr (MASKED) mask[s] = L::broadcast(nz[i][w + s]);
        }
        for (int q = 0; q < NP; ++q) {
          L::Vec diff[S];
          for (int s = 0; s < S; ++s) {
            diff[s] = av[s] ^ bv[q][s];
            if constexpr (MASKED) diff[s] = diff[s] & mask[s];
          }
          acc[i][q] = L::count(acc[i][q], diff);
        }
      }
      if constexpr (L::kFlushSteps > 0) {
        if (++steps == L::kFlushSteps) {
          for (int i = 0; i < MR; ++i)
            for (int q = 0; q < NP; ++q) total[i][q] = L::flush(total[i][q], acc[i][q]), acc[i][q] = L::zero();
          steps = 0;
        }
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < NP; ++q) total[i][q] = L::flush(total[i][q], acc[i][q]);
}

// What an output pixel of the conv reads and where its outputs go.
struct ConvRow {
  int64_t offset;          // word offset of its first input pixel (tap 0, 0) in the padded image
  int64_t out_offset;      // float offset of its output channel 0 (channels_last rows)
  int32_t nonzero_count;   // masked rows: nonzero input values under its taps
  uint8_t masked;          // a tap reads a pixel with zeros (sign_zero)
};

// The output pixels whose valid taps are the same rectangle: output rows [h0, h1) x columns [w0, w1) of every image
// (the valid taps of a coordinate change monotonically along its axis, so each pattern is one range of it). Its rows
// (b, oh, ow) are numbered from 0, b first, then oh, then ow.
struct ConvBox {
  int64_t h0, h1, w0, w1;
  std::vector<int32_t> taps;  // kh * kernel_w + kw of its valid taps (every tap under +-1 padding)
  int64_t rows(int64_t batch) const { return batch * (h1 - h0) * (w1 - w0); }
};

// The packed input grown by the padding, and what each row of the implicit GEMM over it reads (rows(), worked out a
// block at a time by ConvBlock: a table of the B * OH * OW rows cost ~10 us a call at B = 8, C = 128, 14x14, 2
// threads, 4% of the conv, 2026-12-05).
struct ConvInput {
  at::Tensor bits, nonzero;              // int32 [B * HP * WP, C/32]; nonzero only under sign_zero
  std::vector<int64_t> tap_offsets;      // word offset of tap (kh, kw) from a row's offset
  std::vector<int64_t> tap_pixels;       // pixel offset of tap (kh, kw) from a row's first pixel
  std::vector<ConvBox> boxes;
  int64_t channel_words = 0;
  int64_t pixel_words = 0;               // words a pixel of bits (channel_words x the layout's planes)
  ConvGeometry g{};
  std::vector<int32_t> pixel_count;       // sign_zero: nonzero values of each padded pixel
  std::vector<uint8_t> pixel_has_zero;    // sign_zero: whether it holds a zero

  // Rows r .. r + count - 1 of `box`: (b, oh, ow) divided out for the first and stepped for the others (three 64-bit
  // divisions a row, each tile working out its own rows, were ~5-12% of the conv, 2026-12-05).
  void rows(const ConvBox& box, int64_t r, int64_t count, ConvRow* out) const {
    const int64_t width = box.w1 - box.w0, pixels = (box.h1 - box.h0) * width;
    int64_t b = r / pixels, oh = box.h0 + r % pixels / width, ow = box.w0 + r % width;
    for (int64_t i = 0; i < count; ++i) {
      out[i] = row(box, b, oh, ow);
      if (++ow == box.w1) {
        ow = box.w0;
        if (++oh == box.h1) oh = box.h0, ++b;
      }
    }
  }

  ConvRow row(const ConvBox& box, int64_t b, int64_t oh, int64_t ow) const {
    const int64_t padded_height = g.height + 2 * g.pad_h, padded_width = g.width + 2 * g.pad_w;
    const int64_t first_pixel = (b * padded_height + oh * g.stride_h) * padded_width + ow * g.stride_w;
    ConvRow row;
    row.offset = first_pixel * pixel_words;
    row.out_offset = ((b * g.out_height + oh) * g.out_width + ow) * g.out_channels;
    row.masked = 0;
    row.nonzero_count = 0;
    if (!pixel_count.empty()) {
      for (const int32_t t : box.taps) {
        const int64_t pixel = first_pixel + tap_pixels[t];
        row.masked |= pixel_has_zero[pixel];
        row.nonzero_count += pixel_count[pixel];
      }
    }
    return row;
  }
};

// The valid taps of output coordinate o along one axis: [first, last) with input o*s - p + k*d in [0, size).
inline std::pair<int64_t, int64_t> valid_taps(int64_t o, int64_t size, int64_t kernel, int64_t stride, int64_t pad,
                                              int64_t dilation) {
  int64_t first = 0, last = kernel;
  while (first < kernel && o * stride - pad + first * dilation < 0) ++first;
  while (last > first && o * stride - pad + (last - 1) * dilation >= size) --last;
  return {first, last};
}

// An axis of the output cut into runs of coordinates with the same valid taps: (start, end, first tap, last tap).
// Under +-1 padding (zero_padding false) one run of every tap.
struct TapRun {
  int64_t start, end, first, last;
};
inline std::vector<TapRun> tap_runs(int64_t out_size, int64_t size, int64_t kernel, int64_t stride, int64_t pad,
                                    int64_t dilation, bool zero_padding) {
  if (!zero_padding) return {{0, out_size, 0, kernel}};
  std::vector<TapRun> runs;
  for (int64_t o = 0; o < out_size; ++o) {
    const auto [first, last] = valid_taps(o, size, kernel, stride, pad, dilation);
    if (!runs.empty() && runs.back().first == first && runs.back().last == last) runs.back().end = o + 1;
    else runs.push_back({o, o + 1, first, last});
  }
  return runs;
}

// The conv's boxes (ConvBox): runs of output rows times runs of output columns with the same valid taps, row runs
// first. Under +-1 padding (zero_padding false) one box of every tap.
inline std::vector<ConvBox> conv_boxes(const ConvGeometry& g, bool zero_padding) {
  const auto runs_h = tap_runs(g.out_height, g.height, g.kernel_h, g.stride_h, g.pad_h, g.dilation_h, zero_padding);
  const auto runs_w = tap_runs(g.out_width, g.width, g.kernel_w, g.stride_w, g.pad_w, g.dilation_w, zero_padding);
  std::vector<ConvBox> boxes;
  for (const TapRun& h : runs_h)
    for (const TapRun& w : runs_w) {
      ConvBox box{h.start, h.end, w.start, w.end, {}};
      for (int64_t kh = h.first; kh < h.last; ++kh)
        for (int64_t kw = w.first; kw < w.last; ++kw) box.taps.push_back(int32_t(kh * g.kernel_w + kw));
      boxes.push_back(std::move(box));
    }
  return boxes;
}

// `count` pixels of `words` words each set to `pattern`.
inline void fill_pixels(uint32_t* dst, int64_t count, const uint32_t* pattern, int64_t words) {
  for (int64_t p = 0; p < count; ++p)
    for (int64_t w = 0; w < words; ++w) dst[p * words + w] = pattern[w];
}

// The conv's input pixels, NHWC order: packed rows (binary_conv2d_packed; NCHW input through pack_pixels_nchw), or
// fp32 rows of C values (channels_last input) that conv_input packs straight into the padded image (packing them
// first and copying the packed rows in cost ~4 us more and a parallel region at B = 8, C = 128, 14x14, 2026-12-05).
struct ConvPixels {
  const PackedRows* packed = nullptr;
  const float* floats = nullptr;
};

ConvInput conv_input(const ConvPixels& pixels, const ConvGeometry& g, double pad_value, bool sign_zero) {
  const int64_t cw = packed_words(g.channels);
  const int64_t hp = g.height + 2 * g.pad_h, wp = g.width + 2 * g.pad_w;
  ConvInput in;
  in.channel_words = in.pixel_words = cw;
  in.g = g;
  // The signs of a pixel whose channels are all >= 0 (nonzero): every valid bit set.
  std::vector<uint32_t> all_valid(cw, 0xFFFFFFFFu), none(cw, 0);
  all_valid.back() = low_bits(g.channels - 32 * (cw - 1));
  const uint32_t* pad_bits = pad_value > 0 ? all_valid.data() : none.data();
  const uint32_t* pad_nonzero = pad_value != 0.0 ? all_valid.data() : none.data();
  const int32_t pad_count = pad_value != 0.0 ? int32_t(g.channels) : 0;

  const auto int_options = at::TensorOptions().dtype(at::kInt);
  in.bits = at::empty({g.batch * hp * wp, cw}, int_options);
  if (sign_zero) in.nonzero = at::empty({g.batch * hp * wp, cw}, int_options);
  std::vector<int32_t>& pixel_count = in.pixel_count;
  std::vector<uint8_t>& pixel_has_zero = in.pixel_has_zero;
  pixel_count.assign(sign_zero ? g.batch * hp * wp : 0, pad_count);
  pixel_has_zero.assign(sign_zero ? g.batch * hp * wp : 0, 0);
  const PackedRows* packed = pixels.packed;
  const uint32_t* source_bits = packed ? words_of(packed->bits) : nullptr;
  const uint32_t* source_nonzero = packed && sign_zero ? words_of(packed->nonzero) : nullptr;
  const int32_t* source_count = packed && sign_zero ? packed->nonzero_count.data_ptr<int32_t>() : nullptr;
  const uint8_t* source_has_zero = packed && sign_zero ? packed->has_zero.data_ptr<uint8_t>() : nullptr;
  auto* bits = reinterpret_cast<uint32_t*>(in.bits.data_ptr<int32_t>());
  auto* nonzero = sign_zero ? reinterpret_cast<uint32_t*>(in.nonzero.data_ptr<int32_t>()) : nullptr;
  // A padded image row: pad_w pad pixels on each side of the W image pixels (all pad pixels outside the image).
  const auto pad_row = [&](uint32_t* dst, const uint32_t* pad, bool inside) {
    if (!inside) return fill_pixels(dst, wp, pad, cw);
    fill_pixels(dst, g.pad_w, pad, cw);
    fill_pixels(dst + (g.pad_w + g.width) * cw, g.pad_w, pad, cw);
  };
  at::parallel_for(0, g.batch * hp, 16, [&](int64_t begin, int64_t end) {
    for (int64_t image_row = begin; image_row < end; ++image_row) {
      const int64_t b = image_row / hp, ih = image_row % hp - g.pad_h, source = (b * g.height + ih) * g.width;
      const int64_t first = image_row * wp + g.pad_w;  // padded pixel of (b, ih, 0)
      const bool inside = ih >= 0 && ih < g.height;
      pad_row(bits + image_row * wp * cw, pad_bits, inside);
      if (sign_zero) pad_row(nonzero + image_row * wp * cw, pad_nonzero, inside);
      if (!inside) continue;
      if (pixels.floats) {
        for (int64_t iw = 0; iw < g.width; ++iw)
          pack_row_planes(pixels.floats + (source + iw) * g.channels, g.channels, bits + (first + iw) * cw,
                          sign_zero ? nonzero + (first + iw) * cw : nullptr,
                          sign_zero ? &pixel_count[first + iw] : nullptr,
                          sign_zero ? &pixel_has_zero[first + iw] : nullptr);
        continue;
      }
      std::memcpy(bits + first * cw, source_bits + source * cw, g.width * cw * sizeof(uint32_t));
      if (!sign_zero) continue;
      std::memcpy(nonzero + first * cw, source_nonzero + source * cw, g.width * cw * sizeof(uint32_t));
      std::copy_n(source_count + source, g.width, &pixel_count[first]);
      std::copy_n(source_has_zero + source, g.width, &pixel_has_zero[first]);
    }
  });

  for (int64_t kh = 0; kh < g.kernel_h; ++kh)
    for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
      in.tap_pixels.push_back(kh * g.dilation_h * wp + kw * g.dilation_w);
      in.tap_offsets.push_back(in.tap_pixels.back() * cw);
    }

  in.boxes = conv_boxes(g, pad_value == 0.0);
  return in;
}

struct ConvTile {
  const ConvInput& in;
  const uint32_t* panels;  // [panels][taps * channel_words][kSplit][kLanes]
  int64_t n;               // output channels
  const Epilogue& epilogue;
  float* out;              // channels_last rows [B * OH * OW, OC]; a pixel's at out + its ConvRow's out_offset
  // in's tensors as raw pointers, taken once a call (data_ptr<T>() checks the type on every call: ~3% of the conv
  // when each tile asked, B = 8, C = 128, 14x14).
  const uint32_t* bits;
  const uint32_t* nonzero;       // sign_zero only

  template <int MR, int NP, bool MASKED>
  void compute(const ConvBox& box, const ConvRow* rows, int64_t p0) const {
    using L = ConvLanes;
    const int64_t k_words = int64_t(in.tap_offsets.size()) * in.channel_words * L::kSplit;
    const uint32_t *a[MR], *nz[MR], *panel[NP];
    for (int i = 0; i < MR; ++i) {
      a[i] = bits + rows[i].offset;
      nz[i] = MASKED ? nonzero + rows[i].offset : nullptr;
    }
    for (int q = 0; q < NP; ++q) panel[q] = panels + (p0 + q) * k_words * L::kLanes;
    L::Vec total[MR][NP];
    conv_counts<MR, NP, MASKED>(a, nz, in.tap_offsets.data(), box.taps.data(), int64_t(box.taps.size()),
                                in.channel_words, panel, total);
    const int32_t valid = int32_t(box.taps.size() * in.g.channels);
    for (int i = 0; i < MR; ++i) {
      // dot = valid taps * C - 2 popc(a ^ w), or popc(nz) - 2 popc((a ^ w) & nz) when masked.
      const ConvRow& row = rows[i];
      const int32_t ones = MASKED ? row.nonzero_count : valid;
      if ((p0 + NP) * L::kLanes <= n) {
        L::template store_row<NP>(total[i], ones, epilogue, out + row.out_offset, p0 * L::kLanes);
        continue;
      }
      for (int q = 0; q < NP; ++q) {
        const int64_t col = (p0 + q) * L::kLanes;
        L::store(total[i][q], ones, epilogue, out + row.out_offset, col, n);
      }
    }
  }
};

// A block of a box's rows [r0, r1) (at most kBlockRows) worked out once for all its tiles: tiles of kRows rows, then
// one of the rows left (a box's rows are often fewer than kRows: 5 along each edge of a 7x7 image at batch 1, and a
// tile of them costs about one of its rows alone), each over the panels [p0, p1) kPanels at a time.
struct ConvBlock {
  static constexpr int64_t kBlockRows = 36;
  static_assert(kBlockRows % ConvLanes::kRows == 0, "whole tiles a block");
  const ConvTile& tile;
  const ConvBox& box;
  int64_t r0, r1;
  ConvRow rows[kBlockRows];

  ConvBlock(const ConvTile& tile, const ConvBox& box, int64_t r0, int64_t r1) : tile(tile), box(box), r0(r0), r1(r1) {
    tile.in.rows(box, r0, r1 - r0, rows);
  }

  void run(int64_t p0, int64_t p1) const {
    constexpr int R = ConvLanes::kRows;
    int64_t r = r0;
    for (; r + R <= r1; r += R) run_panels<R>(r, p0, p1);
    run_rest<R - 1>(r1 - r, r, p0, p1);
  }

 private:
  template <int MR>
  void run_rest(int64_t count, int64_t r, int64_t p0, int64_t p1) const {
    if constexpr (MR > 0) {
      if (count == MR) return run_panels<MR>(r, p0, p1);
      run_rest<MR - 1>(count, r, p0, p1);
    }
  }

  template <int MR>
  void run_panels(int64_t r, int64_t p0, int64_t p1) const {
    constexpr int NP = ConvLanes::kPanels;
    int64_t p = p0;
    for (; p + NP <= p1; p += NP) run_tile<MR, NP>(r, p);
    for (; p < p1; ++p) run_tile<MR, 1>(r, p);
  }

  template <int MR, int NP>
  void run_tile(int64_t r, int64_t p0) const {
    const ConvRow* first = rows + (r - r0);
    bool masked = false;
    for (int i = 0; i < MR; ++i) masked = masked || first[i].masked;
    if (masked) tile.compute<MR, NP, true>(box, first, p0);
    else tile.compute<MR, NP, false>(box, first, p0);
  }
};

// Word w of a layout of ConvLanes::kSplit planes: w itself, or its nibble plane s.
inline uint32_t split_word(uint32_t w, int s) {
  return ConvLanes::kSplit == 1 ? w : (w >> (4 * s)) & 0x0F0F0F0Fu;
}

#if defined(__AVX512F__)
// panel[k][lane] = word k of row `lane` of the 16 rows at `weight` (rows past `rows`: zeros), by 16 x 16 transposes in
// registers (the table kernel's, binary_weight_linear).
inline void transposed_panel(const uint32_t* weight, int64_t stride, int64_t rows, int64_t k_words, uint32_t* panel) {
  for (int64_t k0 = 0; k0 < k_words; k0 += 16) {
    const int64_t count = std::min<int64_t>(16, k_words - k0);
    const __mmask16 inside = count == 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
    __m512i r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = i < rows ? _mm512_maskz_loadu_epi32(inside, weight + i * stride + k0) : _mm512_setzero_si512();
    transpose_16x16(r);  // r[j] lane i = word k0 + j of row i
    for (int64_t j = 0; j < count; ++j) _mm512_storeu_si512(panel + (k0 + j) * 16, r[j]);
  }
}
#endif

// The weight [OC, W] (W >= taps * C/32 words a row) in panels of `lanes` outputs (see above), each word as `split`
// vectors of its planes: ConvLanes' layout for binary_conv2d, 16 lanes of whole words for binary_weight_conv2d.
template <int64_t lanes = ConvLanes::kLanes, int split = ConvLanes::kSplit>
at::Tensor conv_panels(const uint32_t* weight, int64_t stride, int64_t n, int64_t k_words) {
  const int64_t panels = (n + lanes - 1) / lanes, panel_words = k_words * split * lanes;
  at::Tensor out = at::empty({panels * panel_words}, at::TensorOptions().dtype(at::kInt));
  auto* dst = reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>());
  // A transpose of each panel's rows. At OC = C = 512, 3x3 (73K words) on one thread: 55 us reading the panel's
  // rows a word at a time (16 strided streams), a quarter of a batch-1 conv there; 17 us by 16 x 16 blocks in AVX-512
  // registers, and 24 us over 2 threads (the parallel region costs more than it splits), so threads only past 2^18
  // words (2026-12-05).
  at::parallel_for(0, panels, std::max<int64_t>(1, kMinParallelWork / panel_words), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      uint32_t* panel = dst + p * panel_words;
#if defined(__AVX512F__)
      if constexpr (lanes == 16 && split == 1) {
        transposed_panel(weight + p * 16 * stride, stride, std::min<int64_t>(16, n - p * 16), k_words, panel);
        continue;
      }
#endif
      for (int64_t lane = 0; lane < lanes; ++lane) {
        uint32_t* column = panel + lane;
        const int64_t row = p * lanes + lane;
        const uint32_t* source = weight + row * stride;
        for (int64_t k = 0; k < k_words; ++k)
          for (int s = 0; s < split; ++s) column[(k * split + s) * lanes] = row < n ? split_word(source[k], s) : 0;
      }
    }
  });
  return out;
}

// The padded input (and its nonzero plane) in ConvLanes' layout: each word as kSplit words of its planes, the
// word offsets scaled to match.
void split_conv_input(ConvInput& in) {
  constexpr int split = ConvLanes::kSplit;
  if constexpr (split > 1) {
    const auto planes = [](const at::Tensor& words) {
      at::Tensor out = at::empty({words.size(0), words.size(1) * split}, words.options());
      const uint32_t* src = words_of(words);
      auto* dst = reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>());
      at::parallel_for(0, words.numel(), 4096, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i)
          for (int s = 0; s < split; ++s) dst[i * split + s] = split_word(src[i], s);
      });
      return out;
    };
    in.bits = planes(in.bits);
    if (in.nonzero.defined()) in.nonzero = planes(in.nonzero);
    for (int64_t& offset : in.tap_offsets) offset *= split;
    in.pixel_words *= split;
  }
}

// Runs fn(box, r0, r1, p0, p1) on the conv's blocks: kBlockRows rows of one box x block_panels panels. The threads
// take runs of consecutive blocks as they finish, each run 1 / (2 x threads) of the work left, at least a block
// (2 threads, 2026-12-05, against a split by work before the start, which kept one of this VM's two unequal vCPUs
// waiting, and against one block at a time: 3-7% faster at B = 8 C = 128 14x14, where a thread's consecutive blocks
// read overlapping input rows; runs of a fixed share of the blocks left lost 15% at B = 1 C = 512 7x7, whose blocks'
// work differs tenfold between boxes).
template <typename Fn>
void for_each_conv_block(const ConvInput& in, int64_t panels, int64_t block_panels, const Fn& fn) {
  struct Block {
    int64_t box, r0, r1, p0, p1;
  };
  std::vector<Block> blocks;
  std::vector<int64_t> work_through;  // the work of the blocks up to and including this one
  int64_t work = 0;
  for (size_t k = 0; k < in.boxes.size(); ++k) {
    const ConvBox& box = in.boxes[k];
    const int64_t rows = box.rows(in.g.batch);
    // A row of a tile costs its taps' word-dots (a word-dot is half a work unit), and its stores.
    const int64_t row_work = int64_t(box.taps.size()) * in.channel_words / 2 + 1;
    for (int64_t r0 = 0; r0 < rows; r0 += ConvBlock::kBlockRows)
      for (int64_t p0 = 0; p0 < panels; p0 += block_panels) {
        const int64_t r1 = std::min(rows, r0 + ConvBlock::kBlockRows), p1 = std::min(panels, p0 + block_panels);
        blocks.push_back({int64_t(k), r0, r1, p0, p1});
        work += (r1 - r0) * (p1 - p0) * ConvLanes::kLanes * row_work;
        work_through.push_back(work);
      }
  }
  const int64_t count = int64_t(blocks.size());
  const int64_t threads = work < kMinParallelWork ? 1 : std::min<int64_t>(at::get_num_threads(), count);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (;;) {
      int64_t start = next.load(std::memory_order_relaxed), end = 0;
      do {
        if (start >= count) return;
        const int64_t done = start > 0 ? work_through[start - 1] : 0;
        const int64_t target = done + (work - done) / (2 * threads);
        end = std::upper_bound(work_through.begin() + start, work_through.end(), target) - work_through.begin();
        end = std::max(end, start + 1);
      } while (!next.compare_exchange_weak(start, end, std::memory_order_relaxed));
      for (int64_t i = start; i < end; ++i) {
        const Block& block = blocks[i];
        fn(in.boxes[block.box], block.r0, block.r1, block.p0, block.p1);
      }
    }
  });
}

// The conv of binary_conv2d / binary_conv2d_packed on its input pixels (one row per input pixel, NHWC order)
// into result (fp32 [N, OC, OH, OW], channels_last).
void conv_pixels(const ConvPixels& pixels, const ConvGeometry& g, const at::Tensor& w_packed,
                 const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& bias, double pad_value,
                 bool sign_zero, at::Tensor& result) {
  const int64_t n = g.out_channels;
  const int64_t m = g.batch * g.out_height * g.out_width;
  if (m > 0 && n > 0) {
    const int64_t cw = packed_words(g.channels), k_words = g.kernel_h * g.kernel_w * cw;
    const at::Tensor weight = weight_rows(w_packed.reshape({n, -1}), cw, g.channels);
    constexpr int64_t lanes = ConvLanes::kLanes;
    const int64_t panels = (n + lanes - 1) / lanes;
    const at::Tensor panel_words = conv_panels(words_of(weight), weight.size(1), n, k_words);
    ConvInput in = conv_input(pixels, g, pad_value, sign_zero);
    split_conv_input(in);
    const Epilogue epilogue(scale, bias);
    const ConvTile tile{in, words_of(panel_words), n, epilogue, result.data_ptr<float>(), words_of(in.bits),
                        words_of(in.nonzero)};
    // Blocks of 36 output pixels x 128 output channels.
    for_each_conv_block(in, panels, std::max<int64_t>(1, 128 / lanes),
                        [&](const ConvBox& box, int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
                          ConvBlock(tile, box, r0, r1).run(p0, p1);
                        });
  }
}

// dst [B, C, R] = src [B, R, C] transposed (fp32): channels_last rows into NCHW planes or back, by 16 x 16 blocks
// transposed in registers (AVX-512) or a value at a time. ATen's copy took 296 us for the conv's NCHW output at B = 8,
// C = 128, 14x14 (one thread, 2026-12-05).
void transpose_batched(const float* src, float* dst, int64_t batch, int64_t rows, int64_t cols) {
  constexpr int64_t kBlock = 16;
  const int64_t column_blocks = (cols + kBlock - 1) / kBlock;
  // Threads from 32 K values (B = 8, C = 128, 14x14, 2 threads: 363.7 -> 297.1 us the NCHW conv against 2^18).
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / (rows * kBlock));
  at::parallel_for(0, batch * column_blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / column_blocks, c0 = task % column_blocks * kBlock;
      const int64_t columns = std::min(kBlock, cols - c0);
      const float* from = src + b * rows * cols + c0;
      float* to = dst + (b * cols + c0) * rows;
      for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
        const int64_t count = std::min(kBlock, rows - r0);
#if defined(__AVX512F__)
        const __mmask16 column_mask = __mmask16((1u << columns) - 1), row_mask = __mmask16((1u << count) - 1);
        __m512i r[kBlock];
        for (int64_t i = 0; i < kBlock; ++i)
          r[i] = i < count ? _mm512_maskz_loadu_epi32(column_mask, from + (r0 + i) * cols) : _mm512_setzero_si512();
        transpose_16x16(r);  // r[j] lane i = column c0 + j of row r0 + i
        for (int64_t j = 0; j < columns; ++j) _mm512_mask_storeu_epi32(to + j * rows + r0, row_mask, r[j]);
#else
        for (int64_t j = 0; j < columns; ++j)
          for (int64_t i = 0; i < count; ++i) to[j * rows + r0 + i] = from[(r0 + i) * cols + j];
#endif
      }
    }
  });
}

// binary_conv2d: y = conv2d(pad(s(x), pad_value), s(W), stride, dilation) * scale[OC] + bias.
at::Tensor binary_conv2d_cpu(const at::Tensor& x, const at::Tensor& w_packed, int64_t in_channels,
                             at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                             at::IntArrayRef dilation, const std::optional<at::Tensor>& scale,
                             const std::optional<at::Tensor>& bias, double pad_value, bool sign_zero) {
  const ConvGeometry g = check_binary_conv2d(x, w_packed, in_channels, kernel_size, stride, padding, dilation, scale,
                                             bias, pad_value);
  // A fresh tensor of the input's memory format (strides as the fake kernel's). The conv writes channels_last rows
  // (b, oh, ow) of the output channels; an NCHW result is their transpose (written by the conv's tiles straight into
  // the planes, 16 strided stores a vector, an NCHW conv took twice a channels_last one: 816 against ~400 us at B = 8,
  // C = 128, 14x14, one thread, 2026-12-05).
  const at::MemoryFormat memory_format = x.suggest_memory_format();
  const auto float_options = x.options().dtype(at::kFloat);
  const std::vector<int64_t> sizes = {g.batch, g.out_channels, g.out_height, g.out_width};
  at::Tensor result = at::empty(sizes, float_options.memory_format(memory_format));
  if (result.numel() > 0) {
    // One row per input pixel (NHWC order): channels_last fp32 rows as they are, packed into the padded image by the
    // conv; NCHW packed along the channels first.
    if (memory_format == at::MemoryFormat::ChannelsLast) {
      const at::Tensor rows = x.permute({0, 2, 3, 1}).to(at::kFloat).contiguous();
      conv_pixels({nullptr, rows.data_ptr<float>()}, g, w_packed, scale, bias, pad_value, sign_zero, result);
    } else {
      const PackedRows packed = pack_pixels_nchw(x.to(at::kFloat).contiguous(), sign_zero);
      at::Tensor rows = at::empty(sizes, float_options.memory_format(at::MemoryFormat::ChannelsLast));
      conv_pixels({&packed, nullptr}, g, w_packed, scale, bias, pad_value, sign_zero, rows);
      transpose_batched(rows.data_ptr<float>(), result.data_ptr<float>(), g.batch, g.out_height * g.out_width,
                        g.out_channels);
    }
  }
  return result.to(x.scalar_type());
}

// binary_conv2d_packed: binary_conv2d on x_bits = pack_signs(x.permute(0, 2, 3, 1)), channels_last out_dtype (plus
// a residual); int32: the sign words of the fp32 values, [N, OH, OW, ceil(OC / 32)].
// pack_signs of a conv's values (float [N, OC, OH, OW], channels_last): int32 [N, OH, OW, ceil(OC / 32)] words (a
// value rounded to -0 gives bit 1, as pack_signs).
at::Tensor conv_output_sign_words(const at::Tensor& values, const ConvGeometry& g, const at::TensorOptions& options) {
  const int64_t words = packed_words(g.out_channels);
  if (values.numel() == 0) return at::zeros({g.batch, g.out_height, g.out_width, words}, options);
  const at::Tensor rows = values.permute({0, 2, 3, 1}).reshape({-1, g.out_channels});  // channels_last: a view
  return pack_rows(rows, words, /*with_nonzero=*/false).bits.view({g.batch, g.out_height, g.out_width, words});
}

at::Tensor binary_conv2d_packed_cpu(const at::Tensor& x_bits, const at::Tensor& w_packed, int64_t in_channels,
                                    at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                                    at::IntArrayRef dilation, const std::optional<at::Tensor>& scale,
                                    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual,
                                    at::ScalarType out_dtype, double pad_value) {
  const ConvGeometry g = check_binary_conv2d_packed(x_bits, w_packed, in_channels, kernel_size, stride, padding,
                                                    dilation, scale, bias, pad_value, out_dtype, residual);
  at::Tensor result =
      at::empty({g.batch, g.out_channels, g.out_height, g.out_width},
                x_bits.options().dtype(at::kFloat).memory_format(at::MemoryFormat::ChannelsLast));
  if (result.numel() > 0) {
    PackedRows packed;
    packed.bits = x_bits.contiguous().view({-1, packed_words(g.channels)});
    conv_pixels({&packed, nullptr}, g, w_packed, scale, bias, pad_value, /*sign_zero=*/false, result);
  }
  if (out_dtype == at::kInt) return conv_output_sign_words(result, g, x_bits.options());
  at::Tensor out = result.to(out_dtype);
  // rounded to out_dtype, then added in out_dtype (eager's add of two such tensors: the fp32 sum rounded once)
  if (residual.has_value()) out.add_(*residual);
  return out;
}

// binary_conv2d_packed_with_signs: binary_conv2d_packed (float out_dtype) and pack_signs of its stored values.
std::tuple<at::Tensor, at::Tensor> binary_conv2d_packed_with_signs_cpu(
    const at::Tensor& x_bits, const at::Tensor& w_packed, int64_t in_channels, at::IntArrayRef kernel_size,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, const std::optional<at::Tensor>& scale,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual, at::ScalarType out_dtype,
    double pad_value) {
  const ConvGeometry g = check_binary_conv2d_packed_with_signs(x_bits, w_packed, in_channels, kernel_size, stride,
                                                               padding, dilation, scale, bias, pad_value, out_dtype,
                                                               residual);
  at::Tensor out = binary_conv2d_packed_cpu(x_bits, w_packed, in_channels, kernel_size, stride, padding, dilation,
                                            scale, bias, residual, out_dtype, pad_value);
  return {out, conv_output_sign_words(out.to(at::kFloat), g, x_bits.options())};  // the stored values' signs
}

#if defined(__AVX512F__)
// ------------------------------------------------------------------------------------------------
// binary_weight_conv2d: conv2d(x, s(W)) * scale[OC] + bias, x not binarized (a binary-weight network), fp32 sums
// ------------------------------------------------------------------------------------------------
// The table lookups of binary_weight_linear as an implicit GEMM: every input pixel's channels get their tables
// (build_sign_tables) in an image grown by the padding, whose border pixels' tables are zeros (a padded value is 0).
// Output pixel (oh, ow) reads tap (kh, kw) from input pixel (oh sh + kh dh, ow sw + kw dw) of that image. The weight
// is re-laid once a call so that one vector holds word c of tap t of 16 output channels (conv_panels):
// lanes[ob][t][c][j] = w[16 ob + j][t][c] (0 past OC), the nibbles vpermps indexes, no transpose in the loop.
// Without AVX-512 the op's composite form runs (bitcompile/ops.py: the weight dequantized, then at::conv2d).
constexpr int64_t kConvLutPixels = 4;  // output pixels a tile: they share the weight vector and its shifts

// The taps `taps` (tap t at tap_offsets[t] floats of a pixel's tables, at words t * words of the lanes) of MR pixels.
template <int MR>
inline void conv_lut_tile(const float* const* pixel_tables, const int64_t* tap_offsets, const int32_t* taps,
                          int64_t tap_count, int64_t words, const int32_t* lanes, float (*out)[kLutCols]) {
  __m512 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t j = 0; j < tap_count; ++j) {
    const int64_t t = taps[j];
    for (int64_t c = 0; c < words; ++c)
      lut_word<MR>(_mm512_loadu_si512(lanes + 16 * (t * words + c)), pixel_tables, tap_offsets[t] + kLutTableFloats * c,
                   acc);
  }
  for (int i = 0; i < MR; ++i) _mm512_storeu_ps(out[i], _mm512_add_ps(acc[i][0], acc[i][1]));
}

at::Tensor binary_weight_conv2d_cpu(const at::Tensor& x, const at::Tensor& w_packed, int64_t in_channels,
                                    at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                                    at::IntArrayRef dilation, const std::optional<at::Tensor>& scale,
                                    const std::optional<at::Tensor>& bias) {
  const ConvGeometry g = check_binary_weight_conv2d(x, w_packed, in_channels, kernel_size, stride, padding, dilation,
                                                    scale, bias);
  const at::MemoryFormat memory_format = x.suggest_memory_format();
  const int64_t words = packed_words(g.channels), taps = g.kernel_h * g.kernel_w;
  if (4 * g.channels < 3 * 32 * words) {
    // Mostly padding in each word (a 3-channel stem): the lookups cost as for 32 channels, and oneDNN's dense conv
    // on the dequantized weight is faster. B = 8, 56x56 -> 64: C = 8 0.45x, 16 0.8x, 24 1.1-1.2x, 48 ~1.0x the
    // dense conv; 4 x 3 x 224^2, 7x7 stride 2: 0.11x.
    const at::Tensor shifts = at::arange(32, w_packed.options());
    const at::Tensor bits = w_packed.unsqueeze(-1).bitwise_right_shift(shifts).bitwise_and(1).flatten(-2);
    at::Tensor weight = bits.narrow(-1, 0, g.channels).permute({0, 3, 1, 2}).to(at::kFloat).mul(2).sub(1);
    if (scale.has_value()) weight = weight.mul(as_float_vector(*scale).view({-1, 1, 1, 1}));
    at::Tensor y = at::conv2d(x.to(at::kFloat), weight.contiguous(memory_format), std::nullopt, stride, padding,
                              dilation);
    if (bias.has_value()) y.add_(as_float_vector(*bias).view({1, -1, 1, 1}));
    return y.to(x.scalar_type()).contiguous(memory_format);
  }
  at::Tensor result = at::empty({g.batch, g.out_height, g.out_width, g.out_channels}, x.options().dtype(at::kFloat));
  if (result.numel() > 0) {
    const int64_t out_blocks = (g.out_channels + kLutCols - 1) / kLutCols;
    // x as NHWC fp32 with the channels zero padded to whole words (a copy into zeros: constant_pad_nd of the
    // permuted x took 5 ms at B = 8, C = 48, 56x56, twice the conv).
    at::Tensor pixels;
    if (memory_format == at::MemoryFormat::ChannelsLast) {
      pixels = x.permute({0, 2, 3, 1}).to(at::kFloat).contiguous();
    } else {  // NCHW planes transposed (ATen's copy: the conv 7048 -> 6098 us at B = 8, C = 128, 28x28, 2 threads)
      const at::Tensor planes = x.to(at::kFloat).contiguous();
      pixels = at::empty({g.batch, g.height, g.width, g.channels}, planes.options());
      transpose_batched(planes.data_ptr<float>(), pixels.data_ptr<float>(), g.batch, g.channels, g.height * g.width);
    }
    if (32 * words != g.channels) {
      at::Tensor padded = at::zeros({g.batch, g.height, g.width, 32 * words}, pixels.options());
      padded.narrow(3, 0, g.channels).copy_(pixels);
      pixels = padded;
    }
    // lanes[ob][t][c][j]: weight panels of 16 outputs, binary_conv2d's layout in AVX-512 builds.
    const at::Tensor weight = w_packed.contiguous();
    const at::Tensor lanes_tensor =
        conv_panels<kLutCols, 1>(words_of(weight), taps * words, g.out_channels, taps * words);
    const int32_t* lanes = lanes_tensor.data_ptr<int32_t>();
    const Epilogue epilogue(scale, bias);
    // One image's tables at a time, in the image grown by the padding.
    const int64_t grown_h = g.height + 2 * g.pad_h, grown_w = g.width + 2 * g.pad_w;
    const int64_t pixel_floats = kLutTableFloats * words;
    at::Tensor tables_tensor = at::zeros({grown_h, grown_w, pixel_floats}, pixels.options());
    float* tables = tables_tensor.data_ptr<float>();
    std::vector<int64_t> tap_offsets(taps);
    for (int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (int64_t kw = 0; kw < g.kernel_w; ++kw)
        tap_offsets[kh * g.kernel_w + kw] = (kh * g.dilation_h * grown_w + kw * g.dilation_w) * pixel_floats;
    // binary_conv2d's boxes: each output pixel loops over its valid taps only (padded taps read zeros).
    const std::vector<ConvBox> boxes = conv_boxes(g, /*zero_padding=*/true);
    const float* x_data = pixels.data_ptr<float>();
    float* y = result.data_ptr<float>();
    for (int64_t b = 0; b < g.batch; ++b) {
      at::parallel_for(0, g.height, 1, [&](int64_t h0, int64_t h1) {
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t wi = 0; wi < g.width; ++wi)
            build_sign_tables(x_data + ((b * g.height + h) * g.width + wi) * 32 * words, words,
                              tables + ((h + g.pad_h) * grown_w + wi + g.pad_w) * pixel_floats);
      });
      // Blocks of one output row x 16 output channels; a weight word costs 32 multiply-adds. (10 units a word, as
      // binary_weight_linear counts, timed the same on 2 threads: B = 1-2, C = 32-256, 23.6-525 us, 2026-12-05.)
      const int64_t blocks = g.out_height * out_blocks;
      const int64_t work = std::max<int64_t>(1, g.out_width * kLutCols * taps * words * 6);
      at::parallel_for(0, blocks, std::max<int64_t>(1, kMinParallelWork / work), [&](int64_t begin, int64_t end) {
        for (int64_t block = begin; block < end; ++block) {
          const int64_t oh = block / out_blocks, ob = block % out_blocks;
          const int32_t* block_lanes = lanes + ob * taps * words * kLutCols;
          const int64_t oc0 = ob * kLutCols, cols = std::min<int64_t>(kLutCols, g.out_channels - oc0);
          const float* row_tables = tables + oh * g.stride_h * grown_w * pixel_floats;
          for (const ConvBox& box : boxes) {
            if (oh < box.h0 || oh >= box.h1) continue;
            const int32_t* box_taps = box.taps.data();
            const int64_t count = int64_t(box.taps.size());
            for (int64_t ow = box.w0; ow < box.w1;) {
              const int64_t tile = box.w1 - ow >= kConvLutPixels ? kConvLutPixels : box.w1 - ow >= 2 ? 2 : 1;
              const float* pixel_tables[kConvLutPixels];
              for (int64_t i = 0; i < tile; ++i) pixel_tables[i] = row_tables + (ow + i) * g.stride_w * pixel_floats;
              float acc[kConvLutPixels][kLutCols];
              if (tile == kConvLutPixels)
                conv_lut_tile<kConvLutPixels>(pixel_tables, tap_offsets.data(), box_taps, count, words, block_lanes,
                                              acc);
              else if (tile == 2)
                conv_lut_tile<2>(pixel_tables, tap_offsets.data(), box_taps, count, words, block_lanes, acc);
              else
                conv_lut_tile<1>(pixel_tables, tap_offsets.data(), box_taps, count, words, block_lanes, acc);
              for (int64_t i = 0; i < tile; ++i) {
                float* out = y + ((b * g.out_height + oh) * g.out_width + ow + i) * g.out_channels + oc0;
                for (int64_t j = 0; j < cols; ++j) out[j] = epilogue.apply(acc[i][j], 0, oc0 + j);
              }
              ow += tile;
            }
          }
        }
      });
    }
  }
  if (memory_format == at::MemoryFormat::ChannelsLast || result.numel() == 0)
    return result.permute({0, 3, 1, 2}).to(x.scalar_type()).contiguous(memory_format);
  at::Tensor planes = at::empty({g.batch, g.out_channels, g.out_height, g.out_width}, result.options());
  transpose_batched(result.data_ptr<float>(), planes.data_ptr<float>(), g.batch, g.out_height * g.out_width,
                    g.out_channels);
  return planes.to(x.scalar_type());
}
#endif

}  // namespace
}  // namespace bitcompile

TORCH_LIBRARY_IMPL(bitcompile, CPU, m) {
  m.impl("pack_signs", &bitcompile::pack_signs_cpu);
  m.impl("binary_linear", &bitcompile::binary_linear_cpu);
  m.impl("binary_weight_linear", &bitcompile::binary_weight_linear_cpu);
  m.impl("binary_conv2d", &bitcompile::binary_conv2d_cpu);
  m.impl("binary_conv2d_packed", &bitcompile::binary_conv2d_packed_cpu);
  m.impl("binary_conv2d_packed_with_signs", &bitcompile::binary_conv2d_packed_with_signs_cpu);
#if defined(__AVX512F__)
  m.impl("binary_weight_conv2d", &bitcompile::binary_weight_conv2d_cpu);
#endif
}

// The weight ops' memo (weight_memo.h), if no library loaded before this one registered it.
static const bitcompile::WeightMemoRegistration weight_memo_registration;

// No gradient, and no Python on the way to the kernel (inference_autograd.h).
TORCH_LIBRARY_IMPL(bitcompile, AutogradCPU, m) {
  bitcompile::register_inference_autograd(
      m, {"pack_signs", "binary_linear", "binary_weight_linear", "binary_conv2d", "binary_conv2d_packed",
          "binary_conv2d_packed_with_signs", "binary_weight_conv2d"});
  // The backend's weight ops (bitcompile/weight_ops.py: a Python kernel below autograd) take the same C++ Autograd
  // kernel: their Python one (torch.library.register_autograd) cost more host time a call than a small conv's GPU
  // time (H200 machine: packed_conv2d_of_weight 61.8 us a call against binary_conv2d_packed's 22.7; the binary
  // ResNet-18 forward was host-bound). The computed-weight ops keep the Python one.
  bitcompile::register_inference_autograd(
      m, {"linear_of_weight", "conv2d_of_weight", "packed_conv2d_of_weight", "packed_conv2d_of_weight_with_signs",
          "packed_linear_group"});
}
