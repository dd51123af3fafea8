// apot_linear on Hopper wgmma: 4-bit APoT codes through a level table, for bf16 / fp16 x of more than 16 rows on a
// compute capability 9.0 device, in a build with sm_90a code. First H200 run (tenth session, 2026-12-01): every apot
// row of the sweep failed the harness's fp32 reference by ~1% of an output, with no layout pattern: the table was
// rounded to bf16 on the claim that APoT levels are dyadic (apot4's are multiples of 0.1). Now planned by
// apot_frag::plan_table (exact integers where the table allows it) and the harness's reference rounds as the kernel
// does. Second H200 run (eleventh session, 2026-12-02): benchmarks/kernels/apot_wgmma.sweep 0 rows failed, the CUDA
// apot tests 584 passed; the op (apot_ops.cpp) calls it for kSmallBatchRows < M <= kWgmmaMaxRows.
// One kernel, apot_wgmma_ws_kernel: wgmma_ws.cuh's warp-specialized block (a producer warp, TMA for x and the codes,
// 128-k stages of 64 code bytes a feature, two consumer warpgroups) with NibbleWeights below (thirty-third session,
// 2026-12-04: M = 256 at 8192^2 81.1 -> 59.7 us against the all-threads kernel of then, at 4096 x 11008 103.4 -> 58.4;
// ncu at M = 256: SM throughput 58% against the sign-bit kernel's 73%, 16.6 M instructions issued against 10.7 M, issue
// slots 29% busy; the table in kWgmmaMaxRows' comment, apot_kernels.cuh). The all-threads kernel (wgmma_rs.cuh's old
// cp.async block) served M = 17..64 until the thirty-fifth session, when 32- and 64-row tiles of this one beat it by
// 7-13% at five shapes; it was deleted.
//
// y[m][n] = alpha[n or 0] * sum_k x[m][k] * level(code[n][k]) + bias[n], fp32 accumulation, output of x's type. The
// 2^bits table entries (bits 1..4; a code past the table reads as 0) enter the MMA in x's type: exact where they are
// small integer multiples of one value (the APoT schemes, apot_fragment.cuh plan_table), else rounded to x's type
// (the dequantize + cuBLAS path's rounding); alpha and bias in the fp32 epilogue.
//
// ---- The machine: binary_weight_wgmma.cu's (its header comment has the operands' roles and layouts) -------------
// A = 64 output features x 16 k in registers (RS-form wgmma.mma_async.m64nNk16), B = BN rows of x in shared memory
// (128-byte swizzle, two TMA boxes a 128-k stage), fp32 accumulators, cluster split-K through DSMEM, the Epilogue
// (scale = alpha, bias). What differs is the weights (NibbleWeights below):
//   W in a stage: feature f's 64 bytes of the tile (128 codes, pack_codes nibbles) at f * 64, chunk q of it at
//   16 (q ^ ((f >> 1) & 3)): one TMA box a stage (the block's features x 64 bytes, SWIZZLE_64B) issued by the
//   producer's lane 0 beside x's; features past N and the half tile's k 64..127 read as zeros (code 0: never written
//   out). A consumer lane reads rows g and g + 8 of its slab with four LDS.128 each (the 4 lanes of a quad read the
//   same row: broadcast; the swizzle puts a warp's 8 rows on 8 different bank groups).
//   Until the forty-fifth session the producer warp's 32 lanes copied the codes by cp.async (16 x 16 bytes a lane a
//   stage at 256 rows) and the rows sat unswizzled (4-way bank conflicts). Knockouts measured first (H100, graph us,
//   8192^2, M = 256 / 512 / 1024): main 59.7 / 106.6 / 232.7, no code loads at tile start 57.3 / 102.2 / 210.6, no
//   code copies 49.3 / 87.7 / 175.1 (W1A16 on the same pipeline 49.3 / 85.6 / 178.9). The TMA box (H100, same
//   process, apot_wgmma.sweep and timing rows, every check passed): 59.9 -> 52.8, 107.7 -> 89.0, 220.7 -> 181.9;
//   M = 2048 456.2 -> 385.1; M = 17 / 32 / 64 / 128 35.7 / 36.0 / 38.5 / 44.5 -> 27.8 / 27.9 / 30.6 / 36.3;
//   4096 x 11008 M = 256 56.1 -> 46.7, M = 1024 146.0 -> 113.9.
//   A: apot_fragment.cuh (checked on the host by benchmarks/kernels/apot_fragment_check.cpp): per row and k16 step a
//   gather prmt of byte t of the step's two words, then 2 x (2 lookups + 1 pick) prmt over the low- and high-byte
//   tables (8 registers a thread, built once from code_values) and 2 interleaving prmt: 12 instructions for 2 A
//   registers (6 a register, sign bits 3).
// Needs k % 64 == 0, 16-byte aligned x and w_packed, 2-byte aligned y.
//
// ---- Checking it on the H200 (first) ----------------------------------------------------------------------------
//   bash benchmarks/kernels/build.sh
//   benchmarks/kernels/build/harness --sweep benchmarks/kernels/apot_wgmma.sweep
// Correctness rows first (one block and one tile, then the ring wrapping, split K, odd M / N, fp16, bits 2 / 3,
// alpha / bias, the refusals, a planted error); a wrong output with structure in feature % 16 or k % 16 is the
// fragment (check apot_fragment_check first), NaN / run-to-run noise is the pipeline (-DWGMMA_SERIALIZE=1).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "apot_fragment.cuh"
#include "apot_kernels.cuh"
#include "device_common.cuh"
#include "wgmma_common.cuh"
#include "wgmma_rs.cuh"
#include "wgmma_ws.cuh"

