// binary_weight_linear on Hopper wgmma: the kernel that launch_binary_weight_linear (binary_weight_linear.cu) runs
// for bf16 / fp16 x of more than 16 rows on a compute capability 9.0 device, in a build with sm_90a code; the
// binding runs up to binary_weight_linear_fused_rows = 4096 rows through it and dequantize + cuBLAS above.
// y[m][n] = sum_k x[m][k] * s(w[n][k]), then the Epilogue; fp32 accumulation, output of x's type. Needs k % 64 == 0,
// 16-byte aligned x, 8-byte aligned w_bits, 2-byte aligned out: otherwise the launcher answers cudaErrorNotSupported
// before launching and launch_binary_weight_linear takes the tensor-core pass kernel.
// One kernel, binary_weight_wgmma_ws_kernel: wgmma_ws.cuh's warp-specialized block (a producer warp with TMA for x
// and W, an mbarrier ring of 128-k stages, two consumer warpgroups; its header is the pipeline) with
// SignWeights below; the tile (rows of x, 64-feature slabs a warpgroup) and the launches by wgmma_ws_dispatch.
// (An all-threads kernel, every thread copying into a cp.async ring, served M = 17..128 until 2026-12-04; the
// warp-specialized block on 32- and 64-row tiles beat it at every shape measured, and it was deleted.)
//
// ---- Roles of the operands -----------------------------------------------------------------------------------
// wgmma.mma_async.m64nNk16 computes D[64][N] += A[64][16] * B[16][N]. Here
//   A = 64 output features (rows of W) x 16 k, expanded from the sign bits in registers (the RS form: A from
//       registers, the only form that needs no shared-memory copy of the expanded weights),
//   B = BN rows of x (N = BN = 32, 64, 128, 192 or 256) x 16 k, from shared memory through a matrix descriptor,
//   D = features x rows of x: thread-private fp32 accumulators, written out transposed (y is [rows][features]).
// Block tile (rows BN, slabs SLABS): two consumer warpgroups of SLABS 64-feature slabs each, so a block owns
// FEAT = 128 * SLABS features and BN rows of x; warpgroup wg, slab s owns features n0 + 64 (SLABS wg + s) + [0, 64),
// within it warp w rows 16w..16w+15 (the fragment layout). Accumulators: SLABS x BN / 2 floats a thread.
// Grid: x = feature blocks * slices (a cluster of `slices` blocks splits K, reduced through DSMEM), y = row blocks.
//
// ---- B (x) in shared memory: K-major, 128-byte swizzle -------------------------------------------------------
// A stage holds two TMA boxes of x, [BN rows][64 k] each (bf16/fp16: 128 bytes a row), at 1024-byte aligned
// addresses (CU_TENSOR_MAP_SWIZZLE_128B; rows past M zero-filled):
//   row r, 16-byte chunk c (k 8c..8c+7) at  r * 128 + ((c ^ (r & 7)) * 16)
// i.e. 8-row x 128-byte swizzle atoms (1024 bytes) stacked along N; a core matrix (8 rows x 16 bytes) is chunk c of
// 8 consecutive rows. Descriptor (PTX "matrix descriptor"): start address >> 4 in bits 0-13, leading byte offset
// (LBO) >> 4 in 16-29 = 1 (unused for swizzled K-major layouts), stride byte offset (SBO) >> 4 in 32-45 = 1024 >> 4
// (the next 8 rows), base offset 0 (atoms 1024-aligned), bits 62-63 = 1 (128-byte swizzle). k16 step kk of a box
// starts at box + 32 kk (the hardware XORs address bits 4-6 with bits 7-9, which is the layout above). imm-trans-b =
// 0 (B K-major). After the boxes there are FEAT x 16 bytes of W: feature f's four words of the 128-k tile at f * 16.
//
// ---- A (W) fragment: k natural, 3 ops a register (csrc/cuda/wgmma_fragment.cuh, checked on the host by
// benchmarks/kernels/wgmma_fragment_check.cpp) ------------------------------------------------------------------
// Lane l (g = l >> 2, t = l & 3) of warp w holds rows g and g + 8 of the warp's 16 features; reg0/reg2 = row g,
// k 2t,2t+1 / 8+2t,8+2t+1 of the k16 step, reg1/reg3 the same for row g + 8 (as mma.sync m16n8k16's A). Word q of
// a row (k 32q..32q+31 of the tile) gives k16 steps 2q and 2q + 1; chunk c of the word (bits 8c..8c+7) is
// reg0/reg1 (c even) or reg2/reg3 (c odd) of step 2q + (c >> 1). The x layout is natural k, so no permutation.
// A lane reads its 4 words of a row of a slab (rows g, g + 8) with one LDS.128 each.
//
// ---- Checking a change ------------------------------------------------------------------------------------------
// 0. Without a GPU: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DBITCOMPILE_SM90A=1 -I csrc -Xptxas
//    -v -c csrc/cuda/binary_weight_wgmma.cu -o x.o: no spills and no C7510 / C7513 ("wgmma serialized") line; then
//    cuobjdump -sass x.o > x.sass && python3 benchmarks/kernels/hgmma_a_check.py x.sass: "ok" for every kernel (no
//    write to the A registers of an in-flight HGMMA); benchmarks/kernels/wgmma_fragment_check.cpp checks the A
//    fragment expansion on the host.
// 1. H200: harness --sweep benchmarks/kernels/w1a16_wgmma.sweep (one block and one 128-k tile first, then the half
//    tile, the ring wrapping, split K, multicast pairs, odd M and N, fp16, the refusals, a planted error). A wrong
//    output with structure (it depends on the feature index mod 16 or the x row mod 8) is the fragment / swizzle
//    layout (x one-hot in k shows which (feature, k) each output picked up); NaN or garbage that changes from run to
//    run is the pipeline: build with -DWGMMA_SERIALIZE=1, and if that fixes it, a race.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "binary_weight_wgmma.cuh"
#include "device_common.cuh"
#include "wgmma_common.cuh"
#include "wgmma_fragment.cuh"
#include "wgmma_rs.cuh"
#include "wgmma_ws.cuh"

