// binary_weight_linear (W1A16 / W1A32: float x, +-1 weights) for the rows of x that the tensor-core kernel
// takes, and dequantize_signs for the larger M that the binding sends to cuBLAS. Torch-free (launchers in
// binary_kernels.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cooperative_groups.h>

#include <type_traits>

#include "device_common.cuh"

namespace bitcompile {
namespace cuda {
namespace {

// mma.sync.m16n8k16 with A = 16 output features (rows of W, expanded from bits in registers) and
// B = 8 rows of x (from shared memory); C is [features][x rows], fp32 accumulation. Fragment layout
// (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), g = lane >> 2, t = lane & 3:
//   A: reg0 = (row g, k 2t, 2t+1)  reg1 = (row g+8, k 2t, 2t+1)  reg2 = (row g, k 2t+8, 2t+9)  reg3 = (row g+8, ...)
//   B: reg0 = (k 2t, 2t+1; col g)  reg1 = (k 2t+8, 2t+9; col g)
//   C: c0, c1 = (row g, cols 2t, 2t+1)  c2, c3 = (row g+8, cols 2t, 2t+1)
// The k slots of lane t (2t, 2t+1, 2t+8, 2t+9) are the same in A and B, so any assignment of real k to
// (step, t, slot) works if A and B use the same one. Lane t holds words 4t..4t+3 of a 512-bit chunk of
// its rows (one 16-byte load a row); step s = 8w + q of the chunk uses word w, shifted v = u << (14 - 2q):
//   slot 2t  <- bit 2q+1  (v bit 15)      slot 2t+8 <- bit 2q    (v bit 14)
//   slot 2t+1 <- bit 2q+17 (v bit 31)     slot 2t+9 <- bit 2q+16 (v bit 30)
// Odd bits become +-1 through the sign bit: (v & 0x80008000) ^ (-1, -1) (bit 1 -> +1.0, bit 0 -> -1.0,
// the same for bf16 0xBF80 and fp16 0xBC00). Even bits become {0, 2.0} with one AND: v & 0x40004000
// (2.0 is 0x4000 in both types), and 2 * bit(w) - 1 = s(w) needs minus the sum of x over even k, which
// the staging of x computes per row ("correction"). One shift serves two registers: 0.75 integer ops a
// weight, the cost that bounds this kernel (the tensor cores and W's bytes are cheaper).
// x in shared memory: for each word W and q the four values (x[2q+1], x[2q+17], x[2q], x[2q+16]) of
// that word as one 8-byte group, so a B fragment is one 8-byte load; groups ordered (chunk, w, q, t)
// so the four lanes t of a row read 32 consecutive bytes, rows padded by 32 bytes (no bank conflicts).
// fp32 x is split exactly into three bf16 parts (hi + mid + lo), three MMAs each; products with +-1
// and 2 are exact, the sums are fp32 as before. For fp32 x the even bits are exact +-1 too ((v << 1) &
// 0x80008000 ^ (-1, -1): one more shift and LOP3 against three MMAs) and there is no correction: with
// {0, 2.0} the accumulator grows like the sum of x over even k, and the tensor cores' truncating fp32
// accumulation loses ~1e-5 of that when x has one sign (a numpy model of the kernel, K = 8192 in one
// slice: 2.4e-5 for uniform x, 5.3e-6 for relu(randn); with +-1: 1.6e-7 and 6.5e-8).
// Split K: a cluster of `slices` blocks (K ranges) of one feature block reduces its partial tiles
// through distributed shared memory, in rank order (deterministic), and applies the epilogue.
constexpr int kTcWarps = 8;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcFeatures = kTcWarps * 32;  // output features per block: two m16 tiles per warp
constexpr int kTcChunkWords = 16;           // 512 k per chunk: lane t holds words 4t..4t+3
constexpr int kTcMaxSlices = 8;             // portable cluster size

template <typename MmaT>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// -1.0 in both halves (the sign bit flipped by a set weight bit gives +1.0).
template <typename MmaT>
struct MinusOnePair;
template <>
struct MinusOnePair<__nv_bfloat16> {
  static constexpr uint32_t value = 0xBF80BF80u;
};
template <>
struct MinusOnePair<__half> {
  static constexpr uint32_t value = 0xBC00BC00u;
};

// (v & 0x80008000) ^ minus_one as one LOP3 (0x6A = (a & b) ^ c). Written as C++, the two constants are two
// immediates and a SASS LOP3 takes one: ptxas splits it in two instructions, 33% more integer work here.
__device__ __forceinline__ uint32_t sign_pair(uint32_t v, uint32_t minus_one) {
  uint32_t result;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(result) : "r"(v), "n"(0x80008000), "r"(minus_one));
  return result;
}

__device__ __forceinline__ uint16_t mma_bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ uint16_t mma_bits(__half v) { return __half_as_ushort(v); }
template <typename T>
__device__ __forceinline__ T bits_as(uint16_t bits);
template <>
__device__ __forceinline__ __nv_bfloat16 bits_as<__nv_bfloat16>(uint16_t bits) { return __ushort_as_bfloat16(bits); }
template <>
__device__ __forceinline__ __half bits_as<__half>(uint16_t bits) { return __ushort_as_half(bits); }

// Part `part` of x as the MMA type: the value itself (PARTS = 1), or the exact three-way bf16 split of fp32.
template <typename MmaT, int PARTS>
__device__ __forceinline__ void split_value(float v, uint16_t (&bits)[PARTS]) {
  if constexpr (PARTS == 1) {
    bits[0] = mma_bits(from_float<MmaT>(v));  // exact: x already has this type
  } else {
    float rest = v;
#pragma unroll
    for (int p = 0; p < PARTS; ++p) {
      const __nv_bfloat16 piece = __float2bfloat16_rn(rest);
      bits[p] = __bfloat16_as_ushort(piece);
      rest -= __bfloat162float(piece);  // exact (Sterbenz-like: piece is rest rounded)
    }
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int w) {
  return w == 0 ? v.x : (w == 1 ? v.y : (w == 2 ? v.z : v.w));
}

// The outputs of a tile of partial sums (partial[row][feature] in shared memory, tile_rows x FEATURES, rows
// from x row m0, features from n_block): the sum over the `slices` blocks of a cluster that split K, taken
// through distributed shared memory in rank order (deterministic), or the block's own tile; then the
// epilogue. Every block of a cluster reduces its share of the tile.
template <int THREADS, int FEATURES, typename T>
__device__ __forceinline__ void store_tile(float* partial, int tile_rows, int64_t m0, int64_t m_rows, int64_t n_block,
                                           int64_t n_rows, int slices, const Epilogue& ep, T* __restrict__ out) {
  const int tid = threadIdx.x;
  if (slices > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap();  // clusters are Hopper's; the launchers pass slices = 1 on older GPUs
#else
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's partial tile is written
    const int rank = static_cast<int>(cluster.block_rank());
    for (int index = rank * THREADS + tid; index < tile_rows * FEATURES; index += slices * THREADS) {
      const int64_t m = m0 + index / FEATURES;
      const int64_t n = n_block + index % FEATURES;
      if (m < m_rows && n < n_rows) {
        float sum = 0.f;
        for (int r = 0; r < slices; ++r) sum += cluster.map_shared_rank(partial, r)[index];  // rank order
        out[m * n_rows + n] = from_float<T>(epilogue_value(sum, row_factor(ep, m), column_scale(ep, n), column_bias(ep, n)));
      }
    }
    cluster.sync();  // no block leaves while another still reads its shared memory
#endif
  } else {
    __syncthreads();
    for (int index = tid; index < tile_rows * FEATURES; index += THREADS) {
      const int64_t m = m0 + index / FEATURES;
      const int64_t n = n_block + index % FEATURES;
      if (m < m_rows && n < n_rows) {
        out[m * n_rows + n] =
            from_float<T>(epilogue_value(partial[index], row_factor(ep, m), column_scale(ep, n), column_bias(ep, n)));
      }
    }
  }
}

// InT: x's type; MmaT: the tensor-core type (bf16 for fp32 x, in PARTS = 3 pieces); NB: n8 tiles (8 rows of
// x each); STAGE_CHUNKS: chunks of x staged in shared memory at a time; VEC: 16-byte W loads.
template <typename InT, typename MmaT, int PARTS, int NB, int STAGE_CHUNKS, bool VEC>
__global__ __launch_bounds__(kTcThreads, 2) void binary_weight_linear_tc_kernel(
    const InT* __restrict__ x, const uint32_t* __restrict__ w_bits, int64_t m_rows, int64_t n_rows, int64_t k,
    int64_t words, int slices, int64_t slice_chunks, Epilogue ep, InT* __restrict__ out) {
  constexpr int MB = NB * 8;                               // rows of x a block
  constexpr int kStageWords = STAGE_CHUNKS * kTcChunkWords;
  constexpr int kGroupsPerRow = kStageWords * 8;           // 8-byte groups of a staged row
  constexpr int kRowStride = kGroupsPerRow + 4;            // + 32 bytes: rows g, g+1 on other banks
  extern __shared__ __align__(16) unsigned char tc_smem[];
  uint2* x_stage = reinterpret_cast<uint2*>(tc_smem);      // [PARTS][MB][kRowStride]
  float* correction = reinterpret_cast<float*>(x_stage + PARTS * MB * kRowStride);  // [MB]
  float* partial = reinterpret_cast<float*>(tc_smem);      // [MB][kTcFeatures], after the main loop

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int slice = static_cast<int>(blockIdx.x % static_cast<unsigned>(slices));
  const int64_t n_block = (blockIdx.x / static_cast<unsigned>(slices)) * static_cast<int64_t>(kTcFeatures);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * MB;
  const int64_t total_chunks = ceil_div(words, kTcChunkWords);
  const int64_t chunk_begin = slice * slice_chunks;
  const int64_t chunk_end = chunk_begin + slice_chunks < total_chunks ? chunk_begin + slice_chunks : total_chunks;

  // This lane's four W rows: tile 0 rows g, g+8; tile 1 rows 16+g, 24+g.
  int64_t w_row[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) w_row[r] = n_block + warp * 32 + (r >> 1) * 16 + (r & 1) * 8 + g;

  // Words 4t..4t+3 of chunk c of the four rows; rows and words past the end read as 0 (x is 0 there too).
  auto load_chunk = [&](uint4 (&dst)[4], int64_t c) {
    const int64_t word = c * kTcChunkWords + 4 * t;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if (VEC) {
        dst[r] = (w_row[r] < n_rows && word < words) ? __ldg(reinterpret_cast<const uint4*>(w_bits + w_row[r] * words + word))
                                                    : make_uint4(0, 0, 0, 0);
      } else {
        uint32_t v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = (w_row[r] < n_rows && word + i < words) ? __ldg(w_bits + w_row[r] * words + word + i) : 0u;
        dst[r] = make_uint4(v[0], v[1], v[2], v[3]);
      }
    }
  };

  // The low parts of split fp32 x sum apart: their rounding stays relative to their own (small) size.
  float acc[2][NB][4], acc_low[2][NB][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int j = 0; j < NB; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mt][j][c] = acc_low[mt][j][c] = 0.f;
    }
  }
  // Sum of x over even k, rows warp + 8 i (fixed order: per lane, then a warp sum).
  float even_sum[NB];
#pragma unroll
  for (int i = 0; i < NB; ++i) even_sum[i] = 0.f;

