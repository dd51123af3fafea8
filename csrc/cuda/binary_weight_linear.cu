// binary_weight_linear (W1A16 / W1A32: float x, +-1 weights): the launcher that picks a kernel from the shape and
// the device (the bit-plane and tensor-core pass kernels here, the Hopper wgmma kernel in binary_weight_wgmma.cu),
// the binding's switch to cuBLAS (binary_weight_linear_fused_rows), and dequantize_signs for the larger M that the
// binding sends there. Torch-free (launchers in binary_kernels.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cooperative_groups.h>

#include <algorithm>
#include <type_traits>

#include "binary_weight_wgmma.cuh"
#include "device_common.cuh"
#include "mma_b1.cuh"

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
// Blocks an SM the pass kernel is built for (80 registers a thread at 3, 128 at 2): 3 for bf16 / fp16 x of at
// most 8 rows (NB = 1, no spills), 2 otherwise. At 2 an H200 holds 30 clusters of 8 (240 blocks), so N = 8192 (32
// feature blocks x 8 K slices) runs 2 clusters as a second wave: M = 16 20.1 us in a rotating graph against 14.1 at
// N = 7680 (one wave). H200, graph us, 2 -> 3 blocks an SM (2026-12-02): M = 4 / 8 at 8192^2 14.4 -> 12.4, 15.5 ->
// 13.6; 16384^2 44.7 -> 39.7, 46.8 -> 41.7; 8192 x 28672 M = 4 40.6 -> 37.0; equal (within 1%) at 4096^2, 4096 x
// 11008, 11008 x 4096, 14336 x 4096, 28672 x 8192. 16 rows (NB = 2) staging x themselves spill 16 bytes at 80
// registers; on x prepared by x_groups_kernel (PREPARED: no staging code) they fit 3 blocks without spills.
constexpr int tc_min_blocks(int parts, int nb, bool prepared) { return parts == 1 && (nb == 1 || prepared) ? 3 : 2; }

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

// Where the pass kernel's shared memory (and x_groups_kernel's workspace) holds the 8-byte group of x for word
// `word` of a stage (chunk word / 16, w = word % 4, lane t = (word % 16) / 4) and step q (0..7) of that word:
// groups ordered (chunk, w, q, t), so the four lanes t of a row read 32 consecutive bytes.
__device__ __forceinline__ int group_position(int word, int q) {
  return (((word >> 4) * 4 + (word & 3)) * 8 + q) * 4 + ((word & 15) >> 2);
}

__device__ __forceinline__ float pair_sum(uint32_t pair, __nv_bfloat16) {
  return __uint_as_float(pair << 16) + __uint_as_float(pair & 0xFFFF0000u);
}
__device__ __forceinline__ float pair_sum(uint32_t pair, __half) {
  const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&pair));
  return v.x + v.y;
}

// Stages rows warp + 8 i of x (k from k_stage) in the tensor-core pass kernel's group order from 16-byte loads:
// a task (row, word, half h) loads x[32 word + 8 h .. + 7] and x[32 word + 16 + 8 h .. + 7] and writes the groups
// q = 4 h .. 4 h + 3 (x[2q+1], x[2q+17], x[2q], x[2q+16]) with two byte permutes each; all of a row's loads are in
// flight before the first is used. Needs k % 8 == 0 and x 16-byte aligned; values at k >= k_limit (a multiple of
// 8) or past the last row are 0. Adds the sum of the even-k values to even_sum[i].
// H200, bf16, N = K = 8192, us per call in a rotating graph, before (2-byte loads of x, 2-4 groups a batch) -> after:
// M = 4 16.3 -> 14.3, M = 8 16.8 -> 15.4, M = 16 22.9 -> 20.4, M = 16 at 16384^2 74.9 -> 64.2 (ncu, M = 16: 26.9 -> 21.4 us;
// long-scoreboard stalls on the staging loads 35% -> 12% of the samples).
template <typename InT, int NB, int kStageWords, int kRowStride, int BATCH>
__device__ __forceinline__ void stage_x_vectors(const InT* __restrict__ x, uint2* x_stage, float (&even_sum)[NB],
                                                int64_t m0, int64_t m_rows, int64_t k, int64_t k_stage,
                                                int64_t k_limit, int warp, int lane) {
  constexpr int kTasks = kStageWords * 2;  // (word, half) of a row
  constexpr int kTasksPerLane = kTasks / 32;
  static_assert(kTasks % 32 == 0, "whole tasks a lane");
#pragma unroll
  for (int i = 0; i < NB; ++i) {
    const int r = warp + kTcWarps * i;
    const int64_t row = m0 + r;
    const InT* x_row = x + row * k;
#pragma unroll 1
    for (int j0 = 0; j0 < kTasksPerLane; j0 += BATCH) {
      uint4 lo[BATCH], hi[BATCH];
#pragma unroll
      for (int b = 0; b < BATCH; ++b) {
        const int e = lane + 32 * (j0 + b);
        const int64_t kb = k_stage + (e >> 1) * 32 + (e & 1) * 8;
        const bool in_lo = row < m_rows && kb < k_limit;
        const bool in_hi = row < m_rows && kb + 16 < k_limit;
        lo[b] = in_lo ? __ldg(reinterpret_cast<const uint4*>(x_row + kb)) : make_uint4(0, 0, 0, 0);
        hi[b] = in_hi ? __ldg(reinterpret_cast<const uint4*>(x_row + kb + 16)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int b = 0; b < BATCH; ++b) {
        const int e = lane + 32 * (j0 + b);
        const int word = e >> 1;  // within the stage
        uint2* dst = x_stage + r * kRowStride + group_position(word, (e & 1) * 4);  // groups q, q + 1, .. 4 apart
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const uint32_t l = word_of(lo[b], u), h = word_of(hi[b], u);
          const uint32_t even = __byte_perm(l, h, 0x5410);  // x[2q], x[2q+16]
          even_sum[i] += pair_sum(even, InT());
          dst[u * 4] = make_uint2(__byte_perm(l, h, 0x7632), even);  // x[2q+1], x[2q+17] | x[2q], x[2q+16]
        }
      }
    }
  }
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
        // Every rank's value requested before the first is added (one DSMEM round trip, not one a rank), then
        // summed in rank order. H200, graph us, a dependent load a rank -> all requested first (2026-12-02): M = 16 N
        // = 64 K = 1001 7.94 -> 7.12, M = 8 N = 256 K = 520 5.79 -> 5.38, M = 7 N = 65 K = 1000 5.30 -> 4.93; the large
        // shapes within -2 .. +1%. The same change in wgmma_rs.cuh's finish_tile and the APoT GEMV's cluster sum
        // measured +0.2 .. +1.5% (slower, 2-slice clusters mostly): not taken there.
        float parts[kTcMaxSlices];
#pragma unroll
        for (int r = 0; r < kTcMaxSlices; ++r) parts[r] = r < slices ? cluster.map_shared_rank(partial, r)[index] : 0.f;
        float sum = 0.f;
#pragma unroll
        for (int r = 0; r < kTcMaxSlices; ++r) {
          if (r < slices) sum += parts[r];
        }
        out[m * n_rows + n] = from_float<T>(epilogue_value(sum, row_factor(ep, m), column_scale(ep, n), column_bias(ep, n)));
      }
    }
    // No block leaves while another still reads its shared memory. Relaxed arrive (as the APoT GEMV's): the peers'
    // DSMEM reads are done (their sums are stored), so no MEMBAR.ALL.GPU waits for the output stores as
    // cluster.sync()'s release does. H200, bf16, M = 1, alpha vector, us in a rotating graph, cluster.sync() ->
    // relaxed (2026-12-04, same process, two passes): 8192^2 7.99 -> 7.78, 12288 x 4096 6.43 -> 6.25, 4096^2 5.04 ->
    // 4.77, 4096 x 11008 7.27 -> 6.99 (the bit-plane kernel; 22016 x 4096 takes no cluster).
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n barrier.cluster.wait.aligned;" ::: "memory");
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

