// binary_conv2d (and binary_linear with sign_zero, as a 1x1 conv) as an implicit GEMM on the b1 tensor
// cores. Torch-free (launcher in binary_kernels.cuh).
//
// Dispatch (binary_conv2d_typed): s(x) in {-1, +1} with at most kOnePlaneMaxTaps taps takes the one-plane
// form on the cp.async pipeline (binary_conv2d_pipelined_kernel; 16-, 8- or 4-byte copies as the channel words
// and the alignment allow), or for 3x3 stride 1 or 2 pad 1 convs of 33..64 channels (ResNet's layer1; a residual
// where it can stage it, no row factors) the persistent binary_conv2d_halo_kernel; torch.sign inputs (sign_zero) and
// larger kernels take the two-plane form (binary_conv2d_mma_kernel). On a 9.0 device with sm_90a code, one-plane
// convolutions of at least kCwMinPixels output pixels take the Hopper form of the one-plane kernel instead,
// binary_conv2d_wgmma_kernel (wgmma b1 AND.POPC, TMA + mbarrier ring; its own section below), where it applies
// (ConvTuning::kernel forces either).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "mma_b1.cuh"
#include "wgmma_common.cuh"

namespace bitcompile {
namespace cuda {
namespace {

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

// The same D_t for the whole weight, once a launch (the pipelined kernel's 128 x 64 three-block build:
// launch_binary_conv2d's tap_table): D_t of output channel n at table[t * out_channels + n], sum_t D_t at
// table[taps * out_channels + n]. A block: 32 output channels (lane) x the taps (warp). Launched dependent: with
// weights_ready (the weights were complete when the launch before it began) it counts first and waits last, else
// waits first; either way its completion implies the previous grid's, so the conv launched dependent on it, which
// waits for this grid only, also sees pack_signs' bits.
__global__ void conv_tap_table_kernel(const uint32_t* __restrict__ w_bits, int out_channels, int channels,
                                      int channel_words, int taps, int* __restrict__ table, bool weights_ready) {
  __shared__ int column_d[kOnePlaneMaxTaps][32];
  launch_dependents();
  if (!weights_ready) wait_for_prerequisite_grid();
  const int lane = threadIdx.x & 31, t = threadIdx.x >> 5;
  const int n = blockIdx.x * 32 + lane;
  const int tail = channels - (channel_words - 1) * 32;  // real channels in the last word, 1..32
  const uint32_t last_bits = tail >= 32 ? 0xffffffffu : (1u << tail) - 1u;
  int d = 0;
  if (n < out_channels) {
    const uint32_t* word = w_bits + (static_cast<int64_t>(n) * taps + t) * channel_words;
    int count = __popc(__ldg(word + channel_words - 1) & last_bits);
#pragma unroll 4
    for (int w = 0; w + 1 < channel_words; ++w) count += __popc(__ldg(word + w));
    d = channels - 2 * count;
    table[static_cast<int64_t>(t) * out_channels + n] = d;
  }
  column_d[t][lane] = d;
  __syncthreads();
  if (t == 0 && n < out_channels) {
    int sum = 0;
    for (int i = 0; i < taps; ++i) sum += column_d[i][lane];
    table[static_cast<int64_t>(taps) * out_channels + n] = sum;
  }
  if (weights_ready) wait_for_prerequisite_grid();
}

// conv_tap_table_kernel's launch (dependent on the launch before it where `dependent`).
cudaError_t launch_conv_tap_table(const uint32_t* w_bits, const ConvShape& shape, int* table, bool dependent,
                                  bool weights_ready, cudaStream_t stream) {
  const int taps = static_cast<int>(shape.kernel_h * shape.kernel_w);
  const ClusterLaunch launch(dim3(static_cast<unsigned>(ceil_div(shape.out_channels, 32))), 32 * taps, 0, 1, stream,
                             dependent);
  return cudaLaunchKernelEx(&launch.config, conv_tap_table_kernel, w_bits, static_cast<int>(shape.out_channels),
                            static_cast<int>(shape.channels), static_cast<int>(ceil_div(shape.channels, 32)), taps,
                            table, dependent && weights_ready);
}

// What an absent scale / row factor (1) and bias (0) read.
__device__ const float kEpilogueUnit[2] = {1.f, 0.f};

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

template <int BM, int BN, int WARPS_M, int WARPS_N, int VW, bool SIGN_ZERO, typename OutT>
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

  constexpr int kPlusWords = BM * kMmaRowStride;
  constexpr int kMinusWords = BM * kMmaRowStride;
  constexpr int kTileWords = kPlusWords + kMinusWords + BN * kMmaRowStride;
  constexpr int kStagingWords = ConvStagingBytes<BM, BN, OutT>::value / 4;
  constexpr int kSharedWords = kTileWords > kStagingWords ? kTileWords : kStagingWords;
  __shared__ __align__(16) uint32_t tiles[kSharedWords];  // plus, minus, B tiles; after the main loop the output tile
  uint32_t* const plus_tile = tiles;
  uint32_t* const minus_tile = tiles + kPlusWords;
  uint32_t* const b_tile = tiles + kPlusWords + kMinusWords;
  __shared__ int64_t pixel_image[BM];  // first input pixel of the image, or -1 past the last output pixel
  __shared__ int pixel_top[BM];        // oh * stride_h - pad_h
  __shared__ int pixel_left[BM];       // ow * stride_w - pad_w
  __shared__ int64_t row_out[BM];      // NCHW output offset of the row's channel 0

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_m = warp / WARPS_N;
  const int warp_n = warp % WARPS_N;
  const int group = lane >> 2;
  const int thread_in_group = lane & 3;
  // blocks <= INT_MAX (the launchers), so m_tiles fits 32 bits
  const int64_t m0 = static_cast<int64_t>(blockIdx.x % static_cast<unsigned>(m_tiles)) * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / static_cast<unsigned>(m_tiles)) * BN;
  const int64_t out_plane = shape.out_height * shape.out_width;
  const int64_t n_rows = shape.out_channels;
  const int kernel_w = static_cast<int>(shape.kernel_w);
  const int height = static_cast<int>(shape.height);
  const int width = static_cast<int>(shape.width);
  const int taps = static_cast<int>(shape.kernel_h * shape.kernel_w);

  static_assert(kThreads >= BM && kThreads >= BN, "one row and one column per thread");
  if (tid < BM) {
    const int r = tid;
    const int64_t p = m0 + r;
    int64_t image_pixel = -1, out_offset = 0;
    int top = 0, left = 0;
    if (p < total_pixels) {
      const OutPixel px = split_out_pixel(p, total_pixels, out_plane, shape.out_width);
      image_pixel = px.image * shape.height * shape.width;
      top = static_cast<int>(px.oh * shape.stride_h - shape.pad_h);
      left = static_cast<int>(px.ow * shape.stride_w - shape.pad_w);
      out_offset = px.image * n_rows * out_plane + px.position;
    }
    pixel_image[r] = image_pixel;
    pixel_top[r] = top;
    pixel_left[r] = left;
    row_out[r] = out_offset;
  }
  __syncthreads();

  // All A vectors of a thread sit at one column vector of every stage (kThreads % kVecsPerRow == 0), so the
  // stage's word is one per thread: its tap, channel word and (kh, kw) are advanced by kMmaStageWords words
  // per load_stage call (calls are sequential: stage 0, 1, ...) without a division. word < reduction_words
  // <=> tap < taps.
  static_assert(kThreads % kVecsPerRow == 0, "one column vector per thread");
  const int vec_word = (tid % kVecsPerRow) * VW;
  const int tap_step = kMmaStageWords / channel_words;  // the word advance in whole taps and channel words
  const int word_step = kMmaStageWords % channel_words;
  const int kh_step = tap_step / kernel_w;
  const int kw_step = tap_step % kernel_w;
  int tap = vec_word / channel_words;  // of the next stage to load
  int channel_word = vec_word % channel_words;
  int kh = tap / kernel_w;
  int kw = tap % kernel_w;

  Words<VW> next_p[kLoadsA];
  Words<VW> next_n[kLoadsA];
  Words<VW> next_b[kLoadsB];
  auto load_stage = [&](int64_t stage) {
    // VW = 4 only when channel_words % 4 == 0: the four words share one tap.
    const bool in_taps = tap < taps;
    const int dy = kh * static_cast<int>(shape.dilation_h);
    const int dx = kw * static_cast<int>(shape.dilation_w);
    uint32_t valid[VW];
#pragma unroll
    for (int j = 0; j < VW; ++j) valid[j] = valid_bits(shape.channels, channel_word + j);
#pragma unroll
    for (int i = 0; i < kLoadsA; ++i) {
      const int e = tid + i * kThreads;
      const int r = e / kVecsPerRow;
      next_p[i].zero();
      next_n[i].zero();
      if (e < kVecsA && in_taps && pixel_image[r] >= 0) {
        const int iy = pixel_top[r] + dy;
        const int ix = pixel_left[r] + dx;
        if (iy >= 0 && iy < height && ix >= 0 && ix < width) {
          const int64_t index = (pixel_image[r] + static_cast<int64_t>(iy) * width + ix) * channel_words + channel_word;
          next_p[i].load(plus_bits + index);
          if (SIGN_ZERO) {
            next_n[i].load(minus_bits + index);
          } else {
            next_n[i] = next_p[i];
            next_n[i].invert_within(valid);
          }
        } else if (shape.pad_value > 0) {
          next_p[i].set(valid);
        } else if (shape.pad_value < 0) {
          next_n[i].set(valid);
        }
      }
    }
    tap += tap_step;  // tap = kh * kernel_w + kw stays true; kw + kw_step + 1 < 2 * kernel_w
    kh += kh_step;
    kw += kw_step;
    channel_word += word_step;
    if (channel_word >= channel_words) {
      channel_word -= channel_words;
      ++tap;
      ++kw;
    }
    if (kw >= kernel_w) {
      kw -= kernel_w;
      ++kh;
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
        next_n[i].store(&minus_tile[offset]);
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
      for (int plane = 0; plane < 2; ++plane) {
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
  // The dot: (2 popc(P & B) - popc(P)) - (2 popc(N & B) - popc(N))
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int h = c / 2;
        acc_p[mt][nt][c] = 2 * acc_p[mt][nt][c] - pop_p[mt][h] - 2 * acc_n[mt][nt][c] + pop_n[mt][h];
      }
    }
  }
  // (the main loop's last barrier is behind every read of the tiles; two planes: no inside taps, no D_t)
  const int2 valid = conv_tile_valid<BM, BN>(m0, n0, total_pixels, n_rows);
  const auto values = [&](auto&& emit) {
    conv_epilogue_values<BN, MT, NT, false>(acc_p, warp_m * kWarpRows, warp_n * kWarpCols, lane, nullptr, nullptr,
                                            nullptr, taps, shape.pad_value, m0, n0, valid.x, valid.y, ep, emit);
  };
  conv_epilogue<BM, BN, kThreads, NT>(values, warp_n * kWarpCols, lane, tid, row_out, m0, n0, valid.x, valid.y,
                                      n_rows, out_plane, ep, out, out_channels_last, reinterpret_cast<OutT*>(tiles));
}

template <int VW, bool SIGN_ZERO, typename OutT>
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
  binary_conv2d_mma_kernel<BM, BN, WARPS_M, WARPS_N, VW, SIGN_ZERO, OutT>
      <<<static_cast<unsigned>(blocks), WARPS_M * WARPS_N * 32, 0, stream>>>(
          plus_bits, minus_bits, w_bits, shape, m_tiles, total_pixels, static_cast<int>(channel_words),
          static_cast<int>(reduction_words), ep, out, out_channels_last);
  return cudaGetLastError();
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

template <int BM, int BN, int WARPS_M, int WARPS_N, int KG, int PW, typename OutT>
__global__ __launch_bounds__(WARPS_M* WARPS_N * 32 * KG, conv_pipelined_blocks_per_sm(PW)) void binary_conv2d_pipelined_kernel(
    const uint32_t* __restrict__ plus_bits, const uint32_t* __restrict__ w_bits, const int* __restrict__ tap_table,
    ConvShape shape, int64_t m_tiles, int64_t total_pixels, int channel_words, int reduction_words, Epilogue ep,
    OutT* __restrict__ out, bool out_channels_last, bool weights_ready) {
  static_assert(PW == 1 || PW == 2 || PW == 4, "4-, 8- or 16-byte pieces");
  constexpr int kGroupThreads = WARPS_M * WARPS_N * 32;  // one K group: the whole tile, every KG-th stage
  constexpr int kThreads = kGroupThreads * KG;
  constexpr int kWarpRows = BM / WARPS_M;
  constexpr int kWarpCols = BN / WARPS_N;
  constexpr int MT = kWarpRows / 16;
  constexpr int NT = kWarpCols / 8;
  static_assert(MT * 16 * WARPS_M == BM && NT * 8 * WARPS_N == BN, "tile shape");
  constexpr int kPiecesPerRow = kMmaStageWords / PW;
  constexpr int kRowsPerPass = kGroupThreads / kPiecesPerRow;  // rows of a thread's consecutive copies apart
  static_assert(kGroupThreads % kPiecesPerRow == 0 && BM % kRowsPerPass == 0 && BN % kRowsPerPass == 0,
                "whole A and B pieces per thread, one column piece per thread");
  constexpr int kLoadsA = BM / kRowsPerPass;
  constexpr int kLoadsB = BN / kRowsPerPass;
  constexpr int kPopVecsPerRow = kMmaStageWords / 4;  // the row popcounts' 16-byte reads
  static_assert(kGroupThreads % kPopVecsPerRow == 0 && BM % (kGroupThreads / kPopVecsPerRow) == 0,
                "whole popcount vectors");
  constexpr int kPopRowsPerPass = kGroupThreads / kPopVecsPerRow;
  constexpr int kPopLoads = BM / kPopRowsPerPass;
  constexpr int kStageWordsA = BM * kConvRowStride;
  constexpr int kStageWordsAll = (BM + BN) * kConvRowStride;

  extern __shared__ __align__(16) uint32_t conv_pipe_smem[];  // [KG][kPipeStages][A rows, B rows][kConvRowStride]
  __shared__ int64_t row_source[BM];  // word offset of the row's (image, top, left) pixel (may lie outside the input)
  __shared__ uint32_t row_inside[BM];  // the row's taps inside the image (bit t), 0 past the last output pixel
  __shared__ int64_t tap_offset[kOnePlaneMaxTaps];  // word offset of tap t = (kh, kw) from the (top, left) pixel
  __shared__ int row_pop[BM];
  __shared__ int64_t row_out[BM];  // NCHW output offset of the row's channel 0
  __shared__ int tap_d[kOnePlaneMaxTaps * BN];  // D_t of column c at [t * BN + c]
  __shared__ int all_taps_d[BN];

  const int tid = threadIdx.x;
  const int k_group = KG == 1 ? 0 : tid / kGroupThreads;
  const int gtid = KG == 1 ? tid : tid % kGroupThreads;  // the thread within its K group: gather, popcounts, fragments
  const int lane = tid & 31;
  const int warp = gtid >> 5;
  const int warp_m = warp / WARPS_N;
  const int warp_n = warp % WARPS_N;
  // blocks <= INT_MAX (the launchers), so m_tiles fits 32 bits
  const int64_t m0 = static_cast<int64_t>(blockIdx.x % static_cast<unsigned>(m_tiles)) * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / static_cast<unsigned>(m_tiles)) * BN;
  const int64_t out_plane = shape.out_height * shape.out_width;
  const int64_t n_rows = shape.out_channels;
  const int taps = static_cast<int>(shape.kernel_h * shape.kernel_w);
  const int stages = static_cast<int>(ceil_div(reduction_words, kMmaStageWords));
  // The 128 x 64 three-block build has 80 registers: it reads the weights after the wait (weights_ready ignored; the
  // early copies spill there).
  constexpr bool kTight = BM == 128 && conv_pipelined_blocks_per_sm(PW) == 3;
  const bool early_weights = weights_ready && !kTight;
  // launched dependent: pack_signs' bits (and anything earlier) are visible past this wait; with early_weights the
  // weights are read before it (below)
  if (!early_weights) wait_for_prerequisite_grid();

