// The one-plane binary conv on the cp.async pipeline (binary_conv2d_pipelined_kernel, tiles 128 x 64 and 64 x 32,
// one or two K groups) and its launch, which also hands ResNet's layer1 shapes to the halo kernel. Torch-free;
// the math is conv_common.cuh's, the dispatch binary_conv2d.cu's.
#include "conv_common.cuh"

namespace bitcompile {
namespace cuda {
namespace conv {

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
  const auto [total_pixels, channel_words, reduction_words, m_tiles, blocks, fits] = conv_grid(shape, BM, BN);
  if (!fits) return cudaErrorInvalidValue;
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

template cudaError_t binary_conv2d_pipelined_launch<4, float>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                           const Epilogue&, float*, bool, int*, cudaStream_t,
                                                           const ConvTuning&, bool, bool);
template cudaError_t binary_conv2d_pipelined_launch<4, __half>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                           const Epilogue&, __half*, bool, int*, cudaStream_t,
                                                           const ConvTuning&, bool, bool);
template cudaError_t binary_conv2d_pipelined_launch<4, __nv_bfloat16>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                           const Epilogue&, __nv_bfloat16*, bool, int*, cudaStream_t,
                                                           const ConvTuning&, bool, bool);
template cudaError_t binary_conv2d_pipelined_launch<4, SignWords>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                           const Epilogue&, SignWords*, bool, int*, cudaStream_t,
                                                           const ConvTuning&, bool, bool);
template cudaError_t binary_conv2d_pipelined_launch<2, float>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                           const Epilogue&, float*, bool, int*, cudaStream_t,
                                                           const ConvTuning&, bool, bool);
template cudaError_t binary_conv2d_pipelined_launch<2, __half>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                           const Epilogue&, __half*, bool, int*, cudaStream_t,
                                                           const ConvTuning&, bool, bool);
template cudaError_t binary_conv2d_pipelined_launch<2, __nv_bfloat16>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                           const Epilogue&, __nv_bfloat16*, bool, int*, cudaStream_t,
                                                           const ConvTuning&, bool, bool);
template cudaError_t binary_conv2d_pipelined_launch<2, SignWords>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                           const Epilogue&, SignWords*, bool, int*, cudaStream_t,
                                                           const ConvTuning&, bool, bool);
template cudaError_t binary_conv2d_pipelined_launch<1, float>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                           const Epilogue&, float*, bool, int*, cudaStream_t,
                                                           const ConvTuning&, bool, bool);
template cudaError_t binary_conv2d_pipelined_launch<1, __half>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                           const Epilogue&, __half*, bool, int*, cudaStream_t,
                                                           const ConvTuning&, bool, bool);
template cudaError_t binary_conv2d_pipelined_launch<1, __nv_bfloat16>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                           const Epilogue&, __nv_bfloat16*, bool, int*, cudaStream_t,
                                                           const ConvTuning&, bool, bool);
template cudaError_t binary_conv2d_pipelined_launch<1, SignWords>(const uint32_t*, const uint32_t*, const ConvShape&,
                                                           const Epilogue&, SignWords*, bool, int*, cudaStream_t,
                                                           const ConvTuning&, bool, bool);

}  // namespace conv
}  // namespace cuda
}  // namespace bitcompile
