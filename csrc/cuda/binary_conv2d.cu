// binary_conv2d (and binary_linear with sign_zero, as a 1x1 conv) as an implicit GEMM on the b1 tensor
// cores. Torch-free (launcher in binary_kernels.cuh).
//
// Dispatch (binary_conv2d_typed): s(x) in {-1, +1} with at most kOnePlaneMaxTaps taps takes the one-plane
// form on the cp.async pipeline (binary_conv2d_pipelined_kernel; 16-, 8- or 4-byte copies as the channel words
// and the alignment allow); torch.sign inputs (sign_zero) and larger kernels take the two-plane form
// (binary_conv2d_mma_kernel).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mma_b1.cuh"

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
// gives pad_value * (-D_t). The block tabulates D_t of its columns; a row takes their sum over all taps less
// the padded ones (none for interior pixels). Half the MMAs and accumulators of the two-plane form.
// Both kernels end in conv_epilogue: per-row and per-column values read once, no division, the output tile
// staged in shared memory and stored in coalesced vectors of up to 16 bytes.
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

// One-plane D_t = C - 2 popc(B_t) over the real channels of block column c at tap_d[t * BN + c] (tap-major: the
// epilogue's lanes read neighbouring columns of one tap; t, c by a shift, no division), 0 past the last output
// channel; all_taps_d[c] += D_t by shared atomics (zeroed by the caller before a barrier; read after the main
// loop's barriers). VW = 4: 16-byte loads (channel_words % 4 == 0 and w_bits 16-byte aligned).
template <int BN, int kThreads, int VW>
__device__ __forceinline__ void tabulate_tap_d(int* tap_d, int* all_taps_d, const uint32_t* __restrict__ w_bits,
                                               int64_t n0, int64_t n_rows, int reduction_words, int channel_words,
                                               int channels, int taps, int tid) {
  static_assert((BN & (BN - 1)) == 0, "tap and column by shift and mask");
  const int tail = channels - (channel_words - 1) * 32;  // real channels in the last word, 1..32
  const uint32_t last_bits = tail >= 32 ? 0xffffffffu : (1u << tail) - 1u;
  for (int e = tid; e < BN * taps; e += kThreads) {
    const int t = static_cast<unsigned>(e) / BN;
    const int c = static_cast<unsigned>(e) % BN;
    const int64_t n = n0 + c;
    int d = 0;
    if (n < n_rows) {
      const uint32_t* row = w_bits + n * reduction_words + t * channel_words;
      int count = 0;
      for (int cw = 0; cw < channel_words; cw += VW) {
        if (VW == 4) {
          uint4 v = __ldg(reinterpret_cast<const uint4*>(row + cw));
          if (cw + 4 == channel_words) v.w &= last_bits;
          count += __popc(v.x) + __popc(v.y) + __popc(v.z) + __popc(v.w);
        } else {
          const uint32_t v = __ldg(row + cw);
          count += __popc(cw + 1 == channel_words ? v & last_bits : v);
        }
      }
      d = channels - 2 * count;
      atomicAdd(&all_taps_d[c], d);
    }
    tap_d[t * BN + c] = d;
  }
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

// Copies the staged tile out in vectors of V elements along its lines (channels_last: rows, contiguous channels;
// NCHW: channels, contiguous pixels of one image), V dividing the line's global stride and the output's
// alignment. A thread's vector sits at the same place of every line it copies (kThreads is a multiple of the
// vectors per line), so its NCHW row offset is read once.
template <bool CHANNELS_LAST, int V, int BM, int BN, int kThreads, typename OutT>
__device__ __forceinline__ void store_staged(const OutT* stage, OutT* __restrict__ out, const int64_t* row_out,
                                             int64_t m0, int64_t n0, int64_t n_rows, int64_t out_plane,
                                             int rows_valid, int cols_valid, int tid) {
  using Staging = ConvStaging<BM, BN, OutT>;
  using Vec = typename VecOf<V * static_cast<int>(sizeof(OutT))>::type;
  constexpr int kLines = CHANNELS_LAST ? BM : BN;
  constexpr int kLineLength = CHANNELS_LAST ? BN : BM;
  constexpr int kStride = CHANNELS_LAST ? Staging::kRowStride : Staging::kColumnStride;
  constexpr int kVecsPerLine = kLineLength / V;
  static_assert(kThreads % kVecsPerLine == 0 && kLines % (kThreads / kVecsPerLine) == 0, "whole lines per pass");
  constexpr int kLineStep = kThreads / kVecsPerLine;
  const int first = (tid % kVecsPerLine) * V;  // element of the line
  if (first >= (CHANNELS_LAST ? cols_valid : rows_valid)) return;
  const int lines = CHANNELS_LAST ? rows_valid : cols_valid;
  int line = tid / kVecsPerLine;
  const OutT* src = stage + line * kStride + first;
  // channels_last: element (row m0 + line, channel n0 + first); NCHW: (row m0 + first, channel n0 + line)
  OutT* dst = CHANNELS_LAST ? out + (m0 + line) * n_rows + n0 + first : out + row_out[first] + (n0 + line) * out_plane;
  const int64_t dst_step = kLineStep * (CHANNELS_LAST ? n_rows : out_plane);
  constexpr int kPasses = kLines / kLineStep;
#pragma unroll(kPasses <= 4 ? kPasses : 2)
  for (int i = 0; i < kPasses; ++i) {
    if (line >= lines) break;
    *reinterpret_cast<Vec*>(dst) = *reinterpret_cast<const Vec*>(src);
    line += kLineStep;
    src += kLineStep * kStride;
    dst += dst_step;
  }
}
template <bool CHANNELS_LAST, int V, int BM, int BN, int kThreads, typename OutT>
__device__ __forceinline__ void store_staged_as(int vec, const OutT* stage, OutT* __restrict__ out,
                                                const int64_t* row_out, int64_t m0, int64_t n0, int64_t n_rows,
                                                int64_t out_plane, int rows_valid, int cols_valid, int tid) {
  if constexpr (V > 1) {
    if (vec < V) {
      store_staged_as<CHANNELS_LAST, V / 2, BM, BN, kThreads>(vec, stage, out, row_out, m0, n0, n_rows, out_plane,
                                                              rows_valid, cols_valid, tid);
      return;
    }
  }
  store_staged<CHANNELS_LAST, V, BM, BN, kThreads>(stage, out, row_out, m0, n0, n_rows, out_plane, rows_valid,
                                                   cols_valid, tid);
}

// The epilogue of both kernels, part 1: this thread's MT x NT mma tiles (rows warp_row + 16 mt + g + 8h, columns
// warp_col + 8 nt + 2t + e, at dot[mt][nt][2h + e]) into the staged output tile. dot holds the part of the integer
// dot known per row (one-plane: 4 popc(P & B) - 2 popc(P); two-plane: all of it); the one-plane form adds
// sum_in D_t - pad_value * sum_padded D_t, visiting only the padded taps (none for interior pixels). Then
// y = dot * row_factor * scale + bias (epilogue_value, fp32). Per-column values are read once, per-row ones once
// per row; no division. row_inside: bit t for the taps inside the image (one-plane). `stage` must be free (a
// barrier after the main loop's last read of it).
template <int BM, int BN, int MT, int NT, bool ONE_PLANE, typename OutT>
__device__ __forceinline__ void conv_epilogue_stage(const int (&dot)[MT][NT][4], int warp_row, int warp_col, int lane,
                                                    const uint32_t* row_inside, const int* tap_d,
                                                    const int* all_taps_d, int taps, int pad_value, int64_t m0,
                                                    int64_t n0, int rows_valid, int cols_valid, const Epilogue& ep,
                                                    bool out_channels_last, OutT* stage) {
  using Staging = ConvStaging<BM, BN, OutT>;
  using Pair = OutPair<OutT>;
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
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const typename Pair::type y =
            Pair::make(epilogue_value(static_cast<float>(value[nt][0]), factor[mt][h], col_scale[nt][0], col_bias[nt][0]),
                       epilogue_value(static_cast<float>(value[nt][1]), factor[mt][h], col_scale[nt][1], col_bias[nt][1]));
        const int col = lane_col + nt * 8;
        if (out_channels_last) {
          *reinterpret_cast<typename Pair::type*>(&stage[row * Staging::kRowStride + col]) = y;
        } else {
          stage[col * Staging::kColumnStride + row] = Pair::low(y);
          stage[(col + 1) * Staging::kColumnStride + row] = Pair::high(y);
        }
      }
    }
  }
}