  static_assert(kThreads >= BM && kThreads >= BN && kThreads >= kOnePlaneMaxTaps, "one row, column, tap per thread");
  // D_t of the block's columns. The 128 x 64 three-block build (kTable; 8-byte pieces: C = 64, 192, 320, ...; ResNet's
  // layer1) copies them from the launch's table (written by conv_tap_table_kernel, the grid this one waits for) by
  // 4-byte copies in the first A stage's commit group, zero past the last output channel; the epilogue reads them after
  // the main loop's last wait and barrier. H200, pack + conv in a rotating graph, block-tabulated -> table: B = 256 C
  // = OC = 64 56x56 147.6 -> 140.3 us (ncu: 72.0 M -> 66.2 M instructions; the table kernel, 3 us, runs under the
  // conv's start), sign words 116.3 -> 108.6, B = 64 40.5 -> 39.1, B = 5 10.7 -> 8.4, B = 16 12.2 -> 12.6 (one full
  // wave), C = 192 B = 64 28x28 40.8 -> 39.0. The other builds tabulate them themselves (the table launch is ~0.3-0.9
  // us more on the chain of a latency-bound conv: 64 x 32 tiles, B = 1 C = 128 28x28 6.1 -> 6.7, B = 8 C = 128 14x14
  // 6.7 -> 7.3; the other 128 x 64 builds past one wave were not measured on the table): by the threads past the rows
  // while the rows' pixel math runs (its global loads under it), all_taps_d summed from the table after the set-up's
  // barrier; where no threads are spare (64 x 32 in one K group), by all threads after the first stages' copies,
  // all_taps_d by shared atomics. (The three-block build's own tabulation ran after the first stages' copies, on the
  // chain: the concurrent form spilled there.)
  constexpr bool kTable = kTight;
  constexpr int kSpareThreads = kThreads - BM;
  const auto tabulate = [&](auto threads, int index, int* all_d) {
    tabulate_tap_d<BN, decltype(threads)::value, PW == 4 ? 4 : 1, 8>(
        tap_d, all_d, w_bits, n0, n_rows, reduction_words, channel_words, static_cast<int>(shape.channels), taps, index);
  };
  if (tid < BM) {
    const RowPixel row = row_pixel(shape, m0 + tid, total_pixels, out_plane);
    row_source[tid] = row.pixel * channel_words;
    row_inside[tid] = row.inside;
    row_out[tid] = row.out_offset;
    row_pop[tid] = 0;
  } else if constexpr (kSpareThreads > 0 && !kTable) {
    tabulate(std::integral_constant<int, kSpareThreads>{}, tid - BM, nullptr);
  }
  if (tid < taps) tap_offset[tid] = tap_offset_words(shape, tid, channel_words);
  if constexpr (kSpareThreads == 0 && !kTable) {
    if (tid < BN) all_taps_d[tid] = 0;
  }
  __syncthreads();
  if constexpr (kSpareThreads > 0 && !kTable) {
    if (tid < BN) {
      int sum = 0;
      for (int t = 0; t < taps; ++t) sum += tap_d[t * BN + tid];
      all_taps_d[tid] = sum;
    }
  }
  const auto copy_table = [&] {
    if constexpr (kTable) copy_tap_table<BN, kThreads>(tap_d, all_taps_d, tap_table, w_bits, n0, n_rows, taps, tid);
  };

  // The gather, per thread: its A pieces are rows tid / kPiecesPerRow + i * kRowsPerPass and its B pieces rows
  // tid / kPiecesPerRow + j * kRowsPerPass, all at the same column piece of every stage, so the stage's word
  // (tap, channel word) is one per thread, advanced by kMmaStageWords each issued stage without a division (PW
  // divides channel_words and kMmaStageWords, so channel_word stays a multiple of PW and the piece within its
  // tap); the row's source offset and inside-taps mask are read once. word < reduction_words <=> tap < taps.
  static_assert((kPipeStages & (kPipeStages - 1)) == 0, "ring slot by mask");
  constexpr int kPieceBytes = PW * 4;
  constexpr unsigned kStageBytes = kStageWordsAll * sizeof(uint32_t);
  constexpr unsigned kPassBytes = kRowsPerPass * kConvRowStride * sizeof(uint32_t);
  const unsigned smem = static_cast<unsigned>(__cvta_generic_to_shared(conv_pipe_smem)) +
                        k_group * kPipeStages * kStageBytes;  // the K group's ring
  const int piece_row = gtid / kPiecesPerRow;
  const int vec_word = (gtid % kPiecesPerRow) * PW;
  uint64_t a_source[kLoadsA];  // global byte address of the row's (image, top, left) pixel, integer arithmetic
  uint32_t a_inside[kLoadsA];
#pragma unroll
  for (int i = 0; i < kLoadsA; ++i) {
    const int r = piece_row + i * kRowsPerPass;
    a_source[i] = reinterpret_cast<uint64_t>(plus_bits) + static_cast<uint64_t>(row_source[r] * 4);
    a_inside[i] = row_inside[r];
  }
  const unsigned a_dst = smem + (piece_row * kConvRowStride + vec_word) * 4;  // ring slot 0, pass 0
  const unsigned b_dst = smem + (kStageWordsA + piece_row * kConvRowStride + vec_word) * 4;
  bool b_row_valid[kLoadsB];
#pragma unroll
  for (int j = 0; j < kLoadsB; ++j) b_row_valid[j] = n0 + piece_row + j * kRowsPerPass < n_rows;
  const int64_t b_pass_words = static_cast<int64_t>(kRowsPerPass) * reduction_words;
  constexpr int kGroupStageWords = kMmaStageWords * KG;  // from one of the group's stages to its next
  const int tap_step = kGroupStageWords / channel_words;  // the word advance in whole taps and channel words
  const int word_step = kGroupStageWords % channel_words;
  int64_t b_source;  // the cursor: B pass 0 (read only where b_row_valid), tap and channel word of the next stage
  int tap, channel_word;
  const auto rewind = [&] {
    const int word = k_group * kMmaStageWords + vec_word;
    b_source = (n0 + piece_row) * reduction_words + word;
    tap = word / channel_words;
    channel_word = word % channel_words;
  };
  rewind();

  // One commit group: the group's stage `stage` (stage * KG + k_group of the block)'s A pieces (copy_a) and B pieces
  // (copy_b); advances the gather's cursor.
  auto issue_stage = [&](int stage, bool copy_a, bool copy_b) {
    if (stage * KG + k_group < stages) {
      const unsigned slot = (stage & (kPipeStages - 1)) * kStageBytes;
      const bool in_taps = tap < taps;
      const uint64_t offset = static_cast<uint64_t>((tap_offset[min(tap, taps - 1)] + channel_word) * 4);
#pragma unroll
      for (int i = 0; i < kLoadsA && copy_a; ++i) {
        // funnel shift: the shift clamps at 32 (tap may pass 31 in the last stage; then in_taps is false)
        const bool fill = in_taps && (__funnelshift_rc(a_inside[i], 0u, tap) & 1u) != 0;
        cp_async_shared<kPieceBytes>(a_dst + slot + i * kPassBytes,
                                     fill ? reinterpret_cast<const uint32_t*>(a_source[i] + offset) : plus_bits, fill);
      }
#pragma unroll
      for (int j = 0; j < kLoadsB && copy_b; ++j) {
        const bool b_fill = b_row_valid[j] && in_taps;
        cp_async_shared<kPieceBytes>(b_dst + slot + j * kPassBytes, b_fill ? w_bits + b_source + j * b_pass_words : w_bits,
                                     b_fill);
      }
      b_source += kGroupStageWords;
      tap += tap_step;
      channel_word += word_step;
      if (channel_word >= channel_words) {
        channel_word -= channel_words;
        ++tap;
      }
    }
    cp_async_commit();
  };

  const unsigned a_lane =
      smem + ((warp_m * kWarpRows + (lane & 7) + ((lane >> 3) & 1) * 8) * kConvRowStride + (lane >> 4) * 4) * 4;
  const unsigned b_lane =
      smem + (kStageWordsA + (warp_n * kWarpCols + (lane & 7) + (lane >> 4) * 8) * kConvRowStride + ((lane >> 3) & 1) * 4) * 4;
  // the row popcounts' vectors: rows tid / kPopVecsPerRow + i * kPopRowsPerPass, words 4 (tid % kPopVecsPerRow)
  const unsigned pop_src = smem + ((gtid / kPopVecsPerRow) * kConvRowStride + (gtid % kPopVecsPerRow) * 4) * 4;
  constexpr unsigned kPopPassBytes = kPopRowsPerPass * kConvRowStride * sizeof(uint32_t);
  int acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0;
  }
  int pop[kPopLoads];
#pragma unroll
  for (int i = 0; i < kPopLoads; ++i) pop[i] = 0;

  // weights_ready: the weights were complete when the launches before this one (pack_signs, the D_t table) began, so
  // D_t (above) and the first stages' B pieces go out before the wait; commit groups B 0 .. S-2, then A 0 .. S-2 (the
  // first with the D_t table's copies), so the loop's wait_group (all but the S - 2 newest complete) still covers
  // stage s's A and B pieces.
  if (early_weights) {
#pragma unroll
    for (int s = 0; s < kPipeStages - 1; ++s) issue_stage(s, /*copy_a=*/false, /*copy_b=*/true);
    if constexpr (kSpareThreads == 0 && !kTable) tabulate(std::integral_constant<int, kThreads>{}, tid, all_taps_d);
    wait_for_prerequisite_grid();
    copy_table();
    rewind();
#pragma unroll
    for (int s = 0; s < kPipeStages - 1; ++s) issue_stage(s, /*copy_a=*/true, /*copy_b=*/false);
  } else {
    copy_table();
#pragma unroll
    for (int s = 0; s < kPipeStages - 1; ++s) issue_stage(s, /*copy_a=*/true, /*copy_b=*/true);
    if constexpr (kSpareThreads == 0 && !kTable) tabulate(std::integral_constant<int, kThreads>{}, tid, all_taps_d);
  }
  // Every group runs the same number of iterations (the barriers), its stages past the last skipped.
  const int group_stages = static_cast<int>(ceil_div(stages, KG));
  for (int stage = 0; stage < group_stages; ++stage) {
    cp_async_wait<kPipeStages - 2>();
    __syncthreads();
    issue_stage(stage + kPipeStages - 1, /*copy_a=*/true, /*copy_b=*/true);
    if (KG == 1 || stage * KG + k_group < stages) {
      const unsigned slot = (stage & (kPipeStages - 1)) * kStageBytes;
#pragma unroll
      for (int i = 0; i < kPopLoads; ++i) {
        const uint4 v = ld_shared_16(pop_src + slot + i * kPopPassBytes);
        pop[i] += __popc(v.x) + __popc(v.y) + __popc(v.z) + __popc(v.w);
      }
      mma_ldmatrix_stage<MT, NT>(acc, a_lane + slot, b_lane + slot);
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < kPopLoads; ++i) atomicAdd(&row_pop[gtid / kPopVecsPerRow + i * kPopRowsPerPass], pop[i]);
  __syncthreads();

  // The K groups' sums: every group leaves its tiles in the rings past the first (the output tile's place), then
  // group g < MT adds up m tiles [g kGroupMT, (g + 1) kGroupMT) of its warps and takes them through the epilogue
  // (the other groups only store).
  constexpr int kGroupMT = KG <= MT ? MT / KG : 1;
  static_assert(MT % KG == 0 || KG % MT == 0, "whole m tiles a group");
  const bool owner = k_group * kGroupMT < MT;
  const int first_mt = owner ? k_group * kGroupMT : 0;
  int dot[kGroupMT][NT][4];
  if constexpr (KG == 1) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < 4; ++j) dot[mt][nt][j] = acc[mt][nt][j];
      }
    }
  } else {
    int* partial = reinterpret_cast<int*>(conv_pipe_smem) + kPipeStages * kStageBytes / 4;  // [mt, nt, j][tid]
    static_assert(MT * NT * 4 * kThreads * 4 <= (KG - 1) * kPipeStages * kStageBytes, "the partial sums fit");
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int j = 0; j < 4; ++j) partial[((mt * NT + nt) * 4 + j) * kThreads + tid] = acc[mt][nt][j];
      }
    }
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < kGroupMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int* sums = partial + (((first_mt + mt) * NT + nt) * 4 + j) * kThreads + gtid;
          int sum = 0;
#pragma unroll
          for (int g = 0; g < KG; ++g) sum += sums[g * kGroupThreads];
          dot[mt][nt][j] = sum;
        }
      }
    }
  }

  // 4 popc(P & B) - 2 popc(P); the barrier above is also behind the last ldmatrix of the ring, which holds the
  // output tile from here on (the partial sums lie past it).
  const int group = lane >> 2;
  const int warp_row = warp_m * kWarpRows + first_mt * 16;
#pragma unroll
  for (int mt = 0; mt < kGroupMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pop = row_pop[warp_row + mt * 16 + group + 8 * h];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        dot[mt][nt][2 * h] = 4 * dot[mt][nt][2 * h] - 2 * pop;
        dot[mt][nt][2 * h + 1] = 4 * dot[mt][nt][2 * h + 1] - 2 * pop;
      }
    }
  }
  static_assert(ConvStagingBytes<BM, BN, OutT>::value <= kPipeStages * kStageBytes, "output tile fits the ring");
  const int2 valid = conv_tile_valid<BM, BN>(m0, n0, total_pixels, n_rows);
  const auto values = [&](auto&& emit) {
    conv_epilogue_values<BN, kGroupMT, NT, true>(dot, warp_row, warp_n * kWarpCols, lane, row_inside, tap_d,
                                                 all_taps_d, taps, shape.pad_value, m0, n0, valid.x, valid.y, ep,
                                                 emit);
  };
  conv_epilogue<BM, BN, kThreads, NT>(values, warp_n * kWarpCols, lane, tid, row_out, m0, n0, valid.x, valid.y,
                                      n_rows, out_plane, ep, out, out_channels_last,
                                      reinterpret_cast<OutT*>(conv_pipe_smem), owner);
}

