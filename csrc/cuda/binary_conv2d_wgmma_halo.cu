// The halo-tile binary conv on Hopper's warpgroup b1 tensor cores (binary_conv2d_wgmma_halo_kernel, sm_90a) for
// stride-1, dilation-1 convs whose channel words are a multiple of 4 (ResNet's 3x3 convs of layers 2-4 but the
// first of layers 3 and 4), and its launch: sign words, or 16- / 32-bit channels_last outputs with OC even (a
// residual, the sum's sign words). Torch-free; the math is conv_common.cuh's (one plane, D_t, padding-exact), the
// dispatch binary_conv2d_wgmma.cu's (the gather kernel takes the other shapes).
#include <algorithm>

#include "conv_common.cuh"

namespace bitcompile {
namespace cuda {
namespace conv {

// ==== binary_conv2d_wgmma_halo_kernel ================================================================================
// Rows are the positions of the zero-padded input grid (Hp x Wp, Wp = W + 2 pad_w), not the output pixels: output
// (oh, ow) is row m = oh Wp + ow of its image, and its tap (kh, kw) reads padded pixel m + kh Wp + kw. So if a halo
// buffer holds the padded pixels of an image from p0 on as consecutive 16-byte rows ([chunk plane j][pixel][16 bytes],
// chunk j = channel words 4j..4j+3), the wgmma A operand of tap t for the 64 rows from p0 + 64 b is one no-swizzle
// K-major descriptor at pixel 64 b + kh Wp + kw of the plane (core matrices 8 pixels = 128 bytes: SBO 128), and a k256
// step's second 128-bit half is the next chunk of the tap-major K order, LBO bytes away (another plane, or the next
// tap's pixel shift x 16 bytes: core matrices that overlap; benchmarks/kernels/wgmma_halo_probe.cu checks exactly
// these descriptors). No gather a tap: the halo is copied once (16-byte cp.async, zero outside the image: the padded
// taps' zero bits, corrected by D_t as in every one-plane kernel), and the rows' pixel math is a division a row in the
// epilogue. Rows at ow >= OW (the Wp - OW columns of the padded grid a row) are computed and dropped: 7% more rows at
// W = 28, 14% at 14, 29% at 7 (where an image is one 64-row block).
//
// ---- Work ---------------------------------------------------------------------------------------------------------
//   A block keeps one tile of BN = 128 output channels: its weights as K-chunk planes in shared memory ([chunk g][row
//   n][16 bytes]: the B descriptor of step s is plane 2s, LBO one plane, SBO 128; planes past the last chunk zero), its
//   D_t (conv_tap_table_kernel's table), the columns' sign thresholds. Its two warpgroups work independently: each
//   walks items (image, `group` consecutive 64-row blocks of it) with two halo buffers of its own, the next item's
//   halo copied by its 128 threads while this item's wgmmas and epilogue run (named barrier of the warpgroup).
//   A 64-row block: ceil(G / 2) k256 steps (G = taps x chunks a tap) of m64n128k256 AND.POPC into 64 s32 registers,
//   each with an m64n8k256 of the same A against all-ones rows (pa, the row popcounts; the last step of an odd G
//   against ones on its first half only), in commit groups of up to 4 steps, then the epilogue from the registers:
//   sign words as the gather kernel's (binary_conv2d_wgmma.cu), other outputs a column pair a thread (4- or 8-byte
//   stores and residual loads; a quad's pairs are 16 or 32 contiguous bytes of a row).
constexpr int kWhThreads = 256;
constexpr int kWhBN = 128;
constexpr int kWhBlocksPerSm = 2;
constexpr int kWhMaxSteps = 64;
constexpr int kWhMaxDynamicSmem = 232448;  // sm_90: 227 KB a block (opt-in)
constexpr int kWhSmemPerSm = 233472;       // sm_90: 228 KB an SM, 1 KB of it reserved a resident block

// The launch's geometry (host-made).
struct WhGeometry {
  int padded_width;      // Wp
  int m_blocks;          // 64-row blocks an image: ceil(((OH - 1) Wp + OW) / 64)
  int group;             // 64-row blocks an item (the last item of an image may have fewer)
  int groups_per_image;  // ceil(m_blocks / group)
  int items;             // batch x groups_per_image (of each n tile)
  int blocks_per_tile;   // blocks of one n tile (grid = n tiles x blocks_per_tile)
  int plane_pixels;      // pixels of a halo buffer's chunk plane (a multiple of 8)
  int chunks;            // 16-byte chunks a tap (channel words / 4)
  int k_chunks;          // G = taps x chunks
  int steps;             // ceil(G / 2)
};

// Shared memory (dynamic, base rounded up to 128): [B planes: 2 steps x BN x 16] [halo: 2 warpgroups x 2 buffers x
// chunks x plane_pixels x 16] [tap_d: taps x BN int] [all_d: BN int] [col_sign: BN int2] [step: steps uint64]
// [ones: 384 bytes: 256 of ones, 128 of zeros].
struct WhLayout {
  size_t b_bytes, halo_buffer_bytes, halo_bytes, tap_d, all_d, col_sign, step, ones, total;
  __host__ __device__ WhLayout(const WhGeometry& g, int taps) {
    b_bytes = static_cast<size_t>(2 * g.steps) * kWhBN * 16;
    halo_buffer_bytes = static_cast<size_t>(g.chunks) * g.plane_pixels * 16;
    halo_bytes = 4 * halo_buffer_bytes;
    tap_d = b_bytes + halo_bytes;
    all_d = tap_d + static_cast<size_t>(taps) * kWhBN * 4;
    col_sign = all_d + kWhBN * 4;
    step = col_sign + kWhBN * 8;
    ones = (step + static_cast<size_t>(g.steps) * 8 + 127) & ~static_cast<size_t>(127);
    total = ones + 384 + 128;  // (+ the base's alignment slack)
  }
};

#if BC_WGMMA_ENABLED
__device__ __forceinline__ uint32_t wh_shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Warpgroup wg's own barrier (named barrier 1 + wg of its 128 threads), with an immediate id: a register id makes
// ptxas reserve all 16 of the block's barriers.
__device__ __forceinline__ void warpgroup_barrier(int wg) {
  if (wg == 0) {
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
  } else {
    asm volatile("bar.sync 2, 128;\n" ::: "memory");
  }
}
// No-swizzle K-major descriptor: start >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45 (128: the next 8 rows).
__device__ __forceinline__ uint64_t wh_descriptor(uint32_t start, uint32_t lbo) {
  return static_cast<uint64_t>((start & 0x3ffff) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(128 >> 4) << 32);
}
// STEPS k steps from step s0 as one commit group: A of step s = a_block's descriptor + step_delta[s] (its start and
// LBO fields), B = plane 2 s; each step's A also against the ones operand (half ones for a last step of odd G).
template <int STEPS>
__device__ __forceinline__ void wh_steps(int (&acc)[kWhBN / 2], int (&pa)[4], uint64_t a_block,
                                         const uint64_t* step_delta, uint64_t b_desc, int s0, int steps, bool odd,
                                         uint64_t ones, uint64_t ones_half) {
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < STEPS; ++j) {
    const int s = s0 + j;
    const uint64_t a = a_block + step_delta[s];
    b1::wgmma_and_popc<kWhBN>(acc, a, b_desc + static_cast<uint64_t>(s) * (2 * kWhBN * 16 >> 4));
    b1::wgmma_and_popc<8>(pa, a, odd && s == steps - 1 ? ones_half : ones);
  }
  wgmma_commit();
}
#endif

template <typename OutT>
__global__ __launch_bounds__(kWhThreads, kWhBlocksPerSm) void binary_conv2d_wgmma_halo_kernel(
    const uint32_t* __restrict__ x_bits, const uint32_t* __restrict__ w_bits, const int* __restrict__ tap_table,
    ConvShape shape, WhGeometry g, Epilogue ep, OutT* __restrict__ out, bool weights_ready) {
#if BC_WGMMA_ENABLED
  constexpr int BN = kWhBN;
  constexpr bool kSigns = std::is_same_v<OutT, SignWords>;
  extern __shared__ uint8_t wh_smem_raw[];
  uint8_t* const smem = wh_smem_raw + ((128 - (wh_shared_address(wh_smem_raw) & 127)) & 127);
  const int taps = static_cast<int>(shape.kernel_h * shape.kernel_w);
  const WhLayout layout(g, taps);
  const uint32_t b_base = wh_shared_address(smem);
  const uint32_t halo_base = b_base + static_cast<uint32_t>(layout.b_bytes);
  int* const tap_d = reinterpret_cast<int*>(smem + layout.tap_d);  // D_t of column c at [t * BN + c]
  int* const all_d = reinterpret_cast<int*>(smem + layout.all_d);
  int2* const col_sign = reinterpret_cast<int2*>(smem + layout.col_sign);      // sign words: (d, t) of column c
  float2* const col_value = reinterpret_cast<float2*>(smem + layout.col_sign);  // else: (scale, bias) of column c
  uint64_t* const step_delta = reinterpret_cast<uint64_t*>(smem + layout.step);
  const uint32_t ones = b_base + static_cast<uint32_t>(layout.ones);

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int tile = static_cast<int>(blockIdx.x) / g.blocks_per_tile;
  const int n0 = tile * BN;
  const int n_rows = static_cast<int>(shape.out_channels);
  const int cols_valid = min(BN, n_rows - n0);
  const int channel_words = 4 * g.chunks;
  const int reduction_words = 4 * g.k_chunks;

  // K chunk c (words 4c..4c+3 of a weight row: tap c / chunks, its 16-byte chunk c % chunks) in a halo buffer:
  // bytes from its plane 0, row 0. Step s pairs chunks 2s and 2s + 1, in the order of their offsets: the descriptor's
  // LBO field is unsigned (with 3 chunks a tap, chunk (t, 2) pairs with (t + 1, 0), a lower plane).
  const int wp = g.padded_width;
  const auto chunk_offset = [&](int c) {
    const int t = c / g.chunks, j = c - t * g.chunks;
    const int kh = t / static_cast<int>(shape.kernel_w), kw = t - kh * static_cast<int>(shape.kernel_w);
    return static_cast<uint32_t>(j * g.plane_pixels + kh * wp + kw) * 16u;
  };
  const auto swapped = [&](int s) {  // step s takes chunk 2s + 1 first
    return 2 * s + 1 < g.k_chunks && chunk_offset(2 * s + 1) < chunk_offset(2 * s);
  };
  // B: plane 2s + e, row n = weight row n0 + n's e-th chunk of step s; planes past G and rows past the last zero.
  // A thread takes consecutive chunks of one row (coalesced reads of the K-contiguous weight row).
  const auto load_b = [&] {
    const int planes = 2 * g.steps;
    for (int i = tid; i < planes * BN; i += kWhThreads) {
      const int n = i / planes, p = i - n * planes;
      const int c = swapped(p >> 1) ? p ^ 1 : p;
      const bool fill = c < g.k_chunks && n < cols_valid;
      cp_async_shared<16>(b_base + (p * BN + n) * 16,
                          fill ? w_bits + static_cast<int64_t>(n0 + n) * reduction_words + 4 * c : w_bits, fill);
    }
  };
  if (weights_ready) load_b();  // the weights were complete before the launch before this one began
  wait_for_prerequisite_grid();  // the tap table (and through it the input's bits) complete and visible
  if (!weights_ready) load_b();
  copy_tap_table<BN, kWhThreads>(tap_d, all_d, tap_table, w_bits, n0, n_rows, taps, tid);
  cp_async_commit();
  const bool has_scale = ep.scale != nullptr, has_bias = ep.bias != nullptr;
  if (tid < BN) {
    const int step = has_scale && ep.scale_count != 1 ? 1 : 0;
    const bool valid = tid < cols_valid;
    const float scale = valid && has_scale ? ep.scale[(n0 + tid) * step] : 1.f;
    const float bias = valid && has_bias ? ep.bias[n0 + tid] : 0.f;
    if constexpr (kSigns) {
      col_sign[tid] = valid ? sign_threshold(scale, bias) : make_int2(0, 1);
    } else {
      col_value[tid] = make_float2(scale, bias);
    }
  }
  if (tid < g.steps) {  // step s: chunks 2s and 2s + 1 of the tap-major K order, the lower offset first
    const bool swap = swapped(tid);
    const uint32_t first = chunk_offset(2 * tid + (swap ? 1 : 0));
    const uint32_t lbo = 2 * tid + 1 < g.k_chunks ? chunk_offset(2 * tid + (swap ? 0 : 1)) - first : 16u;
    step_delta[tid] = static_cast<uint64_t>(first >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
                      (static_cast<uint64_t>(128 >> 4) << 32);
  }
  if (tid >= kWhThreads - 96) {  // ones (256 bytes) then zeros (128): written by generic stores, read by the async proxy
    const int k = tid - (kWhThreads - 96);
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(ones + 4 * k), "r"(k < 64 ? ~0u : 0u) : "memory");
  }
  cp_async_wait<0>();
  fence_proxy_async_shared();
  __syncthreads();

  // ---- each warpgroup: its items, two halo buffers ----
  const int wg = __shfl_sync(kFullMask, tid >> 7, 0);  // warp-uniform for ptxas
  const int wtid = tid & 127;
  const uint32_t halo0 = halo_base + static_cast<uint32_t>(wg * 2 * layout.halo_buffer_bytes);
  const uint32_t buffer_bytes = static_cast<uint32_t>(layout.halo_buffer_bytes);
  const int stride = 2 * g.blocks_per_tile;
  const int height = static_cast<int>(shape.height), width = static_cast<int>(shape.width);
  const int pad_h = static_cast<int>(shape.pad_h), pad_w = static_cast<int>(shape.pad_w);
  const int out_h = static_cast<int>(shape.out_height), out_w = static_cast<int>(shape.out_width);
  // The item's halo: padded pixels p0 .. p0 + plane_pixels - 1 of its image, every chunk plane (zero outside).
  const auto issue_halo = [&](int item, uint32_t buffer) {
    if (item < g.items) {
      const int image = item / g.groups_per_image;
      const int p0 = (item - image * g.groups_per_image) * g.group * 64;
      const uint32_t* const image_bits = x_bits + static_cast<int64_t>(image) * height * width * channel_words;
      for (int pix = wtid; pix < g.plane_pixels; pix += 128) {
        const int p = p0 + pix;
        const int y = p / wp;
        const int iy = y - pad_h, ix = p - y * wp - pad_w;
        const bool inside = iy >= 0 && iy < height && ix >= 0 && ix < width;
        const uint32_t* src = inside ? image_bits + (iy * width + ix) * channel_words : x_bits;
        for (int j = 0; j < g.chunks; ++j) {
          cp_async_shared<16>(buffer + (j * g.plane_pixels + pix) * 16, inside ? src + 4 * j : x_bits, inside);
        }
      }
    }
    cp_async_commit();  // (an empty group past the last item: the wait_group accounting stays the same)
  };
  const uint64_t ones_desc = wh_descriptor(ones, 128), ones_half_desc = wh_descriptor(ones + 128, 128);
  const uint64_t b_desc = wh_descriptor(b_base, BN * 16);
  const bool odd = (g.k_chunks & 1) != 0;
  const int pad_weight = -(1 + shape.pad_value);  // of a padded tap's D_t
  const uint32_t all_taps = taps >= 32 ? 0xffffffffu : (1u << taps) - 1u;
  const int quad = lane & 3;
  const int r_top = (warp & 3) * 16 + (lane >> 2);  // the thread's rows r_top, r_top + 8 of a 64-row block
  const int64_t out_plane = static_cast<int64_t>(out_h) * out_w;
  const int64_t words_per_pixel = (n_rows + 31) / 32;

  int item = (static_cast<int>(blockIdx.x) % g.blocks_per_tile) * 2 + wg;
  int buffer = 0;
  issue_halo(item, halo0);
  for (; item < g.items; item += stride) {
    const uint32_t current = halo0 + buffer * buffer_bytes;
    issue_halo(item + stride, halo0 + (buffer ^ 1) * buffer_bytes);
    cp_async_wait<1>();  // this item's halo copies (the thread's own) have landed
    fence_proxy_async_shared();
    warpgroup_barrier(wg);  // ... and every thread's of the warpgroup
    const int image = item / g.groups_per_image;
    const int mb0 = (item - image * g.groups_per_image) * g.group;
    const int count = min(g.group, g.m_blocks - mb0);
    for (int b = 0; b < count; ++b) {
      int acc[BN / 2];
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[i] = 0;
      int pa[4] = {0, 0, 0, 0};
      const uint64_t a_block = static_cast<uint64_t>(((current + b * 64 * 16) & 0x3ffff) >> 4);
      for (int s0 = 0; s0 < g.steps; s0 += 4) {
        const int n = min(4, g.steps - s0);
        b1::fence_accumulators(acc);
        b1::fence_accumulators(pa);
        // one straight-line fence + chain + commit a step count (binary_conv2d_wgmma.cu: a branch around single
        // wgmmas makes ptxas serialize them)
        if (n == 4) {
          wh_steps<4>(acc, pa, a_block, step_delta, b_desc, s0, g.steps, odd, ones_desc, ones_half_desc);
        } else if (n == 3) {
          wh_steps<3>(acc, pa, a_block, step_delta, b_desc, s0, g.steps, odd, ones_desc, ones_half_desc);
        } else if (n == 2) {
          wh_steps<2>(acc, pa, a_block, step_delta, b_desc, s0, g.steps, odd, ones_desc, ones_half_desc);
        } else {
          wh_steps<1>(acc, pa, a_block, step_delta, b_desc, s0, g.steps, odd, ones_desc, ones_half_desc);
        }
      }
      wgmma_wait<0>();
      b1::fence_accumulators(acc);
      b1::fence_accumulators(pa);

      // ---- sign words (as binary_conv2d_wgmma_kernel's): rows r_top, r_top + 8 x columns 8 i + 2 quad (+ 1) ----
      int64_t pixel[2];
      uint32_t left[2];  // the rows' padded taps (none for interior rows, dropped rows or pad = -1)
      bool row_valid[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = (mb0 + b) * 64 + r_top + 8 * h;
        const int oh = m / wp, ow = m - oh * wp;
        row_valid[h] = oh < out_h && ow < out_w;
        pixel[h] = static_cast<int64_t>(image) * out_plane + static_cast<int64_t>(oh) * out_w + ow;
        const uint32_t inside = inside_taps(oh - pad_h, ow - pad_w, static_cast<int>(shape.kernel_h),
                                            static_cast<int>(shape.kernel_w), 1, 1, height, width);
        left[h] = pad_weight != 0 && row_valid[h] ? ~inside & all_taps : 0u;
      }
      const int term_top = -2 * pa[0], term_bottom = -2 * pa[2];
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[i] = 4 * acc[i] + ((i & 2) != 0 ? term_bottom : term_top);
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
      // v = acc + sum_t D_t of the column (conv_epilogue's integer). Sign words: d v - t >= 0 (sign_threshold). 16-
      // and 32-bit outputs (channels_last, OC even): y = fma(v, scale, bias) (epilogue_value without a row factor, bit
      // for bit), plus the residual's element after rounding y to OutT (eager's add), stored a column pair at a time;
      // ep.out_signs: the stored values' sign bits. A word's bits: a quad's, OR-ed by two shuffles.
      uint32_t* const sign_out = kSigns ? reinterpret_cast<uint32_t*>(out) : ep.out_signs;
#pragma unroll
      for (int word = 0; word < BN / 32; ++word) {  // word of the block's columns: i = 4 word .. 4 word + 3
        uint32_t bits[2] = {0u, 0u};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int i = 4 * word + j;
          const int c = 8 * i + 2 * quad;
          const int2 all = *reinterpret_cast<const int2*>(all_d + c);  // sum_t D_t
          const bool valid0 = c < cols_valid, valid1 = c + 1 < cols_valid;
          if constexpr (kSigns) {
            const int4 sign = *reinterpret_cast<const int4*>(&col_sign[c]);  // (d, t) of c, c + 1
            const int term0 = sign.x * all.x - sign.y, term1 = sign.z * all.y - sign.w;  // d (v + all) - t
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int z0 = acc[4 * i + 2 * h] * sign.x + term0;
              const int z1 = acc[4 * i + 2 * h + 1] * sign.z + term1;
              bits[h] |= ((valid0 && z0 >= 0 ? 1u : 0u) | (valid1 && z1 >= 0 ? 2u : 0u)) << (8 * j + 2 * quad);
            }
          } else {
            using Pair = typename OutPair<OutT>::type;
            const float4 cv = *reinterpret_cast<const float4*>(&col_value[c]);  // (scale, bias) of c, c + 1
            const OutT* const residual = static_cast<const OutT*>(ep.residual);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              if (valid0 && row_valid[h]) {  // (OC even: c + 1 is valid too)
                const int64_t at = pixel[h] * n_rows + n0 + c;
                float y0 = __fmaf_rn(static_cast<float>(acc[4 * i + 2 * h] + all.x), cv.x, cv.y);
                float y1 = __fmaf_rn(static_cast<float>(acc[4 * i + 2 * h + 1] + all.y), cv.z, cv.w);
                if (residual != nullptr) {
                  const Pair r = *reinterpret_cast<const Pair*>(residual + at);
                  y0 = to_float(from_float<OutT>(y0)) + to_float(OutPair<OutT>::low(r));
                  y1 = to_float(from_float<OutT>(y1)) + to_float(OutPair<OutT>::high(r));
                }
                const Pair o = OutPair<OutT>::make(y0, y1);
                *reinterpret_cast<Pair*>(out + at) = o;
                bits[h] |= ((to_float(OutPair<OutT>::low(o)) >= 0.f ? 1u : 0u) |
                            (to_float(OutPair<OutT>::high(o)) >= 0.f ? 2u : 0u)) << (8 * j + 2 * quad);
              }
            }
          }
        }
        if (sign_out != nullptr) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t bits_word = bits[h];
            bits_word |= __shfl_xor_sync(kFullMask, bits_word, 1);
            bits_word |= __shfl_xor_sync(kFullMask, bits_word, 2);
            if (quad == 0 && row_valid[h] && 32 * word < cols_valid) {
              sign_out[pixel[h] * words_per_pixel + (n0 >> 5) + word] = bits_word;
            }
          }
        }
      }
    }
    warpgroup_barrier(wg);  // every wgmma of the warpgroup done with `current` before it is refilled
    buffer ^= 1;
  }
  cp_async_wait<0>();