  const uint32_t minus_one = MinusOnePair<MmaT>::value;

  uint4 current[4], next[4];
  if (chunk_begin < chunk_end) load_chunk(current, chunk_begin);
  for (int64_t c = chunk_begin; c < chunk_end; ++c) {
    const int local = static_cast<int>((c - chunk_begin) % STAGE_CHUNKS);
    // The next chunk's W is in flight during this chunk's staging of x (one row of x: registers allow it) and
    // during its math.
    if (NB == 1 && c + 1 < chunk_end) load_chunk(next, c + 1);
    if (local == 0) {
      __syncthreads();  // the previous stage is consumed
      // Warp w stages rows w + 8 i; lane e handles groups (word, q) = e, e + 32, ... of the stage, their loads
      // issued in batches before the first is used (a few memory latencies a stage, not one a group).
      const int64_t k_stage = c * kTcChunkWords * 32;
      // Values of a later slice stay 0 here: this block's correction must cover its own k only.
      const int64_t k_limit = chunk_end * kTcChunkWords * 32 < k ? chunk_end * kTcChunkWords * 32 : k;
      constexpr int kGroupsPerLane = kGroupsPerRow / 32;
#pragma unroll
      for (int i = 0; i < NB; ++i) {
        const int r = warp + kTcWarps * i;
        const int64_t row = m0 + r;
        const InT* x_row = x + row * k;
        // Batches of kBatch groups (4 values each) in flight: more would spill the W registers.
        constexpr int kWanted = NB == 1 ? 4 : (NB == 2 ? 2 : 1);
        constexpr int kBatch = kGroupsPerLane < kWanted ? kGroupsPerLane : kWanted;
        constexpr int kUnroll = NB == 1 ? kGroupsPerLane / kBatch : 1;  // wider x staging spills W's registers
#pragma unroll kUnroll
        for (int j0 = 0; j0 < kGroupsPerLane; j0 += kBatch) {
          float v[kBatch][4];
#pragma unroll
          for (int j = 0; j < kBatch; ++j) {
            const int e = lane + 32 * (j0 + j);
            const int64_t kb = k_stage + (e >> 3) * 32 + 2 * (e & 7);
            const int64_t ks[4] = {kb + 1, kb + 17, kb, kb + 16};
#pragma unroll
            for (int u = 0; u < 4; ++u) v[j][u] = (row < m_rows && ks[u] < k_limit) ? to_float(x_row[ks[u]]) : 0.f;
          }
#pragma unroll
          for (int j = 0; j < kBatch; ++j) {
            const int e = lane + 32 * (j0 + j);
            const int word = e >> 3;  // within the stage
            const int q = e & 7;
            if constexpr (PARTS != 3) even_sum[i] += v[j][2] + v[j][3];
            uint16_t bits[4][PARTS];
#pragma unroll
            for (int u = 0; u < 4; ++u) split_value<MmaT, PARTS>(v[j][u], bits[u]);
            // Group position: chunk, w = word % 4, q, t = (word % 16) / 4.
            const int position = ((((word >> 4) * 4 + (word & 3)) * 8 + q) * 4) + ((word & 15) >> 2);
#pragma unroll
            for (int p = 0; p < PARTS; ++p) {
              x_stage[(p * MB + r) * kRowStride + position] =
                  make_uint2(static_cast<uint32_t>(bits[0][p]) | (static_cast<uint32_t>(bits[1][p]) << 16),
                             static_cast<uint32_t>(bits[2][p]) | (static_cast<uint32_t>(bits[3][p]) << 16));
            }
          }
        }
      }
      __syncthreads();
    }
    if (NB > 1 && c + 1 < chunk_end) load_chunk(next, c + 1);

#pragma unroll
    for (int s = 0; s < 32; ++s) {
      const int w = s >> 3;
      const int q = s & 7;
      uint32_t b[PARTS][NB][2];
#pragma unroll
      for (int p = 0; p < PARTS; ++p) {
#pragma unroll
        for (int j = 0; j < NB; ++j) {
          const uint2 pair = x_stage[(p * MB + 8 * j + g) * kRowStride + ((local * 4 + w) * 8 + q) * 4 + t];
          b[p][j][0] = pair.x;
          b[p][j][1] = pair.y;
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint32_t top = word_of(current[2 * mt], w) << (14 - 2 * q);
        const uint32_t bottom = word_of(current[2 * mt + 1], w) << (14 - 2 * q);
        // Even k: {0, 2.0} and the correction (one AND); fp32 x: exact +-1, bit 2q moved to the sign bit
        // (why: the section comment above).
        uint32_t even_top, even_bottom;
        if constexpr (PARTS == 3) {
          even_top = sign_pair(top << 1, minus_one);
          even_bottom = sign_pair(bottom << 1, minus_one);
        } else {
          even_top = top & 0x40004000u;
          even_bottom = bottom & 0x40004000u;
        }
        const uint32_t a[4] = {sign_pair(top, minus_one), sign_pair(bottom, minus_one), even_top, even_bottom};
#pragma unroll
        for (int j = 0; j < NB; ++j) mma_16816<MmaT>(acc[mt][j], a, b[0][j]);
#pragma unroll
        for (int p = 1; p < PARTS; ++p) {
#pragma unroll
          for (int j = 0; j < NB; ++j) mma_16816<MmaT>(acc_low[mt][j], a, b[p][j]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) current[r] = next[r];
  }

#pragma unroll
  for (int i = 0; i < NB; ++i) {
    const float total = warp_sum(even_sum[i]);
    if (lane == 0) correction[warp + kTcWarps * i] = total;
  }
  __syncthreads();  // x_stage is consumed, correction written
  // Partial tile [x row][feature] = acc - sum of x over even k.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int j = 0; j < NB; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int x_row = 8 * j + 2 * t + e;
          const int feature = warp * 32 + mt * 16 + 8 * h + g;
          const float low = PARTS > 1 ? acc_low[mt][j][2 * h + e] : 0.f;
          const float even_correction = PARTS == 3 ? 0.f : correction[x_row];
          partial[x_row * kTcFeatures + feature] = (acc[mt][j][2 * h + e] - even_correction) + low;
        }
      }
    }
  }