// PW: words a cp.async piece (4, 2, 1), dividing channel_words, plus_bits and w_bits PW * 4-byte aligned. Tile
// BM x BN pixels x output channels, WARPS_M x WARPS_N warps of 32 x 32. tap_table non-null: two launches, the D_t
// table into tap_table, then the conv (null: the blocks tabulate D_t). dependent: each launched with programmatic
// dependent launch on the one before (pack_signs and the table kernel call launch_dependents; sm_90 devices);
// weights_ready: see launch_binary_conv2d (read only where dependent).
template <int BM, int BN, int WARPS_M, int WARPS_N, int KG, int PW, typename OutT>
cudaError_t binary_conv2d_pipelined_tile(const uint32_t* plus_bits, const uint32_t* w_bits, const ConvShape& shape,
                                         const Epilogue& ep, OutT* out, bool out_channels_last, int* tap_table,
                                         bool dependent, bool weights_ready, bool table_ready,
                                         cudaStream_t stream) {
  const int64_t total_pixels = shape.batch * shape.out_height * shape.out_width;
  const int64_t channel_words = ceil_div(shape.channels, 32);
  const int64_t reduction_words = shape.kernel_h * shape.kernel_w * channel_words;
  const int64_t m_tiles = ceil_div(total_pixels, BM);
  const int64_t blocks = m_tiles * ceil_div(shape.out_channels, BN);
  if (blocks > INT_MAX || reduction_words > INT_MAX / 2 || shape.height > INT_MAX / 4 || shape.width > INT_MAX / 4) {
    return cudaErrorInvalidValue;
  }
  constexpr size_t smem = static_cast<size_t>(KG) * kPipeStages * (BM + BN) * kConvRowStride * sizeof(uint32_t);
  auto kernel = binary_conv2d_pipelined_kernel<BM, BN, WARPS_M, WARPS_N, KG, PW, OutT>;
  static unsigned long long smem_devices = 0;
  // three blocks an SM: the whole unified L1 as shared memory
  cudaError_t error =
      allow_dynamic_smem(kernel, smem, smem_devices, /*max_shared_carveout=*/conv_pipelined_blocks_per_sm(PW) == 3);
  if (error != cudaSuccess) return error;
  if (tap_table != nullptr && !table_ready) {
    error = launch_conv_tap_table(w_bits, shape, tap_table, dependent, weights_ready, stream);
    if (error != cudaSuccess) return error;
  }
  const ClusterLaunch launch(dim3(static_cast<unsigned>(blocks)), WARPS_M * WARPS_N * 32 * KG, smem, 1, stream,
                             dependent);
  return cudaLaunchKernelEx(&launch.config, kernel, plus_bits, w_bits, static_cast<const int*>(tap_table), shape,
                            m_tiles, total_pixels, static_cast<int>(channel_words), static_cast<int>(reduction_words),
                            ep, out, out_channels_last, dependent && weights_ready);
}

// ==== binary_conv2d_halo_kernel (harness `conv ... kernel=1 tile=3`) ===============================================
// The one-plane conv for 3x3 stride 1 or 2, dilation 1, pad 1 with 2 channel words a pixel (C = 33..64: ResNet's
// layer1 and layer2's first conv), persistent, without an im2col gather. A block keeps one n tile of 64 output channels
// (its weights as B fragments in registers, D_t in shared memory, read once) and walks m tiles of 128 output pixels
// in raster order within one image (the last tile of an image may be partial). For each it copies the input rows
// those pixels read (their halo, at most halo_rows rows of pitch pixels, zero outside the image) to shared memory
// (stride 1: twice, the second copy shifted by one pixel), and reads A fragments straight from it: the 256-bit A row
// of pixel (oh, ow) at k step kh is the 4 pixels (oh s + kh - 1, ow s - 1 .. ow s + 2) of the input, 32 contiguous
// bytes of the halo (stride 1: copy 0 at even ow, copy 1 at odd ow; stride 2: copy 0; ldmatrix rows are 16-byte
// aligned). Word w of step kh is tap (kh, w / 2)'s channel word w % 2; the fourth pixel's
// weights (w = 6, 7) are zero. pa comes from one more mma a step against a B whose column 0 is ones on words 0..5.
// The next tile's halo and row values go out (cp.async, two buffers) while this one runs its mma and conv_epilogue,
// whose values come from tables the block makes once (halo_epilogue_tables: a row class's D_t term and the columns'
// epilogue; the output tile staged past the halo buffers).
constexpr int kHaloBM = 128, kHaloBN = 64, kHaloThreads = 256;
// Two blocks an SM (128 registers). H100, harness graph us, B = 256 C = OC = 64 56x56 fp16, two / three blocks an SM
// (85 registers): plain 90.3 / 98.7, sign words 84.6 / 88.0, residual + the sum's sign words 167.0 / 154.4.
constexpr int kHaloBlocksPerSm = 2;

// The input rows a tile's halo holds at most: its output rows (at most (BM - 1 + OW - 1) / OW + 1) at the stride, and
// the kernel's rows above and below.
__host__ __device__ constexpr int conv_halo_rows(int64_t out_width, int64_t stride) {
  return static_cast<int>(((kHaloBM - 1 + out_width - 1) / out_width) * stride) + 3;
}
__host__ __device__ constexpr int64_t conv_halo_pitch(int64_t width) { return (width + 3 + 1) / 2 * 2; }  // even

// The halo kernel's epilogue reads two tables a block makes once (halo_epilogue_tables): row_base[c][col], the dot's
// per-row term of a row of class c (bit 0: the pixel's row is the image's first, 1: its last, 2: its column the first,
// 3: the last; those padded taps' D_t out of sum_in D_t - pad_value * sum_padded D_t), and per column (scale, bias),
// or for sign words (d, t) with y(v) >= 0 <=> d v - t >= 0 folded into row_base (sign_threshold).
constexpr int kHaloRowClasses = 16;
__device__ __forceinline__ int halo_row_class(int oh, int ow, int height, int width, int stride) {
  return (oh == 0) | (oh * stride + 1 >= height) << 1 | (ow == 0) << 2 | (ow * stride + 1 >= width) << 3;
}

// The tables from D_t (tap_d, all_taps_d: complete) and ep, by all kHaloThreads threads (a column each).
template <bool kSigns>
__device__ __forceinline__ void halo_epilogue_tables(int* row_base, float2* columns, int* column_dir,
                                                     const int* tap_d, const int* all_taps_d, const Epilogue& ep,
                                                     int pad_value, int64_t n0, int cols_valid, int tid) {
  static_assert(kHaloThreads % kHaloBN == 0, "a column a thread");
  const int col = tid % kHaloBN;
  const bool valid = col < cols_valid;
  const float scale = valid ? column_scale(ep, n0 + col) : 0.f;
  const float bias = valid ? column_bias(ep, n0 + col) : 0.f;
  int2 sign = make_int2(0, 1);
  if constexpr (kSigns) {
    if (valid) sign = sign_threshold(scale, bias);
    if (tid < kHaloBN) column_dir[col] = sign.x;
  } else if (tid < kHaloBN) {
    columns[col] = make_float2(scale, bias);
  }
  for (int c = tid / kHaloBN; c < kHaloRowClasses; c += kHaloThreads / kHaloBN) {
    int padded = 0;
#pragma unroll
    for (int t = 0; t < 9; ++t) {
      const int kh = t / 3, kw = t % 3;
      if ((kh == 0 && (c & 1)) || (kh == 2 && (c & 2)) || (kw == 0 && (c & 4)) || (kw == 2 && (c & 8))) {
        padded += tap_d[t * kHaloBN + col];
      }
    }
    const int base = all_taps_d[col] - (1 + pad_value) * padded;
    row_base[c * kHaloBN + col] = kSigns ? sign.x * base - sign.y : base;
  }
}

// conv_epilogue_values' contract from the tables: y = epilogue_value(dot + row term, 1, scale, bias); for sign words
// (kSigns) the integers d (dot + row term) - t instead, whose signs are y's.
template <bool kSigns, int MT, int NT, typename Emit>
__device__ __forceinline__ void halo_epilogue_values(const int (&dot)[MT][NT][4], int warp_row, int warp_col, int lane,
                                                     const uint8_t* row_class, const int* row_base,
                                                     const float2* columns, const int* column_dir, Emit&& emit) {
  const int group = lane >> 2;
  const int lane_col = warp_col + 2 * (lane & 3);
  float2 column[NT][2];
  int dir[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if constexpr (kSigns) {
        dir[nt][e] = column_dir[lane_col + 8 * nt + e];
      } else {
        column[nt][e] = columns[lane_col + 8 * nt + e];
      }
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row + mt * 16 + group + 8 * h;
      const int* const base = row_base + row_class[row] * kHaloBN + lane_col;
      using Value = std::conditional_t<kSigns, int, float>;
      Value y[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int2 term = *reinterpret_cast<const int2*>(base + 8 * nt);
        if constexpr (kSigns) {
          y[nt][0] = dot[mt][nt][2 * h] * dir[nt][0] + term.x;
          y[nt][1] = dot[mt][nt][2 * h + 1] * dir[nt][1] + term.y;
        } else {
          y[nt][0] = epilogue_value(static_cast<float>(dot[mt][nt][2 * h] + term.x), 1.f, column[nt][0].x,
                                    column[nt][0].y);
          y[nt][1] = epilogue_value(static_cast<float>(dot[mt][nt][2 * h + 1] + term.y), 1.f, column[nt][1].x,
                                    column[nt][1].y);
        }
      }
      emit(row, y);
    }
  }
}

template <typename OutT>
__global__ __launch_bounds__(kHaloThreads, kHaloBlocksPerSm) void binary_conv2d_halo_kernel(
    const uint32_t* __restrict__ plus_bits, const uint32_t* __restrict__ w_bits, const int* __restrict__ tap_table,
    ConvShape shape, int tiles_per_image, int m_tiles, int blocks_per_n, int copy_bytes, Epilogue ep,
    OutT* __restrict__ out, bool out_channels_last, bool weights_ready) {
  constexpr int MT = 2, NT = 4, kTaps = 9, kWords = 18;  // warps 4 x 2 of 32 x 32
  // dynamic: [buffer 0, 1][copy 0, 1] halos of copy_bytes (stride 2: copy 0 only), then the output tile's stage (with
  // a residual: one a buffer, each holding its tile's residual from the prefetch on)
  extern __shared__ __align__(16) uint32_t conv_halo_smem[];
  __shared__ uint8_t row_class[2][kHaloBM];  // halo_row_class
  __shared__ int64_t row_out[2][kHaloBM];
  __shared__ unsigned row_halo[2][kHaloBM];  // byte offset of the row's A row (k step 0) in its buffer
  __shared__ int tap_d[kTaps * kHaloBN];
  __shared__ int all_taps_d[kHaloBN];
  __shared__ __align__(8) int row_base[kHaloRowClasses * kHaloBN];  // halo_epilogue_tables
  __shared__ float2 columns[kHaloBN];
  __shared__ int column_dir[kHaloBN];
  constexpr bool kSigns = std::is_same_v<OutT, SignWords>;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 1, warp_n = warp & 1;
  const int n_tile = static_cast<int>(blockIdx.x) / blocks_per_n;
  const int first_tile = static_cast<int>(blockIdx.x) - n_tile * blocks_per_n;
  const int64_t n0 = static_cast<int64_t>(n_tile) * kHaloBN;
  const int width = static_cast<int>(shape.width), height = static_cast<int>(shape.height);
  const int stride = static_cast<int>(shape.stride_h);  // 1 or 2 (conv_halo_applies)
  const int out_width = static_cast<int>(shape.out_width);
  const int plane = static_cast<int>(shape.out_height) * out_width;  // output pixels an image
  const int pitch = static_cast<int>(conv_halo_pitch(width));
  // Stride 1: the A row of an odd ow starts at an odd halo column, read from copy 1 (shifted by a pixel) for 16-byte
  // alignment; stride 2: every A row starts at the even column 2 ow.
  const int copies = stride == 1 ? 2 : 1;
  const int64_t n_rows = shape.out_channels;
  const int cols_valid = static_cast<int>(min(static_cast<int64_t>(kHaloBN), n_rows - n0));  // the block's columns
  const unsigned smem = static_cast<unsigned>(__cvta_generic_to_shared(conv_halo_smem));
  // m tile `tile`: its image, its first pixel there and its pixels (an image's last tile may be partial)
  struct TilePlace {
    int image, p0, rows_valid;
  };
  const auto place_of = [&](int tile) {
    const int image = tile / tiles_per_image;
    const int p0 = (tile - image * tiles_per_image) * kHaloBM;
    return TilePlace{image, p0, min(kHaloBM, plane - p0)};
  };
  // channels_last, 16-byte pieces, fp16 / bf16 (conv_halo_stages_residual; the fp32 build spilled with it)
  const bool residual_staged = sizeof(OutT) == 2 && ep.residual != nullptr && out_channels_last;
  const auto stage_of = [&](int buf) {
    constexpr int kStageBytes = ConvStagingBytes<kHaloBM, kHaloBN, OutT>::value;
    return reinterpret_cast<OutT*>(reinterpret_cast<char*>(conv_halo_smem) + 4 * copy_bytes +
                                   (residual_staged ? buf * kStageBytes : 0));
  };

  // The weights as B fragments (n tile nt: column n0 + 32 warp_n + 8 nt + lane / 4; b0 = word lane % 4, b1 = word
  // 4 + lane % 4 of step kh), zero past the last output channel and for the fourth pixel.
  uint32_t b_frag[3][NT][2];
  const auto load_weights = [&] {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int64_t n = n0 + warp_n * 32 + nt * 8 + (lane >> 2);
      const uint32_t* w = w_bits + min(n, n_rows - 1) * kWords;
      const int t = lane & 3;
#pragma unroll
      for (int kh = 0; kh < 3; ++kh) {
        b_frag[kh][nt][0] = n < n_rows ? w[kh * 6 + t] : 0u;  // words 0..3: taps (kh, 0), (kh, 1)
        b_frag[kh][nt][1] = n < n_rows && t < 2 ? w[kh * 6 + 4 + t] : 0u;  // words 4, 5: tap (kh, 2)
      }
    }
  };
  if (weights_ready) load_weights();
  wait_for_prerequisite_grid();  // the packed input and the D_t table are complete past this
  if (!weights_ready) load_weights();
  copy_tap_table<kHaloBN, kHaloThreads>(tap_d, all_taps_d, tap_table, w_bits, n0, n_rows, kTaps, tid);

  // Tile `tile` (m tile index) into buffer `buf`: the halo by cp.async (copy c, row s, column j holds input pixel
  // (oh_first stride - 1 + s, j - 1 + c), zero outside the image; a warp a line of pitch pixels), the row values by
  // the first kHaloBM threads (rows past the tile's last pixel: nothing inside, A rows at row 0's).
  const auto prefetch = [&](int tile, int buf) {
    const auto [image, p0, rows_valid] = place_of(tile);
    const int oh_first = p0 / out_width;
    const int halo_rows = ((p0 + rows_valid - 1) / out_width - oh_first) * stride + 3;
    const uint32_t* image_bits = plus_bits + static_cast<int64_t>(image) * height * width * 2;
    const unsigned halo = smem + buf * 2 * copy_bytes;
    for (int line = warp; line < copies * halo_rows; line += kHaloThreads / 32) {
      const int c = line >= halo_rows ? 1 : 0;
      const int s = line - c * halo_rows;
      const int ih = oh_first * stride - 1 + s;
      const bool row_in = ih >= 0 && ih < height;
      const unsigned dst = halo + c * copy_bytes + s * pitch * 8;
      for (int j = lane; j < pitch; j += 32) {
        const int iw = j - 1 + c;
        const bool fill = row_in && iw >= 0 && iw < width;
        cp_async_shared<8>(dst + j * 8, fill ? image_bits + (ih * width + iw) * 2 : plus_bits, fill);
      }
    }
    if (tid < kHaloBM) {
      const bool valid = tid < rows_valid;
      const int p = p0 + (valid ? tid : 0);
      const int oh = p / out_width, ow = p - oh * out_width;
      row_class[buf][tid] = static_cast<uint8_t>(valid ? halo_row_class(oh, ow, height, width, stride) : 0);
      row_out[buf][tid] = static_cast<int64_t>(image) * n_rows * plane + p;
      // input column ow stride - 1 is halo column ow stride (copy 0): even for stride 2; for stride 1 an odd one is
      // copy 1's column ow - 1
      row_halo[buf][tid] = stride == 1 ? (ow & 1) * copy_bytes + ((oh - oh_first) * pitch + (ow & ~1)) * 8
                                       : ((oh - oh_first) * 2 * pitch + 2 * ow) * 8;
    }
    // the residual's tile into the buffer's stage, rows of kHaloBN channels at the staging's stride (16-byte pieces;
    // zero past the tile's pixels and channels)
    if constexpr (sizeof(OutT) == 2) {
      if (residual_staged) {
        constexpr int kVec = 16 / static_cast<int>(sizeof(OutT));
        constexpr int kPieces = kHaloBN / kVec;
        const OutT* const residual =
            static_cast<const OutT*>(ep.residual) + (static_cast<int64_t>(image) * plane + p0) * n_rows + n0;
        const unsigned stage = static_cast<unsigned>(__cvta_generic_to_shared(stage_of(buf)));
        for (int e = tid; e < kHaloBM * kPieces; e += kHaloThreads) {
          const int r = e / kPieces, col = (e % kPieces) * kVec;
          const bool fill = r < rows_valid && col < cols_valid;
          cp_async_shared<16>(stage + (r * ConvStaging<kHaloBM, kHaloBN, OutT>::kRowStride + col) * sizeof(OutT),
                              reinterpret_cast<const uint32_t*>(fill ? residual + r * n_rows + col : residual), fill);
        }
      }
    }
  };

  const uint32_t ones[2] = {lane < 4 ? ~0u : 0u, lane < 2 ? ~0u : 0u};  // column 0: words 0..5
  int buf = 0;
  if (first_tile < m_tiles) prefetch(first_tile, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();  // D_t is complete (the first tile's halo too)
  halo_epilogue_tables<kSigns>(row_base, columns, column_dir, tap_d, all_taps_d, ep, shape.pad_value, n0,
                               cols_valid, tid);  // read past the loop's first barrier
  for (int tile = first_tile; tile < m_tiles; tile += blocks_per_n, buf ^= 1) {
    cp_async_wait<0>();
    // this tile's halo and rows are visible; every thread is past the last tile's epilogue (its stores included)
    __syncthreads();
    if (tile + blocks_per_n < m_tiles) prefetch(tile + blocks_per_n, buf ^ 1);
    cp_async_commit();
    const auto [image, p0, rows_valid] = place_of(tile);
    const int64_t m0 = static_cast<int64_t>(image) * plane + p0;
    // This lane's ldmatrix row address of m tile mt at k step 0: tile row warp_m 32 + 16 mt + lane % 8 + 8 (lane / 8
    // % 2), bytes 16 (lane / 16) of its A row.
    int acc[MT][NT][4] = {};
    int pa[MT][4] = {};
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int r = warp_m * 32 + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      const unsigned a_row = smem + buf * 2 * copy_bytes + row_halo[buf][r] + (lane >> 4) * 16;
#pragma unroll
      for (int kh = 0; kh < 3; ++kh) {
        uint32_t a_frag[4];
        ldmatrix_x4(a_frag, a_row + kh * pitch * 8);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_and_popc(acc[mt][nt], a_frag, b_frag[kh][nt]);
        mma_and_popc(pa[mt], a_frag, ones);
      }
    }
    // 4 popc(P & B) - 2 popc(P): pa of rows g, g + 8 sit in lane 4g's column 0 (c0, c2)
    int dot[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int pop_low = __shfl_sync(kFullMask, pa[mt][0], lane & ~3);
      const int pop_high = __shfl_sync(kFullMask, pa[mt][2], lane & ~3);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        dot[mt][nt][0] = 4 * acc[mt][nt][0] - 2 * pop_low;
        dot[mt][nt][1] = 4 * acc[mt][nt][1] - 2 * pop_low;
        dot[mt][nt][2] = 4 * acc[mt][nt][2] - 2 * pop_high;
        dot[mt][nt][3] = 4 * acc[mt][nt][3] - 2 * pop_high;
      }
    }
    const auto values = [&](auto&& emit) {
      halo_epilogue_values<kSigns>(dot, warp_m * 32, warp_n * 32, lane, row_class[buf], row_base, columns, column_dir,
                                   emit);
    };
    conv_epilogue<kHaloBM, kHaloBN, kHaloThreads, NT>(values, warp_n * 32, lane, tid, row_out[buf], m0, n0, rows_valid,
                                                      cols_valid, n_rows, plane, ep, out, out_channels_last,
                                                      stage_of(buf), true, residual_staged);
  }
  cp_async_wait<0>();
}