#else
  __trap();  // built for another target: the launcher refuses without sm_90a code on a 9.0 device
#endif
}

// The geometry where the kernel takes the shape (false elsewhere): stride 1, dilation 1, <= 32 taps, channel words %
// 4 == 0, <= kWhMaxSteps k steps, two blocks' shared memory within an SM's.
bool conv_wgmma_halo_geometry(const ConvShape& s, int sm_count, WhGeometry& g) {
  const int64_t taps = s.kernel_h * s.kernel_w;
  const int64_t channel_words = ceil_div(s.channels, 32);
  if (s.stride_h != 1 || s.stride_w != 1 || s.dilation_h != 1 || s.dilation_w != 1 || taps > kOnePlaneMaxTaps ||
      channel_words % 4 != 0 || s.out_height != s.height + 2 * s.pad_h - s.kernel_h + 1 ||
      s.out_width != s.width + 2 * s.pad_w - s.kernel_w + 1) {
    return false;
  }
  const int64_t wp = s.width + 2 * s.pad_w;
  const int64_t rows = (s.out_height - 1) * wp + s.out_width;  // the image's rows up to its last output pixel
  const int64_t k_chunks = taps * (channel_words / 4);
  const int64_t steps = (k_chunks + 1) / 2;
  if (steps > kWhMaxSteps || wp > 4096 || (s.out_height + s.kernel_h) * wp > (int64_t{1} << 24) ||
      s.batch * s.height * s.width * channel_words > INT_MAX) {
    return false;
  }
  const int64_t m_blocks = ceil_div(rows, 64);
  const int64_t n_tiles = ceil_div(s.out_channels, kWhBN);
  // two 64-row blocks an item where that leaves an item for every warpgroup of a full grid, else one
  const int64_t slots = 2 * static_cast<int64_t>(sm_count) * kWhBlocksPerSm;
  const int group = s.batch * ceil_div(m_blocks, 2) * n_tiles >= slots ? 2 : 1;
  const int64_t groups_per_image = ceil_div(m_blocks, group);
  const int64_t items = s.batch * groups_per_image;
  if (items > INT_MAX / 2) return false;
  const int64_t extent = (s.kernel_h - 1) * wp + s.kernel_w - 1;
  g.padded_width = static_cast<int>(wp);
  g.m_blocks = static_cast<int>(m_blocks);
  g.group = group;
  g.groups_per_image = static_cast<int>(groups_per_image);
  g.items = static_cast<int>(items);
  const int64_t per_tile = std::max<int64_t>(1, static_cast<int64_t>(sm_count) * kWhBlocksPerSm / n_tiles);
  g.blocks_per_tile = static_cast<int>(std::min(ceil_div(items, 2), per_tile));
  // + 1: an odd G's last step reads one pixel past its chunk's rows (its second half, against zero weights)
  g.plane_pixels = static_cast<int>((group * 64 + extent + 1 + 7) / 8 * 8);
  g.chunks = static_cast<int>(channel_words / 4);
  g.k_chunks = static_cast<int>(k_chunks);
  g.steps = static_cast<int>(steps);
  const WhLayout layout(g, static_cast<int>(taps));
  return layout.total <= static_cast<size_t>(kWhSmemPerSm / kWhBlocksPerSm - 1024);
}

