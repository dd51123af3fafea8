// binary_conv2d (and binary_linear with sign_zero, as a 1x1 conv) as an implicit GEMM on the b1 tensor cores:
// the dispatch, the two-plane kernel and the D_t table kernel. Torch-free (launchers in binary_kernels.cuh; the
// shared math in conv_common.cuh).
//
// Dispatch (binary_conv2d_typed): s(x) in {-1, +1} with at most kOnePlaneMaxTaps taps takes the one-plane form on
// the cp.async pipeline (binary_conv2d_pipelined_kernel, binary_conv2d_pipelined.cu; 16-, 8- or 4-byte copies as
// the channel words and the alignment allow), or for 3x3 stride 1 or 2 pad 1 convs of 33..64 channels (ResNet's
// layer1; a residual where it can stage it, no row factors) the persistent binary_conv2d_halo_kernel
// (binary_conv2d_halo.cu); torch.sign inputs (sign_zero) and larger kernels take the two-plane form
// (binary_conv2d_mma_kernel, here). On a 9.0 device with sm_90a code, one-plane convolutions of at least
// kCwMinPixels output pixels take the Hopper form of the one-plane kernel instead, binary_conv2d_wgmma_kernel (wgmma
// b1 AND.POPC, TMA + mbarrier ring; binary_conv2d_wgmma.cu), where it applies (ConvTuning::kernel forces either).
#include "conv_common.cuh"

namespace bitcompile {
namespace cuda {
namespace conv {

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
  const auto [total_pixels, channel_words, reduction_words, m_tiles, blocks, fits] = conv_grid(shape, BM, BN);
  if (!fits) return cudaErrorInvalidValue;
  binary_conv2d_mma_kernel<BM, BN, WARPS_M, WARPS_N, VW, SIGN_ZERO, OutT>
      <<<static_cast<unsigned>(blocks), WARPS_M * WARPS_N * 32, 0, stream>>>(
          plus_bits, minus_bits, w_bits, shape, m_tiles, total_pixels, static_cast<int>(channel_words),
          static_cast<int>(reduction_words), ep, out, out_channels_last);
  return cudaGetLastError();
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

}  // namespace conv

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
  return conv::binary_conv2d_typed(plus_bits, nullptr, w_bits, shape, epilogue, reinterpret_cast<conv::SignWords*>(out_words),
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
      return conv::binary_conv2d_typed(plus_bits, minus_bits, w_bits, shape, epilogue, static_cast<float*>(out),
                                 out_channels_last, tap_table, stream, chosen, weights_ready, table_first);
    case FloatType::kFloat16:
      return conv::binary_conv2d_typed(plus_bits, minus_bits, w_bits, shape, epilogue, static_cast<__half*>(out),
                                 out_channels_last, tap_table, stream, chosen, weights_ready, table_first);
    case FloatType::kBFloat16:
      return conv::binary_conv2d_typed(plus_bits, minus_bits, w_bits, shape, epilogue, static_cast<__nv_bfloat16*>(out),
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
  if (!wgmma_device(device) || !conv::conv_wgmma_shape(shape) || pixels < conv::kCwMinPixels ||
      reinterpret_cast<uintptr_t>(w_bits) % 16 != 0) {
    return cudaErrorNotSupported;
  }
  if (tap_table == nullptr) return cudaErrorInvalidValue;
  return conv::launch_conv_tap_table(w_bits, shape, tap_table, /*dependent=*/false, /*weights_ready=*/false, stream);
}

}  // namespace cuda
}  // namespace bitcompile