// The halo kernel's launch (the conv_tap_table_kernel launch first, unless table_ready): kHaloBlocksPerSm blocks an
// SM, each n tile's blocks sharing its m tiles; cudaErrorNotSupported where conv_halo_takes is false.
// copy 1 starts 64 bytes past a 128-byte line from copy 0's start: the 8 rows of an ldmatrix matrix (even and odd
// pixels, 16 bytes apart in each copy) fall in distinct banks.
inline int64_t conv_halo_copy_bytes(const ConvShape& s) {
  return (conv_halo_rows(s.out_width, s.stride_h) * conv_halo_pitch(s.width) * 8 + 127) / 128 * 128 + 64;
}
template <typename OutT>
constexpr int64_t conv_halo_smem_bytes(int64_t copy_bytes, bool residual = false) {
  return 4 * copy_bytes + (residual ? 2 : 1) * ConvStagingBytes<kHaloBM, kHaloBN, OutT>::value;
}
constexpr int64_t kHaloMaxSmem = 96 * 1024;
inline bool conv_halo_applies(const ConvShape& s) {
  return s.kernel_h == 3 && s.kernel_w == 3 && (s.stride_h == 1 || s.stride_h == 2) && s.stride_w == s.stride_h &&
         s.dilation_h == 1 && s.dilation_w == 1 && s.pad_h == 1 && s.pad_w == 1 && s.channels > 32 &&
         s.channels <= 64 && s.height * s.width <= INT_MAX / 4 &&
         conv_halo_smem_bytes<float>(conv_halo_copy_bytes(s)) <= kHaloMaxSmem;
}
// A residual (channels_last output, added by conv_epilogue_stage) is prefetched with the tile's halo into the tile's
// own stage: fp16 / bf16 outputs, 16-byte pieces (the residual 16-byte aligned, rows of out_channels a multiple of 16
// bytes) and two stages.
template <typename OutT>
bool conv_halo_stages_residual(const ConvShape& s, const Epilogue& ep, bool out_channels_last) {
  if constexpr (sizeof(OutT) != 2) {
    return false;
  } else {
    return out_channels_last && reinterpret_cast<uintptr_t>(ep.residual) % 16 == 0 &&
           s.out_channels * sizeof(OutT) % 16 == 0 &&
           conv_halo_smem_bytes<OutT>(conv_halo_copy_bytes(s), true) <= kHaloMaxSmem;
  }
}
// Where the halo kernel runs: its shapes, no row factors (its tables hold the columns' whole epilogue), and a residual
// only where it can stage it.
template <typename OutT>
bool conv_halo_takes(const ConvShape& s, const Epilogue& ep, bool out_channels_last) {
  return conv_halo_applies(s) && ep.row_factor == nullptr &&
         (ep.residual == nullptr || conv_halo_stages_residual<OutT>(s, ep, out_channels_last));
}
template <typename OutT>
cudaError_t binary_conv2d_halo_launch(const uint32_t* plus_bits, const uint32_t* w_bits, const ConvShape& shape,
                                      const Epilogue& ep, OutT* out, bool out_channels_last, int* tap_table,
                                      int sm_count, bool dependent, bool weights_ready, bool table_ready,
                                      cudaStream_t stream) {
  if (tap_table == nullptr) return cudaErrorInvalidValue;
  if (!conv_halo_takes<OutT>(shape, ep, out_channels_last)) return cudaErrorNotSupported;
  const int64_t plane = shape.out_height * shape.out_width;
  const int64_t tiles_per_image = ceil_div(plane, kHaloBM);
  const int64_t m_tiles = shape.batch * tiles_per_image;
  const int64_t n_tiles = ceil_div(shape.out_channels, kHaloBN);
  const int64_t resident = static_cast<int64_t>(sm_count) * kHaloBlocksPerSm;
  if (m_tiles > INT_MAX - resident || n_tiles > INT_MAX) return cudaErrorInvalidValue;  // tile + blocks_per_n fits
  const int64_t blocks_per_n = std::max<int64_t>(1, std::min(m_tiles, resident / n_tiles));
  if (blocks_per_n * n_tiles > INT_MAX) return cudaErrorInvalidValue;
  const int64_t copy_bytes = conv_halo_copy_bytes(shape);
  const size_t smem = static_cast<size_t>(conv_halo_smem_bytes<OutT>(copy_bytes, ep.residual != nullptr));
  auto kernel = binary_conv2d_halo_kernel<OutT>;
  static unsigned long long smem_devices = 0;
  cudaError_t error = allow_dynamic_smem(kernel, kHaloMaxSmem, smem_devices);
  if (error != cudaSuccess) return error;
  if (!table_ready) {
    error = launch_conv_tap_table(w_bits, shape, tap_table, dependent, weights_ready, stream);
    if (error != cudaSuccess) return error;
  }
  const ClusterLaunch launch(dim3(static_cast<unsigned>(blocks_per_n * n_tiles)), kHaloThreads, smem, 1, stream,
                             dependent);
  return cudaLaunchKernelEx(&launch.config, kernel, plus_bits, w_bits, static_cast<const int*>(tap_table), shape,
                            static_cast<int>(tiles_per_image), static_cast<int>(m_tiles),
                            static_cast<int>(blocks_per_n), static_cast<int>(copy_bytes), ep, out, out_channels_last,
                            dependent && weights_ready);
}

// The pipelined kernel's tile: 128 x 64 (8 warps), or 64 x 32 in two K groups (4 warps) where those blocks are one
// wave (3 an SM). H200 harness, rotating graph us, pack_signs + conv as the op launches them, 64 x 32 in one
// / two K groups (blocks of 128 x 64): C = OC = 256 14x14 B = 1 7.76 / 7.24 (8), B = 4 8.40 / 8.16 (28); C = OC =
// 512 7x7 B = 1 9.82 / 8.85 (8), B = 2 10.03 / 8.87; C = OC = 1024 7x7 B = 1 15.08 / 13.10 (16); C = OC = 64 56x56
// B = 1 6.58 / 6.17; four K groups were better only at C = 1024 (12.57), worse at the rest. Past the old switch (a
// quarter of the SMs), 128 x 64 / 64 x 32 in one / two groups: C = OC = 64 56x56 B = 4 10.10 / 8.95 / 8.06 (98), C =
// OC = 256 14x14 B = 8 10.29 / 10.17 / 10.05 (52); C = OC = 128 28x28 B = 16 (196, wgmma 12.41): 14.13 / 18.90 with
// 64 x 32 tiles; C = OC = 64 56x56 B = 5 (490 blocks of 64 x 32, two waves) 10.70 / 12.48 (two groups); C = OC =
// 128 28x28 B = 8 (392, wgmma not taken) 10.74 / 10.33; C = OC = 256 14x14 B = 12 (296) 12.26 / 11.67.
template <int PW, typename OutT>
cudaError_t binary_conv2d_pipelined_launch(const uint32_t* plus_bits, const uint32_t* w_bits, const ConvShape& shape,
                                           const Epilogue& ep, OutT* out, bool out_channels_last, int* tap_table,
                                           cudaStream_t stream, const ConvTuning& tuning, bool weights_ready,
                                           bool table_ready) {
  constexpr int kBigBM = 128, kBigBN = 64, kSmallBM = 64, kSmallBN = 32;
  constexpr int kSmallTilesAnSm = 3;  // resident 64 x 32 blocks of two K groups: 61 KB of shared memory, 134 registers
  DeviceFacts device;
  const cudaError_t error = current_device_facts(device);
  if (error != cudaSuccess) return error;
  const bool dependent = device.major >= 9;
  // The halo kernel where it applies (tile 3 asks for it), with a residual where it can stage it (fp16 / bf16,
  // 16-byte rows: prefetched into the tile's stage with its halo). H100, harness graph us, one process, B = 256
  // C = OC = 64 56x56 fp16 channels_last (ResNet's layer1), the pipelined 128 x 64 tile -> halo with its epilogue
  // tables: fp16 out 110.8 -> 69.4, sign words (signed scales) 108.9 -> 57.8, residual + the sum's sign words 156.1 ->
  // 103.1; B = 64, residual + sign words 44.9 -> 31.1; B = 1 (the 64 x 32 tile), sign words 6.25 -> 5.44 (5.29
  // before the tables: their set-up, a threshold search a column, shows where a block has one tile).
  if constexpr (PW == 2) {
    if (tuning.tile == 3 ||
        (tuning.tile == 0 && tap_table != nullptr && conv_halo_takes<OutT>(shape, ep, out_channels_last))) {
      return binary_conv2d_halo_launch<OutT>(plus_bits, w_bits, shape, ep, out, out_channels_last, tap_table,
                                             device.sm_count, dependent, weights_ready, table_ready, stream);
    }
  } else if (tuning.tile == 3) {
    return cudaErrorNotSupported;
  }
  bool small = tuning.tile == 2;
  if (tuning.tile == 0) {
    const int64_t small_blocks = ceil_div(shape.batch * shape.out_height * shape.out_width, kSmallBM) *
                                 ceil_div(shape.out_channels, kSmallBN);
    small = small_blocks <= kSmallTilesAnSm * device.sm_count;
  }
  if (tuning.k_groups < 0 || tuning.k_groups > 2 || (!small && tuning.k_groups > 1)) return cudaErrorInvalidValue;
  if (small && tuning.k_groups != 1) {
    return binary_conv2d_pipelined_tile<kSmallBM, kSmallBN, 2, 1, 2, PW>(plus_bits, w_bits, shape, ep, out,
                                                                         out_channels_last, nullptr, dependent,
                                                                         weights_ready, false, stream);
  }
  if (small) {
    return binary_conv2d_pipelined_tile<kSmallBM, kSmallBN, 2, 1, 1, PW>(plus_bits, w_bits, shape, ep, out,
                                                                         out_channels_last, nullptr, dependent,
                                                                         weights_ready, false, stream);
  }
  // the three-block build (8-byte pieces) reads D_t from a table made once a launch (see the kernel)
  constexpr bool kTable = conv_pipelined_blocks_per_sm(PW) == 3;
  if (kTable && tap_table == nullptr) return cudaErrorInvalidValue;
  return binary_conv2d_pipelined_tile<kBigBM, kBigBN, 4, 2, 1, PW>(plus_bits, w_bits, shape, ep, out, out_channels_last,
                                                                kTable ? tap_table : nullptr, dependent, weights_ready,
                                                                table_ready, stream);
}