  store_tile<kTcThreads, kTcFeatures>(partial, MB, m0, m_rows, n_block, n_rows, slices, ep, out);
}

// A launch configuration with clusters of `slices` blocks along x (not copyable: config points at attribute).
struct ClusterLaunch {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attribute[1];

  ClusterLaunch(dim3 grid, size_t smem, int64_t slices, cudaStream_t stream, int threads = kTcThreads) {
    config.gridDim = grid;
    config.blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = static_cast<unsigned>(slices);
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// The largest cluster of at most `slices` blocks (a power of two <= 8) that the current device can
// co-schedule with this kernel's threads and shared memory; 1 where clusters are not supported (before
// sm_90). Asked up front (cudaOccupancyMaxActiveClusters, not a stream operation) rather than learned from
// a refused launch, which inside a CUDA-graph capture would invalidate the capture. Answers are cached in
// `known`, a static of the launcher of this kernel instantiation: for device d, bit 2i of known[d] says
// that a cluster of 2^(i+1) blocks was asked about, bit 2i+1 that it fits (racing callers set the same bits).
template <typename Kernel>
int64_t fitting_cluster(Kernel kernel, int64_t slices, size_t smem, unsigned (&known)[64], int threads = kTcThreads) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  for (; slices > 1; slices /= 2) {
    const int i = slices == 2 ? 0 : (slices == 4 ? 1 : 2);
    unsigned state = device < 64 ? __atomic_load_n(&known[device], __ATOMIC_ACQUIRE) : 0u;
    if (((state >> (2 * i)) & 1u) == 0) {  // first time on this device: ask (launches then only read `known`)
      int supported = 0, clusters = 0;
      bool fits = cudaDeviceGetAttribute(&supported, cudaDevAttrClusterLaunch, device) == cudaSuccess && supported != 0;
      if (fits) {
        const ClusterLaunch launch(dim3(static_cast<unsigned>(slices), 1, 1), smem, slices, nullptr, threads);
        fits = cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config) == cudaSuccess && clusters > 0;
      }
      if (!fits) (void)cudaGetLastError();
      state = (1u << (2 * i)) | (fits ? 1u << (2 * i + 1) : 0u);
      if (device < 64) __atomic_fetch_or(&known[device], state, __ATOMIC_RELEASE);
    }
    if ((state >> (2 * i + 1)) & 1u) return slices;
  }
  return 1;
}

