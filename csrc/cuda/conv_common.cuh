// The binary conv kernels' shared parts: the one- and two-plane forms' math (below), the prologue's per-row values,
// D_t, the epilogue (staged stores, residuals, sign words) and the cp.async / ldmatrix helpers, for the kernels'
// files: binary_conv2d.cu (dispatch, the two-plane mma kernel, the D_t table kernel), binary_conv2d_pipelined.cu,
// binary_conv2d_halo.cu and binary_conv2d_wgmma.cu. Torch-free.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <type_traits>

#include "mma_b1.cuh"
#include "wgmma_common.cuh"

namespace bitcompile {
namespace cuda {
namespace conv {

// Rows = output pixels (batch, oh, ow), columns = output channels, K = taps x channel words (the
// w_packed layout). Two activation bit planes per row, gathered from the per-pixel packed words:
//   P = bit(s(x) = +1), N = bit(s(x) = -1) at in-bounds taps (N = ~P & real channels without sign_zero);
//   a padded tap is P = real channels (pad_value +1), N = real channels (-1), or neither (0).
// Then s(x).s(w) = sum_P s(w) - sum_N s(w) = (2 popc(P & B) - popc(P)) - (2 popc(N & B) - popc(N)),
// exact for any B tail bits since P and N are 0 outside real channels. Two mma.sync m16n8k256 AND.POPC
// accumulators a tile (P.B and N.B), row popcounts of P and N from the very fragments, as the binary_linear
// kernel (same fragment layout, same 24-word padded shared rows, next stage prefetched in registers).
// One plane (the pipelined kernel; s(x) in {-1, +1}, at most kOnePlaneMaxTaps taps): only P, 0 at padded taps,
// one accumulator.
// At an in-bounds tap N = ~P over the C real channels, so with pb_t = popc(B_t) over real channels and
// D_t = C - 2 pb_t (= -sum_c s(w)):  sum_c s(x) s(w) = 4 popc(P & B_t) - 2 popc(P) + D_t, and a padded tap
// gives pad_value * (-D_t). The block tabulates D_t of its columns or copies them from a table made once a
// launch (the 128 x 64 three-block build); a row takes their sum over all taps less
// the padded ones (none for interior pixels). Half the MMAs and accumulators of the two-plane form.
// The kernels end in conv_epilogue: per-row and per-column values read once, no division, the output tile
// staged in shared memory and stored in coalesced vectors of up to 16 bytes (sign words: from the registers).
constexpr int kOnePlaneMaxTaps = 32;

// ---- Shared by the two kernels: the prologue's per-row values, the D_t table, the epilogue ----

// Output pixel p as (image, position in its image, oh, ow): 32-bit divisions where the pixel count allows (a
// uniform branch), int64 ones (a software routine) beyond.
struct OutPixel {
  int64_t image, position;
  int oh, ow;
};
__device__ __forceinline__ OutPixel split_out_pixel(int64_t p, int64_t total_pixels, int64_t out_plane,
                                                    int64_t out_width) {
  OutPixel px;
  if (total_pixels <= UINT32_MAX) {
    const uint32_t q = static_cast<uint32_t>(p);
    const uint32_t plane = static_cast<uint32_t>(out_plane);
    const uint32_t w = static_cast<uint32_t>(out_width);
    const uint32_t image = q / plane;
    const uint32_t position = q - image * plane;
    const uint32_t oh = position / w;
    px.image = image;
    px.position = position;
    px.oh = static_cast<int>(oh);
    px.ow = static_cast<int>(position - oh * w);
  } else {
    px.image = p / out_plane;
    px.position = p - px.image * out_plane;
    const int64_t oh = px.position / out_width;
    px.oh = static_cast<int>(oh);
    px.ow = static_cast<int>(px.position - oh * out_width);
  }
  return px;
}

// The taps (bit kh * kernel_w + kw, taps <= 32) of a pixel whose tap (0, 0) reads input (top, left) that fall
// inside the image: the mask of the kw inside, shifted in once per kh inside.
__device__ __forceinline__ uint32_t inside_taps(int top, int left, int kernel_h, int kernel_w, int dilation_h,
                                                int dilation_w, int height, int width) {
  uint32_t columns = 0;
  for (int kw = 0; kw < kernel_w; ++kw) {
    const int ix = left + kw * dilation_w;
    columns |= static_cast<uint32_t>(ix >= 0 && ix < width) << kw;
  }
  uint32_t inside = 0;
  for (int kh = 0; kh < kernel_h; ++kh) {
    const int iy = top + kh * dilation_h;
    if (iy >= 0 && iy < height) inside |= columns << (kh * kernel_w);
  }
  return inside;
}

// A one-plane kernel's values of output pixel p (zeros past the last pixel): the flat input pixel of its tap (0, 0)
// (taps outside the image are masked, never read), the taps inside the image, and its output offset.
struct RowPixel {
  int64_t pixel = 0, out_offset = 0;
  uint32_t inside = 0;
};
__device__ __forceinline__ RowPixel row_pixel(const ConvShape& shape, int64_t p, int64_t total_pixels,
                                              int64_t out_plane) {
  RowPixel row;
  if (p < total_pixels) {
    const OutPixel px = split_out_pixel(p, total_pixels, out_plane, shape.out_width);
    const int top = static_cast<int>(px.oh * shape.stride_h - shape.pad_h);
    const int left = static_cast<int>(px.ow * shape.stride_w - shape.pad_w);
    row.pixel = (px.image * shape.height + top) * shape.width + left;
    row.inside = inside_taps(top, left, static_cast<int>(shape.kernel_h), static_cast<int>(shape.kernel_w),
                             static_cast<int>(shape.dilation_h), static_cast<int>(shape.dilation_w),
                             static_cast<int>(shape.height), static_cast<int>(shape.width));
    row.out_offset = px.image * shape.out_channels * out_plane + px.position;
  }
  return row;
}

// Pixel offset of tap t (kh * kernel_w + kw) from tap (0, 0) in the input (NHWC, flat over N, H, W).
__device__ __forceinline__ int64_t tap_offset_pixels(const ConvShape& shape, int t) {
  const int kernel_w = static_cast<int>(shape.kernel_w);
  const int kh = t / kernel_w;
  return static_cast<int64_t>(kh) * shape.dilation_h * shape.width + (t - kh * kernel_w) * shape.dilation_w;
}
// Word offset of tap t from tap (0, 0) in the packed input.
__device__ __forceinline__ int64_t tap_offset_words(const ConvShape& shape, int t, int64_t channel_words) {
  return tap_offset_pixels(shape, t) * channel_words;
}

// One-plane D_t = C - 2 popc(B_t) over the real channels of block column c at tap_d[t * BN + c] (tap-major: the
// epilogue's lanes read neighbouring columns of one tap; t, c by a shift, no division), 0 past the last output
// channel, by kThreads threads (tid < kThreads); unless all_taps_d is null, also all_taps_d[c] += D_t by shared
// atomics (zeroed by the caller before a barrier; read after the main loop's barriers). VW = 4: 16-byte loads
// (channel_words % 4 == 0 and w_bits 16-byte aligned). A thread takes kBatch (tap, column) entries at a time, all
// their loads of a channel word in flight before the first is counted.
// (One entry at a time, as before, was a chain of dependent round trips: B = 1 C = 256 14x14, 288 entries on 64
// threads, ncu on the H200: 14% of the conv kernel's stall samples on the first count's load.)
template <int BN, int kThreads, int VW, int kBatch>
__device__ __forceinline__ void tabulate_tap_d(int* tap_d, int* all_taps_d, const uint32_t* __restrict__ w_bits,
                                               int64_t n0, int64_t n_rows, int reduction_words, int channel_words,
                                               int channels, int taps, int tid) {
  static_assert((BN & (BN - 1)) == 0, "tap and column by shift and mask");
  static_assert(VW == 1 || VW == 4, "4- or 16-byte loads");
  using Vec = typename std::conditional<VW == 4, uint4, uint32_t>::type;
  const int tail = channels - (channel_words - 1) * 32;  // real channels in the last word, 1..32
  const uint32_t last_bits = tail >= 32 ? 0xffffffffu : (1u << tail) - 1u;
  const int entries = BN * taps;
  for (int e0 = tid; e0 < entries; e0 += kThreads * kBatch) {
    int count[kBatch];
    bool live[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int e = e0 + b * kThreads;
      live[b] = e < entries && n0 + static_cast<int>(static_cast<unsigned>(e) % BN) < n_rows;
      count[b] = 0;
    }
    for (int cw = 0; cw < channel_words; cw += VW) {
      Vec v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int e = e0 + b * kThreads;
        const int t = static_cast<unsigned>(e) / BN;
        const int c = static_cast<unsigned>(e) % BN;
        const uint32_t* word = w_bits + (n0 + c) * reduction_words + t * channel_words + cw;
        if constexpr (VW == 4) {
          v[b] = live[b] ? __ldg(reinterpret_cast<const uint4*>(word)) : make_uint4(0, 0, 0, 0);
        } else {
          v[b] = live[b] ? __ldg(word) : 0u;
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if constexpr (VW == 4) {
          if (cw + 4 == channel_words) v[b].w &= last_bits;
          count[b] += __popc(v[b].x) + __popc(v[b].y) + __popc(v[b].z) + __popc(v[b].w);
        } else {
          count[b] += __popc(cw + 1 == channel_words ? v[b] & last_bits : v[b]);
        }
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int e = e0 + b * kThreads;
      if (e < entries) {
        const int d = live[b] ? channels - 2 * count[b] : 0;
        if (all_taps_d != nullptr && live[b]) atomicAdd(&all_taps_d[static_cast<unsigned>(e) % BN], d);
        tap_d[e] = d;  // e = t * BN + c
      }
    }
  }
}

// A conv launch's counts for BM x BN tiles, a block a tile; fits: they are within the kernels' 32-bit indexing (the
// block index, K words, pixel offsets).
struct ConvGrid {
  int64_t total_pixels, channel_words, reduction_words, m_tiles, blocks;
  bool fits;
};
inline ConvGrid conv_grid(const ConvShape& shape, int64_t bm, int64_t bn) {
  ConvGrid grid;
  grid.total_pixels = shape.batch * shape.out_height * shape.out_width;
  grid.channel_words = ceil_div(shape.channels, 32);
  grid.reduction_words = shape.kernel_h * shape.kernel_w * grid.channel_words;
  grid.m_tiles = ceil_div(grid.total_pixels, bm);
  grid.blocks = grid.m_tiles * ceil_div(shape.out_channels, bn);
  grid.fits = grid.blocks <= INT_MAX && grid.reduction_words <= INT_MAX / 2 && shape.height <= INT_MAX / 4 &&
              shape.width <= INT_MAX / 4;
  return grid;
}

// conv_tap_table_kernel's launch (binary_conv2d.cu; dependent on the launch before it where `dependent`): the D_t
// table of the whole weight, read by the pipelined kernel's 128 x 64 three-block build, the halo and wgmma kernels.
cudaError_t launch_conv_tap_table(const uint32_t* w_bits, const ConvShape& shape, int* table, bool dependent,
                                  bool weights_ready, cudaStream_t stream);

// What an absent scale / row factor (1) and bias (0) read.
static __device__ const float kEpilogueUnit[2] = {1.f, 0.f};  // one a file

// The epilogue's output tile in shared memory (the main loop's tiles, reused), so that the global stores are
// coalesced. channels_last: BM rows of BN channels, + 8 so that the pair stores of a warp (rows g, columns
// 2t..2t+1) hit distinct banks; NCHW: BN channels of BM pixels, + 16 bytes (scalar stores of a warp on distinct
// banks). Lines stay 16-byte aligned.
template <int BM, int BN, typename OutT>
struct ConvStaging {
  static constexpr int kRowStride = BN + 8;
  static constexpr int kColumnStride = BM + 16 / static_cast<int>(sizeof(OutT));
  static constexpr int kElements = BM * kRowStride > BN * kColumnStride ? BM * kRowStride : BN * kColumnStride;
  static constexpr int kBytes = kElements * static_cast<int>(sizeof(OutT));
  static_assert(kRowStride * sizeof(OutT) % 16 == 0 && kColumnStride * sizeof(OutT) % 16 == 0, "aligned lines");
};

// The sign-word output (launch_binary_conv2d_signs), a tag for the kernels' OutT: bit c % 32 of word c / 32 of an
// output pixel is 1 where the fp32 value of channel c is >= 0 (words [pixels, ceil(OC / 32)], bits past OC 0). The
// epilogues compute the values as for fp32 output and keep their signs, from the registers (nothing staged).
struct SignWords {};
template <int BM, int BN, typename OutT>
struct ConvStagingBytes {
  static constexpr int value = ConvStaging<BM, BN, OutT>::kBytes;
};
template <int BM, int BN>
struct ConvStagingBytes<BM, BN, SignWords> {
  static constexpr int value = 0;
};

// Two outputs of neighbouring columns, converted together (fp16 / bf16: one packed conversion, each value rounded
// as from_float rounds it).
template <typename OutT>
struct OutPair;
template <>
struct OutPair<float> {
  using type = float2;
  static __device__ __forceinline__ type make(float a, float b) { return make_float2(a, b); }
  static __device__ __forceinline__ float low(type v) { return v.x; }
  static __device__ __forceinline__ float high(type v) { return v.y; }
};
template <>
struct OutPair<__half> {
  using type = __half2;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2half2_rn(a, b); }
  static __device__ __forceinline__ __half low(type v) { return __low2half(v); }
  static __device__ __forceinline__ __half high(type v) { return __high2half(v); }
};
template <>
struct OutPair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2bfloat162_rn(a, b); }
  static __device__ __forceinline__ __nv_bfloat16 low(type v) { return __low2bfloat16(v); }
  static __device__ __forceinline__ __nv_bfloat16 high(type v) { return __high2bfloat16(v); }
};
template <int BYTES>
struct VecOf;
template <>
struct VecOf<16> {
  using type = uint4;
};
template <>
struct VecOf<8> {
  using type = uint2;
};
template <>
struct VecOf<4> {
  using type = uint32_t;
};
template <>
struct VecOf<2> {
  using type = uint16_t;
};

// v plus rv (V elements of OutT each), each sum rounded once to OutT from the fp32 sum of the two rounded values
// (eager's add of two OutT tensors). fp16 / bf16 pairs add by __hadd2, the exact sum rounded once: the same values,
// since fp32 carries 24 >= 2 * 11 + 2 significand bits (rounding the exact sum to fp32 first never changes its
// rounding to fp16 or bf16).
template <typename OutT, typename Vec>
__device__ __forceinline__ Vec add_residual(Vec v, Vec rv) {
  constexpr int kCount = static_cast<int>(sizeof(Vec) / sizeof(OutT));
  if constexpr (sizeof(OutT) == 2 && kCount % 2 == 0) {
    using Pair = typename OutPair<OutT>::type;
    Pair a[kCount / 2], b[kCount / 2];
    memcpy(a, &v, sizeof(Vec));
    memcpy(b, &rv, sizeof(Vec));
#pragma unroll
    for (int i = 0; i < kCount / 2; ++i) a[i] = __hadd2(a[i], b[i]);
    memcpy(&v, a, sizeof(Vec));
  } else {
    OutT a[kCount], b[kCount];
    memcpy(a, &v, sizeof(Vec));
    memcpy(b, &rv, sizeof(Vec));
#pragma unroll
    for (int i = 0; i < kCount; ++i) a[i] = from_float<OutT>(to_float(a[i]) + to_float(b[i]));
    memcpy(&v, a, sizeof(Vec));
  }
  return v;
}

// Bit e of the result: element e of v (V elements of OutT) is >= 0 (NaN: 0; -0: 1), as the fp32 compare of the
// element; fp16 / bf16 pairs by __hge2_mask.
template <typename OutT, typename Vec>
__device__ __forceinline__ uint32_t nonnegative_bits(Vec v) {
  constexpr int kCount = static_cast<int>(sizeof(Vec) / sizeof(OutT));
  uint32_t bits = 0;
  if constexpr (sizeof(OutT) == 2 && kCount % 2 == 0) {
    using Pair = typename OutPair<OutT>::type;
    Pair a[kCount / 2];
    memcpy(a, &v, sizeof(Vec));
    const Pair zero = OutPair<OutT>::make(0.f, 0.f);
#pragma unroll
    for (int i = 0; i < kCount / 2; ++i) {
      const uint32_t mask = __hge2_mask(a[i], zero);  // 0xffff per true half
      bits |= ((mask & 1u) | ((mask >> 15) & 2u)) << (2 * i);
    }
  } else {
    OutT a[kCount];
    memcpy(a, &v, sizeof(Vec));
#pragma unroll
    for (int e = 0; e < kCount; ++e) bits |= static_cast<uint32_t>(to_float(a[e]) >= 0.f) << e;
  }
  return bits;
}

// Copies the staged tile out in vectors of V elements along its lines (channels_last: rows, contiguous channels;
// NCHW: channels, contiguous pixels of one image), V dividing the line's global stride and the output's
// alignment. A thread's vector sits at the same place of every line it copies (kThreads is a multiple of the
// vectors per line), so its NCHW row offset is read once.
template <bool CHANNELS_LAST, int V, int BM, int BN, int kThreads, typename OutT>
__device__ __forceinline__ void store_staged(const OutT* stage, OutT* __restrict__ out, const int64_t* row_out,
                                             int64_t m0, int64_t n0, int64_t n_rows, int64_t out_plane,
                                             int rows_valid, int cols_valid, int tid,
                                             const OutT* __restrict__ residual, uint32_t* __restrict__ out_signs) {
  using Staging = ConvStaging<BM, BN, OutT>;
  using Vec = typename VecOf<V * static_cast<int>(sizeof(OutT))>::type;
  constexpr int kLines = CHANNELS_LAST ? BM : BN;
  constexpr int kLineLength = CHANNELS_LAST ? BN : BM;
  constexpr int kStride = CHANNELS_LAST ? Staging::kRowStride : Staging::kColumnStride;
  constexpr int kVecsPerLine = kLineLength / V;
  static_assert(kThreads % kVecsPerLine == 0 && kLines % (kThreads / kVecsPerLine) == 0, "whole lines per pass");
  constexpr int kLineStep = kThreads / kVecsPerLine;
  const int first = (tid % kVecsPerLine) * V;  // element of the line
  // (with sign words, every thread of a word that has valid columns goes on: the word's shuffles)
  if ((out_signs != nullptr ? first & ~31 : first) >= (CHANNELS_LAST ? cols_valid : rows_valid)) return;
  const int lines = CHANNELS_LAST ? rows_valid : cols_valid;
  int line = tid / kVecsPerLine;
  const OutT* src = stage + line * kStride + first;
  // channels_last: element (row m0 + line, channel n0 + first); NCHW: (row m0 + first, channel n0 + line)
  OutT* dst = CHANNELS_LAST ? out + (m0 + line) * n_rows + n0 + first : out + row_out[first] + (n0 + line) * out_plane;
  const int64_t dst_step = kLineStep * (CHANNELS_LAST ? n_rows : out_plane);
  constexpr int kPasses = kLines / kLineStep;
  if (residual == nullptr && out_signs == nullptr) {
#pragma unroll(kPasses <= 4 ? kPasses : 2)
    for (int i = 0; i < kPasses; ++i) {
      if (line >= lines) break;
      *reinterpret_cast<Vec*>(dst) = *reinterpret_cast<const Vec*>(src);
      line += kLineStep;
      src += kLineStep * kStride;
      dst += dst_step;
    }
    return;
  }
  // channels_last with a residual or sign words: a line a trip (unrolled, the 128 x 64 tile's fp32 form spilled at
  // its 80 registers). A sign word's 32 columns are kGroup consecutive threads of one line (kVecsPerLine is a
  // multiple of kGroup), whose bits are OR-ed by shuffles; a thread past cols_valid in a word with valid columns
  // takes part with no bits and no stores.
  constexpr int kGroup = 32 / V;
  const bool stores = first < cols_valid;
  const int64_t words_per_pixel = (n_rows + 31) / 32;
  uint32_t* words = out_signs == nullptr ? nullptr : out_signs + (m0 + line) * words_per_pixel + ((n0 + first) >> 5);
  const uint32_t group_mask = kGroup == 32 ? 0xffffffffu : ((1u << kGroup) - 1u) << ((tid & 31) & ~(kGroup - 1));
  // the thread's elements < cols_valid (bits of nonnegative_bits)
  const int valid_count = cols_valid - first;
  const uint32_t valid =
      valid_count >= V ? (V == 32 ? ~0u : (1u << V) - 1u) : valid_count > 0 ? (1u << valid_count) - 1u : 0u;
  int64_t offset = dst - out;
  // the residual's vector of the next line read one trip ahead (its latency under this trip's work)
  const bool reads = residual != nullptr && stores;
  Vec next_rv{};
  if (reads && line < lines) next_rv = *reinterpret_cast<const Vec*>(residual + offset);
#pragma unroll 1
  for (; line < lines; line += kLineStep) {
    Vec v = *reinterpret_cast<const Vec*>(src);
    if (stores) {
      if (residual != nullptr) {
        const Vec rv = next_rv;
        if (line + kLineStep < lines) next_rv = *reinterpret_cast<const Vec*>(residual + offset + dst_step);
        v = add_residual<OutT>(v, rv);
      }
      *reinterpret_cast<Vec*>(out + offset) = v;
    }
    if (words != nullptr) {
      uint32_t bits = (nonnegative_bits<OutT>(v) & valid) << (first & 31);
#pragma unroll
      for (int step = 1; step < kGroup; step <<= 1) bits |= __shfl_xor_sync(group_mask, bits, step);
      if ((first & 31) == 0) *words = bits;
      words += kLineStep * words_per_pixel;
    }
    src += kLineStep * kStride;
    offset += dst_step;
  }
}
template <bool CHANNELS_LAST, int V, int BM, int BN, int kThreads, typename OutT>
__device__ __forceinline__ void store_staged_as(int vec, const OutT* stage, OutT* __restrict__ out,
                                                const int64_t* row_out, int64_t m0, int64_t n0, int64_t n_rows,
                                                int64_t out_plane, int rows_valid, int cols_valid, int tid,
                                                const OutT* __restrict__ residual, uint32_t* __restrict__ out_signs) {
  if constexpr (V > 1) {
    if (vec < V) {
      store_staged_as<CHANNELS_LAST, V / 2, BM, BN, kThreads>(vec, stage, out, row_out, m0, n0, n_rows, out_plane,
                                                              rows_valid, cols_valid, tid, residual, out_signs);
      return;
    }
  }
  store_staged<CHANNELS_LAST, V, BM, BN, kThreads>(stage, out, row_out, m0, n0, n_rows, out_plane, rows_valid,
                                                   cols_valid, tid, residual, out_signs);
}

// The epilogue of both kernels, its values: this thread's MT x NT mma tiles (rows warp_row + 16 mt + g + 8h, columns
// warp_col + 8 nt + 2t + e, at dot[mt][nt][2h + e]) as fp32 outputs. dot holds the part of the integer
// dot known per row (one-plane: 4 popc(P & B) - 2 popc(P); two-plane: all of it); the one-plane form adds
// sum_in D_t - pad_value * sum_padded D_t, visiting only the padded taps (none for interior pixels). Then
// y = dot * row_factor * scale + bias (epilogue_value, fp32). Per-column values are read once, per-row ones once
// per row; no division. row_inside: bit t for the taps inside the image (one-plane).
// emit(row, y) takes the fp32 values y[nt][e] of one row of the thread (tile row `row`, columns lane_col + 8 nt + e);
// it is called for every (mt, h) in the same order by all lanes (rows past rows_valid included), so it may shuffle.
template <int BN, int MT, int NT, bool ONE_PLANE, typename Emit>
__device__ __forceinline__ void conv_epilogue_values(const int (&dot)[MT][NT][4], int warp_row, int warp_col,
                                                     int lane, const uint32_t* row_inside, const int* tap_d,
                                                     const int* all_taps_d, int taps, int pad_value, int64_t m0,
                                                     int64_t n0, int rows_valid, int cols_valid, const Epilogue& ep,
                                                     Emit&& emit) {
  const int group = lane >> 2;
  const int lane_col = warp_col + 2 * (lane & 3);  // column of (nt, e): lane_col + 8 nt + e
  // Absent epilogue vectors read kEpilogueUnit with a zero step: loads without null checks, the same values as
  // column_scale / column_bias / row_factor.
  const bool has_scale = ep.scale != nullptr, has_bias = ep.bias != nullptr, has_factor = ep.row_factor != nullptr;
  const int scale_step = has_scale && ep.scale_count != 1 ? 1 : 0;
  const float* scale = has_scale ? ep.scale + n0 * scale_step : &kEpilogueUnit[0];
  const float* bias = has_bias ? ep.bias + n0 : &kEpilogueUnit[1];
  const float* factors = has_factor ? ep.row_factor + m0 : &kEpilogueUnit[0];
  float col_scale[NT][2], col_bias[NT][2];
  int col_all_d[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = lane_col + nt * 8 + e;
      const bool valid = col < cols_valid;
      col_scale[nt][e] = valid ? scale[col * scale_step] : 0.f;
      col_bias[nt][e] = valid ? bias[has_bias ? col : 0] : 0.f;
      col_all_d[nt][e] = ONE_PLANE ? all_taps_d[col] : 0;
    }
  }
  // Per row: the factor and the padded taps (none past the last output pixel).
  const uint32_t all_taps = taps >= 32 ? 0xffffffffu : (1u << taps) - 1u;
  float factor[MT][2];
  uint32_t padded[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row + mt * 16 + group + 8 * h;
      const bool valid = row < rows_valid;
      factor[mt][h] = valid ? factors[has_factor ? row : 0] : 0.f;
      padded[mt][h] = ONE_PLANE && valid ? ~row_inside[row] & all_taps : 0u;
    }
  }
  // sum_in D_t - pad_value * sum_padded D_t = all_taps_d - (1 + pad_value) * sum_padded D_t (integers: exact)
  const int padded_weight = 1 + pad_value;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row + mt * 16 + group + 8 * h;
      int value[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        value[nt][0] = dot[mt][nt][2 * h] + col_all_d[nt][0];
        value[nt][1] = dot[mt][nt][2 * h + 1] + col_all_d[nt][1];
      }
      if (ONE_PLANE) {
        for (uint32_t left = padded[mt][h]; left != 0; left &= left - 1) {
          const int* d = tap_d + (__ffs(left) - 1) * BN + lane_col;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            value[nt][0] -= padded_weight * d[nt * 8];
            value[nt][1] -= padded_weight * d[nt * 8 + 1];
          }
        }
      }
      float y[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          y[nt][e] = epilogue_value(static_cast<float>(value[nt][e]), factor[mt][h], col_scale[nt][e], col_bias[nt][e]);
        }
      }
      emit(row, y);
    }
  }
}