// x_groups_kernel: bf16 / fp16 x of kGroupsMinRows .. kGroupsMaxRows rows prepared for the 16-row pass kernel by its
// own launch: a warp per (row m, chunk c) writes the chunk's 128 groups in the pass kernel's shared order (group
// (w, q) at ((w % 4) * 8 + q) * 4 + w / 4, 1 KB a chunk) to groups[(m * chunks + c) * 128 ..] and the sum of its
// even-k values to even_sums[m * chunks + c]; lane (w, h) = (lane / 2, lane % 2) writes groups q = 4 h .. 4 h + 3 of
// word w. Values past k are 0. The pass kernel (PREPARED) starts its W loads while this grid runs (programmatic
// dependent launch), then copies its slice of x into shared memory with cp.async: no staging code, 3 blocks an SM
// without spills (the staging 16-row build: 2), one wave of clusters at N = 8192.
// H200, bf16, M = 16, us per call in a rotating graph, staging in the kernel (2 blocks an SM) -> prepared (3), same
// process (2026-12-02): 8192^2 20.36 -> 17.65 (M = 12: 19.97 -> 17.58), 16384^2 63.95 -> 52.63, 8192 x 28672 58.08
// -> 45.40, 28672 x 8192 44.24 -> 40.84, 4096 x 11008 19.36 -> 17.98, 4096^2 9.82 -> 9.41; slower where the 2-block
// grid was one wave already: 11008 x 4096 14.32 -> 14.53, 14336 x 4096 14.49 -> 14.96, N = 7680 13.68 -> 15.27.
// Not taken for <= 8 rows (the 8-row build stages x at 3 blocks already; prepared lost 0.6-1.5 us there: M = 4
// 8192^2 12.39 -> 14.14, M = 8 13.46 -> 14.31). Tried and dropped: x copied raw by cp.async and permuted in shared
// memory within the one launch (3 blocks for 8 and 16 rows): slower everywhere (M = 16 8192^2 21.07, M = 4 14.41).
constexpr int kGroupsWarps = 4;
constexpr int kGroupsPerChunk = kTcChunkWords * 8;  // 8-byte groups of a chunk of a row
constexpr int64_t kGroupsMinRows = 9;
constexpr int64_t kGroupsMaxRows = 16;
template <typename T>
__global__ __launch_bounds__(kGroupsWarps * 32) void x_groups_kernel(const T* __restrict__ x, int64_t k, int64_t chunks,
                                                                     uint2* __restrict__ groups,
                                                                     float* __restrict__ even_sums) {
  launch_dependents();  // the pass kernel may start its W loads now; it waits for this grid's writes
  const int lane = threadIdx.x & 31;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kGroupsWarps + (threadIdx.x >> 5);
  const int64_t m = blockIdx.y;
  if (c >= chunks) return;
  const int w = lane >> 1;
  const int h = lane & 1;
  const int64_t first = c * kTcChunkWords * 32 + 32 * w;  // k of this word's first value
  const T* x_word = x + m * k + first;
  const int64_t left = k - first;  // values of this word inside the row
  float even = 0.f;
  uint2* dst = groups + (m * chunks + c) * kGroupsPerChunk;
  if (k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0) {  // uniform over the grid
    // Two 16-byte loads a lane, x[8 h .. 8 h + 7] and x[16 + 8 h ..] of word w (as stage_x_vectors): value u of
    // pair u is q = 4 h + u's (x[2q], x[2q+1]); k % 8 == 0, so a vector is wholly inside the row or wholly past it.
    const uint4 lo = 8 * h < left ? __ldg(reinterpret_cast<const uint4*>(x_word + 8 * h)) : make_uint4(0, 0, 0, 0);
    const uint4 hi = 16 + 8 * h < left ? __ldg(reinterpret_cast<const uint4*>(x_word + 16 + 8 * h)) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const uint32_t l = word_of(lo, u), r = word_of(hi, u);
      const uint32_t even_pair = __byte_perm(l, r, 0x5410);  // x[2q], x[2q+16]
      even += pair_sum(even_pair, T());
      dst[group_position(w, 4 * h + u)] = make_uint2(__byte_perm(l, r, 0x7632), even_pair);  // x[2q+1], x[2q+17]
    }
  } else {
    uint16_t bits[4][4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int q = 4 * h + u;
      const int offsets[4] = {2 * q + 1, 2 * q + 17, 2 * q, 2 * q + 16};
#pragma unroll
      for (int i = 0; i < 4; ++i) bits[u][i] = offsets[i] < left ? mma_bits(x_word[offsets[i]]) : uint16_t{0};
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const uint32_t odd_pair = bits[u][0] | (static_cast<uint32_t>(bits[u][1]) << 16);
      const uint32_t even_pair = bits[u][2] | (static_cast<uint32_t>(bits[u][3]) << 16);
      even += pair_sum(even_pair, T());
      dst[group_position(w, 4 * h + u)] = make_uint2(odd_pair, even_pair);
    }
  }
  even = warp_sum(even);
  if (lane == 0) even_sums[m * chunks + c] = even;
}

inline size_t groups_workspace_bytes(int64_t m_rows, int64_t k) {
  const int64_t chunks = ceil_div(ceil_div(k, 32), kTcChunkWords);
  return static_cast<size_t>(m_rows * chunks) * (kGroupsPerChunk * sizeof(uint2) + sizeof(float));
}

// InT: x's type; MmaT: the tensor-core type (bf16 for fp32 x, in PARTS = 3 pieces); NB: n8 tiles (8 rows of
// x each); STAGE_CHUNKS: chunks of x staged in shared memory at a time; VEC: 16-byte W loads. Blocks an SM:
// tc_min_blocks.
template <typename InT, typename MmaT, int PARTS, int NB, int STAGE_CHUNKS, bool VEC, bool PREPARED>
__global__ __launch_bounds__(kTcThreads, tc_min_blocks(PARTS, NB, PREPARED)) void binary_weight_linear_tc_kernel(
    const InT* __restrict__ x, const uint2* x_groups, const float* x_even, const uint32_t* __restrict__ w_bits,
    int64_t m_rows, int64_t n_rows, int64_t k, int64_t words, int slices, int64_t slice_chunks, Epilogue ep,
    InT* __restrict__ out) {
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
  // x staged from 16-byte loads (8 values of a row at once) where its rows allow them.
  const bool x_vec = PARTS == 1 && k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;

  uint4 current[4], next[4];
  if (chunk_begin < chunk_end) load_chunk(current, chunk_begin);
  if constexpr (PREPARED) {
    wait_for_prerequisite_grid();  // x_groups_kernel's groups and even sums are written
    if (tid < MB) {
      float total = 0.f;
      if (m0 + tid < m_rows) {
        for (int64_t c = chunk_begin; c < chunk_end; ++c) total += __ldcg(x_even + (m0 + tid) * total_chunks + c);
      }
      correction[tid] = total;
    }
  }
  for (int64_t c = chunk_begin; c < chunk_end; ++c) {
    const int local = static_cast<int>((c - chunk_begin) % STAGE_CHUNKS);
    // The next chunk's W is in flight during this chunk's staging of x (one row of x, or x copied from the
    // workspace: registers allow it) and during its math. H200, M = 16 prepared, graph us (2026-12-02), requested
    // after the copy of x -> before it: 16384^2 52.94 -> 51.76, 28672 x 8192 40.91 -> 39.73, 4096 x 11008 18.08 ->
    // 17.37, 11008 x 4096 14.58 -> 14.18; 8192^2 17.67 -> 17.60.
    if ((NB == 1 || PREPARED) && c + 1 < chunk_end) load_chunk(next, c + 1);
    if (local == 0) {
      __syncthreads();  // the previous stage is consumed
      if constexpr (PREPARED) {
        // The stage's chunks of rows m0 .. m0 + MB - 1 as x_groups_kernel wrote them: 64 16-byte copies a (row,
        // chunk), thread tid copying piece tid % 64 of rows tid / 64 + 4 j; rows past M zero-filled.
        const int chunks_here = static_cast<int>(chunk_end - c < STAGE_CHUNKS ? chunk_end - c : STAGE_CHUNKS);
        constexpr int kPieces = kGroupsPerChunk / 2;
        static_assert(kTcThreads % kPieces == 0 && MB % (kTcThreads / kPieces) == 0, "whole rows a pass");
        const int piece = tid % kPieces;
        for (int cc = 0; cc < chunks_here; ++cc) {
#pragma unroll
          for (int r = tid / kPieces; r < MB; r += kTcThreads / kPieces) {
            const int64_t row = m0 + r;
            const bool inside = row < m_rows;
            const uint2* src = x_groups + ((inside ? row : 0) * total_chunks + c + cc) * kGroupsPerChunk + 2 * piece;
            cp_async_16(reinterpret_cast<uint32_t*>(x_stage + r * kRowStride + cc * kGroupsPerChunk + 2 * piece),
                        reinterpret_cast<const uint32_t*>(src), inside);
          }
        }
        cp_async_commit();
        cp_async_wait<0>();
      } else {
        // Warp w stages rows w + 8 i; lane e handles groups (word, q) = e, e + 32, ... of the stage, their loads
        // issued in batches before the first is used (a few memory latencies a stage, not one a group).
        const int64_t k_stage = c * kTcChunkWords * 32;
        // Values of a later slice stay 0 here: this block's correction must cover its own k only.
        const int64_t k_limit = chunk_end * kTcChunkWords * 32 < k ? chunk_end * kTcChunkWords * 32 : k;
        constexpr int kGroupsPerLane = kGroupsPerRow / 32;
        // Tasks of a row in flight at once: all of them where the registers allow (more spills W's registers).
        constexpr int kXBatch = NB == 1 || (NB == 2 && VEC) ? kStageWords * 2 / 32 : 1;
        if (x_vec) {  // never for fp32 x (PARTS = 3)
          if constexpr (PARTS == 1) {
            stage_x_vectors<InT, NB, kStageWords, kRowStride, kXBatch>(x, x_stage, even_sum, m0, m_rows, k, k_stage, k_limit, warp, lane);
          }
        } else {
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
                const int position = group_position(word, q);
#pragma unroll
                for (int p = 0; p < PARTS; ++p) {
                  x_stage[(p * MB + r) * kRowStride + position] =
                      make_uint2(static_cast<uint32_t>(bits[0][p]) | (static_cast<uint32_t>(bits[1][p]) << 16),
                                 static_cast<uint32_t>(bits[2][p]) | (static_cast<uint32_t>(bits[3][p]) << 16));
                }
              }
            }
          }
        }
      }
      __syncthreads();
    }
    if (NB > 1 && !PREPARED && c + 1 < chunk_end) load_chunk(next, c + 1);