// ==== binary_conv2d_wgmma_kernel: the one-plane conv on Hopper's warpgroup b1 tensor cores (sm_90a) ==============
// The Hopper form of binary_conv2d_pipelined_kernel (from kCwMinPixels pixels; harness `conv ... kernel=2`): same
// math (one plane, D_t, padding-exact, conv_epilogue's integer value and epilogue_value), same results bit for bit.
// Applies to s(x) in {-1, +1}, <= kOnePlaneMaxTaps taps, channel_words % 4 == 0 (a 16-byte piece lies within one
// tap of one pixel), 16-byte aligned operands, a 9.0 device with sm_90a code.
//
// ---- Tiles ------------------------------------------------------------------------------------------------------
//   Block tile 128 pixels x BN = 128 output channels, K stage = 1024 bits = 32 words (C = 256: 4 taps of 8 words,
//   one tap a k256 step). 320 threads, two blocks an SM (so that one block's prologue, fills and epilogue run under
//   the other's main loop: a block alone is latency-bound, ~0.4 eligible warps a scheduler):
//     warps 0-3, 4-7 (consumer warpgroups 0, 1): rows 0-63 / 64-127, all BN columns: per stage up to 4 wgmma
//         m64n128k256 into 64 s32 registers a thread, each with an m64n8k256 of the same A against 8 all-ones rows
//         (the row popcounts pa, 4 s32 registers). The columns' D_t come from conv_tap_table_kernel's table (copied
//         to shared memory by cp.async before the main loop), so the main loop only issues wgmmas. H100, harness
//         graph us, 2026-12-06, against counting pa from the input pixels before the main loop and pb_t from each
//         stage's B (fp16 out): C = OC = 256 14x14 B = 64 11.69 -> 10.64, with pack_signs 15.24 -> 13.94; C = OC =
//         512 7x7 B = 256 24.11 -> 23.15, with pack_signs 29.22 -> 28.65; C = OC = 128 28x28 B = 256 with pack_signs
//         80.63 -> 76.96 (the m64n8 pa wgmmas alone: B = 64 -> 10.68, but B = 256 C = 512 -> 26.14: they add the
//         A reads a stage, and the main loop is bound by shared-memory reads there; the pb counts' were what made room).
//     warps 8-9 (producer, 64 threads): gather A by cp.async (thread p: chunk p % 8 of rows p / 8 + 8 i, i < 16);
//         producer thread 0 also issues B (the weight: rows = output channels, K-contiguous words) by 2-D TMA.
//   The last stage issues only its k steps that hold real words (C = 256 3x3: 9 k steps, not 12); its chunks past
//   them are not copied.
//   Budget: registers (ptxas, nvcc 13.0) 96, no spills (two blocks need <= 102); shared memory for 3x3: 3 stages
//   of 32 KB + tap_d 5 KB + 2.9 KB + 1 KB alignment slack, ~105 KB (two blocks in the SM's 228 KB).
//   H200 harness, rotating graph us, 2026-12-01, these two blocks an SM against one block an SM of BN = 256 (same
//   kernel otherwise): C = OC = 256 14x14 B = 64 12.3 / 13.1, B = 256 34.9 / 36.4; C = OC = 512 7x7 B = 256 30.7 /
//   33.7, B = 1 11.6 / 14.6. C = OC = 128 28x28 B = 256 (ResNet-18 layer2): 63.1; ncu 65.6 us against 90.1 for the
//   earlier one-block-an-SM kernel of 384 threads (a producer warpgroup) at BN = 128.
//
// ---- Shared memory (dynamic; base rounded up to 1024) -----------------------------------------------------------
//   [ring: S stages of (A 128 x 128 bytes | B 128 x 128 bytes)] [tap_d: taps x BN int] [all_d: BN int] [ConvWgRows]
//   and the pa wgmma's all-ones B operand (256 bytes, no swizzle: cw_ones_descriptor) in the base's 1 KB alignment
//   slack, before the base where the slack holds it, else after ConvWgRows (then >= 768 bytes are left there).
//   Both boxes in the canonical K-major SW128 layout of wgmma (as binary_linear_wgmma.cu): row r at r * 128, its
//   16-byte chunk q (words 4q..4q+3 of the stage) at r * 128 + ((q ^ (r % 8)) * 16); TMA writes B so
//   (CU_TENSOR_MAP_SWIZZLE_128B), the gather writes A so itself. Descriptors: A of consumer WG w, step j:
//   slot + w * 8192 + 32 j; B: slot + 16384 + 32 j; SBO 1024, SW128 (sw128_descriptor).
//   S = 3 where two blocks fit an SM (up to 25 taps), else as many as fit one block (up to 6).
//   After the main loop the ring holds the epilogue's int32 tile [128][BN + 8] (and for NCHW output the
//   converted tile, [BN][128 + 2] 32-bit words).
//
// ---- Pipeline protocol (kb = 0 .. kblocks-1, s = kb % S, round = kb / S) -----------------------------------------
//   full[s]  (count 65): the 64 producer threads, each after its own copies of stage kb have landed
//            (cp.async.wait_group LAG, then fence.proxy.async.shared::cta: its generic-proxy writes ordered before
//            the consumers' async-proxy wgmma reads; then mbarrier.arrive, release), + one arrive.expect_tx(BN *
//            128) whose TMA box completes the transaction bytes (thread 0 for the first S, then producer thread 0).
//   empty[s] (count 8): lane 0 of each consumer warp, after its wgmmas of the stage completed (wait_group).
//   producer thread: for kb: if kb >= S wait empty[s] parity (round - 1) & 1; (producer thread 0: expect_tx + TMA
//            B; the first S B boxes go out right after the barrier init, before the row set-up); 16 cp.async (zero
//            fill for padded taps, taps past the last, pixels past the end); commit; if kb >= LAG: wait_group LAG,
//            fence.proxy.async, arrive full[kb - LAG]. After the loop: wait_group 0, fence, arrive the last LAG.
//            LAG = min(S - 2, 2): the producer of stage kb waits for the release of kb - S, which the consumers
//            give after issuing kb - S + 1, whose arrival came at the end of iteration kb - S + 1 + LAG <= kb - 1.
//   consumers: for kb: wait full[s] parity round & 1; wgmma.fence; k steps (each an n128 and an n8 wgmma); commit;
//            wait_group 1 (the wgmmas of kb - 1 are done); arrive empty[(kb - 1) % S]. Then wait_group 0.
//   No fence for the ring's reuse (wgmma reads, then cp.async / TMA writes): a wgmma's completion is followed by
//   an implicit generic-async proxy fence (PTX ISA, wgmma "Async Proxy"), and TMA is async proxy itself.
//
// ---- Epilogue -----------------------------------------------------------------------------------------------------
//   Sign words: the consumers from their registers, after the named barrier of the 256 (their D_t, copied by
//      cp.async with the table, and the columns' sign thresholds in ConvWgRows::col_sign, found by consumer threads
//      0-127 while stage 0 is on its way, complete): the thread's two rows (16 w4 + lane / 4, + 8) x 32 columns (8 i +
//      2 (lane % 4) + 0/1), the padded taps over the union of the warp's rows, then d v - t >= 0 a bit (no float
//      math), a quad's bits OR-ed by two shuffles. No E1 / E2 (the producer warps return after their loop). Row
//      factors are refused for sign words.
//   16- and 32-bit outputs:
//   E1 (consumers, after a named barrier of the 256: both warpgroups' wgmmas are done with the ring): each thread
//      writes 4 acc - 2 pa of its fragment (rows 16 w4 + lane / 4 (+ 8), columns 8i +
//      2 (lane % 4) + 0/1, the mma.sync m16n8 C layout repeated) into the int32 tile, rows BN + 8 words apart
//      (8-byte stores of a warp on distinct banks); for a channels_last output column c at word cw_col(c) (16-byte
//      chunks swapped in pairs, so that E2's 16-byte reads are free of bank conflicts; tap_d likewise: ncu, H100,
//      B = 64 C = 256 14x14: 260,469 -> 69,338 shared-load bank conflicts, 12.10 -> 11.52 us; H200 11.99 ->
//      11.57). __syncthreads (all 320: the producer warps join the rest).
//   E2 (all 10 warps): a warp takes two rows at a time (16 lanes a row), so the padded-tap correction of the row is
//      uniform across the warp (no divergence): value = tile + all_d[c] - (1 + pad) sum_padded D_t[c] (all_d =
//      sum_t D_t; with the E1 term conv_epilogue's integer). Then epilogue_value's fma (bit for bit). The column values (scale, bias,
//      all_d) of the lane's 8 columns are read once a thread.
//      channels_last: lane = 8 consecutive columns, stored straight to global (16-byte vectors where the row
//      pitch and the output pointer allow: a half warp writes a row's 256 contiguous bytes for fp16); 16-bit
//      outputs two of the warp's row pairs a trip (both pairs' tile loads before either's math).
//      NCHW: lane = columns lane % 16 + 16 e, values kept in registers for all the thread's rows, __syncthreads,
//      written transposed ([channel][pixel], 2 mod 32 line stride: no bank conflicts), __syncthreads, E3: the 256
//      consumer threads store consecutive pixels of a channel.
//
// Debugging: -DBITCOMPILE_WGMMA_WATCHDOG (wgmma_common.cuh) traps a wait that spins ~4 s and prints role and
// stage: role 0 = producer thread on empty[s], role 2 = consumer on full[s].
constexpr int kCwThreads = 320;                 // 8 consumer warps (two warpgroups), then 2 producer warps
constexpr int kCwConsumerThreads = 256;
constexpr int kCwProducerThreads = kCwThreads - kCwConsumerThreads;
constexpr int kCwBM = 128;
constexpr int kCwMaxStages = 6;
constexpr int kCwStageWords = 32;               // 1024 bits of K a stage, 128 bytes of a row
constexpr int kCwMaxDynamicSmem = 232448;       // sm_90: 227 KB a block (opt-in)
constexpr int kCwEmptyArrivals = 8;             // consumer warps
constexpr int kCwFullArrivals = kCwProducerThreads + 1;  // producer threads + the TMA thread's expect_tx
constexpr int kCwBN = 128;                      // output channels a block
constexpr int kCwBlocksPerSm = 2;               // resident blocks an SM (registers <= 65536 / 640 = 102 a thread)
constexpr int kCwSmemPerSm = 233472;            // sm_90: 228 KB an SM, 1 KB of it reserved a resident block

struct ConvWgLayout {
  static constexpr int BN = kCwBN;
  static constexpr int kBytesA = kCwBM * 128;                    // 16384
  static constexpr int kBytesB = BN * 128;
  static constexpr int kStageBytes = kBytesA + kBytesB;
  static_assert(kBytesA % 1024 == 0 && kStageBytes % 1024 == 0, "SW128 boxes 1024-byte aligned");
  static constexpr int kTileStride = BN + 8;                     // int32 words a row of the E1 tile
  static constexpr int kTileBytes = kCwBM * kTileStride * 4;
  static constexpr int kLineStride = kCwBM + 2;                 // words a channel line (NCHW staging)
  static constexpr int kLineBytes = BN * kLineStride * 4;
  static_assert(kTileBytes <= 3 * kStageBytes && kLineBytes <= 3 * kStageBytes, "epilogue tiles fit a 3-stage ring");
  static constexpr int kLanesPerRow = BN / 8;                    // E2: 8 columns a lane
  static constexpr int kRowsPerWarp = 32 / kLanesPerRow;         // E2: rows a warp at a time
  static constexpr int kRowStep = (kCwThreads / 32) * kRowsPerWarp;
  static constexpr int kRowsPerThread = (kCwBM + kRowStep - 1) / kRowStep;  // NCHW: rows held in registers
};

// Per-block values that are not part of the ring (8-byte aligned: placed after the int arrays).
struct ConvWgRows {
  int64_t row_pixel[kCwBM];               // flat input pixel of the row's (image, top, left) tap (may lie outside)
  union {
    int64_t row_out[kCwBM];               // NCHW output offset of the row's channel 0
    int2 col_sign[kCwBM];                 // sign words: (d, t) of column c (sign_threshold)
  };
  int64_t tap_offset[kOnePlaneMaxTaps];   // pixel offset of tap t = (kh, kw) from the (top, left) pixel
  uint32_t row_inside[kCwBM];             // the row's taps inside the image (bit t), 0 past the last output pixel
  uint64_t bars[2 * kCwMaxStages];        // full[s] at bars[s], empty[s] at bars[S + s]
};

// Dynamic shared memory of the kernel: 1 KB of alignment slack (it also holds the 256-byte ones operand), the ring,
// tap_d and all_d, ConvWgRows (a multiple of 16 bytes: the tail slack starts 16-byte aligned).
static_assert(sizeof(ConvWgRows) % 16 == 0, "the tail slack after ConvWgRows starts 16-byte aligned");
static_assert(kCwBN <= kCwBM, "col_sign holds a (d, t) for each of the block's columns");
constexpr size_t conv_wgmma_smem_bytes(int stages, int taps) {
  return 1024 + static_cast<size_t>(stages) * ConvWgLayout::kStageBytes + static_cast<size_t>(taps + 1) * kCwBN * 4 +
         sizeof(ConvWgRows);
}

#if BC_WGMMA_ENABLED
__device__ __forceinline__ uint32_t cw_shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Word of column c (0..127) in a row of the E1 tile and of tap_d for a channels_last output (swizzle = 4): the
// 16-byte chunks of columns 32..63 and 96..127 trade places in pairs (word bit 2 flipped where bit 5 is set), so E2's
// eight lanes of a 16-byte load phase (chunks 2 l or 2 l + 1, l = 0..7) land on eight distinct bank quads; without
// it lanes l and l + 4 share one (2-way conflicts). NCHW (swizzle = 0) reads single words, 16 consecutive a row.
constexpr int kCwColSwizzle = 4;  // cw_col's swizzle for a channels_last output (NCHW: 0)
__device__ __forceinline__ int cw_col(int c, int swizzle) { return c ^ ((c >> 3) & swizzle); }
// Named barrier `id` (1..15) of `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void st_shared_v2(uint32_t address, int a, int b) {
  asm volatile("st.shared.v2.s32 [%0], {%1, %2};\n" ::"r"(address), "r"(a), "r"(b) : "memory");
}
// Descriptor of the all-ones B operand of the row popcounts (N = 8, k256: 8 rows x 32 bytes) with no swizzle: two
// 8-row x 16-byte core matrices, K-adjacent 128 bytes apart (leading byte offset 128); with a single 8-row group the
// stride byte offset is unused (128 too), so every byte the wgmma reads lies in the 256 bytes at `start`.
__device__ __forceinline__ uint64_t cw_ones_descriptor(uint32_t start) {
  constexpr uint64_t kLbo = 128 >> 4, kSbo = 128 >> 4;  // swizzle mode 0 (none) in bits 62-63
  return static_cast<uint64_t>((start & 0x3ffff) >> 4) | (kLbo << 16) | (kSbo << 32);
}
// A stage's STEPS k256 steps as one commit group: A at a_start, B at b_start (SW128 K-major), step j 32 bytes into
// both rows; each step's A also against the all-ones operand into pa (its 8 columns all popc of the A row).
template <int BN, int STEPS>
__device__ __forceinline__ void wgmma_stage(int (&acc)[BN / 2], int (&pa)[4], uint32_t a_start, uint32_t b_start,
                                            uint64_t ones) {
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < STEPS; ++j) {
    const uint64_t a = sw128_descriptor(a_start + 32 * j);
    b1::wgmma_and_popc<BN>(acc, a, sw128_descriptor(b_start + 32 * j));
    b1::wgmma_and_popc<8>(pa, a, ones);
  }
  wgmma_commit();
}
#endif

// from_float's value as raw bits in the low bits of a word.
template <typename OutT>
__device__ __forceinline__ uint32_t out_bits(float v);
template <>
__device__ __forceinline__ uint32_t out_bits<float>(float v) {
  return __float_as_uint(v);
}
template <>
__device__ __forceinline__ uint32_t out_bits<__half>(float v) {
  return __half_as_ushort(from_float<__half>(v));
}
template <>
__device__ __forceinline__ uint32_t out_bits<__nv_bfloat16>(float v) {
  return __bfloat16_as_ushort(from_float<__nv_bfloat16>(v));
}