// Part 1 for a float output: the values into the staged output tile (channels_last: rows of BN channels; NCHW:
// columns of BM pixels). values(emit) calls emit(row, y) as conv_epilogue_values does (y: fp32 y[NT][2] of columns
// lane_col + 8 nt + e). `stage` must be free (a barrier after the main loop's last read of it), or with
// residual_staged (channels_last) hold the residual's tile, to which the rounded values are added (add_residual).
template <int BM, int BN, int NT, typename OutT, typename Values>
__device__ __forceinline__ void conv_epilogue_stage(Values&& values, int warp_col, int lane, bool out_channels_last,
                                                    OutT* stage, bool residual_staged) {
  using Staging = ConvStaging<BM, BN, OutT>;
  using Pair = OutPair<OutT>;
  const int lane_col = warp_col + 2 * (lane & 3);
  values([&](int row, const float (&y)[NT][2]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      typename Pair::type v = Pair::make(y[nt][0], y[nt][1]);
      const int col = lane_col + nt * 8;
      if (out_channels_last) {
        auto* const place = reinterpret_cast<typename Pair::type*>(&stage[row * Staging::kRowStride + col]);
        if (residual_staged) v = add_residual<OutT>(v, *place);
        *place = v;
      } else {
        stage[col * Staging::kColumnStride + row] = Pair::low(v);
        stage[(col + 1) * Staging::kColumnStride + row] = Pair::high(v);
      }
    }
  });
}