namespace bitcompile {
namespace cuda {
namespace {

// Sign bits as the Weights of wgmma_ws_block: four words (k 0..127) a feature a stage; A by wgmma_fragment.cuh (the
// header's "A (W) fragment"). kTma: the stage's W by one TMA box (16-byte rows: k % 128 == 0, w_bits 16-byte
// aligned); else by the producer lanes' cp.async (ws_copy).
template <typename T, bool kTma>
struct SignWeights {
  using Word = uint32_t;
  static constexpr int kWsTileBytes = 16;  // a 128-k tile
  static constexpr bool kWsTma = kTma;
  static __host__ __device__ __forceinline__ int64_t row_stride(int k) { return k / 32; }
#if BC_WGMMA_ENABLED
  template <int SLABS, int kAcc>
  __device__ __forceinline__ void finish(float (&)[SLABS][kAcc]) const {}  // +-1 needs no scale
  // ---- the warp-specialized block (wgmma_ws.cuh) ----
  template <int kFeatures>
  static __device__ __forceinline__ void ws_copy(const uint32_t* __restrict__ w_bits, int64_t words, uint32_t w_area,
                                                 int j, bool half, int64_t n0, int n_rows, int lane) {
    // Feature n0 + f (f = lane, lane + 32, ...) -> 16 bytes at w_area + 16 f. Few registers (40 in the producer): one
    // running row pointer, not unrolled.
    uint32_t w_dst = w_area + lane * 16;
    const uint32_t* row = w_bits + (n0 + lane) * words + j * 4;
    int64_t left = n_rows - n0 - lane;  // features of this lane's rounds still inside N
#pragma unroll 1
    for (int round = 0; round < kFeatures / 32; ++round, w_dst += 32 * 16, row += 32 * words, left -= 32) {
      const bool inside = left > 0;  // features past N: zero-filled (their outputs are not written)
      const uint32_t* src = inside ? row : w_bits;
      // 8-byte rows (k % 128 == 64) or a w_bits off 16 bytes: the 16-byte rows come by TMA (kTma)
      cp_async_8(w_dst, src, inside ? 8u : 0u);
      cp_async_8(w_dst + 8, src + (half ? 0 : 2), inside && !half ? 8u : 0u);
    }
  }
  template <int SLABS>
  struct WsRows {
    uint4 g[SLABS], h[SLABS];  // words 0..3 (k 0..127) of rows g and g + 8 of each slab
  };
  template <int SLABS>
  __device__ __forceinline__ void ws_rows(const uint8_t* w_stage, int w_row, WsRows<SLABS>& rows) const {
#pragma unroll
    for (int slab = 0; slab < SLABS; ++slab) {
      rows.g[slab] = *reinterpret_cast<const uint4*>(w_stage + (w_row + 64 * slab) * 16);
      rows.h[slab] = *reinterpret_cast<const uint4*>(w_stage + (w_row + 64 * slab + 8) * 16);
    }
  }
  // Word q of a uint4 (q a constant after unrolling).
  static __device__ __forceinline__ uint32_t word_of(const uint4& v, int q) {
    return q == 0 ? v.x : (q == 1 ? v.y : (q == 2 ? v.z : v.w));
  }
  template <int SLABS>
  __device__ __forceinline__ void ws_step(const WsRows<SLABS>& rows, int kk, int t, uint32_t (&a)[SLABS][4]) const {
    constexpr uint32_t minus_one =
        std::is_same<T, __half>::value ? wgmma_frag::kMinusOneF16 : wgmma_frag::kMinusOneBf16;
#pragma unroll
    for (int slab = 0; slab < SLABS; ++slab) {
      // k16 step kk is half (kk & 1) of word kk / 2: chunks 0, 1 (lo) or 2, 3 (hi) of the word.
      const uint32_t word_g = word_of(rows.g[slab], kk >> 1), word_h = word_of(rows.h[slab], kk >> 1);
      const uint32_t lo_g = wgmma_frag::split_lo(word_g, t), hi_g = wgmma_frag::split_hi(word_g, t);
      const uint32_t lo_h = wgmma_frag::split_lo(word_h, t), hi_h = wgmma_frag::split_hi(word_h, t);
      if (kk & 1) {
        wgmma_frag::step_registers<1>(lo_g, hi_g, lo_h, hi_h, minus_one, a[slab]);
      } else {
        wgmma_frag::step_registers<0>(lo_g, hi_g, lo_h, hi_h, minus_one, a[slab]);
      }
    }
  }
#endif
};

// ================================================================================================================
// The kernel (binary_weight_wgmma_ws_kernel; WeightLinearTuning kernel = 3 forces it where kernel 0 would not take
// it): wgmma_ws.cuh's block (its header is the design: a producer warp with TMA for x and W, an mbarrier ring of
// 128-k stages, two consumer warpgroups) with SignWeights: the tile's 4 words a feature (16 bytes at f * 16; one TMA
// box of 4 words x the block's features where k % 128 == 0 and w_bits is 16-byte aligned, else the producer lanes'
// two 8-byte cp.async a feature; 2026-12-05, H100 graph us, cp.async / TMA, 2 passes: M = 17 22.24 / 21.53, 128
// 30.29 / 28.83, 2048 357.95 / 342.92, 4096 x 11008 M = 1024 109.07 / 106.78, 28672 x 8192 M = 32 63.65 / 58.93),
// a consumer lane's rows g and g + 8 of each slab by LDS.128 when the tile is full (k 0..127), k16 step kk = half
// kk & 1 of word kk / 2 (wgmma_fragment.cuh). The highest register in the SASS: (64, 2) R152, (128, 1) R119, (128, 2) R215,
// (256, 1) R183. Stages: (64, 2) 20 KiB x 8, (128, 1) 34 KiB x 6, (128, 2) 36 KiB x 6, (256, 1) 66 KiB x 3.
// L2 -> SM bytes a stage: x 2 * BN * 128 and W FEAT * 16 (32 with the unused half of each 32-byte sector): (128, 2)
// 32 + 8 KiB per 2048 clk = 20 B/clk an SM, 5.2 TB/s over 132 SMs at 1.98 GHz at the full tensor rate; (256, 1)
// 64 + 4 KiB, 34 B/clk; x re-reads from L2 = (N / FEAT) * M * K * 2.
// ================================================================================================================
template <typename T, int BN, int SLABS, int MC, bool kTma>
__global__ void __launch_bounds__(384, 1)
    binary_weight_wgmma_ws_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                                  const uint32_t* __restrict__ w_bits, int m_rows, int n_rows, int k, int slices,
                                  Epilogue ep, T* __restrict__ out) {
#if BC_WGMMA_ENABLED
  wgmma_ws_block<T, BN, SLABS, MC, SignWeights<T, kTma>>(map_x, &map_w, w_bits, [] { return SignWeights<T, kTma>{}; },
                                                         m_rows, n_rows, k, slices, ep, out);
#else
  __trap();  // no sm_90a code: never launched (binary_weight_wgmma_applies: BITCOMPILE_SM90A)
#endif
}

template <int BN, int SLABS>
using SignWsShape = WsShape<BN, SLABS, SignWeights<__half, true>::kWsTileBytes>;

template <typename T, int BN, int SLABS, int MC>
cudaError_t sign_ws_launch(const T* x, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows, int64_t k,
                            const Epilogue& ep, T* out, int sm_count, int slices_wanted, cudaStream_t stream) {
  // W as a [n, k / 32] word matrix, boxes of a tile's 4 words x the block's features, where its rows are 16-byte
  // multiples (k % 128 == 0) and w_bits is 16-byte aligned; else 8-byte cp.async (the map unused).
  CUtensorMap map_w{};
  const bool tma = k % 128 == 0 && (reinterpret_cast<uintptr_t>(w_bits) & 15u) == 0 &&
                   encode_tiled_map(&map_w, CU_TENSOR_MAP_DATA_TYPE_UINT32, w_bits, n_rows, k / 32, k / 8, 4,
                                    SignWsShape<BN, SLABS>::kFeatures, CU_TENSOR_MAP_SWIZZLE_NONE);
  if (tma) {
    return cuda::wgmma_ws_launch<SignWsShape<BN, SLABS>, binary_weight_wgmma_ws_kernel<T, BN, SLABS, MC, true>, MC>(
        x, map_w, w_bits, m_rows, n_rows, k, ep, out, sm_count, slices_wanted, stream);
  }
  return cuda::wgmma_ws_launch<SignWsShape<BN, SLABS>, binary_weight_wgmma_ws_kernel<T, BN, SLABS, MC, false>, MC>(
      x, map_w, w_bits, m_rows, n_rows, k, ep, out, sm_count, slices_wanted, stream);
}

// The cluster room (cluster_room) of the warp-specialized kernel's (rows, slabs) tile, for the cost model.
template <typename T, int BN, int SLABS>
cudaError_t ws_room(ClusterRoom& room) {
  return prepare_wgmma_launch<SignWsShape<BN, SLABS>, binary_weight_wgmma_ws_kernel<T, BN, SLABS, 1, true>>(room);
}
template <typename T>
cudaError_t sign_ws_rooms(WsRooms& rooms) {
  return cuda::ws_rooms<SignWsShape<128, 1>, binary_weight_wgmma_ws_kernel<T, 128, 1, 1, true>, SignWsShape<192, 1>,
                        binary_weight_wgmma_ws_kernel<T, 192, 1, 1, true>, SignWsShape<256, 1>,
                        binary_weight_wgmma_ws_kernel<T, 256, 1, 1, true>>(rooms);
}
// Block times, in (128, 1) block times: H200, N = K = 8192 bf16, graph us (2026-12-04, ws_tiles.sweep): one wave of
// (128, 1) blocks 52.2 us (M = 256), of (192, 1) blocks 64.3 (M = 384), of (256, 1) blocks 83.1 (M = 512).
constexpr WsBlockTimes kSignBlockTimes{1.23, 1.59};
// (32, 1) (32, 2) (64, 1) (64, 2): us a 128-k tile (wgmma_ws.cuh, beside kWsSmallFixedTiles).
constexpr WsSmallTimes kSignSmallTimes{0.54, 0.87, 0.60, 1.04};

// Tiles (rows, slabs) of the kernel (always 2 consumer warpgroups): (32, 1) (32, 2) (64, 1) (64, 2) (128, 1) (128, 2)
// (192, 1) (256, 1). From M: one row block of 32 or 64 rows up to M = 64, 1 or 2 slabs by ws_small_slabs
// (kSignSmallTimes), then wgmma_ws.cuh's cost model: one launch or two (ws_split_head), each on (128, 1), (192, 1) or
// (256, 1) (ws_rows_by_cost). H200, bf16, us in a rotating graph:
// - M = 17..64 (2026-12-04, pending/w1a16_small_tiles.sweep), the deleted all-threads kernel / this tiling, M = 32:
//   8192^2 31.3 / 21.6, 4096 x 11008 35.6 / 25.9, 11008 x 4096 26.8 / 19.8, 28672 x 8192 100.4 / 63.6, 4096^2 17.1 /
//   12.8; M = 64: 8192^2 31.4 / 24.1, 28672 x 8192 100.9 / 73.1.
// - M = 96 / 128 (2026-12-04, pending/w1a16_mid_m.sweep), the all-threads kernel / (128, 1): 8192^2 43.3 / 29.4,
//   44.3 / 30.0; 4096 x 11008 55.0 / 37.2, 55.3 / 37.7; 11008 x 4096 41.9 / 28.1, 42.5 / 28.4; 28672 x 8192 159.5 /
//   102.7, 162.0 / 103.6; 4096^2 23.8 / 17.3, 24.5 / 17.7.
// - N = K = 8192 (2026-12-01): M = 129 (128, 2) 56.1; 192 / 256 / 384 / 512 (256, 1) 45.9 / 47.5 / 83.5 / 83.8
//   against (128, 1) 51.4 / 51.6 / 102.8 / 101.7; 640 / 768 (128, 1) 154.3 / 162.2 against (256, 1) 167.2 / 169.3;
//   1024 (256, 1) 183.2 against (128, 1) 222.2. N = 4096 (2026-12-02, the K split by cluster room): M = 192 / 256
//   (128, 1) x 2 slices 21.8 / 22.2 against (256, 1) x 2 31.4 / 32.7 and x 4 (two waves) 41.0 / 43.9. (2026-12-04)
//   M = 320 / 384 / 576 / 768 / 1152 (192, 1) 63.5 / 64.9 / 129.3 / 137.2 / 219.3 against 98.1 / 82.7 / 156.0 /
//   155.1 / 259.0 on (256, 1) or (128, 1); 11008 x 4096 M = 384 47.3 against 67.4.
// Multicast pairs (tuning.multicast; 0: where the K split would be 1) for (128, 2) only, the tile that multicast = 2
// then takes at any M; a pair the device refuses falls back to one block a feature block.
template <typename T>
cudaError_t wgmma_ws_dispatch(const T* x, const uint32_t* w_bits, int64_t m, int64_t n, int64_t k, const Epilogue& ep,
                              T* out, int sm_count, const WeightLinearTuning& tuning, cudaStream_t stream) {
  int rows = tuning.rows_per_pass, slabs = tuning.slabs;
  if (tuning.multicast < 0 || tuning.multicast > 2) return cudaErrorInvalidValue;
  if (rows == 0) {
    if (tuning.multicast == 2) {  // forced pairs: the one tile they are instantiated for, whatever M
      rows = 128;
      slabs = 2;
    } else if (m <= 64) {  // one row block of 32 or 64 rows, 1 or 2 slabs (ws_small_slabs)
      rows = ws_small_rows(m);
      ClusterRoom room1, room2;
      cudaError_t error = rows == 32 ? ws_room<T, 32, 1>(room1) : ws_room<T, 64, 1>(room1);
      if (error == cudaSuccess) error = rows == 32 ? ws_room<T, 32, 2>(room2) : ws_room<T, 64, 2>(room2);
      if (error != cudaSuccess) return error;
      slabs = ws_small_slabs(rows, n, k, sm_count, room1, room2, kSignSmallTimes);
    } else {
      WsRooms rooms;
      const cudaError_t error = sign_ws_rooms<T>(rooms);
      if (error != cudaSuccess) return error;
      const int64_t head = tuning.head != 0 ? tuning.head : ws_split_head(m, n, k, sm_count, rooms, kSignBlockTimes);
      if (head > 0 && head < m) {  // two launches, each with its tile
        WeightLinearTuning once = tuning;
        once.head = -1;
        const cudaError_t first = wgmma_ws_dispatch(x, w_bits, head, n, k, ep, out, sm_count, once, stream);
        if (first != cudaSuccess) return first;
        Epilogue rest = ep;
        if (rest.row_factor != nullptr) rest.row_factor += head;
        return wgmma_ws_dispatch(x + head * k, w_bits, m - head, n, k, rest, out + head * n, sm_count, once, stream);
      }
      rows = ws_rows_by_cost(m, n, k, sm_count, rooms, kSignBlockTimes);
      slabs = 1;
    }
  }
  if (slabs == 0) slabs = rows >= 192 ? 1 : 2;
  if (rows == 128 && slabs == 2) {
    using Shape = SignWsShape<128, 2>;
    const int64_t blocks = ceil_div(n, Shape::kFeatures) * ceil_div(m, 128);
    ClusterRoom room;
    const cudaError_t room_error = ws_room<T, 128, 2>(room);
    if (room_error != cudaSuccess) return room_error;
    const bool pair = tuning.multicast == 2 ||
                      (tuning.multicast == 0 && tuning.slices <= 1 &&
                       split_k_slices(blocks, ceil_div(k, 128), sm_count, room, tuning.slices) == 1);
    if (pair) {
      const cudaError_t error = sign_ws_launch<T, 128, 2, 2>(x, w_bits, m, n, k, ep, out, sm_count, 1, stream);
      if (error != cudaErrorNotSupported) return error;
      (void)cudaGetLastError();
    }
    return sign_ws_launch<T, 128, 2, 1>(x, w_bits, m, n, k, ep, out, sm_count, tuning.slices, stream);
  }
  if (tuning.multicast == 2) return cudaErrorInvalidValue;  // not instantiated
#define BC_CASE(BN, SLABS)      \
  if (rows == BN && slabs == SLABS) \
    return sign_ws_launch<T, BN, SLABS, 1>(x, w_bits, m, n, k, ep, out, sm_count, tuning.slices, stream);
  BC_CASE(32, 1)
  BC_CASE(32, 2)
  BC_CASE(64, 1)
  BC_CASE(64, 2)
  BC_CASE(128, 1)
  BC_CASE(192, 1)
  BC_CASE(256, 1)
#undef BC_CASE
  return cudaErrorInvalidValue;  // a tile that is not instantiated
}

}  // namespace

bool binary_weight_wgmma_applies(FloatType type, int64_t k) {
  if (!BITCOMPILE_SM90A || type == FloatType::kFloat32 || k <= 0 || k % 64 != 0 || k > INT_MAX / 2) return false;
  DeviceFacts device;
  if (current_device_facts(device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return wgmma_device(device);
}

bool binary_weight_wgmma_splits_tail(FloatType type, int64_t m_rows, int64_t tail, int64_t n_rows, int64_t k,
                                     int sm_count) {
  if (tail <= 0 || m_rows - tail <= kWsSplitMinRows || !binary_weight_wgmma_applies(type, k)) return false;
  // The tile wgmma_ws_dispatch takes, its K split past 2 counted as 2 (fitted before the cluster room: at N = K = 4096
  // the 256 rows' 4 slices in two waves made the split lose, 52.6 us at M = 257 against 32.8 in one launch; with the
  // room the 256 rows cost (128, 1) x 2 slices, this rule splits M = 257 and the op measured 31.2).
  WsRooms rooms;
  const cudaError_t error =
      type == FloatType::kBFloat16 ? sign_ws_rooms<__nv_bfloat16>(rooms) : sign_ws_rooms<__half>(rooms);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const auto cost = [&](int64_t rows) {
    return ws_tiling_cost(rows, n_rows, k, ws_rows_by_cost(rows, n_rows, k, sm_count, rooms, kSignBlockTimes), sm_count,
                          rooms, kSignBlockTimes, 2);
  };
  return cost(m_rows - tail) < cost(m_rows);
}

cudaError_t launch_binary_weight_wgmma(const void* x, FloatType type, const uint32_t* w_bits, int64_t m_rows,
                                       int64_t n_rows, int64_t k, const Epilogue& epilogue, void* out, int sm_count,
                                       const WeightLinearTuning& tuning, cudaStream_t stream) {
  if (!binary_weight_wgmma_applies(type, k) || m_rows < 0 || n_rows < 0 || m_rows > INT_MAX || n_rows > INT_MAX)
    return cudaErrorNotSupported;
  if ((reinterpret_cast<uintptr_t>(x) & 15u) != 0 || (reinterpret_cast<uintptr_t>(w_bits) & 7u) != 0 ||
      (reinterpret_cast<uintptr_t>(out) & 1u) != 0)
    return cudaErrorNotSupported;
  if (tuning.kernel != 0 && tuning.kernel != 3) return cudaErrorInvalidValue;  // 3: forced (2 was the all-threads kernel)
  if (m_rows == 0 || n_rows == 0) return cudaSuccess;
  if (type == FloatType::kBFloat16) {
    return wgmma_ws_dispatch(static_cast<const __nv_bfloat16*>(x), w_bits, m_rows, n_rows, k, epilogue,
                             static_cast<__nv_bfloat16*>(out), sm_count, tuning, stream);
  }
  return wgmma_ws_dispatch(static_cast<const __half*>(x), w_bits, m_rows, n_rows, k, epilogue,
                           static_cast<__half*>(out), sm_count, tuning, stream);
}

}  // namespace cuda
}  // namespace bitcompile