namespace bitcompile {
namespace apot {
namespace {

using cuda::Epilogue;

// The kernel's weight operand: the nibble codes and their table.
struct NibbleCodes {
  const uint8_t* codes;      // [n][k / 2]
  const float* code_values;  // 2^bits entries
  int bits;
};

// Nibble codes as the Weights of wgmma_ws_block: 64 bytes (128 codes) a feature a stage; A by apot_fragment.cuh from
// the thread's copy of the table.
template <typename T>
struct NibbleWeights {
  using Word = uint8_t;
  static constexpr int kWsTileBytes = 64;  // a 128-k tile
  static constexpr bool kWsTma = true;     // W by a TMA box a stage (ws_launch's map_w), SWIZZLE_64B
  apot_frag::Table table;
#if BC_WGMMA_ENABLED
  float unscale;  // the accumulators' factor after the MMA (apot_frag::plan_table: base, or 2^e)
  // The table of 16 entries in T's bits (past 2^bits: 0), read by every thread (64 bytes, cached), planned by
  // apot_frag::plan_table: integer multiples of one base (the APoT schemes) enter exact, any other table scaled by a
  // power of two and rounded to T.
  __device__ __forceinline__ explicit NibbleWeights(const NibbleCodes& w) {
    float values[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) values[e] = e < (1 << w.bits) ? w.code_values[e] : 0.f;
    const apot_frag::TablePlan plan =
        apot_frag::plan_table(values, std::is_same<T, __half>::value ? 2048.f : 256.f);
    unscale = plan.unscale;
    uint16_t entries[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      if constexpr (std::is_same<T, __half>::value) {
        entries[e] = __half_as_ushort(__float2half_rn(plan.scaled[e]));
      } else {
        entries[e] = __bfloat16_as_ushort(__float2bfloat16_rn(plan.scaled[e]));
      }
    }
    table = apot_frag::make_table(entries);
  }
  template <int SLABS>
  struct WsRows {
    uint4 g[SLABS][4], h[SLABS][4];  // the tile's 64 bytes (k 0..127) of rows g and g + 8 of each slab
  };
  // Chunk q (16 bytes, k 32q..32q+31) of feature f lies at f * 64 + 16 (q ^ ((f >> 1) & 3)): SWIZZLE_64B on the
  // 1024-byte aligned W area (address bits 7-8 into 4-5). The 8 rows g of a warp's LDS.128 then hit 8 different
  // 16-byte bank groups (unswizzled, rows 64 bytes apart: 4-way conflicts). Rows g and g + 8 share the pattern.
  template <int SLABS>
  __device__ __forceinline__ void ws_rows(const uint8_t* w_stage, int w_row, WsRows<SLABS>& rows) const {
    const int swizzle = (w_row >> 1) & 3;
#pragma unroll
    for (int slab = 0; slab < SLABS; ++slab)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int chunk = 16 * (q ^ swizzle);
        rows.g[slab][q] = *reinterpret_cast<const uint4*>(w_stage + (w_row + 64 * slab) * 64 + chunk);
        rows.h[slab][q] = *reinterpret_cast<const uint4*>(w_stage + (w_row + 64 * slab + 8) * 64 + chunk);
      }
  }
  template <int SLABS>
  __device__ __forceinline__ void ws_step(const WsRows<SLABS>& rows, int kk, int t, uint32_t (&a)[SLABS][4]) const {
    const uint32_t gather = apot_frag::gather_selector(t);
#pragma unroll
    for (int slab = 0; slab < SLABS; ++slab) {  // step kk: bytes 8 kk .. 8 kk + 7 = half kk & 1 of chunk kk / 2
      const uint4& g = rows.g[slab][kk >> 1];
      const uint4& h = rows.h[slab][kk >> 1];
      if (kk & 1) {
        apot_frag::step_registers(g.z, g.w, h.z, h.w, gather, table, a[slab]);
      } else {
        apot_frag::step_registers(g.x, g.y, h.x, h.y, gather, table, a[slab]);
      }
    }
  }
  template <int SLABS, int kAcc>
  __device__ __forceinline__ void finish(float (&acc)[SLABS][kAcc]) const {
#pragma unroll
    for (int slab = 0; slab < SLABS; ++slab)
#pragma unroll
      for (int v = 0; v < kAcc; ++v) acc[slab][v] *= unscale;
  }
#endif
};

template <typename T, int BN>  // one 64-feature slab a consumer warpgroup
__global__ void __launch_bounds__(384, 1)
    apot_wgmma_ws_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                         NibbleCodes w, int m_rows, int n_rows, int k, int slices, Epilogue ep,
                         T* __restrict__ out) {
#if BC_WGMMA_ENABLED
  cuda::wgmma_ws_block<T, BN, 1, 1, NibbleWeights<T>>(map_x, &map_w, w.codes, [&] { return NibbleWeights<T>(w); },
                                                      m_rows, n_rows, k, slices, ep, out);
#else
  __trap();  // no sm_90a code: never launched (linear_wgmma: BITCOMPILE_SM90A)
#endif
}

template <int BN>
using NibbleWsShape = cuda::WsShape<BN, 1, NibbleWeights<__half>::kWsTileBytes>;

template <typename T, int BN>
cudaError_t ws_launch(const T* x, const NibbleCodes& w, int64_t m, int64_t n, int64_t k, const Epilogue& ep, T* out,
                      int sm_count, int slices, cudaStream_t stream) {
  // The codes as a [n, k / 2] byte matrix, boxes of a tile's 64 bytes x the block's features, SWIZZLE_64B.
  CUtensorMap map_w;
  if (!cuda::encode_tiled_map(&map_w, CU_TENSOR_MAP_DATA_TYPE_UINT8, w.codes, n, k / 2, k / 2,
                              NibbleWeights<T>::kWsTileBytes, NibbleWsShape<BN>::kFeatures,
                              CU_TENSOR_MAP_SWIZZLE_64B)) {
    return cudaErrorNotSupported;
  }
  return cuda::wgmma_ws_launch<NibbleWsShape<BN>, apot_wgmma_ws_kernel<T, BN>, 1>(x, map_w, w, m, n, k, ep, out,
                                                                                   sm_count, slices, stream);
}

// The kernel's tile (always 1 slab a warpgroup: (64, 2) and (128, 2) lost to the all-threads kernel of then, and
// (128, 2) spills with the tile's codes in registers): as asked, else one row block of 32 rows up to M = 32, of
// 64 up to 64, (128, 1) up to M = 128, then wgmma_ws.cuh's cost model (one launch or two, each on (128, 1), (192, 1) or (256, 1); kNibbleBlockTimes). H200, N = K = 8192 bf16,
// apot4, graph us (2026-12-04): M = 32 (32, 1) against the all-threads kernel (pending/small_m_tiles2.sweep) 35.6 /
// 41.0, 4096 x 11008 46.1 / 52.3, 11008 x 4096 34.7 / 40.0, 28672 x 8192 130.6 / 150.0, 4096^2 19.8 / 22.6; M = 64
// (64, 1) 38.1 / 41.9 (4096 x 11008 49.1 / 52.5); M = 128 (128, 1) 44.6 against (128, 2) 85.3; M = 256 (256, 1) 59.6 against (128, 1)
// 83.2; M = 384 / 768 (192, 1) 93.4 / 192.1 against 107.1 / 248.6 on (256, 1).
// Block times, in (128, 1) block times (ws_tiles.sweep): one wave of (128, 1) blocks 83.9 us (M = 256), of (192, 1)
// 92.6 (M = 384), of (256, 1) 106.6 (M = 512).
constexpr cuda::WsBlockTimes kNibbleBlockTimes{1.10, 1.27};
template <typename T>
cudaError_t ws_dispatch(const T* x, const NibbleCodes& w, int64_t m, int64_t n, int64_t k, const Epilogue& ep, T* out,
                        int sm_count, const WgmmaTuning& tuning, cudaStream_t stream) {
  int rows = tuning.rows;
  if (rows == 0 && m <= 64) rows = cuda::ws_small_rows(m);  // one row block of 32 or 64 rows (1 slab: see above)
  if (rows == 0 && m <= 128) rows = 128;
  if (rows == 0) {
    cuda::WsRooms rooms;
    const cudaError_t error =
        cuda::ws_rooms<NibbleWsShape<128>, apot_wgmma_ws_kernel<T, 128>, NibbleWsShape<192>,
                       apot_wgmma_ws_kernel<T, 192>, NibbleWsShape<256>, apot_wgmma_ws_kernel<T, 256>>(rooms);
    if (error != cudaSuccess) return error;
    const int64_t head =
        tuning.head != 0 ? tuning.head : cuda::ws_split_head(m, n, k, sm_count, rooms, kNibbleBlockTimes);
    if (head > 0 && head < m) {  // two launches, each with its tile
      WgmmaTuning once = tuning;
      once.head = -1;
      const cudaError_t first = ws_dispatch(x, w, head, n, k, ep, out, sm_count, once, stream);
      if (first != cudaSuccess) return first;
      return ws_dispatch(x + head * k, w, m - head, n, k, ep, out + head * n, sm_count, once, stream);
    }
    rows = cuda::ws_rows_by_cost(m, n, k, sm_count, rooms, kNibbleBlockTimes);
  }
  if (rows == 32) return ws_launch<T, 32>(x, w, m, n, k, ep, out, sm_count, tuning.slices, stream);
  if (rows == 64) return ws_launch<T, 64>(x, w, m, n, k, ep, out, sm_count, tuning.slices, stream);
  if (rows == 128) return ws_launch<T, 128>(x, w, m, n, k, ep, out, sm_count, tuning.slices, stream);
  if (rows == 192) return ws_launch<T, 192>(x, w, m, n, k, ep, out, sm_count, tuning.slices, stream);
  if (rows == 256) return ws_launch<T, 256>(x, w, m, n, k, ep, out, sm_count, tuning.slices, stream);
  return cudaErrorInvalidValue;  // a tile that is not instantiated
}

}  // namespace