// The epilogue of both kernels, part 2 (after a barrier): the staged tile out in the widest vectors (up to 16
// bytes) that divide the line's global stride (channels_last: out_channels; NCHW: out_plane) and the output's
// alignment (and the residual's, read with the same vectors: channels_last outputs only). row_out: the NCHW offset
// of row r's channel 0 (image * out_channels * out_plane + position).
template <int BM, int BN, int kThreads, typename OutT>
__device__ __forceinline__ void conv_epilogue_store(const OutT* stage, OutT* __restrict__ out, const int64_t* row_out,
                                                    int64_t m0, int64_t n0, int64_t n_rows, int64_t out_plane,
                                                    int rows_valid, int cols_valid, bool out_channels_last, int tid,
                                                    const Epilogue& ep) {
  constexpr int kMaxVec = 16 / static_cast<int>(sizeof(OutT));
  const int64_t line_stride = out_channels_last ? n_rows : out_plane;
  const OutT* const residual = static_cast<const OutT*>(ep.residual);
  const uintptr_t address = reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(residual);
  int vec = kMaxVec;
  while (vec > 1 && ((line_stride & (vec - 1)) != 0 || (address & (vec * sizeof(OutT) - 1)) != 0)) vec >>= 1;
  if (out_channels_last) {
    store_staged_as<true, kMaxVec, BM, BN, kThreads>(vec, stage, out, row_out, m0, n0, n_rows, out_plane, rows_valid,
                                                     cols_valid, tid, residual, ep.out_signs);
  } else {
    store_staged_as<false, kMaxVec, BM, BN, kThreads>(vec, stage, out, row_out, m0, n0, n_rows, out_plane, rows_valid,
                                                      cols_valid, tid, static_cast<const OutT*>(nullptr), nullptr);
  }
}