#pragma unroll
    for (int s = 0; s < 32; ++s) {
      const int w = s >> 3;
      const int q = s & 7;
      uint32_t b[PARTS][NB][2];
#pragma unroll
      for (int p = 0; p < PARTS; ++p) {
#pragma unroll
        for (int j = 0; j < NB; ++j) {
          const uint2 pair = x_stage[(p * MB + 8 * j + g) * kRowStride + group_position(local * kTcChunkWords + 4 * t + w, q)];
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

  if constexpr (!PREPARED) {
#pragma unroll
    for (int i = 0; i < NB; ++i) {
      const float total = warp_sum(even_sum[i]);
      if (lane == 0) correction[warp + kTcWarps * i] = total;
    }
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

template <typename InT, typename MmaT, int PARTS, int NB, int STAGE_CHUNKS>
constexpr size_t tc_smem_bytes() {
  return static_cast<size_t>(PARTS) * NB * 8 * (STAGE_CHUNKS * kTcChunkWords * 8 + 4) * sizeof(uint2) +
         NB * 8 * sizeof(float);
}

// x_groups / x_even: x as x_groups_kernel prepared it (PREPARED), launched just before on the stream (the pass kernel
// is then a programmatic dependent launch); null otherwise.
template <typename InT, typename MmaT, int PARTS, int NB, int STAGE_CHUNKS, bool VEC, bool PREPARED>
cudaError_t binary_weight_linear_tc_launch(const InT* x, const uint2* x_groups, const float* x_even,
                                           const uint32_t* w_bits, int64_t m_rows, int64_t n_rows, int64_t k,
                                           const Epilogue& ep, InT* out, int sm_count, const WeightLinearTuning& tuning,
                                           cudaStream_t stream) {
  constexpr int MB = NB * 8;
  constexpr size_t smem = tc_smem_bytes<InT, MmaT, PARTS, NB, STAGE_CHUNKS>();
  static_assert(smem >= static_cast<size_t>(MB) * kTcFeatures * sizeof(float), "partial tile aliases x_stage");
  const int64_t words = ceil_div(k, 32);
  const int64_t total_chunks = ceil_div(words, kTcChunkWords);
  const int64_t feature_blocks = ceil_div(n_rows, kTcFeatures);
  const int64_t row_blocks = ceil_div(m_rows, MB);
  if (row_blocks > 65535) return cudaErrorInvalidValue;
  auto kernel = binary_weight_linear_tc_kernel<InT, MmaT, PARTS, NB, STAGE_CHUNKS, VEC, PREPARED>;
  if (smem > 48 * 1024) {
    static unsigned long long smem_devices = 0;
    const cudaError_t error = allow_dynamic_smem(kernel, smem, smem_devices);
    if (error != cudaSuccess) return error;
  }
  static ClusterRoomCache rooms = {};
  const ClusterRoom room = cluster_room(kernel, kTcThreads, smem, rooms);
  // K split over a cluster of `slices` blocks: a power of two up to 8 and up to the chunks (trailing slices may get
  // no chunk). One row block (M <= 8, or 16 on the 16-row build): the largest split whose grid the device holds at
  // once in clusters of that size (one wave), or, past one wave, whose blocks still get 2 chunks or more (more
  // blocks an SM in flight outweigh a second wave there; at one chunk a block the fixed cost, prologue and cluster
  // reduction, does not). H200, bf16, graph us, the earlier rule (about two blocks an SM, rounded down) -> this,
  // M = 4 / 8 / 16 (2026-12-02): 16384^2 (4 -> 8 slices, 512 blocks) 39.75 -> 34.65, 41.73 -> 35.79, 51.92 -> 44.51;
  // 11008 x 4096 (4 -> 8, 344 blocks, one wave) 9.62 -> 8.98, 10.66 -> 9.74, 13.88 -> 12.14; 28672 x 8192 (2 -> 8)
  // 30.37 -> 29.08, 31.83 -> 30.84, 40.03 -> 38.49. Kept at 4: 14336 x 4096 (8 slices: 448 blocks of one chunk,
  // 9.93 -> 12.29 at M = 4). fp32 x (2 blocks an SM) takes the same rule, not measured. More row blocks: the earlier
  // rule (not measured against this one). Past one wave a split of s needs >= 2 s chunks (it was ceil(chunks / s) >= 2,
  // which took 8 slices of 9-15 chunks, 1-2 a block and empty trailing slices, in 2 waves); H200, bf16, graph us, same
  // process (2026-12-04), 8 -> 4 slices, M = 4 (pass kernel forced) / 8 / 16: 12000 x 4608 15.00 -> 13.30, 15.82 ->
  // 14.34, 20.34 -> 18.04; 12288 x 6144 16.05 -> 13.78, 16.71 -> 14.76, 21.31 -> 18.88; 13824 x 5120 16.17 -> 13.63,
  // 16.74 -> 14.75, 21.34 -> 18.53; 20480 x 5120 M = 8 / 16 22.96 -> 19.56, 29.07 -> 24.18; unchanged (one wave, or
  // >= 16 chunks) at 8192 x 5120, 8192^2, 16384^2, 28672 x 8192, 11008 x 4096, 14336 x 4096, 6144^2, 4096 x 11008.
  int64_t slices = 1;
  const int64_t most = tuning.slices > 0 ? tuning.slices : kTcMaxSlices;
  const int64_t wanted = 2 * static_cast<int64_t>(sm_count) / (feature_blocks * row_blocks);
  for (int64_t s = 2; s <= most && s <= kTcMaxSlices && s <= total_chunks; s *= 2) {
    const bool take = tuning.slices > 0 ||
                      (row_blocks == 1 ? room.of(s) > 0 && (feature_blocks * s <= room.of(s) || total_chunks >= 2 * s)
                                       : s <= wanted);
    if (!take) break;
    slices = s;
  }
  int64_t slice_chunks = ceil_div(total_chunks, slices);
  if (feature_blocks * slices > INT_MAX) return cudaErrorInvalidValue;
  if (slices > 1) {
    slices = room.largest_within(slices);
    slice_chunks = ceil_div(total_chunks, slices);
  }
  if (slices > 1) {
    const ClusterLaunch launch(dim3(static_cast<unsigned>(feature_blocks * slices), static_cast<unsigned>(row_blocks), 1),
                               kTcThreads, smem, slices, stream, PREPARED);
    const cudaError_t error = cudaLaunchKernelEx(&launch.config, kernel, x, x_groups, x_even, w_bits, m_rows, n_rows,
                                                 k, words, static_cast<int>(slices), slice_chunks, ep, out);
    if (error == cudaSuccess) return cudaGetLastError();
    (void)cudaGetLastError();  // refused all the same: fall back to one block per feature block
    slices = 1;
    slice_chunks = total_chunks;
  }
  kernel<<<dim3(static_cast<unsigned>(feature_blocks), static_cast<unsigned>(row_blocks), 1), kTcThreads, smem, stream>>>(
      x, x_groups, x_even, w_bits, m_rows, n_rows, k, words, 1, slice_chunks, ep, out);
  return cudaGetLastError();
}

template <typename InT, typename MmaT, int PARTS, int NB, int STAGE_CHUNKS, bool PREPARED = false>
cudaError_t binary_weight_linear_tc_aligned(const InT* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                            int64_t k, const Epilogue& ep, InT* out, int sm_count, const WeightLinearTuning& tuning,
                                            cudaStream_t stream, const uint2* x_groups = nullptr,
                                            const float* x_even = nullptr) {
  const bool vec = ceil_div(k, 32) % 4 == 0 && reinterpret_cast<uintptr_t>(w_bits) % 16 == 0;
  if (vec) {
    return binary_weight_linear_tc_launch<InT, MmaT, PARTS, NB, STAGE_CHUNKS, true, PREPARED>(
        x, x_groups, x_even, w_bits, m_rows, n_rows, k, ep, out, sm_count, tuning, stream);
  }
  return binary_weight_linear_tc_launch<InT, MmaT, PARTS, NB, STAGE_CHUNKS, false, PREPARED>(
      x, x_groups, x_even, w_bits, m_rows, n_rows, k, ep, out, sm_count, tuning, stream);
}

// bf16 / fp16 x of kGroupsMinRows .. kGroupsMaxRows rows: x_groups_kernel, then the 16-row pass kernel on its groups.
template <typename InT>
cudaError_t binary_weight_linear_prepared(const InT* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                          int64_t k, const Epilogue& ep, InT* out, int sm_count,
                                          const WeightLinearTuning& tuning, void* workspace, cudaStream_t stream) {
  const int64_t chunks = ceil_div(ceil_div(k, 32), kTcChunkWords);
  uint2* groups = static_cast<uint2*>(workspace);
  float* even = reinterpret_cast<float*>(groups + m_rows * chunks * kGroupsPerChunk);
  x_groups_kernel<InT><<<dim3(static_cast<unsigned>(ceil_div(chunks, kGroupsWarps)), static_cast<unsigned>(m_rows), 1),
                         kGroupsWarps * 32, 0, stream>>>(x, k, chunks, groups, even);
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  return binary_weight_linear_tc_aligned<InT, InT, 1, 2, 2, true>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count,
                                                                   tuning, stream, groups, even);
}

// Rows of x a pass: 8 (M <= 8), 16, else 32 (bf16/fp16) or 16 (fp32: three parts, three times the staging).
// ---------------------------------------------------------------------------------------------
// binary_weight_planes: bf16/fp16 x with M <= kPlaneMaxRows rows (decoding), on the b1 tensor cores.
// x_planes_kernel turns each 512-value chunk of a row of x into P = 24 two's-complement bit planes of
// fixed-point integers, scaled by 2^shift from the chunk's largest |x| (xq = rint(x * 2^shift), |xq| < 2^22).
// Then for the chunk
//   sum_k x[k] s(w[k]) = 2^-shift (2 sum_p coef_p popc(w & plane_p) - sum_k xq[k]),  coef_p = 2^p (-2^(P-1) at P-1)
// exactly in integers: the weight bits feed mma.sync m16n8k256 AND.POPC as they are, 4096 weights in 2
// instructions per 8 planes (the fp16 expansion of the tensor-core pass kernel takes ~0.75 integer ops a weight), and the
// chunks add up in fp64. A value of at least 2^-14 of its chunk's largest |x| is exact (bf16; fp16: 2^-11), a
// smaller one is rounded by less than 2^-22 of the largest. binary_weight_planes_kernel starts before x_planes_kernel ends (programmatic
// dependent launch, sm_90): it issues its W loads, then waits for the planes (griddepcontrol.wait).
// Blocks of 4 warps and 64 W rows (a warp: one m16 tile, lane rows g, g + 8, words 4t..4t+3 of each 512-bit
// chunk), K split over a cluster reduced by store_tile.
// H200, M = 1, N = K = 8192, us per call in a rotating graph: 7.5 (the fp16-expansion GEMV kernel it replaces:
// 12.6). Tried first: one scale per K slice of a block, planes built by a 4-block kernel: 9.1 (its block-wide
// reductions and ~2 us of serial work on the critical path); planes built inside every weight block: 11.8 (~1000
// instructions a warp).
constexpr int kPlaneBits = 24;
// kPlaneMaxRows: H200, bf16, us in a rotating graph (2026-12-02), this kernel (plan_planes' slices) against the
// tensor-core pass kernel, N x K: M = 3: 8192^2 12.1 / 14.2, 4096 x 11008 10.3 / 13.1, 16384^2 33.1 / 44.5,
// 14336 x 4096 10.0 / 9.6; M = 4 (the slices plan_planes would take): 18.2 / 14.3, 14.4 / 13.2, 35.1 / 44.5,
// 11.4 / 9.8 (the best slices: 13.7, 11.8, 35.1, 10.9), with one warp a 16-row tile. M = 4 takes this kernel since
// blocks share a tile among 2 or 4 warps (plane_split) and only at K > 4096 (plan_planes).
constexpr int kPlaneMaxRows = 4;
constexpr int kPlaneWarps = 4;
constexpr int kPlaneThreads = kPlaneWarps * 32;
constexpr int kPlaneFeatures = kPlaneWarps * 16;
constexpr int kPlaneRing = 4;       // chunks of W in flight per lane
constexpr int kPlaneMaxChunks = 16;  // chunks of a block's K slice (plan_planes: why 16)
constexpr int kPlaneChunkWords = kPlaneBits * kTcChunkWords;  // plane words of one chunk of one row of x
constexpr int kNonFinite = 1000;    // PlaneGroup::shift of a chunk with an Inf or NaN

struct __align__(16) PlaneGroup {  // one row of x, one chunk
  long long x_sum;                 // sum of the fixed-point values
  int shift;                       // xq = rint(x * 2^shift); kNonFinite: the row's outputs become NaN
  int padding;                     // to 16 bytes: one cp.async a group
};

// A block per (row m of x, chunk c), a warp per word w of the chunk (lane i: value 512 c + 32 w + i):
// planes[(m * chunks + c) * kPlaneChunkWords + p * 16 + w] = bit p of xq for k = 512 c + 32 w + bit, and
// groups[m * chunks + c]. The chunk's largest |x| and its sum of xq go through shared memory. Each warp's chain is
// one load, a max, one 32 x 32 transpose and a sum (the warp-a-chunk form did 16 of each in series: 2.3 us of the
// M = 1 critical path with 16 warps on 4 SMs, the twelfth session's stamps). H200, bf16, us per call in a rotating
// graph, warp-a-chunk -> block-a-chunk (2026-12-02, same process): M = 1 8192^2 7.49 -> 7.16, 16384^2 16.84 -> 15.25,
// 4096 x 11008 7.65 -> 7.21; M = 2 8192^2 10.22 -> 9.49; M = 3 12.38 -> 11.24; M = 2, 100 x 1001 5.50 -> 4.38.
constexpr int kXPlanesThreads = kTcChunkWords * 32;
template <typename T>
__global__ __launch_bounds__(kXPlanesThreads) void x_planes_kernel(const T* __restrict__ x, int64_t k, int64_t chunks,
                                                                   uint32_t* __restrict__ planes,
                                                                   PlaneGroup* __restrict__ groups) {
  // Launched dependent (M = 1), this grid waits for the previous one before anything: x, the workspace, and W too,
  // which the weight kernel loads before its own wait, may be the previous kernel's writes. Only then may the weight
  // kernel start (its W loads overlap this grid); it waits for this grid's writes.
  wait_for_prerequisite_grid();
  launch_dependents();
  constexpr int P = kPlaneBits;
  __shared__ uint32_t word_largest[kTcChunkWords];  // bits of each word's largest |x|
  __shared__ int word_finite[kTcChunkWords];
  __shared__ int word_sum[kTcChunkWords];
  const int lane = threadIdx.x & 31;
  const int w = threadIdx.x >> 5;
  const int64_t c = blockIdx.x;
  const int64_t m = blockIdx.y;
  const int64_t kk = c * kTcChunkWords * 32 + w * 32 + lane;
  const float v = kk < k ? to_float(x[m * k + kk]) : 0.f;
  // |x| >= 0 orders as its bits: one redux.sync a reduction, not five shuffles (a NaN's bits win the max; the chunk
  // is then non-finite, and its shift unused)
  const uint32_t word_bits = __reduce_max_sync(kFullMask, __float_as_uint(fabsf(v)));
  const bool word_ok = __all_sync(kFullMask, isfinite(v));
  if (lane == 0) {
    word_largest[w] = word_bits;
    word_finite[w] = word_ok;
  }
  __syncthreads();
  // Lanes past the chunk's words hold the identities (0, 1).
  const float largest =
      __uint_as_float(__reduce_max_sync(kFullMask, lane < kTcChunkWords ? word_largest[lane] : 0u));
  const bool finite =
      __reduce_and_sync(kFullMask, lane < kTcChunkWords ? static_cast<unsigned>(word_finite[lane]) : 1u) != 0;
  // |xq| < 2^(P-2): largest < 2^e, shift = P - 2 - e, kept where 2^shift is a normal float.
  int e = 0;
  (void)frexpf(largest, &e);
  int shift = P - 2 - e;
  shift = shift > 126 ? 126 : (shift < -126 ? -126 : shift);
  const float factor = __int_as_float((shift + 127) << 23);
  const int q = finite ? __float2int_rn(v * factor) : 0;
  const uint32_t plane_word = transpose_bits(static_cast<uint32_t>(q), lane);  // lane p: plane p's word w
  if (lane < P) planes[(m * chunks + c) * kPlaneChunkWords + lane * kTcChunkWords + w] = plane_word;
  const int sum = __reduce_add_sync(kFullMask, q);  // |sum| < 32 * 2^22: int32 within a word
  if (lane == 0) word_sum[w] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    long long total = 0;
#pragma unroll
    for (int i = 0; i < kTcChunkWords; ++i) total += word_sum[i];
    groups[m * chunks + c] = PlaneGroup{total, finite ? shift : kNonFinite, 0};
  }
}

// SPLIT warps share each 16-row tile, warp `part` taking chunks part, part + SPLIT, ... of the block's slice, their
// sums added in part order before store_tile (plane_split says when).
template <typename T, int MMAX, int SPLIT>
__global__ __launch_bounds__(kPlaneThreads * SPLIT) void binary_weight_planes_kernel(
    const uint32_t* __restrict__ w_bits, const uint32_t* __restrict__ planes, const PlaneGroup* __restrict__ groups,
    int m_rows, int64_t n_rows, int64_t words, int slices, int slice_chunks, Epilogue ep, T* __restrict__ out) {
  constexpr int P = kPlaneBits;
  constexpr int NP = P / 8;  // n8 tiles (8 planes each) per row of x
  static_assert(P <= 24, "the int32 lane sums need P <= 24");
  extern __shared__ __align__(16) uint32_t plane_smem[];  // [m_rows][slice_chunks][kPlaneChunkWords]
  float* partial = reinterpret_cast<float*>(plane_smem);   // [m_rows][kPlaneFeatures], after the main loop
  __shared__ PlaneGroup chunk_groups[MMAX][kPlaneMaxChunks];

  constexpr int kPlaneBlockThreads = kPlaneThreads * SPLIT;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = (tid >> 5) % kPlaneWarps;  // the row tile
  const int part = (tid >> 5) / kPlaneWarps;  // this warp's chunks: part, part + SPLIT, ...
  const int g = lane >> 2;
  const int t = lane & 3;
  const int slice = static_cast<int>(blockIdx.x % static_cast<unsigned>(slices));
  const int64_t n_block = (blockIdx.x / static_cast<unsigned>(slices)) * static_cast<int64_t>(kPlaneFeatures);
  const int64_t total_chunks = ceil_div(words, kTcChunkWords);
  const int64_t chunk_begin = static_cast<int64_t>(slice) * slice_chunks;
  const int64_t chunk_end = chunk_begin + slice_chunks < total_chunks ? chunk_begin + slice_chunks : total_chunks;
  const int chunks = chunk_end > chunk_begin ? static_cast<int>(chunk_end - chunk_begin) : 0;
  const int my_chunks = chunks > part ? (chunks - part + SPLIT - 1) / SPLIT : 0;
  const int64_t row_top = n_block + warp * 16 + g;

  auto load_chunk = [&](uint4 (&dst)[2], int64_t c) {
    const int64_t word = c * kTcChunkWords + 4 * t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row_top + 8 * h;
      dst[h] = (row < n_rows && word < words) ? __ldg(reinterpret_cast<const uint4*>(w_bits + row * words + word))
                                              : make_uint4(0, 0, 0, 0);
    }
  };
  uint4 ring[kPlaneRing][2];
#pragma unroll
  for (int i = 0; i < kPlaneRing; ++i) {
    if (i < my_chunks) load_chunk(ring[i], chunk_begin + part + SPLIT * i);
  }

  wait_for_prerequisite_grid();  // x_planes_kernel's planes and groups are written
  {
    // cp.async (through L2: data written by the grid this kernel overlapped), all in flight at once.
    const int row_vectors = chunks * kPlaneChunkWords / 4;
    for (int i = tid; i < m_rows * row_vectors; i += kPlaneBlockThreads) {
      const int m = i / row_vectors;
      const int v = i % row_vectors;
      cp_async_16(plane_smem + (m * slice_chunks * kPlaneChunkWords) + 4 * v,
                  planes + (static_cast<int64_t>(m) * total_chunks + chunk_begin) * kPlaneChunkWords + 4 * v, true);
    }
    if (tid < m_rows * chunks) {
      const int m = tid / chunks;
      const int c = tid % chunks;
      cp_async_16(reinterpret_cast<uint32_t*>(&chunk_groups[m][c]),
                  reinterpret_cast<const uint32_t*>(groups + static_cast<int64_t>(m) * total_chunks + chunk_begin + c), true);
    }
    cp_async_commit();
    cp_async_wait<0>();
  }
  __syncthreads();

  // Per chunk and row m of x: lane (g, t) of tile pg holds the counts of planes 8 pg + 2t + e (e = 0, 1) of W rows
  // g (c0, c1) and g + 8 (c2, c3); its share of sum_p coef_p count_p is 4^t sum_pg 2^(8 pg) (c_e0 + 2 c_e1), the top
  // plane's coefficient negative (t = 3, e = 1 of the last group): exact in int32 (counts <= 512), then in fp64
  // times 2^(1 - shift + 2t). x's part (-2^-shift sum xq) is added by lanes t = 0.
  double dot[MMAX][2];
  bool finite[MMAX];
#pragma unroll
  for (int m = 0; m < MMAX; ++m) {
    dot[m][0] = dot[m][1] = 0.0;
    finite[m] = true;
  }
  const int top_factor = t == 3 ? -2 : 2;
  for (int base = 0; base < my_chunks; base += kPlaneRing) {
#pragma unroll
    for (int i = 0; i < kPlaneRing; ++i) {
      const int mine = base + i;
      const int local = part + SPLIT * mine;
      if (mine < my_chunks) {  // uniform over the warp
        const uint32_t a_low[4] = {ring[i][0].x, ring[i][1].x, ring[i][0].y, ring[i][1].y};
        const uint32_t a_high[4] = {ring[i][0].z, ring[i][1].z, ring[i][0].w, ring[i][1].w};
        if (mine + kPlaneRing < my_chunks) load_chunk(ring[i], chunk_begin + local + SPLIT * kPlaneRing);
#pragma unroll
        for (int m = 0; m < MMAX; ++m) {
          if (m < m_rows) {  // uniform
            const uint32_t* b_base = plane_smem + (m * slice_chunks + local) * kPlaneChunkWords + g * kTcChunkWords + 4 * t;
            int count[NP][4];
#pragma unroll
            for (int pg = 0; pg < NP; ++pg) {
              const uint4 b = *reinterpret_cast<const uint4*>(b_base + pg * 8 * kTcChunkWords);
              const uint32_t b_low[2] = {b.x, b.y};
              const uint32_t b_high[2] = {b.z, b.w};
#pragma unroll
              for (int r = 0; r < 4; ++r) count[pg][r] = 0;
              mma_and_popc(count[pg], a_low, b_low);
              mma_and_popc(count[pg], a_high, b_high);
            }
            const PlaneGroup group = chunk_groups[m][local];
            finite[m] = finite[m] && group.shift != kNonFinite;
            const int shift = group.shift == kNonFinite ? 0 : group.shift;  // |shift| <= 126
            const double lane_unit = __longlong_as_double(static_cast<long long>(1023 + 1 - shift + 2 * t) << 52);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              int lane_sum = 0;
#pragma unroll
              for (int pg = 0; pg < NP; ++pg) {
                lane_sum += (count[pg][2 * h] + count[pg][2 * h + 1] * (pg == NP - 1 ? top_factor : 2)) << (8 * pg);
              }
              dot[m][h] = fma(static_cast<double>(lane_sum), lane_unit, dot[m][h]);
            }
            if (t == 0) {
              const double x_part = -static_cast<double>(group.x_sum) *
                                    __longlong_as_double(static_cast<long long>(1023 - shift) << 52);
              dot[m][0] += x_part;
              dot[m][1] += x_part;
            }
          }
        }
      }
    }
  }

  __syncthreads();  // plane_smem consumed: partial aliases it
#pragma unroll
  for (int m = 0; m < MMAX; ++m) {
    if (m < m_rows) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        double sum = dot[m][h];
        sum += __shfl_xor_sync(kFullMask, sum, 1);
        sum += __shfl_xor_sync(kFullMask, sum, 2);
        if (t == 0) {
          partial[(part * m_rows + m) * kPlaneFeatures + warp * 16 + g + 8 * h] =
              finite[m] ? static_cast<float>(sum) : __int_as_float(0x7fc00000);
        }
      }
    }
  }
  if constexpr (SPLIT > 1) {  // the parts' sums, in part order (deterministic)
    __syncthreads();
    for (int i = tid; i < m_rows * kPlaneFeatures; i += kPlaneBlockThreads) {
      float sum = partial[i];
#pragma unroll
      for (int q = 1; q < SPLIT; ++q) sum += partial[q * m_rows * kPlaneFeatures + i];
      partial[i] = sum;
    }
  }
  store_tile<kPlaneBlockThreads, kPlaneFeatures>(partial, m_rows, 0, m_rows, n_block, n_rows, slices, ep, out);
}