// apot_ops.cpp calls this for bf16 / fp16 x with kSmallBatchRows < M <= kWgmmaMaxRows and bits <= 4; on
// cudaErrorNotSupported (not a 9.0 device with sm_90a code, k % 64 != 0, misaligned operands) it keeps dequantize +
// cuBLAS, which stays the path for fp32 x, byte codes and larger M too.
cudaError_t linear_wgmma(const void* x, FloatType x_type, int64_t m, int64_t k, const uint8_t* w_packed, int64_t n,
                         int bits, const float* code_values, const float* alpha, int64_t alpha_count,
                         const float* bias, void* y, cudaStream_t stream, const WgmmaTuning* tuning) {
  if (!BITCOMPILE_SM90A || x_type == FloatType::kFloat32 || bits < 1 || bits > 4) return cudaErrorNotSupported;
  if (k <= 0 || k % 64 != 0 || k > INT_MAX / 2 || m < 0 || n < 0 || m > INT_MAX || n > INT_MAX)
    return cudaErrorNotSupported;
  if (alpha != nullptr && alpha_count != 1 && alpha_count != n) return cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(x) & 15u) != 0 || (reinterpret_cast<uintptr_t>(w_packed) & 15u) != 0 ||
      (reinterpret_cast<uintptr_t>(y) & 1u) != 0)
    return cudaErrorNotSupported;
  cuda::DeviceFacts device;
  cudaError_t error = cuda::current_device_facts(device);
  if (error != cudaSuccess) return error;
  if (!cuda::wgmma_device(device)) return cudaErrorNotSupported;
  if (m == 0 || n == 0) return cudaSuccess;
  const WgmmaTuning chosen = tuning != nullptr ? *tuning : WgmmaTuning{};
  if (chosen.kernel != 0 && chosen.kernel != 3) return cudaErrorInvalidValue;  // 3: forced (2 was the all-threads kernel)
  Epilogue ep;
  ep.scale = alpha;
  ep.scale_count = alpha != nullptr ? alpha_count : 0;
  ep.bias = bias;
  const NibbleCodes w{w_packed, code_values, bits};
  if (x_type == FloatType::kBFloat16) {
    return ws_dispatch(static_cast<const __nv_bfloat16*>(x), w, m, n, k, ep, static_cast<__nv_bfloat16*>(y),
                       device.sm_count, chosen, stream);
  }
  return ws_dispatch(static_cast<const __half*>(x), w, m, n, k, ep, static_cast<__half*>(y), device.sm_count, chosen,
                     stream);
}

}  // namespace apot
}  // namespace bitcompile