// Part 1 and 2 for sign words, from the registers (no staging, no barrier): a warp's 32 columns (NT = 4) are one
// word of each of its rows; a lane's bits of a row (columns 8 nt + 2 (lane & 3) + e: the signs of y[nt][e], fp32 values
// or integers whose sign is the value's) are OR-ed over the 4 lanes of its group by two shuffles and the group's first
// lane stores the word. Columns past cols_valid give 0 bits.
template <int NT, typename Values>
__device__ __forceinline__ void conv_epilogue_sign_words(Values&& values, int warp_col, int lane, int64_t m0,
                                                         int64_t n0, int64_t n_rows, int rows_valid, int cols_valid,
                                                         uint32_t* __restrict__ out) {
  static_assert(NT == 4, "a warp's columns are one sign word");
  const int words_per_pixel = static_cast<int>((n_rows + 31) / 32);
  uint32_t* const words = out + m0 * words_per_pixel + (n0 >> 5) + (warp_col >> 5);
  const int first_col = warp_col + 2 * (lane & 3);  // tile column of y[0][0]
  uint32_t valid = 0;  // this lane's bits of the word whose columns are < cols_valid
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) valid |= static_cast<uint32_t>(first_col + 8 * nt + e < cols_valid) << (8 * nt + e);
  }
  valid <<= 2 * (lane & 3);
  const bool store = (lane & 3) == 0 && warp_col < cols_valid;
  values([&](int row, const auto& y) {
    uint32_t bits = 0;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) bits |= static_cast<uint32_t>(y[nt][e] >= 0) << (8 * nt + e);
    }
    bits = (bits << 2 * (lane & 3)) & valid;
    bits |= __shfl_xor_sync(kFullMask, bits, 1);
    bits |= __shfl_xor_sync(kFullMask, bits, 2);
    if (store && row < rows_valid) words[row * words_per_pixel] = bits;
  });
}