template <typename InT, typename MmaT, int PARTS, int NB, int STAGE_CHUNKS>
constexpr size_t tc_smem_bytes() {
  return static_cast<size_t>(PARTS) * NB * 8 * (STAGE_CHUNKS * kTcChunkWords * 8 + 4) * sizeof(uint2) +
         NB * 8 * sizeof(float);
}

template <typename InT, typename MmaT, int PARTS, int NB, int STAGE_CHUNKS, bool VEC>
cudaError_t binary_weight_linear_tc_launch(const InT* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                           int64_t k, const Epilogue& ep, InT* out, int sm_count, const WeightLinearTuning& tuning,
    cudaStream_t stream) {
  constexpr int MB = NB * 8;
  constexpr size_t smem = tc_smem_bytes<InT, MmaT, PARTS, NB, STAGE_CHUNKS>();
  static_assert(smem >= static_cast<size_t>(MB) * kTcFeatures * sizeof(float), "partial tile aliases x_stage");
  const int64_t words = ceil_div(k, 32);
  const int64_t total_chunks = ceil_div(words, kTcChunkWords);
  const int64_t feature_blocks = ceil_div(n_rows, kTcFeatures);
  const int64_t row_blocks = ceil_div(m_rows, MB);
  if (row_blocks > 65535) return cudaErrorInvalidValue;
  // Split K until about two blocks an SM (the loads need warps in flight), at most a cluster of 8, rounding
  // down so that every block is resident at once (one wave: a second, partial wave would cost up to 50%).
  const int64_t wanted = 2 * static_cast<int64_t>(sm_count > 0 ? sm_count : 132) / (feature_blocks * row_blocks);
  int64_t slices = 1;  // a power of two (cluster shapes 1, 2, 4, 8); trailing slices may get no chunk
  const int64_t most = tuning.slices > 0 ? tuning.slices : kTcMaxSlices;
  while ((tuning.slices > 0 || slices * 2 <= wanted) && slices * 2 <= most && slices * 2 <= kTcMaxSlices &&
         slices * 2 <= total_chunks) {
    slices *= 2;
  }
  int64_t slice_chunks = ceil_div(total_chunks, slices);
  if (feature_blocks * slices > INT_MAX) return cudaErrorInvalidValue;

  auto kernel = binary_weight_linear_tc_kernel<InT, MmaT, PARTS, NB, STAGE_CHUNKS, VEC>;
  if (smem > 48 * 1024) {
    static unsigned long long smem_devices = 0;
    const cudaError_t error = allow_dynamic_smem(kernel, smem, smem_devices);
    if (error != cudaSuccess) return error;
  }
  if (slices > 1) {
    static unsigned cluster_sizes[64] = {};
    slices = fitting_cluster(kernel, slices, smem, cluster_sizes);
    slice_chunks = ceil_div(total_chunks, slices);
  }
  if (slices > 1) {
    const ClusterLaunch launch(dim3(static_cast<unsigned>(feature_blocks * slices), static_cast<unsigned>(row_blocks), 1),
                               smem, slices, stream);
    const cudaError_t error = cudaLaunchKernelEx(&launch.config, kernel, x, w_bits, m_rows, n_rows, k, words,
                                                 static_cast<int>(slices), slice_chunks, ep, out);
    if (error == cudaSuccess) return cudaGetLastError();
    (void)cudaGetLastError();  // refused all the same: fall back to one block per feature block
    slices = 1;
    slice_chunks = total_chunks;
  }
  kernel<<<dim3(static_cast<unsigned>(feature_blocks), static_cast<unsigned>(row_blocks), 1), kTcThreads, smem, stream>>>(
      x, w_bits, m_rows, n_rows, k, words, 1, slice_chunks, ep, out);
  return cudaGetLastError();
}