template <typename OutT>
cudaError_t binary_conv2d_wgmma_halo(const uint32_t* x_bits, const uint32_t* w_bits, const ConvShape& shape,
                                     const Epilogue& ep, OutT* out, bool out_channels_last, int* tap_table,
                                     int sm_count, cudaStream_t stream, bool weights_ready, bool table_ready) {
  constexpr bool kSigns = std::is_same_v<OutT, SignWords>;
  // 16- and 32-bit outputs a column pair at a time: channels_last, OC even, output and residual pair-aligned
  const size_t pair_bytes = kSigns ? 1 : 2 * sizeof(OutT);
  const bool pairs = kSigns || (out_channels_last && shape.out_channels % 2 == 0 &&
                                reinterpret_cast<uintptr_t>(out) % pair_bytes == 0 &&
                                reinterpret_cast<uintptr_t>(ep.residual) % pair_bytes == 0);
  WhGeometry g;
  if (ep.row_factor != nullptr || !pairs || !conv_wgmma_halo_geometry(shape, sm_count, g) ||
      reinterpret_cast<uintptr_t>(x_bits) % 16 != 0 || reinterpret_cast<uintptr_t>(w_bits) % 16 != 0) {
    return cudaErrorNotSupported;
  }
  if (tap_table == nullptr) return cudaErrorInvalidValue;
  const WhLayout layout(g, static_cast<int>(shape.kernel_h * shape.kernel_w));
  auto kernel = binary_conv2d_wgmma_halo_kernel<OutT>;
  static unsigned long long smem_devices = 0;
  cudaError_t error = allow_dynamic_smem(kernel, kWhMaxDynamicSmem, smem_devices, /*max_shared_carveout=*/true);
  if (error != cudaSuccess) return error;
  if (!table_ready) {  // the weight's D_t table first (its completion implies the launch before it complete)
    error = launch_conv_tap_table(w_bits, shape, tap_table, /*dependent=*/true, weights_ready, stream);
    if (error != cudaSuccess) return error;
  }
  const int n_tiles = static_cast<int>(ceil_div(shape.out_channels, kWhBN));
  const ClusterLaunch launch(dim3(static_cast<unsigned>(n_tiles * g.blocks_per_tile)), kWhThreads, layout.total, 1,
                             stream, /*dependent=*/true);
  return cudaLaunchKernelEx(&launch.config, kernel, x_bits, w_bits, static_cast<const int*>(tap_table), shape, g, ep,
                            out, weights_ready);
}

#define BC_WGMMA_HALO(OutT)                                                                                           \
  template cudaError_t binary_conv2d_wgmma_halo<OutT>(const uint32_t*, const uint32_t*, const ConvShape&,           \
                                                      const Epilogue&, OutT*, bool, int*, int, cudaStream_t, bool, bool);
BC_WGMMA_HALO(float)
BC_WGMMA_HALO(__half)
BC_WGMMA_HALO(__nv_bfloat16)
BC_WGMMA_HALO(SignWords)
#undef BC_WGMMA_HALO

}  // namespace conv
}  // namespace cuda
}  // namespace bitcompile