// Both parts, for the block's tile at (m0, n0) with rows_valid x cols_valid outputs: values(emit) as in
// conv_epilogue_stage (sign words: conv_epilogue_sign_words), the staged tile in `stage` (free, or the residual's tile
// with residual_staged: see conv_epilogue_stage; then ep.residual is not read again). A thread with has_values false
// gives no values (values not called) and takes its part in the barrier and the stores.
template <int BM, int BN, int kThreads, int NT, typename OutT, typename Values>
__device__ __forceinline__ void conv_epilogue(Values&& values, int warp_col, int lane, int tid, const int64_t* row_out,
                                              int64_t m0, int64_t n0, int rows_valid, int cols_valid, int64_t n_rows,
                                              int64_t out_plane, const Epilogue& ep, OutT* __restrict__ out,
                                              bool out_channels_last, OutT* stage, bool has_values = true,
                                              bool residual_staged = false) {
  if constexpr (std::is_same_v<OutT, SignWords>) {
    if (!has_values) return;
    conv_epilogue_sign_words<NT>(values, warp_col, lane, m0, n0, n_rows, rows_valid, cols_valid,
                                 reinterpret_cast<uint32_t*>(out));
  } else {
    if (has_values) conv_epilogue_stage<BM, BN, NT>(values, warp_col, lane, out_channels_last, stage, residual_staged);
    __syncthreads();
    Epilogue store_ep = ep;
    if (residual_staged) store_ep.residual = nullptr;
    conv_epilogue_store<BM, BN, kThreads>(stage, out, row_out, m0, n0, n_rows, out_plane, rows_valid, cols_valid,
                                          out_channels_last, tid, store_ep);
  }
}

