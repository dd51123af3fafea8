// The one-plane binary conv on Hopper's warpgroup b1 tensor cores (binary_conv2d_wgmma_kernel, sm_90a) and its
// launch. Torch-free; the math is conv_common.cuh's, the dispatch binary_conv2d.cu's.
#include "conv_common.cuh"

namespace bitcompile {
namespace cuda {
namespace conv {

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
  const auto [total_pixels, channel_words, reduction_words, m_tiles, blocks, fits] = conv_grid(shape, kCwBM, BN);
  const int taps = static_cast<int>(shape.kernel_h * shape.kernel_w);
  if (!fits || shape.out_channels > INT_MAX - BN || tap_table == nullptr) return cudaErrorInvalidValue;
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

template cudaError_t binary_conv2d_wgmma<float>(const uint32_t*, const uint32_t*, const ConvShape&, const Epilogue&,
                                              float*, bool, int*, cudaStream_t, bool, bool);
template cudaError_t binary_conv2d_wgmma<__half>(const uint32_t*, const uint32_t*, const ConvShape&, const Epilogue&,
                                              __half*, bool, int*, cudaStream_t, bool, bool);
template cudaError_t binary_conv2d_wgmma<__nv_bfloat16>(const uint32_t*, const uint32_t*, const ConvShape&, const Epilogue&,
                                              __nv_bfloat16*, bool, int*, cudaStream_t, bool, bool);
template cudaError_t binary_conv2d_wgmma<SignWords>(const uint32_t*, const uint32_t*, const ConvShape&, const Epilogue&,
                                              SignWords*, bool, int*, cudaStream_t, bool, bool);

}  // namespace conv
}  // namespace cuda
}  // namespace bitcompile