// How binary_weight_planes splits K, or slices = 0 where it does not take the problem.
struct PlanePlan {
  int64_t slices = 0;
  int slice_chunks = 0;
};

inline PlanePlan plan_planes(int64_t m_rows, int64_t n_rows, int64_t k, int sm_count, const WeightLinearTuning& tuning) {
  PlanePlan plan;
  const int64_t words = ceil_div(k, 32);
  const int64_t total_chunks = ceil_div(words, kTcChunkWords);
  if (m_rows < 1 || m_rows > kPlaneMaxRows || words % 4 != 0) return plan;
  // M = 4 with K <= 4096 stays on the pass kernel unless tuning.split asks for bit planes (plane_split: measurements).
  // H200, bf16, graph us, same process (2026-12-04), M = 4, the pass kernel -> bit planes at 4096 < K < 8192:
  // 12000 x 4608 14.70 -> 10.48, 5120^2 9.35 -> 8.04, 12288 x 6144 16.01 -> 13.09, 8192 x 7680 12.84 -> 10.65,
  // 13824 x 5120 16.14 -> 11.83, 8192 x 5120 12.25 -> 8.78, 4096 x 5120 9.16 -> 7.72, 6144^2 9.34 -> 9.32.
  if (m_rows == 4 && total_chunks <= 8 && tuning.split == 0) return plan;
  const int64_t feature_blocks = ceil_div(n_rows, kPlaneFeatures);
  // The most slices (a power of two, a cluster of at most 8, at most one a chunk) that keep the grid within
  // 8 / (m_rows + 1) blocks an SM (4 at M = 1, 2.67 at M = 2), then more where a block would exceed kPlaneMaxChunks.
  // H200, bf16, alpha vector, us in a rotating graph (2026-12-02), slices this rule takes against the rule before
  // (4 blocks an SM whatever M, 8 chunks a block at most), N x K:
  //   M = 1: 16384^2 16.6 / 18.1 (2 slices of 16 chunks: one wave, not two), 28672 x 8192 14.1 / 16.1,
  //          8192 x 28672 15.7 / 16.7; 8192^2, 4096 x 11008, 11008 x 4096, 14336 x 4096, 4096^2: the same slices.
  //   M = 2: 8192^2 9.8 / 12.1, 16384^2 22.6 / 26.5, 4096 x 11008 8.6 / 11.8, 4096 x 14336 9.3 / 12.7, 4096^2
  //          6.7 / 9.2, 6144 x 4096 6.9 / 7.1, 11008 x 4096 the same slices (2, 7.4; 1 slice: 8.4); worse:
  //          14336 x 4096 8.4 / 8.2, 28672 x 8192 19.9 / 19.1, 8192 x 28672 26.8 / 25.8.
  int64_t slices = 1;
  const int64_t wanted = 8 * static_cast<int64_t>(sm_count) / (m_rows + 1);
  if (tuning.slices > 0) {
    while (slices * 2 <= tuning.slices && slices * 2 <= kTcMaxSlices) slices *= 2;
  } else {
    while (slices < kTcMaxSlices && slices * 2 <= total_chunks && feature_blocks * slices * 2 <= wanted) slices *= 2;
  }
  while (ceil_div(total_chunks, slices) > kPlaneMaxChunks && slices < kTcMaxSlices) slices *= 2;
  if (ceil_div(total_chunks, slices) > kPlaneMaxChunks || feature_blocks * slices > INT_MAX) return plan;
  plan.slices = slices;
  plan.slice_chunks = static_cast<int>(ceil_div(total_chunks, slices));
  return plan;
}