// y(v) = epilogue_value(v, 1, scale, bias) is monotone in the integer dot v (a product and a sum, each rounded
// monotonically), so its sign bit is a threshold on v: returns (d, t) with y(v) >= 0 <=> d v - t >= 0 for |v| <= 2^20
// (d = 0 where it is constant there: NaN or zero scales).
__device__ __forceinline__ int2 sign_threshold(float scale, float bias) {
  constexpr int kBound = 1 << 20;
  const auto nonnegative = [&](int v) { return epilogue_value(static_cast<float>(v), 1.f, scale, bias) >= 0.f; };
  const bool low = nonnegative(-kBound), high = nonnegative(kBound);
  if (low == high) return make_int2(0, low ? 0 : 1);
  // The least v with nonnegative(v) == high lies in (below, at]: first the bracket of 4 around the real root
  // -bias / scale (its float quotient is within 0.1 of it for |v| <= 2^20), checked; else all of (-2^20, 2^20]. The
  // search's steps are dependent: 2 + 2 instead of 21 where the bracket holds.
  const float guess = fminf(fmaxf(ceilf(-bias / scale), -kBound), kBound);
  int below = static_cast<int>(guess) - 2, at = static_cast<int>(guess) + 2;
  if (below < -kBound || at > kBound || nonnegative(below) == high || nonnegative(at) != high) {
    below = -kBound;
    at = kBound;
  }
  while (at - below > 1) {
    const int mid = (below + at) >> 1;
    if (nonnegative(mid) == high) {
      at = mid;
    } else {
      below = mid;
    }
  }
  return high ? make_int2(1, at) : make_int2(-1, 1 - at);  // v >= at, or v <= at - 1
}

