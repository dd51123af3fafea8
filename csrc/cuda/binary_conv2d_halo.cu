// The persistent halo conv (binary_conv2d_halo_kernel: 3x3, stride 1 or 2, pad 1, 33..64 channels, ResNet's
// layer1) and its launch. Torch-free; the math is conv_common.cuh's.
#include "conv_common.cuh"

namespace bitcompile {
namespace cuda {
namespace conv {

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

template bool conv_halo_takes<float>(const ConvShape&, const Epilogue&, bool);
template bool conv_halo_takes<__half>(const ConvShape&, const Epilogue&, bool);
template bool conv_halo_takes<__nv_bfloat16>(const ConvShape&, const Epilogue&, bool);
template bool conv_halo_takes<SignWords>(const ConvShape&, const Epilogue&, bool);
template cudaError_t binary_conv2d_halo_launch<float>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                    const Epilogue&, float*, bool, int*, int, bool, bool, bool,
                                                    cudaStream_t);
template cudaError_t binary_conv2d_halo_launch<__half>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                    const Epilogue&, __half*, bool, int*, int, bool, bool, bool,
                                                    cudaStream_t);
template cudaError_t binary_conv2d_halo_launch<__nv_bfloat16>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                    const Epilogue&, __nv_bfloat16*, bool, int*, int, bool, bool, bool,
                                                    cudaStream_t);
template cudaError_t binary_conv2d_halo_launch<SignWords>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                    const Epilogue&, SignWords*, bool, int*, int, bool, bool, bool,
                                                    cudaStream_t);

}  // namespace conv
}  // namespace cuda
}  // namespace bitcompile