inline size_t planes_workspace_bytes(int64_t m_rows, int64_t k) {
  const int64_t chunks = ceil_div(ceil_div(k, 32), kTcChunkWords);
  return static_cast<size_t>(m_rows * chunks) * (kPlaneChunkWords * sizeof(uint32_t) + sizeof(PlaneGroup));
}

// The largest shared memory an MMAX-row block of the bit-plane kernel takes, and the kernel of SPLIT warps a tile
// opted into it (once a device).
template <int MMAX>
constexpr size_t plane_max_smem() {
  return static_cast<size_t>(MMAX) * kPlaneMaxChunks * kPlaneChunkWords * sizeof(uint32_t);
}
template <typename T, int MMAX, int SPLIT>
cudaError_t plane_kernel_ready() {
  static unsigned long long smem_devices = 0;
  return allow_dynamic_smem(binary_weight_planes_kernel<T, MMAX, SPLIT>, plane_max_smem<MMAX>(), smem_devices);
}

// Warps a 16-row tile (the kernel's SPLIT): 2 at M = 2 / 3 where each warp still fills its ring (a block's slice of
// >= 2 * kPlaneRing chunks at M = 2, >= kPlaneRing at M = 3: the M = 3 rows below) and the grid of 2-warp blocks runs
// in one wave of the device (its blocks an SM, or its clusters of `slices`) or its last wave is >= 3/4 full; else 1
// (and always at M = 1). At M = 4: 4 where the grid of 4-warp blocks is one wave, else 2 where the 2-warp grid fits
// as above, else 0: the pass kernel takes it (a 1-warp tile lost to it at every M = 4 shape but 12000 x 4608).
// tuning.split forces 1 (not at M = 4), 2 or 4.
// H200, bf16, alpha vector, us per call in a rotating graph, 1 warp a tile -> 2 (2026-12-04, same process, two
// passes; plan_planes' slices): 8192^2 M = 2 9.40 -> 8.82, M = 3 11.22 -> 9.86; 12288 x 4096 M = 3 9.35 -> 8.77;
// 14336 x 4096 M = 3 9.80 -> 9.13; 12000 x 4608 M = 3 10.15 -> 9.38; 16384^2 (1.94 waves of 2-warp blocks) M = 2
// 22.66 -> 20.61, M = 3 32.23 -> 24.29; 28672 x 8192 (1.70 waves) 20.62 -> 19.02, 29.92 -> 23.09; where the rule
// keeps 1: 4096^2 (clusters of 4, 2 chunks a block) M = 2 5.87 -> 8.34, 4096 x 11008 (clusters of 4) 8.51 -> 11.45,
// 22016 x 4096 (1.30 waves) 9.41 -> 12.94, N = 100 K = 1024 4.16 -> 4.26; M = 1: 8192^2 7.27 -> 11.93, 12288 x 4096
// 5.83 -> 8.52, 16384^2 15.55 -> 17.21 (one warp a tile is not short of MMA issue there). M = 1 with 2 warps a tile
// and half the slices (the same warps, half the clusters): 12288 x 4096 6.54 -> 6.18, 6144 x 4096 5.44 -> 5.53,
// 8192^2 6.66 -> 6.80, 4096^2 5.00 -> 7.21, 4096 x 11008 6.62 -> 9.52 (clusters of 4): no rule yet, so 1.
// M = 3 with 4 to 7 chunks a slice (2026-12-04, same process, the rule with 8 chunks -> 4): 6144 x 4096 7.16 -> 6.39,
// 12288 x 3584 8.63 -> 8.36; unchanged at 4096^2, 11008 x 4096, 22016 x 4096, 4096 x 11008 (the wave clause).
// M = 4 (2026-12-04, same process, graph us, the pass kernel / bit planes with 1, 2, 4 warps a tile): 8192^2 12.19 /
// 17.96, 15.15, 10.80; 4096 x 11008 13.43 / 15.12, 11.58, 9.79; 4096 x 14336 15.15 / 16.06, 13.30, 10.93; 16384^2
// 34.63 / 35.57, 30.30, 38.32; 28672 x 8192 28.80 / 34.44, 28.72, 34.25; 8192 x 28672 (clusters of 4, past a wave
// at 2 warps) 36.77 / 46.10, 34.89, 42.24; K = 4096 (plan_planes leaves it to the pass kernel): 4096^2 6.50 / 7.81,
// 7.53, 7.00; 12288 x 4096 9.75 / 11.91, 10.07, 12.77; 22016 x 4096 12.81 / 15.83, 16.08, 18.18; 14336 x 4096 10.06
// / 13.01, 10.35, 12.99; 11008 x 4096 8.84 / 11.83, 9.96, 12.67 (12000 x 4608: 15.21 / 13.52, 11.16, 14.10; K > 4096
// at M = 4 is on bit planes since: plan_planes).
// The blocks of the bit-plane kernel of SPLIT warps a tile the device holds at once (its blocks an SM, or its clusters
// of `slices`), at its largest shared memory; 0 where its opt-in or the query fails.
template <typename T, int MMAX, int SPLIT>
int64_t plane_room(int64_t slices, int sm_count) {
  if (plane_kernel_ready<T, MMAX, SPLIT>() != cudaSuccess) {
    (void)cudaGetLastError();  // its opt-in refused: another split (or kernel) takes it
    return 0;
  }
  auto kernel = binary_weight_planes_kernel<T, MMAX, SPLIT>;
  if (slices > 1) {
    static ClusterRoomCache rooms = {};
    return cluster_room(kernel, SPLIT * kPlaneThreads, plane_max_smem<MMAX>(), rooms).of(slices);
  }
  static OccupancyCache occupancy = {};
  return static_cast<int64_t>(blocks_per_sm(kernel, SPLIT * kPlaneThreads, plane_max_smem<MMAX>(), occupancy)) * sm_count;
}