// The tile's rows and columns with outputs.
template <int BM, int BN>
__device__ __forceinline__ int2 conv_tile_valid(int64_t m0, int64_t n0, int64_t total_pixels, int64_t n_rows) {
  return make_int2(static_cast<int>(min(static_cast<int64_t>(BM), total_pixels - m0)),
                   static_cast<int>(min(static_cast<int64_t>(BN), n_rows - n0)));
}

// cp.async of BYTES (16, 8 or 4) to a shared-state-space byte address (computed once per thread, not per copy);
// the global address is BYTES-aligned. 16 bytes bypass L1 (.cg); 8 and 4 only exist as .ca.
template <int BYTES>
__device__ __forceinline__ void cp_async_shared(unsigned shared_dst, const uint32_t* global_src, bool fill) {
  static_assert(BYTES == 16 || BYTES == 8 || BYTES == 4, "cp.async sizes");
  const int src_bytes = fill ? BYTES : 0;  // 0: the BYTES bytes are zero-filled, nothing is read
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_dst), "l"(global_src), "r"(src_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(shared_dst), "l"(global_src), "n"(BYTES),
                 "r"(src_bytes)
                 : "memory");
  }
}

// 16 bytes from a shared-state-space byte address.
__device__ __forceinline__ uint4 ld_shared_16(unsigned shared_address) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(shared_address));
  return v;
}

// The pipelined kernel's shared rows: 16 words + 4 padding, so that the 8 rows of one ldmatrix 8x8 matrix
// (16 bytes each, 80 bytes apart) fall in 8 distinct 4-bank groups (24 words would pair rows r and r + 4).
constexpr int kConvRowStride = 20;

// ldmatrix .x4: lane l gives the row address of matrix l / 8, row l % 8 (16 bytes); register j receives
// word l % 4 of row l / 4 of matrix j (PTX ISA: ldmatrix; b16 pairs moved as 32-bit words).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&d)[4], unsigned shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(shared_address));
}

// mma_shared_stage with ldmatrix fragments (rows kConvRowStride words apart): per 8-word step s, lane (g, t)
// holds a0 = A[g][8s + t], a1 = A[g + 8][8s + t], a2 = A[g][8s + 4 + t], a3 = A[g + 8][8s + 4 + t] and
// b0 = B[g][8s + t], b1 = B[g][8s + 4 + t]: the same pairing as mma_shared_stage (a0, a1 with b0; a2, a3 with
// b1; same word in A and B), only the word order within the step differs (t, 4 + t instead of 2t, 2t + 1),
// which the K sum does not see. One ldmatrix .x4 per m tile and per two n tiles, fragments land in the
// registers the MMA reads (no moves). a_lane / b_lane: shared byte addresses of lane l's ldmatrix row at
// m tile 0 / n tiles 0-1, step 0 (A: row l % 8 + 8 * (l / 8 % 2), word 4 * (l / 16): matrices a0..a3;
// B: row l % 8 + 8 * (l / 16), word 4 * (l / 8 % 2): matrices b0, b1 of n tile 0, then of n tile 1).
template <int MT, int NT>
__device__ __forceinline__ void mma_ldmatrix_stage(int (&acc)[MT][NT][4], unsigned a_lane, unsigned b_lane) {
  static_assert(NT % 2 == 0, "B fragments of two n tiles per ldmatrix");
#pragma unroll
  for (int step = 0; step < kMmaStageWords / 8; ++step) {
    uint32_t a_frag[MT][4];
    uint32_t b_frag[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a_frag[mt], a_lane + (mt * 16 * kConvRowStride + step * 8) * 4);
#pragma unroll
    for (int pair = 0; pair < NT / 2; ++pair) {
      uint32_t d[4];
      ldmatrix_x4(d, b_lane + (pair * 16 * kConvRowStride + step * 8) * 4);
      b_frag[2 * pair][0] = d[0];
      b_frag[2 * pair][1] = d[1];
      b_frag[2 * pair + 1][0] = d[2];
      b_frag[2 * pair + 1][1] = d[3];
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_and_popc(acc[mt][nt], a_frag[mt], b_frag[nt]);
    }
  }
}