template <typename InT, typename MmaT, int PARTS, int NB, int STAGE_CHUNKS>
cudaError_t binary_weight_linear_tc_aligned(const InT* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                            int64_t k, const Epilogue& ep, InT* out, int sm_count, const WeightLinearTuning& tuning,
    cudaStream_t stream) {
  const bool vec = ceil_div(k, 32) % 4 == 0 && reinterpret_cast<uintptr_t>(w_bits) % 16 == 0;
  if (vec) {
    return binary_weight_linear_tc_launch<InT, MmaT, PARTS, NB, STAGE_CHUNKS, true>(x, w_bits, m_rows, n_rows, k, ep,
                                                                                     out, sm_count, tuning, stream);
  }
  return binary_weight_linear_tc_launch<InT, MmaT, PARTS, NB, STAGE_CHUNKS, false>(x, w_bits, m_rows, n_rows, k, ep,
                                                                                    out, sm_count, tuning, stream);
}

// Rows of x a pass: 8 (M <= 8), 16, else 32 (bf16/fp16) or 16 (fp32: three parts, three times the staging).
// ---------------------------------------------------------------------------------------------
// binary_weight_gemv_kernel: bf16/fp16 x with M <= kGemvMaxRows rows (decoding). H200, N = K = 8192, M = 1:
// 16.3 us (12.4 in a rotating graph) against 20.3 (15.8) for the tensor-core kernel; N = K = 16384: 40 against 58.
// ncu (M = 1): 4.0 M warp instructions (~15 a 16x16x16 MMA step), issue active 43%, ALU pipe 39%, DRAM 12%:
// bound by instruction issue, not bytes (issue 10 has the next steps).
// The MMA math and fragment layout of binary_weight_linear_tc_kernel (one n8 tile of x rows), organized
// for bytes in flight: 4-warp blocks of 64 W rows (a warp owns one m16 tile: rows g, g + 8 of each lane) over
// a K range of at most kGemvMaxChunks chunks; a ring of kGemvPrefetch chunks of W per lane in registers, all
// issued before x is staged; x of the block's whole K range staged once (rows < M only, rows 32 bytes apart
// so the lanes g of one step read distinct banks); K split over a cluster of up to 8 blocks reduced through
// distributed shared memory in rank order (deterministic), as the tensor-core kernel.
constexpr int kGemvWarps = 4;
constexpr int kGemvThreads = kGemvWarps * 32;
constexpr int kGemvFeatures = kGemvWarps * 16;
constexpr int kGemvMaxChunks = 8;   // K range of a block: at most 4096 k (x staging <= 8 rows x 8 KB)
constexpr int kGemvGroupsPerChunk = kTcChunkWords * 8;  // 8-byte groups of x per chunk and row

constexpr int kGemvPrefetch = 4;  // chunks of W in flight per lane (8 x 16 bytes); 2 measured the same (H200)
constexpr int kGemvMaxRows = 4;   // measured: faster than the tensor-core kernel up to M = 2, equal at 4, slower at 8

template <typename T>
__global__ __launch_bounds__(kGemvThreads, 5) void binary_weight_gemv_kernel(const T* __restrict__ x,
                                                                        const uint32_t* __restrict__ w_bits,
                                                                        int m_rows, int64_t n_rows, int64_t k,
                                                                        int64_t words, int slices, int slice_chunks,
                                                                        Epilogue ep, T* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char gemv_smem[];
  const int row_stride = slice_chunks * kGemvGroupsPerChunk + 4;  // in groups (uint2)
  uint2* x_stage = reinterpret_cast<uint2*>(gemv_smem);         // [m_rows][row_stride]
  float* correction = reinterpret_cast<float*>(x_stage + m_rows * row_stride);  // [8]
  float* partial = reinterpret_cast<float*>(gemv_smem);         // [8][kGemvFeatures], after the main loop

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int slice = static_cast<int>(blockIdx.x % static_cast<unsigned>(slices));
  const int64_t n_block = (blockIdx.x / static_cast<unsigned>(slices)) * static_cast<int64_t>(kGemvFeatures);
  const int64_t total_chunks = ceil_div(words, kTcChunkWords);
  const int64_t chunk_begin = static_cast<int64_t>(slice) * slice_chunks;
  const int64_t chunk_end = chunk_begin + slice_chunks < total_chunks ? chunk_begin + slice_chunks : total_chunks;
  const int64_t row_top = n_block + warp * 16 + g;  // this lane's W rows: row_top, row_top + 8

  // Words 4t..4t+3 of chunk c of both rows; past the end 0 (x is 0 there too).
  auto load_chunk = [&](uint4 (&dst)[2], int64_t c) {
    const int64_t word = c * kTcChunkWords + 4 * t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row_top + 8 * h;
      dst[h] = (row < n_rows && word < words) ? __ldg(reinterpret_cast<const uint4*>(w_bits + row * words + word))
                                              : make_uint4(0, 0, 0, 0);
    }
  };
  uint4 ring[kGemvPrefetch][2];