// Whether `blocks` run in one wave of `room` blocks, or in more whose last one is >= 3/4 full.
inline bool fills_waves(int64_t blocks, int64_t room) {
  if (room <= 0) return false;
  const int64_t waves = ceil_div(blocks, room);
  return waves == 1 || 4 * blocks >= 3 * waves * room;
}

// Readies the bit-plane kernel of SPLIT warps a tile (`kernel`): its shared-memory opt-in, and a cluster of `slices`
// at `smem` that the device co-schedules (cudaErrorNotSupported where it does not).
template <typename T, int MMAX, int SPLIT, typename Kernel>
cudaError_t ready_plane_kernel(int64_t slices, size_t smem, Kernel& kernel) {
  kernel = binary_weight_planes_kernel<T, MMAX, SPLIT>;
  const cudaError_t error = plane_kernel_ready<T, MMAX, SPLIT>();
  if (error != cudaSuccess) return error;
  static ClusterRoomCache rooms = {};
  if (slices > 1 && fitting_cluster(kernel, slices, kPlaneThreads * SPLIT, smem, rooms) != slices)
    return cudaErrorNotSupported;
  return cudaSuccess;
}

template <typename T, int MMAX>
int plane_split(int64_t blocks, int64_t slices, int slice_chunks, int sm_count, const WeightLinearTuning& tuning) {
  if (MMAX >= 4 && tuning.split == 1) return 0;  // no 1-warp tile at M = 4 (binary_weight_planes_launch)
  if (tuning.split == 1 || tuning.split == 2 || tuning.split == 4) return tuning.split;
  if constexpr (MMAX >= 4) {
    if (blocks <= plane_room<T, MMAX, 4>(slices, sm_count)) return 4;
    return fills_waves(blocks, plane_room<T, MMAX, 2>(slices, sm_count)) ? 2 : 0;
  } else if constexpr (MMAX >= 2) {
    if (slice_chunks < (MMAX >= 3 ? kPlaneRing : 2 * kPlaneRing)) return 1;
    return fills_waves(blocks, plane_room<T, MMAX, 2>(slices, sm_count)) ? 2 : 1;
  } else {
    return 1;
  }
}

template <typename T, int MMAX>
cudaError_t binary_weight_planes_launch(const T* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows, int64_t k,
                                        const Epilogue& ep, T* out, const PlanePlan& plan, void* workspace,
                                        int sm_count, const WeightLinearTuning& tuning, cudaStream_t stream) {
  const int64_t words = ceil_div(k, 32);
  const int64_t chunks = ceil_div(words, kTcChunkWords);
  const int64_t slices = plan.slices;
  const int64_t blocks = ceil_div(n_rows, kPlaneFeatures) * slices;
  const int split = plane_split<T, MMAX>(blocks, slices, plan.slice_chunks, sm_count, tuning);
  if (split == 0) return cudaErrorNotSupported;  // the pass kernel takes it
  // kOne: the 1-warp tile, never at M = 4 (slower than the pass kernel at every shape measured; not built there)
  constexpr int kOne = MMAX >= 4 ? 2 : 1;
  const size_t smem = static_cast<size_t>(m_rows) * plan.slice_chunks * kPlaneChunkWords * sizeof(uint32_t);
  decltype(&binary_weight_planes_kernel<T, MMAX, kOne>) kernel = nullptr;
  cudaError_t error = split == 4   ? ready_plane_kernel<T, MMAX, 4>(slices, smem, kernel)
                      : split == 2 ? ready_plane_kernel<T, MMAX, 2>(slices, smem, kernel)
                                   : ready_plane_kernel<T, MMAX, kOne>(slices, smem, kernel);
  if (error != cudaSuccess) return error;
  uint32_t* planes = static_cast<uint32_t*>(workspace);
  PlaneGroup* groups = reinterpret_cast<PlaneGroup*>(planes + m_rows * chunks * kPlaneChunkWords);
  DeviceFacts device;
  error = current_device_facts(device);
  if (error != cudaSuccess) return error;
  {
    // At M = 1 x_planes_kernel is launched dependent too: its launch overlaps the previous kernel's tail, and it
    // waits for that grid before reading x or writing the workspace. H200, bf16, alpha vector, us per call in a
    // rotating graph (2026-12-04, same process, two passes), plain -> dependent launch: M = 1 8192^2 7.70 -> 7.23,
    // 12288 x 4096 6.24 -> 5.80, 22016 x 4096 8.28 -> 7.75, 4096 x 11008 6.93 -> 6.61, 4096^2 4.69 -> 4.62; but M = 2
    // 8192^2 9.53 -> 10.04, M = 3 4096 x 11008 10.05 -> 10.59, so not there. Those are of a first version that let the
    // weight kernel start before this grid's wait (a race with a kernel writing W just before); this one measured the
    // same in one process (8192^2 7.27 / 7.27, 12288 x 4096 5.85 / 5.86, 22016 x 4096 7.78 / 7.77). Also tried: the
    // weight kernel letting the next launch start once its W loads are issued: mixed (8192^2 6.88, 22016 x 4096 8.16).
    const ClusterLaunch x_launch(dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(m_rows), 1), kXPlanesThreads,
                                 0, 1, stream, device.major >= 9 && m_rows == 1);
    error = cudaLaunchKernelEx(&x_launch.config, x_planes_kernel<T>, x, k, chunks, planes, groups);
    if (error != cudaSuccess) return error;
  }
  // programmatic dependent launch (sm_90): the W loads overlap x_planes_kernel
  const ClusterLaunch launch(dim3(static_cast<unsigned>(blocks), 1, 1),
                             kPlaneThreads * split, smem, slices, stream, device.major >= 9);
  error = cudaLaunchKernelEx(&launch.config, kernel, w_bits, static_cast<const uint32_t*>(planes),
                             static_cast<const PlaneGroup*>(groups), static_cast<int>(m_rows), n_rows, words,
                             static_cast<int>(slices), plan.slice_chunks, ep, out);
  return error != cudaSuccess ? error : cudaGetLastError();
}