// Eight outputs of one row (channels_last), converted as from_float converts (OutPair: one packed conversion a pair)
// and packed into 32-bit words: 16-bit types 4 words (a pair each), fp32 8.
template <typename OutT>
struct EightOut {
  static constexpr int kWords = sizeof(OutT) == 2 ? 4 : 8;
  uint32_t w[kWords];
  __device__ __forceinline__ void set(const float (&y)[8]) {
    if constexpr (sizeof(OutT) == 2) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const typename OutPair<OutT>::type pair = OutPair<OutT>::make(y[2 * i], y[2 * i + 1]);
        w[i] = *reinterpret_cast<const uint32_t*>(&pair);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = __float_as_uint(y[i]);
    }
  }
  // Loads the first `valid` elements (a multiple of V, or all 8) from src in vectors of V elements (store's mirror).
  template <int V>
  __device__ __forceinline__ void load(const OutT* __restrict__ src, int valid) {
    constexpr int kBytes = V * static_cast<int>(sizeof(OutT));
#pragma unroll
    for (int g = 0; g < 8 / V; ++g) {
      if (g * V >= valid) break;
      if constexpr (kBytes == 16) {
        const uint4 a = *reinterpret_cast<const uint4*>(src + g * V);
        w[4 * g] = a.x, w[4 * g + 1] = a.y, w[4 * g + 2] = a.z, w[4 * g + 3] = a.w;
      } else if constexpr (kBytes == 8) {
        const uint2 a = *reinterpret_cast<const uint2*>(src + g * V);
        w[2 * g] = a.x, w[2 * g + 1] = a.y;
      } else if constexpr (kBytes == 4) {
        w[g] = *reinterpret_cast<const uint32_t*>(src + g * V);
      } else {  // one 16-bit element, into the half of its word that element() reads
        const uint32_t bits = *reinterpret_cast<const uint16_t*>(src + g);
        w[g >> 1] = (g & 1) ? (w[g >> 1] & 0xffffu) | (bits << 16) : bits;
      }
    }
  }
  // Element e (0..7) as a float.
  __device__ __forceinline__ float value(int e) const {
    if constexpr (sizeof(OutT) == 2) {
      const uint16_t bits = static_cast<uint16_t>(element(e));
      return to_float(*reinterpret_cast<const OutT*>(&bits));
    } else {
      return __uint_as_float(w[e]);
    }
  }
  // Element e (0..7) as its raw bits in the low bits of a word.
  __device__ __forceinline__ uint32_t element(int e) const {
    if constexpr (sizeof(OutT) == 2) {
      return (w[e >> 1] >> (16 * (e & 1))) & 0xffffu;
    } else {
      return w[e];
    }
  }
  // Stores the first `valid` elements (a multiple of V, or all 8) at dst in vectors of V elements (dst V-aligned).
  template <int V>
  __device__ __forceinline__ void store(OutT* dst, int valid) const {
    constexpr int kBytes = V * static_cast<int>(sizeof(OutT));
#pragma unroll
    for (int g = 0; g < 8 / V; ++g) {
      if (g * V >= valid) break;
      if constexpr (kBytes == 16) {
        *reinterpret_cast<uint4*>(dst + g * V) = make_uint4(w[4 * g], w[4 * g + 1], w[4 * g + 2], w[4 * g + 3]);
      } else if constexpr (kBytes == 8) {
        *reinterpret_cast<uint2*>(dst + g * V) = make_uint2(w[2 * g], w[2 * g + 1]);
      } else if constexpr (kBytes == 4) {
        *reinterpret_cast<uint32_t*>(dst + g * V) = w[g];
      } else {  // one 16-bit element
        *reinterpret_cast<uint16_t*>(dst + g) = static_cast<uint16_t>(element(g));
      }
    }
  }
};