#pragma unroll
  for (int i = 0; i < kGemvPrefetch; ++i) {
    if (chunk_begin + i < chunk_end) load_chunk(ring[i], chunk_begin + i);
  }

  // x of this block's K range in fragment order: group (chunk, w, q, t) = (x[2q+1], x[2q+17], x[2q], x[2q+16])
  // of word 4t + w of the chunk (see binary_weight_linear_tc_kernel). Values of other slices stay 0: this
  // block's correction (the sum of x over even k) covers its own k only.
  const int64_t k_begin = chunk_begin * kTcChunkWords * 32;
  const int64_t k_end = chunk_end * kTcChunkWords * 32 < k ? chunk_end * kTcChunkWords * 32 : k;
  const int stage_words = slice_chunks * kTcChunkWords;
  auto store_group = [&](int r, int word, int q, uint32_t low_pair, uint32_t high_pair) {
    // low_pair = (x[2q], x[2q+1]), high_pair = (x[2q+16], x[2q+17]) of the word, as raw 16-bit values.
    const uint32_t odd = __byte_perm(low_pair, high_pair, 0x7632);   // (x[2q+1], x[2q+17])
    const uint32_t even = __byte_perm(low_pair, high_pair, 0x5410);  // (x[2q], x[2q+16])
    const int position = (word / kTcChunkWords) * kGemvGroupsPerChunk + ((word & 3) * 8 + q) * 4 + ((word % kTcChunkWords) >> 2);
    x_stage[r * row_stride + position] = make_uint2(odd, even);
  };
  auto low_value = [](uint32_t pair) { return to_float(bits_as<T>(static_cast<uint16_t>(pair & 0xffffu))); };
  auto high_value = [](uint32_t pair) { return to_float(bits_as<T>(static_cast<uint16_t>(pair >> 16))); };
  // Coalesced: 16-byte loads, four lanes a 32-value word (lane j of the four holds x[8j .. 8j + 8)); lanes 0, 1
  // of the four take lanes 2, 3's values by shuffle and build groups q = 4j .. 4j + 3. Every thread of the block
  // takes part (one warp alone serialized a round trip per 32 vectors), its loads issued before use. Rows of
  // k % 8 != 0 or an unaligned x (rare) read value by value. The even-k sums go through even_part [8][threads]
  // and are added in a fixed order (deterministic).
  float* even_part = correction + 8;  // [8][kGemvThreads]
  for (int r = 0; r < m_rows; ++r) even_part[r * kGemvThreads + tid] = 0.f;
  const bool vector_x = k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (vector_x) {
    const int row_vectors = stage_words * 4;          // a multiple of 64: whole warps share a row and a word
    const int vectors = m_rows * row_vectors;
    constexpr int kBatch = 4;
    for (int first = tid; first < vectors; first += kBatch * kGemvThreads) {  // uniform over each warp
      uint4 v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int vec = first + b * kGemvThreads;
        v[b] = make_uint4(0, 0, 0, 0);
        if (vec < vectors) {
          const int r = vec / row_vectors;
          const int64_t k0 = k_begin + static_cast<int64_t>(vec % row_vectors) * 8;
          if (k0 < k_end) v[b] = __ldg(reinterpret_cast<const uint4*>(x + static_cast<int64_t>(r) * k + k0));  // k_end % 8 == 0
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int vec = first + b * kGemvThreads;
        const uint4 other = make_uint4(__shfl_down_sync(kFullMask, v[b].x, 2), __shfl_down_sync(kFullMask, v[b].y, 2),
                                       __shfl_down_sync(kFullMask, v[b].z, 2), __shfl_down_sync(kFullMask, v[b].w, 2));
        const int j = lane & 3;
        if (j < 2 && vec < vectors) {
          const int r = vec / row_vectors;
          const int word = (vec % row_vectors) >> 2;
          const uint32_t low[4] = {v[b].x, v[b].y, v[b].z, v[b].w};
          const uint32_t high[4] = {other.x, other.y, other.z, other.w};
          float sum = 0.f;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            sum += low_value(low[i]) + low_value(high[i]);
            store_group(r, word, 4 * j + i, low[i], high[i]);
          }
          even_part[r * kGemvThreads + tid] += sum;
        }
      }
    }
  } else {
    for (int item = tid; item < m_rows * stage_words; item += kGemvThreads) {
      const int r = item / stage_words;
      const int word = item % stage_words;
      const T* x_row = x + static_cast<int64_t>(r) * k;
      const int64_t k0 = k_begin + static_cast<int64_t>(word) * 32;
      uint16_t v[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) v[i] = k0 + i < k_end ? mma_bits(x_row[k0 + i]) : uint16_t{0};
      float sum = 0.f;
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const uint32_t low_pair = v[2 * q] | (static_cast<uint32_t>(v[2 * q + 1]) << 16);
        const uint32_t high_pair = v[2 * q + 16] | (static_cast<uint32_t>(v[2 * q + 17]) << 16);
        sum += low_value(low_pair) + low_value(high_pair);
        store_group(r, word, q, low_pair, high_pair);
      }
      even_part[r * kGemvThreads + tid] += sum;
    }
  }
  __syncthreads();
  for (int r = warp; r < m_rows; r += kGemvWarps) {
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kGemvThreads / 32; ++i) sum += even_part[r * kGemvThreads + i * 32 + lane];
    sum = warp_sum(sum);  // fixed order: deterministic
    if (lane == 0) correction[r] = sum;
  }
  // correction[] is read after the main loop's __syncthreads.

  const uint32_t minus_one = MinusOnePair<T>::value;
  // Four accumulators taken in turn: four independent MMA chains instead of one (an MMA waits for the last).
  float acc4[4][4] = {};
  const bool has_column = g < m_rows;  // lanes of x rows >= M feed zeros
  const uint2* x_lane = x_stage + (has_column ? g : 0) * row_stride + t;
  for (int64_t base = chunk_begin; base < chunk_end; base += kGemvPrefetch) {
#pragma unroll
    for (int i = 0; i < kGemvPrefetch; ++i) {
      const int64_t c = base + i;
      if (c < chunk_end) {  // uniform over the block
        const int local = static_cast<int>(c - chunk_begin);
#pragma unroll
        for (int s = 0; s < 32; ++s) {
          const int w = s >> 3;
          const int q = s & 7;
          uint32_t b[2] = {0u, 0u};
          if (has_column) {
            const uint2 pair = x_lane[local * kGemvGroupsPerChunk + (w * 8 + q) * 4];
            b[0] = pair.x;
            b[1] = pair.y;
          }
          const uint32_t top = word_of(ring[i][0], w) << (14 - 2 * q);
          const uint32_t bottom = word_of(ring[i][1], w) << (14 - 2 * q);
          const uint32_t a[4] = {sign_pair(top, minus_one), sign_pair(bottom, minus_one), top & 0x40004000u,
                                 bottom & 0x40004000u};
          mma_16816<T>(acc4[s & 3], a, b);
        }
        if (c + kGemvPrefetch < chunk_end) load_chunk(ring[i], c + kGemvPrefetch);
      }
    }
  }

  // acc: c0, c1 = (W row g, x rows 2t, 2t + 1), c2, c3 = (W row g + 8, ...); minus the even-k correction.
  float acc[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) acc[e] = (acc4[0][e] + acc4[1][e]) + (acc4[2][e] + acc4[3][e]);
  __syncthreads();  // x_stage consumed: partial may alias it (it is at most 8 x 64 floats)
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int m = 2 * t + (e & 1);
    const int feature = warp * 16 + g + 8 * (e >> 1);
    if (m < m_rows) partial[m * kGemvFeatures + feature] = acc[e] - correction[m];
  }
  store_tile<kGemvThreads, kGemvFeatures>(partial, m_rows, 0, m_rows, n_block, n_rows, slices, ep, out);
}