template <typename T>
cudaError_t binary_weight_planes(const T* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows, int64_t k,
                                 const Epilogue& ep, T* out, const PlanePlan& plan, void* workspace, int sm_count,
                                 const WeightLinearTuning& tuning, cudaStream_t stream) {
  static_assert(kPlaneMaxRows == 4, "one instantiation a row count up to kPlaneMaxRows");
  if (m_rows <= 1)
    return binary_weight_planes_launch<T, 1>(x, w_bits, m_rows, n_rows, k, ep, out, plan, workspace, sm_count, tuning, stream);
  if (m_rows <= 2)
    return binary_weight_planes_launch<T, 2>(x, w_bits, m_rows, n_rows, k, ep, out, plan, workspace, sm_count, tuning, stream);
  if (m_rows <= 3)
    return binary_weight_planes_launch<T, 3>(x, w_bits, m_rows, n_rows, k, ep, out, plan, workspace, sm_count, tuning, stream);
  return binary_weight_planes_launch<T, 4>(x, w_bits, m_rows, n_rows, k, ep, out, plan, workspace, sm_count, tuning, stream);
}

template <typename InT>
cudaError_t binary_weight_linear_tc_typed(const InT* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                          int64_t k, const Epilogue& ep, InT* out, int sm_count, const WeightLinearTuning& tuning,
                                          void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if constexpr (std::is_same<InT, float>::value) {
    const int64_t rows = tuning.rows_per_pass > 0 ? tuning.rows_per_pass : m_rows;
    if (rows <= 8) return binary_weight_linear_tc_aligned<float, __nv_bfloat16, 3, 1, 1>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, tuning, stream);
    return binary_weight_linear_tc_aligned<float, __nv_bfloat16, 3, 2, 1>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, tuning, stream);
  } else {
    if (tuning.kernel != 1) {
      const PlanePlan plan = plan_planes(m_rows, n_rows, k, sm_count, tuning);
      if (plan.slices > 0 && reinterpret_cast<uintptr_t>(w_bits) % 16 == 0 && workspace != nullptr &&
          workspace_bytes >= planes_workspace_bytes(m_rows, k)) {
        const cudaError_t result =
            binary_weight_planes(x, w_bits, m_rows, n_rows, k, ep, out, plan, workspace, sm_count, tuning, stream);
        if (result != cudaErrorNotSupported) return result;  // not supported: no cluster of that size here
        (void)cudaGetLastError();
      }
    }
    const int64_t rows = tuning.rows_per_pass > 0 ? tuning.rows_per_pass : m_rows;
    if (rows <= 8) return binary_weight_linear_tc_aligned<InT, InT, 1, 1, 2>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, tuning, stream);
    if (rows <= 16 && m_rows >= kGroupsMinRows && m_rows <= kGroupsMaxRows && workspace != nullptr &&
        workspace_bytes >= groups_workspace_bytes(m_rows, k)) {
      return binary_weight_linear_prepared(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, tuning, workspace, stream);
    }
    if (rows <= 16) return binary_weight_linear_tc_aligned<InT, InT, 1, 2, 2>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, tuning, stream);
    return binary_weight_linear_tc_aligned<InT, InT, 1, 4, 2>(x, w_bits, m_rows, n_rows, k, ep, out, sm_count, tuning, stream);
  }
}

// dequantize_signs: W as s(w) * scale in x's type, for cuBLAS at large M.
constexpr int kDequantThreads = 256;

// One thread a 16-byte piece of an output row (8 bf16/fp16 or 4 fp32 values), consecutive threads consecutive
// pieces: every warp store writes 512 contiguous bytes. (The first version took a packed word a thread, 4 x 16 bytes
// with threads 64 bytes apart, so each store instruction wrote half of every sector it touched: on the H200,
// dequantize + cuBLAS at M = 257, N = K = 8192 took ~167 us against ~50 us for the bf16 GEMM alone.)
// Rows of k % (16 / sizeof(T)) != 0 store value by value. Grid: x = rows, y (with a loop) = pieces of a row.
template <typename T>
__global__ __launch_bounds__(kDequantThreads) void dequantize_signs_kernel(const uint32_t* __restrict__ w_bits,
                                                                           int64_t k, int64_t words,
                                                                           const float* __restrict__ scale,
                                                                           int64_t scale_count, T* __restrict__ out) {
  constexpr int V = 16 / sizeof(T);
  const int64_t row = blockIdx.x;
  const float magnitude = scale != nullptr ? scale[scale_count == 1 ? 0 : row] : 1.f;
  const T plus = from_float<T>(magnitude);
  const T minus = from_float<T>(-magnitude);
  const uint32_t* row_bits = w_bits + row * words;
  T* row_out = out + row * k;
  const int64_t pieces = ceil_div(k, V);
  const bool vector = k % V == 0;  // rows 16-byte aligned (out is)
  for (int64_t piece = static_cast<int64_t>(blockIdx.y) * kDequantThreads + threadIdx.x; piece < pieces;
       piece += static_cast<int64_t>(gridDim.y) * kDequantThreads) {
    const int64_t first = piece * V;
    const uint32_t bits = __ldg(row_bits + first / 32) >> (first % 32);  // V divides 32: one word
    union {
      uint4 vector;
      T values[V];
    } pack;
#pragma unroll
    for (int j = 0; j < V; ++j) pack.values[j] = (bits >> j) & 1u ? plus : minus;
    if (vector) {
      reinterpret_cast<uint4*>(row_out)[piece] = pack.vector;
    } else {
      for (int j = 0; j < V && first + j < k; ++j) row_out[first + j] = pack.values[j];
    }
  }
}

template <typename T>
cudaError_t dequantize_signs_typed(const uint32_t* w_bits, int64_t n_rows, int64_t k, const float* scale,
                                   int64_t scale_count, T* out, cudaStream_t stream) {
  const int64_t pieces = ceil_div(k, 16 / static_cast<int64_t>(sizeof(T)));
  const int64_t row_blocks = ceil_div(pieces, kDequantThreads);
  if (n_rows > INT_MAX) return cudaErrorInvalidValue;
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(n_rows), static_cast<unsigned>(row_blocks < 65535 ? row_blocks : 65535), 1);
  dequantize_signs_kernel<T><<<grid, kDequantThreads, 0, stream>>>(w_bits, k, ceil_div(k, 32), scale, scale_count, out);
  return cudaGetLastError();
}

// bf16/fp16 x of more than kWgmmaMinRows rows runs on the wgmma kernel where it applies. H200, us per call in a
// rotating CUDA graph, N = K = 8192 bf16 (2026-12-01), pass kernel against wgmma's tile for that M: M = 16 22.6 / 30.5,
// 32 37.4 / 31.6, 64 66.1 / 31.7, 128 75.1 / 44.3 (N = 4096, K = 11008, M = 128: 93.2 / 60.8). (2026-12-04: the
// pass kernel at M = 16 17.6 us, the wgmma kernel's 32-row tile at M = 17 21.6.)
constexpr int64_t kWgmmaMinRows = 16;
// Rows of x up to which bit planes on the b1 wgmma (binary_weight_planes_wgmma.cu) take bf16 / fp16 x.
constexpr int64_t kPlanesWgmmaMaxRows = 32;