// binary_conv2d_pipelined_kernel: the one-plane implicit GEMM (s(x) in {-1, +1}, at most kOnePlaneMaxTaps taps) on the
// cp.async pipeline of binary_linear_mma_pipelined_kernel, for any channel count. The gather copies pieces of PW words
// (PW = 4, 2, 1: 16-, 8-, 4-byte cp.async), PW dividing channel_words, so that a piece lies within one tap of one
// pixel: an in-bounds tap copies PW channel words of the input pixel, a padded tap (P = 0 in the one-plane form) and
// anything past the end are zero-filled. A stage is kMmaStageWords words of K as for PW = 4 (16 / channel_words taps
// for 1 or 2 words a pixel), with the same ldmatrix fragments. The weight rows take the same piece width (their copies
// zero-filled past the row's last word). Row popcounts of P read the stage in 16-byte vectors whatever PW (every copy
// of the stage is visible after the loop's barrier); D_t tabulated under the set-up or the first stages, or copied
// from the launch's table with the first stage (the three-block build); the epilogue
// is conv_epilogue (one-plane), its output tile in the ring. The 64 x 32 tile runs KG = 2 K groups of its 2 warps:
// group g takes stages g, g + 2, ... into a ring of its own (the barriers shared), the partial sums meet in shared
// memory and group g takes m tile g through the epilogue (B = 1 C = 512 7x7, ncu: 3424 -> 2470 instructions a warp,
// 10.8 -> 9.7 us). Main loop, offline SASS (nvcc 13.0, sm_90a), PW = 4: 110 instructions per stage of 16 BMMA (351 with
// per-stage divisions in the gather and LDS.64 fragments). After the last BMMA (fp16 out): 1497 static instructions
// (8233 with the per-element epilogue: int64 index division, null checks and taps loop per output, scattered 2-byte
// stores).
// Resident blocks an SM: three for 8-byte pieces (ResNet's C = 64 layers: 79 registers without spills, ~74 KB of shared
// memory each), else two (three would spill at 16- and 4-byte pieces).
__host__ __device__ constexpr int conv_pipelined_blocks_per_sm(int pw) { return pw == 2 ? 3 : 2; }

// The launch's D_t table (conv_tap_table_kernel's [taps + 1][n_rows] ints, the last row the sums over the taps) of
// columns n0 .. n0 + BN - 1 into tap_d[taps * BN] and all_taps_d[BN] by 4-byte cp.async of kThreads threads (in the
// caller's commit group), zero past the last output channel.
template <int BN, int kThreads>
__device__ __forceinline__ void copy_tap_table(int* tap_d, int* all_taps_d, const int* __restrict__ tap_table,
                                               const uint32_t* w_bits, int64_t n0, int64_t n_rows, int taps, int tid) {
  for (int e = tid; e < (taps + 1) * BN; e += kThreads) {
    const int t = static_cast<unsigned>(e) / BN, c = static_cast<unsigned>(e) % BN;
    const bool fill = n0 + c < n_rows;
    int* const dst = t < taps ? &tap_d[e] : &all_taps_d[c];
    cp_async_shared<4>(static_cast<unsigned>(__cvta_generic_to_shared(dst)),
                       fill ? reinterpret_cast<const uint32_t*>(tap_table + t * n_rows + n0 + c) : w_bits, fill);
  }
}

// ---- The kernels' launches across the files (each defined in its kernel's file, for the four output types) ----
// Output pixels from which the op takes the wgmma kernel. H200 harness, 3x3 convolutions, fp16 out, graph us, wgmma /
// mma.sync pipelined (2026-12-01): C = OC = 256 14x14: B = 1 8.9 / 7.9, 8 9.2 / 8.7, 16 (3136 pixels) 9.3 / 9.3,
// 32 9.2 / 12.9, 64 12.9 / 24.2, 256 36.0 / 77.5; C = OC = 512 7x7: B = 1 10.8 / 9.6, 64 11.9 / 16.0, 256 32.3 /
// 47.5; C = OC = 128 28x28 B = 64 24.1 / 31.7; C = 128 -> OC = 256 stride 2, B = 64 12.3 / 19.5.
constexpr int64_t kCwMinPixels = 3072;

// The shapes the wgmma kernel takes (binary_conv2d_wgmma.cu).
bool conv_wgmma_shape(const ConvShape& shape);

// The wgmma kernel where it applies (cudaErrorNotSupported elsewhere; binary_conv2d_wgmma.cu).
template <typename OutT>
cudaError_t binary_conv2d_wgmma(const uint32_t* plus_bits, const uint32_t* w_bits, const ConvShape& shape,
                                const Epilogue& ep, OutT* out, bool out_channels_last, int* tap_table,
                                cudaStream_t stream, bool weights_ready, bool table_ready);

// Where the halo kernel runs, and its launch (binary_conv2d_halo.cu).
template <typename OutT>
bool conv_halo_takes(const ConvShape& s, const Epilogue& ep, bool out_channels_last);
template <typename OutT>
cudaError_t binary_conv2d_halo_launch(const uint32_t* plus_bits, const uint32_t* w_bits, const ConvShape& shape,
                                      const Epilogue& ep, OutT* out, bool out_channels_last, int* tap_table,
                                      int sm_count, bool dependent, bool weights_ready, bool table_ready,
                                      cudaStream_t stream);

// The one-plane kernels on the cp.async pipeline, PW words a piece (4, 2 or 1), or the halo kernel where it takes
// the shape (binary_conv2d_pipelined.cu).
template <int PW, typename OutT>
cudaError_t binary_conv2d_pipelined_launch(const uint32_t* plus_bits, const uint32_t* w_bits, const ConvShape& shape,
                                           const Epilogue& ep, OutT* out, bool out_channels_last, int* tap_table,
                                           cudaStream_t stream, const ConvTuning& tuning, bool weights_ready,
                                           bool table_ready);

}  // namespace conv
}  // namespace cuda
}  // namespace bitcompile