// The epilogue of both kernels, part 2 (after a barrier): the staged tile out in the widest vectors (up to 16
// bytes) that divide the line's global stride (channels_last: out_channels; NCHW: out_plane) and the output's
// alignment. row_out: the NCHW offset of row r's channel 0 (image * out_channels * out_plane + position).
template <int BM, int BN, int kThreads, typename OutT>
__device__ __forceinline__ void conv_epilogue_store(const OutT* stage, OutT* __restrict__ out, const int64_t* row_out,
                                                    int64_t m0, int64_t n0, int64_t n_rows, int64_t out_plane,
                                                    int rows_valid, int cols_valid, bool out_channels_last, int tid) {
  constexpr int kMaxVec = 16 / static_cast<int>(sizeof(OutT));
  const int64_t line_stride = out_channels_last ? n_rows : out_plane;
  const uintptr_t address = reinterpret_cast<uintptr_t>(out);
  int vec = kMaxVec;
  while (vec > 1 && ((line_stride & (vec - 1)) != 0 || (address & (vec * sizeof(OutT) - 1)) != 0)) vec >>= 1;
  if (out_channels_last) {
    store_staged_as<true, kMaxVec, BM, BN, kThreads>(vec, stage, out, row_out, m0, n0, n_rows, out_plane, rows_valid,
                                                     cols_valid, tid);
  } else {
    store_staged_as<false, kMaxVec, BM, BN, kThreads>(vec, stage, out, row_out, m0, n0, n_rows, out_plane, rows_valid,
                                                      cols_valid, tid);
  }
}