// Where the bit planes on the b1 wgmma beat the kernels below (H200, harness graph us, main / planes, 2026-12-05,
// benchmarks/kernels/pending/planes_rule.sweep and planes_plan.sweep, planes on the tile plan of
// binary_weight_planes_wgmma.cu):
// - 2..8 rows from 2^25 weights: 8192^2 M = 2 8.68 / 8.40, 8 13.47 / 11.52; 16384^2 M = 4 29.91 / 14.75; 8192 x 28672
//   M = 4 36.70 / 16.59; 4096 x 11008 M = 8 14.08 / 11.37; 12288 x 4096 M = 4 9.74 / 7.79; 11008 x 4096 M = 2 7.55 /
//   6.74. Not 4096^2 (M = 8 7.06 / 9.16), nor M = 1 but at 16384^2 (8192^2 7.26 / 8.12, 4096 x 11008 6.57 / 7.78).
// - 9..32 rows from 2^23 weights (H100, main 64412e4 with the cheaper epilogue, 2026-12-07, graph us best of two,
//   pending/planes_pays.sweep, the kernels below / planes on the plan's tile): 12288 x 4096 M = 12 13.40 / 10.27,
//   M = 16 14.76 / 10.98, M = 24 20.29 / 17.97, M = 32 20.24 / 18.36; 11008 x 4096 M = 16 12.39 / 10.69, M = 24
//   20.06 / 12.37; 8192 x 4096 M = 16 11.89 / 8.74; 4096^2 M = 12 9.26 / 6.51, M = 32 10.87 / 8.50; 2048 x 8192 M = 9
//   9.43 / 8.52; 4096 x 2048 M = 16 7.69 / 5.56; 2048 x 4096 M = 9 7.36 / 7.16, M = 32 9.58 / 6.82. Below 2^23 not
//   measured. (On the H200 before the epilogue's rewrite, 2026-12-05, these lost at K = 4096 below 2^26: 12288 x 4096
//   M = 16 13.88 / 14.25, 11008 x 4096 M = 16 11.88 / 14.09; from 2^26 they won: 8192^2 M = 16 15.94 / 13.10, 16384^2
//   M = 16 44.18 / 27.45, 28672 x 8192 M = 32 63.66 / 58.48.)
bool planes_wgmma_pays(int64_t m_rows, int64_t n_rows, int64_t k) {
  const int64_t weights = n_rows * k;
  if (m_rows < 2 || m_rows > kPlanesWgmmaMaxRows) return false;
  return weights >= (int64_t(1) << (m_rows <= 8 ? 25 : 23));
}

// binary_weight_linear_fused_rows: where the binding switches to dequantize_signs + cuBLAS, placed by H200 sweeps
// (N = K = 8192 bf16, 2026-12-01). wgmma (the warp-specialized kernel), harness us L2 flushed / graph:
// M = 1024 170 / 175, 2048 336 / 363, 4096 666 / 728, against cuBLAS alone 179 / ~360 / 688 plus ~64 of
// dequantization; both grow linearly, so the kernel keeps its ~60 us lead to about M = 8192 (not measured past
// 4096: the switch sits there). Pass kernel (other GPUs): 94.7 us at M = 128 and 164.9 at 160 (do_bench),
// dequantize + cuBLAS 117.7 at 257. fp32 x (three-way bf16 split on the tensor cores): 2048, not placed by a sweep.
constexpr int64_t kFusedRowsWgmma = 4096;
constexpr int64_t kFusedRowsPass = 128;
constexpr int64_t kFusedRowsFp32 = 2048;

// Remainder rows: bf16/fp16 x of M > 256 rows whose last 128-row tile holds r <= 16 rows runs as two launches,
// the first M - r rows on the wgmma kernels and the last r on the small-M kernels (bit planes up to kPlaneMaxRows
// rows, else the pass kernel), where binary_weight_wgmma_splits_tail says the wgmma tiling of M - r rows costs less
// (one row past 256 takes a second 256-row tile; at 385 the tiling of 384 rows is the same). H200, bf16, alpha
// vector, us in a rotating graph (2026-12-02), split / one launch: N = K = 8192: M = 257 63.9 / 119.7, 259 68.9 /
// 125.5, 272 74.9 / 114.0, 513 102.1 / 166.8, 1025 188.2 / 277.5; 11008 x 4096: 385 70.8 / 94.5; N = K = 4096: 513
// 42.4 / 50.1. Kept as one launch by the rule, where the split lost: N = K = 8192 at 385 (99.7 / 89.4) and 400
// (110.9 / 89.4), N = K = 4096 at 257 (52.6 / 32.8), N = 4096, K = 11008 at 257 (87.3 / 88.1) and 272 (98.4 / 93.0).
constexpr int64_t kRemainderTile = 128;
constexpr int64_t kRemainderMaxRows = 16;
inline int64_t remainder_rows(FloatType type, int64_t m_rows) {  // the candidate; the launcher asks the cost rule
  if (type == FloatType::kFloat32 || m_rows <= 2 * kRemainderTile) return 0;
  const int64_t r = m_rows % kRemainderTile;
  return r <= kRemainderMaxRows ? r : 0;
}

}  // namespace

size_t binary_weight_linear_workspace_bytes(FloatType type, int64_t m_rows, int64_t k) {
  const int64_t remainder = remainder_rows(type, m_rows);  // room for the remainder's bit planes, split or not
  if (remainder > 0) m_rows = remainder;
  if (type == FloatType::kFloat32 || m_rows < 1 || !valid_sizes(m_rows, k)) return 0;
  size_t bytes = m_rows <= kPlaneMaxRows ? planes_workspace_bytes(m_rows, k)
                 : m_rows >= kGroupsMinRows && m_rows <= kGroupsMaxRows ? groups_workspace_bytes(m_rows, k) : 0;
  // Room for forced bit planes (kernel 4) up to 64 rows, to measure them against the bf16 wgmma kernel.
  if (m_rows <= 2 * kPlanesWgmmaMaxRows)
    bytes = std::max(bytes, binary_weight_planes_wgmma_workspace_bytes(m_rows, k));
  return bytes;
}

cudaError_t launch_binary_weight_linear(const void* x, FloatType type, const uint32_t* w_bits, int64_t m_rows,
                                        int64_t n_rows, int64_t k, const Epilogue& epilogue, void* out,
                                        void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                        const WeightLinearTuning* tuning) {
  const WeightLinearTuning chosen = tuning != nullptr ? *tuning : WeightLinearTuning{};
  if (!valid_sizes(m_rows, k) || n_rows < 0) return cudaErrorInvalidValue;
  if (m_rows == 0 || n_rows == 0) return cudaSuccess;
  DeviceFacts device;  // the SM count sizes the K splits (cached per device)
  const cudaError_t facts = current_device_facts(device);
  if (facts != cudaSuccess) return facts;
  const int sm_count = device.sm_count;
  const int64_t remainder = chosen.kernel == 0 && chosen.remainder >= 0 ? remainder_rows(type, m_rows) : 0;
  if (remainder > 0 && binary_weight_wgmma_splits_tail(type, m_rows, remainder, n_rows, k, sm_count)) {
    WeightLinearTuning whole = chosen;
    whole.remainder = -1;  // no second split
    const int64_t head = m_rows - remainder;
    const size_t element = type == FloatType::kFloat32 ? 4 : 2;
    cudaError_t error = launch_binary_weight_linear(x, type, w_bits, head, n_rows, k, epilogue, out, nullptr, 0,
                                                    stream, &whole);
    if (error != cudaSuccess) return error;
    Epilogue tail = epilogue;
    if (tail.row_factor != nullptr) tail.row_factor += head;
    return launch_binary_weight_linear(static_cast<const char*>(x) + head * k * element, type, w_bits, remainder,
                                       n_rows, k, tail, static_cast<char*>(out) + head * n_rows * element,
                                       workspace, workspace_bytes, stream, &whole);
  }
  // Few rows (bf16 / fp16) of large weights: x as bit planes on the b1 wgmma where it applies (kernel 4 forces it).
  const bool forced_planes = chosen.kernel == 4;
  if (forced_planes ||
      (chosen.kernel == 0 && type != FloatType::kFloat32 && planes_wgmma_pays(m_rows, n_rows, k))) {
    const cudaError_t result = launch_binary_weight_planes_wgmma(x, type, w_bits, m_rows, n_rows, k, epilogue, out,
                                                                 sm_count, chosen, workspace, workspace_bytes, stream);
    if (result != cudaErrorNotSupported || forced_planes) return result;
    (void)cudaGetLastError();  // not here: the kernels below
  }
  const bool forced_wgmma = chosen.kernel == 2 || chosen.kernel == 3;  // 3: the wgmma kernel; 2 (deleted): refused there
  if (forced_wgmma || (chosen.kernel == 0 && type != FloatType::kFloat32 && m_rows > kWgmmaMinRows)) {
    const cudaError_t result =
        launch_binary_weight_wgmma(x, type, w_bits, m_rows, n_rows, k, epilogue, out, sm_count, chosen, stream);
    if (result != cudaErrorNotSupported || forced_wgmma) return result;
    (void)cudaGetLastError();  // not here (no sm_90a, k % 64, alignment): the pass kernel
  }
  switch (type) {
    case FloatType::kFloat32:
      return binary_weight_linear_tc_typed(static_cast<const float*>(x), w_bits, m_rows, n_rows, k, epilogue,
                                           static_cast<float*>(out), sm_count, chosen, workspace, workspace_bytes, stream);
    case FloatType::kFloat16:
      return binary_weight_linear_tc_typed(static_cast<const __half*>(x), w_bits, m_rows, n_rows, k, epilogue,
                                           static_cast<__half*>(out), sm_count, chosen, workspace, workspace_bytes, stream);
    case FloatType::kBFloat16:
      return binary_weight_linear_tc_typed(static_cast<const __nv_bfloat16*>(x), w_bits, m_rows, n_rows, k, epilogue,
                                           static_cast<__nv_bfloat16*>(out), sm_count, chosen, workspace, workspace_bytes, stream);
  }
  return cudaErrorInvalidValue;
}

int64_t binary_weight_linear_fused_rows(FloatType type, int64_t k) {
  if (type == FloatType::kFloat32) return kFusedRowsFp32;
  return binary_weight_wgmma_applies(type, k) ? kFusedRowsWgmma : kFusedRowsPass;
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