// Launches binary_weight_gemv_kernel when it can take the problem (M <= kGemvMaxRows, or 8 with tuning.kernel = 2;
// 16-byte W rows; K <= 8 slices of kGemvMaxChunks chunks); returns false otherwise (the tensor-core kernel
// then runs).
template <typename T>
bool binary_weight_gemv(const T* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows, int64_t k,
                        const Epilogue& ep, T* out, int sm_count, const WeightLinearTuning& tuning,
                        cudaStream_t stream, cudaError_t& result) {
  const int64_t words = ceil_div(k, 32);
  const int64_t total_chunks = ceil_div(words, kTcChunkWords);
  if (m_rows > (tuning.kernel == 2 ? 8 : kGemvMaxRows) || words % 4 != 0 || reinterpret_cast<uintptr_t>(w_bits) % 16 != 0) return false;
  const int64_t feature_blocks = ceil_div(n_rows, kGemvFeatures);
  // Slices: the fewest (a power of two) that keep a block within kGemvMaxChunks and give about four blocks an
  // SM (16 warps, each with its ring of chunks in flight), at most 8 (a portable cluster).
  int64_t slices = 1;
  const int64_t wanted = 4 * static_cast<int64_t>(sm_count > 0 ? sm_count : 132);
  if (tuning.slices > 0) {
    while (slices * 2 <= tuning.slices && slices * 2 <= kTcMaxSlices) slices *= 2;
  } else {
    while (slices < kTcMaxSlices && slices * 2 <= total_chunks && feature_blocks * slices * 2 <= wanted) slices *= 2;
  }
  while (ceil_div(total_chunks, slices) > kGemvMaxChunks && slices < kTcMaxSlices) slices *= 2;
  if (ceil_div(total_chunks, slices) > kGemvMaxChunks || feature_blocks * slices > INT_MAX) return false;
  auto kernel = binary_weight_gemv_kernel<T>;
  auto smem_for = [&](int64_t s) {
    const int64_t chunks = ceil_div(total_chunks, s);
    const int64_t stage = m_rows * (chunks * kGemvGroupsPerChunk + 4) * static_cast<int64_t>(sizeof(uint2)) +
                          (8 + 8 * kGemvThreads) * static_cast<int64_t>(sizeof(float));
    const int64_t partials = 8 * kGemvFeatures * static_cast<int64_t>(sizeof(float));
    return static_cast<size_t>(stage > partials ? stage : partials);
  };
  constexpr size_t kMaxSmem =
      static_cast<size_t>(8) * (kGemvMaxChunks * kGemvGroupsPerChunk + 4) * sizeof(uint2) + (8 + 8 * kGemvThreads) * sizeof(float);
  static unsigned long long smem_devices = 0;
  result = allow_dynamic_smem(kernel, kMaxSmem, smem_devices);
  if (result != cudaSuccess) return true;
  if (slices > 1) {
    static unsigned cluster_sizes[64] = {};
    const int64_t fitting = fitting_cluster(kernel, slices, smem_for(slices), cluster_sizes, kGemvThreads);
    if (fitting != slices) return false;  // no cluster this large here: the tensor-core kernel splits otherwise
  }
  const int slice_chunks = static_cast<int>(ceil_div(total_chunks, slices));
  const size_t smem = smem_for(slices);
  const dim3 grid(static_cast<unsigned>(feature_blocks * slices), 1, 1);
  if (slices > 1) {
    const ClusterLaunch launch(grid, smem, slices, stream, kGemvThreads);
    result = cudaLaunchKernelEx(&launch.config, kernel, x, w_bits, static_cast<int>(m_rows), n_rows, k, words,
                                static_cast<int>(slices), slice_chunks, ep, out);
    if (result == cudaSuccess) result = cudaGetLastError();
    return true;
  }
  kernel<<<grid, kGemvThreads, smem, stream>>>(x, w_bits, static_cast<int>(m_rows), n_rows, k, words, 1, slice_chunks,
                                               ep, out);
  result = cudaGetLastError();
  return true;
}