template <typename OutT>
__global__ __launch_bounds__(kCwThreads, kCwBlocksPerSm) void binary_conv2d_wgmma_kernel(
    const __grid_constant__ CUtensorMap map_w, const uint32_t* __restrict__ plus_bits,
    const int* __restrict__ tap_table, ConvShape shape, int m_tiles,
    int stages, int channel_words, int reduction_words, Epilogue ep, OutT* __restrict__ out, bool out_channels_last,
    bool weights_ready) {
#if BC_WGMMA_ENABLED
  using L = ConvWgLayout;
  constexpr int BN = kCwBN;
  constexpr bool kSigns = std::is_same_v<OutT, SignWords>;
  extern __shared__ uint8_t cw_smem_raw[];
  uint8_t* const smem = cw_smem_raw + ((1024 - (cw_shared_address(cw_smem_raw) & 1023)) & 1023);
  const uint32_t ring = cw_shared_address(smem);
  const int taps = static_cast<int>(shape.kernel_h * shape.kernel_w);
  int* const tap_d = reinterpret_cast<int*>(smem + stages * L::kStageBytes);  // D_t of column c at [t * BN + cw_col(c)]
  int* const all_d = tap_d + taps * BN;                                      // sum_t D_t of column c at [c]
  ConvWgRows& rows = *reinterpret_cast<ConvWgRows*>(all_d + BN);
  const uint32_t slack = ring - cw_shared_address(cw_smem_raw);  // 0..1023 bytes before the base
  const uint32_t ones = slack >= 256 ? ring - 256 : cw_shared_address(&rows + 1);
  const uint32_t full_bar = cw_shared_address(&rows.bars[0]);  // full[s] at full_bar + 8 s
  const uint32_t empty_bar = full_bar + 8 * stages;            // empty[s] at empty_bar + 8 s

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x % static_cast<unsigned>(m_tiles)) * kCwBM;
  const int n0 = static_cast<int>(blockIdx.x / static_cast<unsigned>(m_tiles)) * BN;  // out_channels <= INT_MAX
  const int kblocks = (reduction_words + kCwStageWords - 1) / kCwStageWords;
  const int64_t total_pixels = shape.batch * shape.out_height * shape.out_width;
  const int64_t out_plane = shape.out_height * shape.out_width;
  const int64_t n_rows = shape.out_channels;
  // launched dependent: pack_signs' bits (and anything earlier) are visible past this wait; with weights_ready the
  // first stages' B boxes and the row set-up go first (launch_binary_conv2d)
  if (!weights_ready) wait_for_prerequisite_grid();
  if (tid == 0) {
    init_stage_ring(full_bar, empty_bar, stages, kCwFullArrivals, kCwEmptyArrivals);
    fence_proxy_async_shared();
    // B does not depend on the rows: the first stages' boxes go out before the row set-up.
    for (int kb = 0; kb < stages && kb < kblocks; ++kb) {
      mbar_arrive_expect_tx(full_bar + 8 * kb, L::kBytesB);  // TMA counts the zero-filled out-of-bound bytes too
      tma_load_2d(ring + kb * L::kStageBytes + L::kBytesA, &map_w, kb * kCwStageWords, n0, full_bar + 8 * kb);
    }
  }
  if (tid < kCwBM) {  // the rows' pixel math, once a row (as binary_conv2d_pipelined_kernel)
    const RowPixel row = row_pixel(shape, m0 + tid, total_pixels, out_plane);
    rows.row_pixel[tid] = row.pixel;
    rows.row_inside[tid] = row.inside;
    if (!kSigns) rows.row_out[tid] = row.out_offset;
  }
  if (tid < taps) rows.tap_offset[tid] = tap_offset_pixels(shape, tid);
  if (tid >= kCwThreads - 64) {  // the ones operand, written by generic stores and read by the async proxy
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(ones + 4 * (tid - (kCwThreads - 64))), "r"(~0u) : "memory");
    fence_proxy_async_shared();
  }
  __syncthreads();
  if (weights_ready) wait_for_prerequisite_grid();

  // The epilogue's values (conv_epilogue's integer and epilogue_value). Sign words are written by the consumers
  // straight from their accumulators (E1 and E2 are for 16- and 32-bit outputs).
  const int2 tile_valid = conv_tile_valid<kCwBM, BN>(m0, n0, total_pixels, n_rows);
  const int rows_valid = tile_valid.x, cols_valid = tile_valid.y;
  const bool has_scale = ep.scale != nullptr, has_bias = ep.bias != nullptr;
  const int scale_step = has_scale && ep.scale_count != 1 ? 1 : 0;
  const float* scale = has_scale ? ep.scale + n0 * scale_step : &kEpilogueUnit[0];
  const float* bias = has_bias ? ep.bias + n0 : &kEpilogueUnit[1];
  const uint32_t all_taps = taps >= 32 ? 0xffffffffu : (1u << taps) - 1u;
  const int pad_weight = -(1 + shape.pad_value);  // of a padded tap's D_t
  const int tap_step = kCwStageWords / channel_words;  // a stage's advance in whole taps and channel words
  const int word_step = kCwStageWords % channel_words;
  const int steps_words = (reduction_words + 7) & ~7;  // the words the k steps cover (whole 256-bit steps)
  // The warpgroup, broadcast from lane 0 so that ptxas sees a warp-uniform role: with a threadIdx-derived one it
  // takes the consumers' branch on the step count (below) as divergent and serializes the wgmmas (C7520).
  // warps 0-3 / 4-7: consumer warpgroups 0 / 1; warps 8-9 (warpgroup 2, not a whole one): the producer.
  const int warpgroup = __shfl_sync(kFullMask, tid / 128, 0);
  if (warpgroup == 2) {
    // ---- producer warps: the A gather (and producer thread 0: B by TMA) ----
    constexpr int kRowGroups = kCwProducerThreads / 8;  // rows a pass: 8 threads (chunks) a row
    constexpr int kRowsEach = kCwBM / kRowGroups;       // rows a producer thread copies
    const int ptid = tid - kCwConsumerThreads;
    const int chunk = ptid & 7;   // 16-byte chunk of the stage row: words 4 chunk .. 4 chunk + 3
    const int row0 = ptid >> 3;   // rows row0 + kRowGroups i: a warp copies 4 whole rows (128 contiguous bytes a tap)
    uint64_t a_source[kRowsEach];  // global byte address of the row's (image, top, left) pixel
    uint32_t a_inside[kRowsEach];
#pragma unroll
    for (int i = 0; i < kRowsEach; ++i) {
      const int r = row0 + kRowGroups * i;
      a_source[i] = reinterpret_cast<uint64_t>(plus_bits) + static_cast<uint64_t>(rows.row_pixel[r] * channel_words * 4);
      a_inside[i] = rows.row_inside[r];
    }
    static_assert(kRowGroups % 8 == 0, "rows row0 + kRowGroups i share r % 8 (one swizzle a thread)");
    // + slot + i * kRowGroups * 128
    const uint32_t a_dst = row0 * 128 + ((chunk ^ (row0 & 7)) * 16);
    int tap = 4 * chunk / channel_words;  // of the next stage to issue (tap < taps <=> word < reduction_words)
    int channel_word = 4 * chunk % channel_words;
    const int lag = stages >= 4 ? 2 : 1;
    int s = 0, published_s = 0;  // slot of kb, and of the next stage to publish (stages are published in order)
    uint32_t round_parity = 0;   // (kb / stages) & 1
    for (int kb = 0; kb < kblocks; ++kb) {
      const uint32_t slot = ring + s * L::kStageBytes;
      if (kb >= stages) {
        mbar_wait(empty_bar + 8 * s, round_parity ^ 1u, 0, kb);  // round kb / S - 1 released it
        if (ptid == 0) {
          mbar_arrive_expect_tx(full_bar + 8 * s, L::kBytesB);
          tma_load_2d(slot + L::kBytesA, &map_w, kb * kCwStageWords, n0, full_bar + 8 * s);
        }
      }
      const bool in_taps = tap < taps;
      const int tap_bit = in_taps ? tap : 0;
      const uint64_t offset = static_cast<uint64_t>((rows.tap_offset[tap_bit] * channel_words + channel_word) * 4);
      // A chunk past the stage's last k step is never read (by no wgmma): not copied
      if (kb * kCwStageWords + 4 * chunk < steps_words) {
#pragma unroll
        for (int i = 0; i < kRowsEach; ++i) {
          const bool fill = in_taps && ((a_inside[i] >> tap_bit) & 1u) != 0;
          cp_async_shared<16>(slot + a_dst + i * kRowGroups * 128,
                              fill ? reinterpret_cast<const uint32_t*>(a_source[i] + offset) : plus_bits, fill);
        }
      }
      cp_async_commit();  // (an empty group where nothing was copied: the wait_group accounting stays the same)
      tap += tap_step;
      channel_word += word_step;
      if (channel_word >= channel_words) {
        channel_word -= channel_words;
        ++tap;
      }
      if (kb >= lag) {  // this thread's copies of stage kb - lag have landed: publish them to the async proxy
        if (lag == 2) {
          cp_async_wait<2>();
        } else {
          cp_async_wait<1>();
        }
        fence_proxy_async_shared();
        mbar_arrive(full_bar + 8 * published_s);  // stage kb - lag
        if (++published_s == stages) published_s = 0;
      }
      if (++s == stages) {
        s = 0;
        round_parity ^= 1u;
      }
    }
    cp_async_wait<0>();
    fence_proxy_async_shared();
    for (int done = max(kblocks - lag, 0); done < kblocks; ++done) {
      mbar_arrive(full_bar + 8 * published_s);
      if (++published_s == stages) published_s = 0;
    }
  } else {
    // ---- consumer warpgroups ----
    const int wg = warpgroup;  // 0: tile rows 0-63, 1: rows 64-127
    const int ctid = tid;      // 0..255
    const int quad = lane & 3;
    int acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0;
    // pa, the popcount of a tile row's A bits (padded taps and words past the channels are zero-filled), from the
    // m64n8 wgmmas against the ones operand: every column of a row holds it (rows of the acc fragment).
    int pa[4] = {0, 0, 0, 0};
    const uint64_t ones_desc = cw_ones_descriptor(ones);
    // D_t of the block's columns (conv_tap_table_kernel's table, complete past the prerequisite-grid wait above)
    // into tap_d / all_d by cp.async (awaited before E1): no pb counts in the main loop.
    const int col_swizzle = out_channels_last && !kSigns ? kCwColSwizzle : 0;  // cw_col's, for tap_d and the E1 tile
    for (int i = ctid; i < (taps + 1) * BN; i += kCwConsumerThreads) {
      const int t = i / BN, c = i - t * BN;
      const bool valid = n0 + c < n_rows;
      const uint32_t dst = cw_shared_address(tap_d + t * BN + (t < taps ? cw_col(c, col_swizzle) : c));
      cp_async_shared<4>(dst, valid ? reinterpret_cast<const uint32_t*>(tap_table + t * n_rows + n0 + c)
                                    : reinterpret_cast<const uint32_t*>(tap_table), valid);
    }
    cp_async_commit();
    if constexpr (kSigns) {  // the columns' sign thresholds, while stage 0 is on its way (threads 0-127)
      if (ctid < BN) {
        const bool valid = ctid < cols_valid;
        rows.col_sign[ctid] = valid ? sign_threshold(scale[ctid * scale_step], has_bias ? bias[ctid] : 0.f)
                                    : make_int2(0, 1);
      }
    }
    int s = 0, previous_s = 0;
    uint32_t round_parity = 0;
    for (int kb = 0; kb < kblocks; ++kb) {
      mbar_wait(full_bar + 8 * s, round_parity, 2, kb);
      const uint32_t slot = ring + s * L::kStageBytes;
      const int steps = min(4, (reduction_words - kb * kCwStageWords + 7) / 8);  // k steps holding real words
      const uint32_t a_start = slot + wg * (64 * 128);
      const uint32_t b_start = slot + L::kBytesA;
      b1::fence_accumulators(acc);
      b1::fence_accumulators(pa);
      // One straight-line fence + chain + commit a step count: a branch around single wgmmas makes ptxas serialize
      // them (C7520); a fence before the branch or a commit after the join makes it inject arrives (C7519).
      if (steps == 4) {
        wgmma_stage<BN, 4>(acc, pa, a_start, b_start, ones_desc);
      } else if (steps == 3) {
        wgmma_stage<BN, 3>(acc, pa, a_start, b_start, ones_desc);
      } else if (steps == 2) {
        wgmma_stage<BN, 2>(acc, pa, a_start, b_start, ones_desc);
      } else {
        wgmma_stage<BN, 1>(acc, pa, a_start, b_start, ones_desc);
      }
      wgmma_wait<1>();  // the wgmmas of kb - 1 are complete: their stage may be refilled
      b1::fence_accumulators(acc);
      b1::fence_accumulators(pa);
      if (kb > 0) {
        __syncwarp();
        if (lane == 0) mbar_arrive(empty_bar + 8 * previous_s);
      }
      previous_s = s;
      if (++s == stages) {
        s = 0;
        round_parity ^= 1u;
      }
    }
    wgmma_wait<0>();
    b1::fence_accumulators(acc);
    b1::fence_accumulators(pa);
    cp_async_wait<0>();     // the thread's D_t (and column) copies, visible to the other consumers past the barrier
    named_barrier(1, 256);  // both warpgroups' wgmmas are done with the ring (16- and 32-bit outputs: the E1 tile)
    const int r_top = wg * 64 + (warp & 3) * 16 + (lane >> 2);
    const int term_top = -2 * pa[0], term_bottom = -2 * pa[2];  // pa of rows r_top and r_top + 8
    if constexpr (kSigns) {
      // ---- Sign words from the accumulators: the thread's rows r_top and r_top + 8, columns 8 i + 2 quad (+ 1) ----
      // v = 4 acc - 2 pa + sum_t D_t - (1 + pad) sum_padded D_t (conv_epilogue's integer); the sign of
      // epilogue_value(v, 1, scale, bias) is that of d v - t (col_sign, no row factors here); bit c % 32 of the
      // pixel's word (n0 + c) / 32 where it is >= 0, a quad's bits OR-ed by two shuffles. H100 harness, graph
      // us, against E1 / E2 writing them (2026-12-06): B = 64 C = 256 14x14 11.82 -> 10.50; ResNet-18 at B = 256:
      // layer2 (C = 128 28x28) 57.38 -> 49.72, layer3 (C = 256 14x14) 31.26 -> 28.20, layer4 (C = 512 7x7) 23.01 ->
      // 21.62; B = 1 5.71 both. The same from the registers for fp16 output lost (B = 64 10.66 -> 11.80): its
      // padded-tap loop runs over the union of a warp's 16 rows, where E2 takes a row's taps over 16 lanes at once.
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[i] = 4 * acc[i] + ((i & 2) != 0 ? term_bottom : term_top);
      uint32_t left[2];  // the rows' padded taps (none for interior rows, rows past the last or pad = -1)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r_top + 8 * h;
        left[h] = pad_weight != 0 && r < rows_valid ? ~rows.row_inside[r] & all_taps : 0u;
      }
      for (uint32_t any = left[0] | left[1]; any != 0; any &= any - 1) {
        const int t = __ffs(any) - 1;
        const int w_top = ((left[0] >> t) & 1u) != 0 ? pad_weight : 0;
        const int w_bottom = ((left[1] >> t) & 1u) != 0 ? pad_weight : 0;
        const int* d = tap_d + t * BN + 2 * quad;
#pragma unroll
        for (int i = 0; i < BN / 8; ++i) {
          const int2 v = *reinterpret_cast<const int2*>(d + 8 * i);
          acc[4 * i] += w_top * v.x;
          acc[4 * i + 1] += w_top * v.y;
          acc[4 * i + 2] += w_bottom * v.x;
          acc[4 * i + 3] += w_bottom * v.y;
        }
      }
      uint32_t* const words = reinterpret_cast<uint32_t*>(out);
      const int64_t words_per_pixel = (n_rows + 31) / 32;
#pragma unroll
      for (int g = 0; g < BN / 32; ++g) {  // word g of the block's columns: i = 4 g .. 4 g + 3
        uint32_t bits[2] = {0u, 0u};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int i = 4 * g + j;
          const int c = 8 * i + 2 * quad;
          const int2 all = *reinterpret_cast<const int2*>(all_d + c);  // sum_t D_t
          const bool valid0 = c < cols_valid, valid1 = c + 1 < cols_valid;
          const int4 sign = *reinterpret_cast<const int4*>(&rows.col_sign[c]);  // (d, t) of c, c + 1
          // d (v + all) - t = d v + (d all - t)
          const int term0 = sign.x * all.x - sign.y, term1 = sign.z * all.y - sign.w;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int z0 = acc[4 * i + 2 * h] * sign.x + term0;
            const int z1 = acc[4 * i + 2 * h + 1] * sign.z + term1;
            bits[h] |= ((valid0 && z0 >= 0 ? 1u : 0u) | (valid1 && z1 >= 0 ? 2u : 0u)) << (8 * j + 2 * quad);
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t word = bits[h];
          word |= __shfl_xor_sync(kFullMask, word, 1);
          word |= __shfl_xor_sync(kFullMask, word, 2);
          const int r = r_top + 8 * h;
          if (quad == 0 && r < rows_valid && 32 * g < cols_valid) {
            words[(m0 + r) * words_per_pixel + (n0 >> 5) + g] = word;
          }
        }
      }
    } else {
      // E1: 4 acc - 2 pa into the int32 tile [128][BN + 8] (E2 adds the columns' terms).
      // columns 8 i + 2 quad (+ 1) at words cw_col of them: channels_last 8 i + (2 quad ^ 4) where i / 4 is odd
      const uint32_t e1_top = ring + (r_top * L::kTileStride + 2 * quad) * 4;
      const uint32_t e1_top_x = ring + (r_top * L::kTileStride + (2 * quad ^ col_swizzle)) * 4;
      constexpr uint32_t kEightRows = 8 * L::kTileStride * 4;
#pragma unroll
      for (int i = 0; i < BN / 8; ++i) {
        const uint32_t e1 = ((i >> 2) & 1) != 0 ? e1_top_x : e1_top;
        st_shared_v2(e1 + i * 32, 4 * acc[4 * i] + term_top, 4 * acc[4 * i + 1] + term_top);
        st_shared_v2(e1 + kEightRows + i * 32, 4 * acc[4 * i + 2] + term_bottom, 4 * acc[4 * i + 3] + term_bottom);
      }
    }
  }
  if constexpr (kSigns) return;  // (the producer warps too: E2 is for 16- and 32-bit outputs)
  __syncthreads();  // the E1 tile, tap_d and all_d complete

  // ---- E2: a row (BN = 128: two) a warp at a time, 8 columns a lane ----
  const int row_sub = lane / L::kLanesPerRow;
  const int lane_in_row = lane % L::kLanesPerRow;
  const int first_row = warp * L::kRowsPerWarp + row_sub;
  // columns of the lane: channels_last 8 consecutive (vector stores); NCHW lane_in_row + kLanesPerRow e (the
  // transposed staging's writes on distinct banks)
  const int col_base = out_channels_last ? 8 * lane_in_row : lane_in_row;
  const int col_step = out_channels_last ? 1 : L::kLanesPerRow;
  float col_scale[8], col_bias[8];
  int col_all_d[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int col = col_base + e * col_step;
    const bool valid = col < cols_valid;
    col_scale[e] = valid ? scale[col * scale_step] : 0.f;
    col_bias[e] = valid ? bias[has_bias ? col : 0] : 0.f;
    col_all_d[e] = all_d[col];  // sum_t D_t
  }
  const int* tile = reinterpret_cast<const int*>(smem);
  // Words of the lane's two 16-byte chunks in a tile / tap_d row (channels_last; they trade places where lane_in_row
  // / 4 is odd)
  const int lo_word = cw_col(col_base, kCwColSwizzle), hi_word = cw_col(col_base + 4, kCwColSwizzle);
  // The integer dot of (row r, the lane's 8 columns): tile + sum_t D_t - (1 + pad) sum_padded D_t (conv_epilogue's),
  // the padded taps' loop uniform across the row's lanes (none for interior pixels or pad = -1).
  auto row_tile = [&](int r, int (&v)[8]) {
    const int* line = tile + r * L::kTileStride;
    if (out_channels_last) {
      const int4 lo = *reinterpret_cast<const int4*>(line + lo_word);
      const int4 hi = *reinterpret_cast<const int4*>(line + hi_word);
      v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = line[col_base + e * L::kLanesPerRow];
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] += col_all_d[e];
  };
  auto row_padded = [&](int r, int (&v)[8]) {
    if (pad_weight != 0) {
      for (uint32_t left = ~rows.row_inside[r] & all_taps; left != 0; left &= left - 1) {
        const int* d = tap_d + (__ffs(left) - 1) * BN;
        if (out_channels_last) {
          const int4 lo = *reinterpret_cast<const int4*>(d + lo_word);
          const int4 hi = *reinterpret_cast<const int4*>(d + hi_word);
          v[0] += pad_weight * lo.x, v[1] += pad_weight * lo.y, v[2] += pad_weight * lo.z;
          v[3] += pad_weight * lo.w, v[4] += pad_weight * hi.x, v[5] += pad_weight * hi.y;
          v[6] += pad_weight * hi.z, v[7] += pad_weight * hi.w;
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] += pad_weight * d[col_base + e * L::kLanesPerRow];
        }
      }
    }
  };
  auto row_dots = [&](int r, int (&v)[8]) {
    row_tile(r, v);
    row_padded(r, v);
  };
  // epilogue_value(dot, factor, scale, bias) = fma(dot * factor, scale, bias) as nvcc contracts it, bit for bit;
  // without a row factor (the op's convs) dot * 1 is exact, so fma(dot, scale, bias) gives the same bits.
  auto run = [&](auto with_factor) {
    constexpr bool kFactor = decltype(with_factor)::value;
    const float* factors = ep.row_factor + m0;
    auto dot_values = [&](int r, const int (&v)[8], float (&y)[8]) {
      const float factor = kFactor ? factors[r] : 1.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float dot = static_cast<float>(v[e]);
        y[e] = __fmaf_rn(kFactor ? __fmul_rn(dot, factor) : dot, col_scale[e], col_bias[e]);
      }
    };
    auto row_values = [&](int r, float (&y)[8]) {
      int v[8];
      row_dots(r, v);
      dot_values(r, v, y);
    };
    if constexpr (kSigns) {
      // (written by the consumers from their accumulators)
    } else if (out_channels_last) {
      // The widest vector (elements) dividing the row pitch and the output's (and the residual's) alignment, as
      // conv_epilogue_store.
      constexpr int kMaxVec = 16 / static_cast<int>(sizeof(OutT));
      const OutT* const residual = static_cast<const OutT*>(ep.residual);
      const uintptr_t address = reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(residual);
      int vec = kMaxVec;
      while (vec > 1 && ((n_rows & (vec - 1)) != 0 || (address & (vec * sizeof(OutT) - 1)) != 0)) vec >>= 1;
      const int valid = min(8, cols_valid - col_base);  // a multiple of vec, or 8 (n_rows % vec == 0)
      // Sign words: a word's 32 columns are 4 consecutive lanes of a row, whose bits are OR-ed by two shuffles; a lane
      // past cols_valid in a word with valid columns takes part with no bits and no loads or stores.
      uint32_t* const out_signs = ep.out_signs;
      if (valid > 0 || (out_signs != nullptr && (col_base & ~31) < cols_valid)) {
        OutT* dst = out + (m0 + first_row) * n_rows + n0 + col_base;
        const int64_t dst_step = static_cast<int64_t>(L::kRowStep) * n_rows;
        const int64_t words_per_pixel = (n_rows + 31) / 32;
        uint32_t* words =
            out_signs == nullptr ? nullptr : out_signs + (m0 + first_row) * words_per_pixel + ((n0 + col_base) >> 5);
        const int64_t words_step = static_cast<int64_t>(L::kRowStep) * words_per_pixel;
        const uint32_t group_mask = 0xfu << (lane & ~3);
        // f(std::integral_constant<int, V>{}) for the row's vector width V (elements), the loads' and the stores'
        auto by_vec = [&](auto&& f) {
          if (vec == kMaxVec) {
            f(std::integral_constant<int, kMaxVec>{});
          } else if (vec >= 4) {
            f(std::integral_constant<int, 4>{});
          } else if (vec == 2) {
            f(std::integral_constant<int, 2>{});
          } else {
            f(std::integral_constant<int, 1>{});
          }
        };
        auto load_residual = [&](EightOut<OutT>& r, const OutT* src) {
          by_vec([&](auto v) { r.template load<decltype(v)::value>(src, valid); });
        };
        // y rounded to OutT, plus the residual's element, in fp32 (then rounded again by the store): eager's add
        auto plus_residual = [&](float (&y)[8], const EightOut<OutT>& r) {
#pragma unroll
          for (int e = 0; e < 8; ++e) y[e] = to_float(from_float<OutT>(y[e])) + r.value(e);
        };
        auto store_row = [&](OutT* d, uint32_t* w, const float (&y)[8]) {
          EightOut<OutT> o;
          o.set(y);
          if (valid > 0) by_vec([&](auto v) { o.template store<decltype(v)::value>(d, valid); });
          if (w != nullptr) {
            uint32_t bits = 0;
#pragma unroll
            for (int e = 0; e < 8; ++e) bits |= static_cast<uint32_t>(e < valid && o.value(e) >= 0.f) << e;
            bits <<= 8 * (lane_in_row & 3);
            bits |= __shfl_xor_sync(group_mask, bits, 1);
            bits |= __shfl_xor_sync(group_mask, bits, 2);
            if ((lane_in_row & 3) == 0) *w = bits;
          }
        };
        const bool loads = residual != nullptr && valid > 0;
        // 16-bit outputs two rows a trip: both rows' tile loads issued before either's math (two independent chains
        // a warp; H100, two A/Bs of the fifty-first / fifty-second sessions: B = 64 C = 256 14x14 and B = 256 C = 512
        // 7x7 -1.2 to -1.7%); fp32 outputs one (their two rows' 16 words a lane lost 0.6 and 2.6%).
        constexpr int kTrip = sizeof(OutT) == 2 ? 2 : 1;
        // The residual's elements a trip ahead: next0 / next1 hold rows r and r + kRowStep when a trip starts, and
        // the trip loads the next trip's before its own math (the loads' latency under a trip's math, not exposed
        // at each trip's start).
        EightOut<OutT> next0, next1;
        auto load_next = [&](int row, const OutT* d) {
          if (loads && row < rows_valid) load_residual(next0, residual + (d - out));
          if (kTrip == 2 && loads && row + L::kRowStep < rows_valid) load_residual(next1, residual + (d + dst_step - out));
        };
        int r = first_row;
        load_next(r, dst);
        for (; kTrip == 2 && r + L::kRowStep < rows_valid;
             r += 2 * L::kRowStep, dst += 2 * dst_step, words += words != nullptr ? 2 * words_step : 0) {
          const EightOut<OutT> r0 = next0, r1 = next1;
          load_next(r + 2 * L::kRowStep, dst + 2 * dst_step);
          int v0[8], v1[8];
          row_tile(r, v0);
          row_tile(r + L::kRowStep, v1);
          row_padded(r, v0);
          row_padded(r + L::kRowStep, v1);
          float y0[8], y1[8];
          dot_values(r, v0, y0);
          dot_values(r + L::kRowStep, v1, y1);
          if (loads) {
            plus_residual(y0, r0);
            plus_residual(y1, r1);
          }
          store_row(dst, words, y0);
          store_row(dst + dst_step, words != nullptr ? words + words_step : nullptr, y1);
        }
        for (; r < rows_valid; r += L::kRowStep, dst += dst_step, words += words != nullptr ? words_step : 0) {
          const EightOut<OutT> r0 = next0;
          if (kTrip == 1) load_next(r + L::kRowStep, dst + dst_step);  // (16-bit outputs: one row is left here)
          float y[8];
          row_values(r, y);
          if (loads) plus_residual(y, r0);
          store_row(dst, words, y);
        }
      }
    } else {
      // NCHW: the thread's rows first (registers), then the transposed staging once every tile read is done.
      uint32_t held[L::kRowsPerThread][8];
#pragma unroll
      for (int k = 0; k < L::kRowsPerThread; ++k) {
        const int r = first_row + k * L::kRowStep;
        if (r < rows_valid) {
          float y[8];
          row_values(r, y);
#pragma unroll
          for (int e = 0; e < 8; ++e) held[k][e] = out_bits<OutT>(y[e]);
        }
      }
      __syncthreads();  // every read of the E1 tile done: the ring becomes [BN][kLineStride] words
      uint32_t* lines = reinterpret_cast<uint32_t*>(smem);
#pragma unroll
      for (int k = 0; k < L::kRowsPerThread; ++k) {
        const int r = first_row + k * L::kRowStep;
        if (r < rows_valid) {
#pragma unroll
          for (int e = 0; e < 8; ++e) lines[(col_base + e * col_step) * L::kLineStride + r] = held[k][e];
        }
      }
      __syncthreads();
      // E3: consumer thread tid stores pixel tid % 128 of channels tid / 128 + 2 j (256 = 2 x 128: the pixel is fixed).
      const int r = tid % kCwBM;
      if (tid < kCwConsumerThreads && r < rows_valid) {
        OutT* dst = out + rows.row_out[r] + static_cast<int64_t>(n0) * out_plane;
        for (int c = tid / kCwBM; c < cols_valid; c += kCwConsumerThreads / kCwBM) {
          const uint32_t bits = lines[c * L::kLineStride + r];
          if constexpr (sizeof(OutT) == 2) {
            *reinterpret_cast<uint16_t*>(dst + c * out_plane) = static_cast<uint16_t>(bits);
          } else {
            *reinterpret_cast<uint32_t*>(dst + c * out_plane) = bits;
          }
        }
      }
    }
  };
  if (ep.row_factor != nullptr) {  // uniform: the NCHW path's barriers are reached by every thread either way
    run(std::true_type{});
  } else {
    run(std::false_type{});
  }