// Both parts, for the block's tile at (m0, n0), the staged tile in `stage` (free: see conv_epilogue_stage).
template <int BM, int BN, int kThreads, int MT, int NT, bool ONE_PLANE, typename OutT>
__device__ __forceinline__ void conv_epilogue(const int (&dot)[MT][NT][4], int warp_row, int warp_col, int lane,
                                              int tid, const uint32_t* row_inside, const int* tap_d,
                                              const int* all_taps_d, const int64_t* row_out, int taps, int pad_value,
                                              int64_t m0, int64_t n0, int64_t total_pixels, int64_t n_rows,
                                              int64_t out_plane, const Epilogue& ep, OutT* __restrict__ out,
                                              bool out_channels_last, OutT* stage) {
  const int rows_valid = static_cast<int>(min(static_cast<int64_t>(BM), total_pixels - m0));
  const int cols_valid = static_cast<int>(min(static_cast<int64_t>(BN), n_rows - n0));
  conv_epilogue_stage<BM, BN, MT, NT, ONE_PLANE>(dot, warp_row, warp_col, lane, row_inside, tap_d, all_taps_d, taps,
                                                 pad_value, m0, n0, rows_valid, cols_valid, ep, out_channels_last,
                                                 stage);
  __syncthreads();
  conv_epilogue_store<BM, BN, kThreads>(stage, out, row_out, m0, n0, n_rows, out_plane, rows_valid, cols_valid,
                                        out_channels_last, tid);
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

  using Staging = ConvStaging<BM, BN, OutT>;
  constexpr int kPlusWords = BM * kMmaRowStride;
  constexpr int kMinusWords = BM * kMmaRowStride;
  constexpr int kTileWords = kPlusWords + kMinusWords + BN * kMmaRowStride;
  constexpr int kSharedWords = kTileWords > Staging::kBytes / 4 ? kTileWords : Staging::kBytes / 4;
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
  conv_epilogue<BM, BN, kThreads, MT, NT, false>(
      acc_p, warp_m * kWarpRows, warp_n * kWarpCols, lane, tid, nullptr, nullptr, nullptr, row_out, taps,
      shape.pad_value, m0, n0, total_pixels, n_rows, out_plane, ep, out, out_channels_last,
      reinterpret_cast<OutT*>(tiles));
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

// binary_conv2d_pipelined_kernel: the one-plane implicit GEMM (s(x) in {-1, +1}, at most kOnePlaneMaxTaps taps)
// on the cp.async pipeline of binary_linear_mma_pipelined_kernel, for any channel count. The gather copies
// pieces of PW words (PW = 4, 2, 1: 16-, 8-, 4-byte cp.async), PW dividing channel_words, so that a piece lies
// within one tap of one pixel: an in-bounds tap copies PW channel words of the input pixel, a padded tap (P = 0
// in the one-plane form) and anything past the end are zero-filled. A stage is kMmaStageWords words of K as
// for PW = 4 (16 / channel_words taps for 1 or 2 words a pixel), with the same ldmatrix fragments. The weight
// rows take the same piece width (their copies zero-filled past the row's last word). Row popcounts of P read
// the stage in 16-byte vectors whatever PW (every copy of the stage is visible after the loop's barrier); D_t
// tabulated while the first stages are in flight; the epilogue is conv_epilogue (one-plane), its output tile in
// the ring. Main loop, offline SASS (nvcc 13.0, sm_90a), PW = 4: 110 instructions per stage of 16 BMMA (351
// with per-stage divisions in the gather and LDS.64 fragments). After the last BMMA (fp16 out): 1497 static
// instructions (8233 with the per-element epilogue: int64 index division, null checks and taps loop per output,
// scattered 2-byte stores).
template <int BM, int BN, int WARPS_M, int WARPS_N, int PW, typename OutT>
__global__ __launch_bounds__(WARPS_M* WARPS_N * 32, 2) void binary_conv2d_pipelined_kernel(
    const uint32_t* __restrict__ plus_bits, const uint32_t* __restrict__ w_bits, ConvShape shape, int64_t m_tiles,
    int64_t total_pixels, int channel_words, int reduction_words, Epilogue ep, OutT* __restrict__ out,
    bool out_channels_last) {
  static_assert(PW == 1 || PW == 2 || PW == 4, "4-, 8- or 16-byte pieces");
  constexpr int kThreads = WARPS_M * WARPS_N * 32;
  constexpr int kWarpRows = BM / WARPS_M;
  constexpr int kWarpCols = BN / WARPS_N;
  constexpr int MT = kWarpRows / 16;
  constexpr int NT = kWarpCols / 8;
  static_assert(MT * 16 * WARPS_M == BM && NT * 8 * WARPS_N == BN, "tile shape");
  constexpr int kPiecesPerRow = kMmaStageWords / PW;
  constexpr int kRowsPerPass = kThreads / kPiecesPerRow;  // rows of a thread's consecutive copies apart
  static_assert(kThreads % kPiecesPerRow == 0 && BM % kRowsPerPass == 0 && BN % kRowsPerPass == 0,
                "whole A and B pieces per thread, one column piece per thread");
  constexpr int kLoadsA = BM / kRowsPerPass;
  constexpr int kLoadsB = BN / kRowsPerPass;
  constexpr int kPopVecsPerRow = kMmaStageWords / 4;  // the row popcounts' 16-byte reads
  static_assert(kThreads % kPopVecsPerRow == 0 && BM % (kThreads / kPopVecsPerRow) == 0, "whole popcount vectors");
  constexpr int kPopRowsPerPass = kThreads / kPopVecsPerRow;
  constexpr int kPopLoads = BM / kPopRowsPerPass;
  constexpr int kStageWordsA = BM * kConvRowStride;
  constexpr int kStageWordsAll = (BM + BN) * kConvRowStride;

  extern __shared__ __align__(16) uint32_t conv_pipe_smem[];  // [kPipeStages][A rows, B rows][kConvRowStride]
  __shared__ int64_t row_source[BM];  // word offset of the row's (image, top, left) pixel (may lie outside the input)
  __shared__ uint32_t row_inside[BM];  // the row's taps inside the image (bit t), 0 past the last output pixel
  __shared__ int64_t tap_offset[kOnePlaneMaxTaps];  // word offset of tap t = (kh, kw) from the (top, left) pixel
  __shared__ int row_pop[BM];
  __shared__ int64_t row_out[BM];  // NCHW output offset of the row's channel 0
  __shared__ int tap_d[kOnePlaneMaxTaps * BN];  // D_t of column c at [t * BN + c]
  __shared__ int all_taps_d[BN];

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_m = warp / WARPS_N;
  const int warp_n = warp % WARPS_N;
  // blocks <= INT_MAX (the launchers), so m_tiles fits 32 bits
  const int64_t m0 = static_cast<int64_t>(blockIdx.x % static_cast<unsigned>(m_tiles)) * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / static_cast<unsigned>(m_tiles)) * BN;
  const int64_t out_plane = shape.out_height * shape.out_width;
  const int64_t n_rows = shape.out_channels;
  const int kernel_w = static_cast<int>(shape.kernel_w);
  const int dilation_h = static_cast<int>(shape.dilation_h);
  const int dilation_w = static_cast<int>(shape.dilation_w);
  const int taps = static_cast<int>(shape.kernel_h * shape.kernel_w);
  const int stages = static_cast<int>(ceil_div(reduction_words, kMmaStageWords));

  static_assert(kThreads >= BM && kThreads >= BN && kThreads >= kOnePlaneMaxTaps, "one row, column, tap per thread");
  if (tid < BM) {
    const int r = tid;
    const int64_t p = m0 + r;
    uint32_t inside = 0;
    int64_t source = 0, out_offset = 0;
    if (p < total_pixels) {
      const OutPixel px = split_out_pixel(p, total_pixels, out_plane, shape.out_width);
      const int top = static_cast<int>(px.oh * shape.stride_h - shape.pad_h);
      const int left = static_cast<int>(px.ow * shape.stride_w - shape.pad_w);
      source = ((px.image * shape.height + top) * shape.width + left) * channel_words;
      inside = inside_taps(top, left, static_cast<int>(shape.kernel_h), kernel_w, dilation_h, dilation_w,
                           static_cast<int>(shape.height), static_cast<int>(shape.width));
      out_offset = px.image * n_rows * out_plane + px.position;
    }
    row_source[r] = source;
    row_inside[r] = inside;
    row_out[r] = out_offset;
    row_pop[r] = 0;
  }
  if (tid < taps) {
    const int kh = tid / kernel_w;
    tap_offset[tid] = (static_cast<int64_t>(kh) * dilation_h * shape.width + (tid - kh * kernel_w) * dilation_w) *
                      channel_words;
  }
  if (tid < BN) all_taps_d[tid] = 0;
  __syncthreads();

  // The gather, per thread: its A pieces are rows tid / kPiecesPerRow + i * kRowsPerPass and its B pieces rows
  // tid / kPiecesPerRow + j * kRowsPerPass, all at the same column piece of every stage, so the stage's word
  // (tap, channel word) is one per thread, advanced by kMmaStageWords each issued stage without a division (PW
  // divides channel_words and kMmaStageWords, so channel_word stays a multiple of PW and the piece within its
  // tap); the row's source offset and inside-taps mask are read once. word < reduction_words <=> tap < taps.
  static_assert((kPipeStages & (kPipeStages - 1)) == 0, "ring slot by mask");
  constexpr int kPieceBytes = PW * 4;
  constexpr unsigned kStageBytes = kStageWordsAll * sizeof(uint32_t);
  constexpr unsigned kPassBytes = kRowsPerPass * kConvRowStride * sizeof(uint32_t);
  const unsigned smem = static_cast<unsigned>(__cvta_generic_to_shared(conv_pipe_smem));
  const int piece_row = tid / kPiecesPerRow;
  const int vec_word = (tid % kPiecesPerRow) * PW;
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
  int64_t b_source = (n0 + piece_row) * reduction_words + vec_word;  // pass 0; read only where b_row_valid
  const int tap_step = kMmaStageWords / channel_words;  // the word advance in whole taps and channel words
  const int word_step = kMmaStageWords % channel_words;
  int tap = vec_word / channel_words;  // of the next stage to issue
  int channel_word = vec_word % channel_words;

  auto issue_stage = [&](int stage) {
    if (stage < stages) {
      const unsigned slot = (stage & (kPipeStages - 1)) * kStageBytes;
      const bool in_taps = tap < taps;
      const uint64_t offset = static_cast<uint64_t>((tap_offset[min(tap, taps - 1)] + channel_word) * 4);
#pragma unroll
      for (int i = 0; i < kLoadsA; ++i) {
        // funnel shift: the shift clamps at 32 (tap may pass 31 in the last stage; then in_taps is false)
        const bool fill = in_taps && (__funnelshift_rc(a_inside[i], 0u, tap) & 1u) != 0;
        cp_async_shared<kPieceBytes>(a_dst + slot + i * kPassBytes,
                                     fill ? reinterpret_cast<const uint32_t*>(a_source[i] + offset) : plus_bits, fill);
      }
#pragma unroll
      for (int j = 0; j < kLoadsB; ++j) {
        const bool b_fill = b_row_valid[j] && in_taps;
        cp_async_shared<kPieceBytes>(b_dst + slot + j * kPassBytes, b_fill ? w_bits + b_source + j * b_pass_words : w_bits,
                                     b_fill);
      }
      b_source += kMmaStageWords;
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
  const unsigned pop_src = smem + ((tid / kPopVecsPerRow) * kConvRowStride + (tid % kPopVecsPerRow) * 4) * 4;
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

#pragma unroll
  for (int s = 0; s < kPipeStages - 1; ++s) issue_stage(s);
  // D_t while the first stages are in flight (the loop's barriers order it before the epilogue)
  tabulate_tap_d<BN, kThreads, PW == 4 ? 4 : 1>(tap_d, all_taps_d, w_bits, n0, n_rows, reduction_words,
                                                channel_words, static_cast<int>(shape.channels), taps, tid);
  for (int stage = 0; stage < stages; ++stage) {
    cp_async_wait<kPipeStages - 2>();
    __syncthreads();
    issue_stage(stage + kPipeStages - 1);
    const unsigned slot = (stage & (kPipeStages - 1)) * kStageBytes;
#pragma unroll
    for (int i = 0; i < kPopLoads; ++i) {
      const uint4 v = ld_shared_16(pop_src + slot + i * kPopPassBytes);
      pop[i] += __popc(v.x) + __popc(v.y) + __popc(v.z) + __popc(v.w);
    }
    mma_ldmatrix_stage<MT, NT>(acc, a_lane + slot, b_lane + slot);
  }
  cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < kPopLoads; ++i) atomicAdd(&row_pop[tid / kPopVecsPerRow + i * kPopRowsPerPass], pop[i]);
  __syncthreads();

  // 4 popc(P & B) - 2 popc(P); the barrier above is also behind the last ldmatrix of the ring, which holds the
  // output tile from here on.
  const int group = lane >> 2;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pop = row_pop[warp_m * kWarpRows + mt * 16 + group + 8 * h];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        acc[mt][nt][2 * h] = 4 * acc[mt][nt][2 * h] - 2 * pop;
        acc[mt][nt][2 * h + 1] = 4 * acc[mt][nt][2 * h + 1] - 2 * pop;
      }
    }
  }
  static_assert(ConvStaging<BM, BN, OutT>::kBytes <= kPipeStages * kStageBytes, "output tile fits the ring");
  conv_epilogue<BM, BN, kThreads, MT, NT, true>(acc, warp_m * kWarpRows, warp_n * kWarpCols, lane, tid, row_inside,
                                                tap_d, all_taps_d, row_out, taps, shape.pad_value, m0, n0,
                                                total_pixels, n_rows, out_plane, ep, out, out_channels_last,
                                                reinterpret_cast<OutT*>(conv_pipe_smem));
}