template <typename InT>
cudaError_t binary_weight_linear_tc_typed(const InT* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                          int64_t k, const Epilogue& ep, InT* out, int sm_count, const WeightLinearTuning& tuning,
    cudaStream_t stream) {
  if constexpr (std::is_same<InT, float>::value) {
    const int64_t rows = tuning.rows_per_pass > 0 ? tuning.rows_per_pass : m_rows;
    if (rows <= 8) return binary_weight_linear_tc_aligned<float, __nv_bfloat16, 3, 1, 1>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, tuning, stream);
    return binary_weight_linear_tc_aligned<float, __nv_bfloat16, 3, 2, 1>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, tuning, stream);
  } else {
    cudaError_t result = cudaSuccess;
    if (tuning.kernel != 1 && binary_weight_gemv(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, tuning, stream, result)) {
      return result;
    }
    const int64_t rows = tuning.rows_per_pass > 0 ? tuning.rows_per_pass : m_rows;
    if (rows <= 8) return binary_weight_linear_tc_aligned<InT, InT, 1, 1, 2>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, tuning, stream);
    if (rows <= 16) return binary_weight_linear_tc_aligned<InT, InT, 1, 2, 2>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, tuning, stream);
    return binary_weight_linear_tc_aligned<InT, InT, 1, 4, 2>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, tuning, stream);
  }
}

// dequantize_signs: W as s(w) * scale in x's type, for cuBLAS at large M.
constexpr int kDequantThreads = 256;

// One thread a packed word: 32 values; 16-byte stores when the row length allows them.
template <typename T>
__global__ __launch_bounds__(kDequantThreads) void dequantize_signs_kernel(const uint32_t* __restrict__ w_bits,
                                                                           int64_t n_rows, int64_t k, int64_t words,
                                                                           const float* __restrict__ scale,
                                                                           int64_t scale_count, T* __restrict__ out) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kDequantThreads + threadIdx.x;
  if (index >= n_rows * words) return;
  const int64_t row = index / words;
  const int64_t word = index % words;
  const float magnitude = scale != nullptr ? scale[scale_count == 1 ? 0 : row] : 1.f;
  const T plus = from_float<T>(magnitude);
  const T minus = from_float<T>(-magnitude);
  const uint32_t bits = __ldg(w_bits + index);
  T* dst = out + row * k + word * 32;
  constexpr int kPerVector = 16 / sizeof(T);
  const bool whole = word * 32 + 32 <= k && k % kPerVector == 0;
  if (whole) {
#pragma unroll
    for (int v = 0; v < 32 / kPerVector; ++v) {
      union {
        uint4 vector;
        T values[kPerVector];
      } pack;
#pragma unroll
      for (int j = 0; j < kPerVector; ++j) pack.values[j] = (bits >> (v * kPerVector + j)) & 1u ? plus : minus;
      reinterpret_cast<uint4*>(dst)[v] = pack.vector;
    }
  } else {
    for (int j = 0; j < 32 && word * 32 + j < k; ++j) dst[j] = (bits >> j) & 1u ? plus : minus;
  }
}

template <typename T>
cudaError_t dequantize_signs_typed(const uint32_t* w_bits, int64_t n_rows, int64_t k, const float* scale,
                                   int64_t scale_count, T* out, cudaStream_t stream) {
  const int64_t words = ceil_div(k, 32);
  const int64_t blocks = ceil_div(n_rows * words, kDequantThreads);
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0) return cudaErrorInvalidValue;
  dequantize_signs_kernel<T><<<static_cast<unsigned>(blocks), kDequantThreads, 0, stream>>>(w_bits, n_rows, k, words,
                                                                                            scale, scale_count, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_binary_weight_linear(const void* x, FloatType type, const uint32_t* w_bits, int64_t m_rows,
                                        int64_t n_rows, int64_t k, const Epilogue& epilogue, void* out, int sm_count,
                                        cudaStream_t stream, const WeightLinearTuning* tuning) {
  const WeightLinearTuning chosen = tuning != nullptr ? *tuning : WeightLinearTuning{};
  if (!valid_sizes(m_rows, k) || n_rows < 0) return cudaErrorInvalidValue;
  if (m_rows == 0 || n_rows == 0) return cudaSuccess;
  switch (type) {
    case FloatType::kFloat32:
      return binary_weight_linear_tc_typed(static_cast<const float*>(x), w_bits, m_rows, n_rows, k, epilogue,
                                           static_cast<float*>(out), sm_count, chosen, stream);
    case FloatType::kFloat16:
      return binary_weight_linear_tc_typed(static_cast<const __half*>(x), w_bits, m_rows, n_rows, k, epilogue,
                                           static_cast<__half*>(out), sm_count, chosen, stream);
    case FloatType::kBFloat16:
      return binary_weight_linear_tc_typed(static_cast<const __nv_bfloat16*>(x), w_bits, m_rows, n_rows, k, epilogue,
                                           static_cast<__nv_bfloat16*>(out), sm_count, chosen, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_dequantize_signs(const uint32_t* w_bits, int64_t n_rows, int64_t k, const float* scale,
                                    int64_t scale_count, void* out, FloatType type, cudaStream_t stream) {
  if (!valid_sizes(n_rows, k)) return cudaErrorInvalidValue;
  if (n_rows == 0) return cudaSuccess;
  switch (type) {
    case FloatType::kFloat32:
      return dequantize_signs_typed(w_bits, n_rows, k, scale, scale_count, static_cast<float*>(out), stream);
    case FloatType::kFloat16:
      return dequantize_signs_typed(w_bits, n_rows, k, scale, scale_count, static_cast<__half*>(out), stream);
    case FloatType::kBFloat16:
      return dequantize_signs_typed(w_bits, n_rows, k, scale, scale_count, static_cast<__nv_bfloat16*>(out), stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace bitcompile