#else
  __trap();  // built for another target: the launcher refuses without sm_90a code on a 9.0 device
#endif
}

template <typename OutT>
cudaError_t binary_conv2d_wgmma_launch(const uint32_t* plus_bits, const uint32_t* w_bits, const ConvShape& shape,
                                       const Epilogue& ep, OutT* out, bool out_channels_last, int* tap_table,
                                       cudaStream_t stream, bool weights_ready, bool table_ready) {
  using L = ConvWgLayout;
  constexpr int BN = kCwBN;
  const int64_t total_pixels = shape.batch * shape.out_height * shape.out_width;
  const int64_t channel_words = ceil_div(shape.channels, 32);
  const int taps = static_cast<int>(shape.kernel_h * shape.kernel_w);
  const int64_t reduction_words = taps * channel_words;
  const int64_t m_tiles = ceil_div(total_pixels, kCwBM);
  const int64_t blocks = m_tiles * ceil_div(shape.out_channels, BN);
  if (blocks > INT_MAX || reduction_words > INT_MAX / 2 || shape.height > INT_MAX / 4 || shape.width > INT_MAX / 4 ||
      shape.out_channels > INT_MAX - BN || tap_table == nullptr) {
    return cudaErrorInvalidValue;
  }
  // Ring stages: as many as fit a resident block's share of the SM's shared memory (3 for 3x3), at least 3 (the
  // producer's lag needs S >= 3); where fewer than 3 fit that share (more than 25 taps), as many as fit one block
  // an SM (at most kCwMaxStages).
  const size_t fixed = conv_wgmma_smem_bytes(0, taps);
  constexpr size_t kShare = kCwSmemPerSm / kCwBlocksPerSm - 1024;
  static_assert(kShare <= kCwMaxDynamicSmem, "a block's share is within the per-block limit");
  size_t fitting = kShare > fixed ? (kShare - fixed) / static_cast<size_t>(L::kStageBytes) : 0;
  if (fitting < 3) fitting = (kCwMaxDynamicSmem - fixed) / static_cast<size_t>(L::kStageBytes);
  const int stages = static_cast<int>(fitting < kCwMaxStages ? fitting : kCwMaxStages);
  if (stages < 3) return cudaErrorNotSupported;
  CUtensorMap map_w;  // [out_channels, reduction_words] words, boxes of 32 words x BN rows
  if (!encode_sw128_map(&map_w, CU_TENSOR_MAP_DATA_TYPE_UINT32, w_bits, shape.out_channels, reduction_words,
                        reduction_words * 4, kCwStageWords, BN)) {
    return cudaErrorNotSupported;
  }
  auto kernel = binary_conv2d_wgmma_kernel<OutT>;
  static unsigned long long smem_devices = 0;  // the attribute is raised to the largest size once (sizes vary)
  // with the whole unified L1 as shared memory, so that two blocks of ~105 KB fit an SM
  cudaError_t error = allow_dynamic_smem(kernel, kCwMaxDynamicSmem, smem_devices, /*max_shared_carveout=*/true);
  if (error != cudaSuccess) return error;
  // the weight's D_t table first (its completion implies the launch before it complete), then the conv
  if (!table_ready) {
    error = launch_conv_tap_table(w_bits, shape, tap_table, /*dependent=*/true, weights_ready, stream);
    if (error != cudaSuccess) return error;
  }
  const ClusterLaunch launch(dim3(static_cast<unsigned>(blocks)), kCwThreads, conv_wgmma_smem_bytes(stages, taps), 1,
                             stream, /*dependent=*/true);
  return cudaLaunchKernelEx(&launch.config, kernel, map_w, plus_bits, static_cast<const int*>(tap_table), shape,
                            static_cast<int>(m_tiles), stages,
                            static_cast<int>(channel_words), static_cast<int>(reduction_words), ep, out,
                            out_channels_last, weights_ready);
}

// Output pixels from which the op takes the wgmma kernel. H200 harness, 3x3 convolutions, fp16 out, graph us, wgmma /
// mma.sync pipelined (2026-12-01): C = OC = 256 14x14: B = 1 8.9 / 7.9, 8 9.2 / 8.7, 16 (3136 pixels) 9.3 / 9.3,
// 32 9.2 / 12.9, 64 12.9 / 24.2, 256 36.0 / 77.5; C = OC = 512 7x7: B = 1 10.8 / 9.6, 64 11.9 / 16.0, 256 32.3 /
// 47.5; C = OC = 128 28x28 B = 64 24.1 / 31.7; C = 128 -> OC = 256 stride 2, B = 64 12.3 / 19.5.
constexpr int64_t kCwMinPixels = 3072;

// The shapes the wgmma kernel takes: <= kOnePlaneMaxTaps taps, channel words % 4 == 0 (a 16-byte piece lies within
// one tap of one pixel); it also needs 16-byte aligned operands and a 9.0 device with sm_90a code.
bool conv_wgmma_shape(const ConvShape& shape) {
  return shape.kernel_h * shape.kernel_w <= kOnePlaneMaxTaps && ceil_div(shape.channels, 32) % 4 == 0;
}

// The wgmma kernel where it applies (cudaErrorNotSupported elsewhere).
template <typename OutT>
cudaError_t binary_conv2d_wgmma(const uint32_t* plus_bits, const uint32_t* w_bits, const ConvShape& shape,
                                const Epilogue& ep, OutT* out, bool out_channels_last, int* tap_table,
                                cudaStream_t stream, bool weights_ready, bool table_ready) {
  if (!conv_wgmma_shape(shape) || reinterpret_cast<uintptr_t>(plus_bits) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(w_bits) % 16 != 0) {
    return cudaErrorNotSupported;
  }
  // sign words from thresholds on the integer dot: no row factors
  if (std::is_same_v<OutT, SignWords> && ep.row_factor != nullptr) return cudaErrorNotSupported;
  DeviceFacts device;
  const cudaError_t error = current_device_facts(device);
  if (error != cudaSuccess) return error;
  if (!wgmma_device(device)) return cudaErrorNotSupported;
  return binary_conv2d_wgmma_launch(plus_bits, w_bits, shape, ep, out, out_channels_last, tap_table, stream,
                                    weights_ready, table_ready);
}

template <typename OutT>
cudaError_t binary_conv2d_typed(const uint32_t* plus_bits, const uint32_t* minus_bits, const uint32_t* w_bits,
                                const ConvShape& shape, const Epilogue& ep, OutT* out, bool out_channels_last,
                                int* tap_table, cudaStream_t stream, const ConvTuning& tuning, bool weights_ready,
                                bool table_ready) {
  // a residual, the outputs' sign words: channels_last 16- and 32-bit outputs (every kernel's epilogue reads / writes
  // them with the output's indexing)
  if ((ep.residual != nullptr || ep.out_signs != nullptr) && (std::is_same_v<OutT, SignWords> || !out_channels_last)) {
    return cudaErrorInvalidValue;
  }
  // Hopper: the wgmma kernel from kCwMinPixels output pixels where it applies (one plane, <= 32 taps, channel words
  // % 4 == 0, 16-byte aligned operands, sm_90a code on a 9.0 device), else the mma.sync kernels below.
  const int64_t pixels = shape.batch * shape.out_height * shape.out_width;
  if (tuning.kernel == 2 || (tuning.kernel == 0 && minus_bits == nullptr && pixels >= kCwMinPixels)) {
    if (minus_bits != nullptr) return cudaErrorNotSupported;
    const cudaError_t error =
        binary_conv2d_wgmma(plus_bits, w_bits, shape, ep, out, out_channels_last, tap_table, stream, weights_ready,
                            table_ready);
    if (error != cudaErrorNotSupported || tuning.kernel == 2) return error;
    (void)cudaGetLastError();
  }
  const int64_t channel_words = ceil_div(shape.channels, 32);
  const auto aligned = [&](uintptr_t bytes) {
    return reinterpret_cast<uintptr_t>(plus_bits) % bytes == 0 && reinterpret_cast<uintptr_t>(minus_bits) % bytes == 0 &&
           reinterpret_cast<uintptr_t>(w_bits) % bytes == 0;
  };
  const bool sign_zero = minus_bits != nullptr;
  if (!sign_zero && shape.kernel_h * shape.kernel_w <= kOnePlaneMaxTaps) {
    // one plane: the widest piece that divides the channel words and the operands' alignment
    if (channel_words % 4 == 0 && aligned(16)) {
      return binary_conv2d_pipelined_launch<4>(plus_bits, w_bits, shape, ep, out, out_channels_last, tap_table,
                                               stream, tuning, weights_ready, table_ready);
    }
    if (channel_words % 2 == 0 && aligned(8)) {
      return binary_conv2d_pipelined_launch<2>(plus_bits, w_bits, shape, ep, out, out_channels_last, tap_table,
                                               stream, tuning, weights_ready, table_ready);
    }
    if (aligned(4)) {
      return binary_conv2d_pipelined_launch<1>(plus_bits, w_bits, shape, ep, out, out_channels_last, tap_table,
                                               stream, tuning, weights_ready, table_ready);
    }
  }
  // two planes: torch.sign inputs, more than kOnePlaneMaxTaps taps (or words not 4-byte aligned)
  if (channel_words % 4 == 0 && aligned(16)) {
    if (sign_zero) return binary_conv2d_mma_launch<4, true>(plus_bits, minus_bits, w_bits, shape, ep, out, out_channels_last, stream);
    return binary_conv2d_mma_launch<4, false>(plus_bits, minus_bits, w_bits, shape, ep, out, out_channels_last, stream);
  }
  if (sign_zero) return binary_conv2d_mma_launch<1, true>(plus_bits, minus_bits, w_bits, shape, ep, out, out_channels_last, stream);
  return binary_conv2d_mma_launch<1, false>(plus_bits, minus_bits, w_bits, shape, ep, out, out_channels_last, stream);
}

}  // namespace

namespace {
// cudaSuccess for a launchable shape; done: nothing to compute (an empty output).
cudaError_t check_conv_launch(const ConvShape& shape, const ConvTuning& chosen, bool& done) {
  done = false;
  if (chosen.kernel < 0 || chosen.kernel > 2 || chosen.tile < 0 || chosen.tile > 3) return cudaErrorInvalidValue;
  if (shape.batch < 0 || shape.channels < 1 || shape.channels > INT_MAX || shape.out_channels < 0 ||
      shape.kernel_h < 1 || shape.kernel_w < 1 || shape.pad_value < -1 || shape.pad_value > 1) {
    return cudaErrorInvalidValue;
  }
  done = shape.batch == 0 || shape.out_channels == 0 || shape.out_height <= 0 || shape.out_width <= 0;
  if (!done && !conv_geometry_fits(shape)) return cudaErrorNotSupported;
  return cudaSuccess;
}
}  // namespace

cudaError_t launch_binary_conv2d_signs(const uint32_t* plus_bits, const uint32_t* w_bits, const ConvShape& shape,
                                       const Epilogue& epilogue, uint32_t* out_words, int* tap_table,
                                       cudaStream_t stream, const ConvTuning* tuning) {
  const ConvTuning chosen = tuning != nullptr ? *tuning : ConvTuning{};
  bool done = false;
  const cudaError_t error = check_conv_launch(shape, chosen, done);
  if (error != cudaSuccess || done) return error;
  return binary_conv2d_typed(plus_bits, nullptr, w_bits, shape, epilogue, reinterpret_cast<SignWords*>(out_words),
                             /*out_channels_last=*/true, tap_table, stream, chosen, /*weights_ready=*/false,
                             /*table_ready=*/false);
}

cudaError_t launch_binary_conv2d(const uint32_t* plus_bits, const uint32_t* minus_bits, const uint32_t* w_bits,
                                 const ConvShape& shape, const Epilogue& epilogue, void* out, FloatType out_type,
                                 bool out_channels_last, int* tap_table, cudaStream_t stream,
                                 const ConvTuning* tuning, bool weights_ready, bool table_ready) {
  const ConvTuning chosen = tuning != nullptr ? *tuning : ConvTuning{};
  bool done = false;
  const cudaError_t error = check_conv_launch(shape, chosen, done);
  if (error != cudaSuccess || done) return error;
  const bool table_first = table_ready && weights_ready;
  switch (out_type) {
    case FloatType::kFloat32:
      return binary_conv2d_typed(plus_bits, minus_bits, w_bits, shape, epilogue, static_cast<float*>(out),
                                 out_channels_last, tap_table, stream, chosen, weights_ready, table_first);
    case FloatType::kFloat16:
      return binary_conv2d_typed(plus_bits, minus_bits, w_bits, shape, epilogue, static_cast<__half*>(out),
                                 out_channels_last, tap_table, stream, chosen, weights_ready, table_first);
    case FloatType::kBFloat16:
      return binary_conv2d_typed(plus_bits, minus_bits, w_bits, shape, epilogue, static_cast<__nv_bfloat16*>(out),
                                 out_channels_last, tap_table, stream, chosen, weights_ready, table_first);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_conv_tap_table_first(const uint32_t* w_bits, const ConvShape& shape, int* tap_table,
                                        cudaStream_t stream) {
  bool done = false;
  cudaError_t error = check_conv_launch(shape, ConvTuning{}, done);  // the conv launch's own checks
  if (error != cudaSuccess || done) return error;
  DeviceFacts device;
  error = current_device_facts(device);
  if (error != cudaSuccess) return error;
  // only where the wgmma conv may take the shape (a table launched ahead of a kernel that reads none, such as the
  // 64 x 32 tile of small batches, costs: H100 B = 1 C = 256 14x14 with pack_signs 7.10 -> 7.85 us a call)
  const int64_t pixels = shape.batch * shape.out_height * shape.out_width;
  if (!wgmma_device(device) || !conv_wgmma_shape(shape) || pixels < kCwMinPixels ||
      reinterpret_cast<uintptr_t>(w_bits) % 16 != 0) {
    return cudaErrorNotSupported;
  }
  if (tap_table == nullptr) return cudaErrorInvalidValue;
  return launch_conv_tap_table(w_bits, shape, tap_table, /*dependent=*/false, /*weights_ready=*/false, stream);
}

}  // namespace cuda
}  // namespace bitcompile