// PW: words a cp.async piece (4, 2, 1), dividing channel_words, plus_bits and w_bits PW * 4-byte aligned.
template <int PW, typename OutT>
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
  constexpr size_t smem = static_cast<size_t>(kPipeStages) * (BM + BN) * kConvRowStride * sizeof(uint32_t);
  auto kernel = binary_conv2d_pipelined_kernel<BM, BN, WARPS_M, WARPS_N, PW, OutT>;
  static unsigned long long smem_devices = 0;
  const cudaError_t error = allow_dynamic_smem(kernel, smem, smem_devices);
  if (error != cudaSuccess) return error;
  kernel<<<static_cast<unsigned>(blocks), WARPS_M * WARPS_N * 32, smem, stream>>>(
      plus_bits, w_bits, shape, m_tiles, total_pixels, static_cast<int>(channel_words),
      static_cast<int>(reduction_words), ep, out, out_channels_last);
  return cudaGetLastError();
}

template <typename OutT>
cudaError_t binary_conv2d_typed(const uint32_t* plus_bits, const uint32_t* minus_bits, const uint32_t* w_bits,
                                    const ConvShape& shape, const Epilogue& ep, OutT* out, bool out_channels_last,
                                    cudaStream_t stream) {
  const int64_t channel_words = ceil_div(shape.channels, 32);
  const auto aligned = [&](uintptr_t bytes) {
    return reinterpret_cast<uintptr_t>(plus_bits) % bytes == 0 && reinterpret_cast<uintptr_t>(minus_bits) % bytes == 0 &&
           reinterpret_cast<uintptr_t>(w_bits) % bytes == 0;
  };
  const bool sign_zero = minus_bits != nullptr;
  if (!sign_zero && shape.kernel_h * shape.kernel_w <= kOnePlaneMaxTaps) {
    // one plane: the widest piece that divides the channel words and the operands' alignment
    if (channel_words % 4 == 0 && aligned(16)) {
      return binary_conv2d_pipelined_launch<4>(plus_bits, w_bits, shape, ep, out, out_channels_last, stream);
    }
    if (channel_words % 2 == 0 && aligned(8)) {
      return binary_conv2d_pipelined_launch<2>(plus_bits, w_bits, shape, ep, out, out_channels_last, stream);
    }
    if (aligned(4)) return binary_conv2d_pipelined_launch<1>(plus_bits, w_bits, shape, ep, out, out_channels_last, stream);
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

cudaError_t launch_binary_conv2d(const uint32_t* plus_bits, const uint32_t* minus_bits, const uint32_t* w_bits,
                                 const ConvShape& shape, const Epilogue& epilogue, void* out, FloatType out_type,
                                 bool out_channels_last, cudaStream_t stream) {
  if (shape.batch < 0 || shape.channels < 1 || shape.channels > INT_MAX || shape.out_channels < 0 ||
      shape.kernel_h < 1 || shape.kernel_w < 1 || shape.pad_value < -1 || shape.pad_value > 1) {
    return cudaErrorInvalidValue;
  }
  if (shape.batch == 0 || shape.out_channels == 0 || shape.out_height <= 0 || shape.out_width <= 0) return cudaSuccess;
  if (!conv_geometry_fits(shape)) return cudaErrorNotSupported;
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

}  // namespace cuda
}  // namespace bitcompile
