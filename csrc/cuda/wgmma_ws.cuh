// The warp-specialized RS-form wgmma block of the W1A16-style kernels (binary_weight_wgmma.cu: sign bits;
// apot_wgmma.cu: 4-bit APoT codes; each op's one wgmma kernel, from M = 17). The operands' roles and layouts are
// binary_weight_wgmma.cu's header comment, the RS wrappers and the end of a block wgmma_rs.cuh's; here: who moves the
// data (a producer warp: TMA for x, TMA or cp.async for W, an mbarrier ring), the stage (128 k), how the steps wait for
// each other, the launch, and the cost model of the tiles. What differs between the kernels is the Weights policy:
//   Word, kWsTileBytes                           the weights' element type in global memory; bytes of one feature's
//                                                weights in a 128-k tile (in the stage: feature f at f * kWsTileBytes)
//   kWsTma                                       true: W comes as one TMA box a stage (the kernel's map_w: the
//                                                block's features x kWsTileBytes, from byte j * kWsTileBytes of a
//                                                row, the map's coordinates in Words; past N and past K zeros),
//                                                issued by the producer's lane 0; false: by the producer warp's
//                                                cp.async (ws_copy)
//   row_stride(k)                                (kWsTma false) Words a feature (a row of w)
//   ws_copy<kFeatures>(w, stride, w_area, j, half, n0, n_rows, lane)   (kWsTma false) static, the producer
//                                                warp: lane's cp.async copies of tile j of the block's features
//                                                (past N: zeros; half: only k 0..63 of the tile exist); few
//                                                registers (40)
//   WsRows<SLABS>, ws_rows(w_stage, w_row, rows) a consumer lane's part of the stage's weights (row w_row of its
//                                                first slab and + 8, of each slab), read when the tile is full
//   ws_step(rows, kk, t, a)                      the 4 A registers a slab of k16 step kk (0..7) of the tile
//   finish(acc)                                  the accumulators' factor after the MMA (before the epilogue)
// The kernel builds the policy object in its consumer warps only (make_weights()), so a table the policy holds
// costs the producer no registers.
//
// ---- Roles (384 threads: warps 0-7 two consumer warpgroups, warps 8-11 the producer warpgroup) -----------------
// Producer (warp 8; warps 9-11 only take part in the cluster barriers of the end): for each 128-k tile of its K
//   slice, waits until the ring stage is free (empty[s]); lane 0 posts the x bytes (arrive.expect_tx) and issues the
//   TMA copies of the x tile, two boxes of BN rows x 64 k (one 128-byte swizzle row each, SWIZZLE_128B: the layout
//   the B descriptor reads; rows past M zero-filled) and, with kWsTma, the W box; otherwise all 32 lanes cp.async
//   the tile's W (Weights::ws_copy) and arrive on full[s] once their copies have landed
//   (cp.async.mbarrier.arrive.noinc). No __syncthreads in the loop.
// Consumers (warpgroup wg = 0, 1 with SLABS slabs of 64 features): for each tile wait full[s]; read the lane's W of
//   the tile (Weights::ws_rows); then 8 k16 steps, each one wgmma group: wgmma.wait_group(F) (F = kStepsInFlight),
//   expand the step's A (Weights::ws_step, 4 registers a slab), wgmma.fence, SLABS wgmmas m64nBNk16 (B: box kk / 4,
//   + 32 (kk % 4) bytes), commit. So F steps of a warpgroup stay in flight while the next is expanded, and none of
//   their A registers is rewritten: each unrolled step has its own registers, and step kk of tile i + 1 reuses those
//   of step kk of tile i, retired by the wait F + 1 <= 8 steps later (benchmarks/kernels/hgmma_a_check.py checks the
//   SASS). After the wait of step F of tile i every step of tile i - 1 is complete: lane 0 of each consumer warp
//   arrives on empty[(i - 1) % S].
//
// ---- Protocol (S stages; tile i of the slice in stage s = i % S, round r = i / S) --------------------------------
//   full[s]  count 1 + 32: lane 0's arrive.expect_tx (the tile's x bytes) + the x TMA's complete_tx, and one
//            arrival a producer lane from cp.async.mbarrier.arrive.noinc when that lane's W copies have landed; with
//            kWsTma count 1: the expect_tx covers the W box too.
//   empty[s] count 8 (x MC): lane 0 of each consumer warp (of each block the stage's x goes to), once tile i's
//            wgmmas are complete (step F of tile i + 1).
//   producer: for i >= S wait empty[s] parity (r - 1) & 1 (the release of tile i - S), then the copies; at the end
//            it waits for the full phases of its last S tiles (with slices == 1 it leaves before the consumers).
//   consumer: wait full[s] parity r & 1.
//   Watchdog build (-DBITCOMPILE_WGMMA_WATCHDOG): role 0 the producer on empty[s], 1 a consumer on full[s], 2 the
//   producer's tail on full[s]; step = the tile of the slice.
//   The last tile of a slice is never released (nobody waits for it). With k % 128 == 64 the last tile of K is half:
//   one x box (the producer posts half the bytes), the W of k 64..127 zero-filled, 4 steps; it is always the last
//   tile of its slice and runs in its own unrolled instance after the loop (a break out of the unrolled steps made
//   ptxas serialize every wgmma: C7513).
//   TMA writes (async proxy) are read by wgmma (async proxy) after the mbarrier wait; cp.async writes are read by LDS
//   after it; a stage is refilled only after the wgmmas that read it completed, and with them the LDS that fed their
//   A. After the loop: wait_group(0), named barrier 1 (the 256 consumers), fp32 tile (aliasing the ring; the
//   barriers lie past both), store_accumulators and finish_tile, the producer warpgroup joining only the two cluster
//   barriers. MC = 2: the two blocks of a cluster pair share x (each TMA-multicasts one box of the stage into both).
//
// ---- Budgets (an SM: 64K registers in 4 sub-partitions of 16K, 227 KiB shared memory; one block) ----------------
//   Registers: with a producer warp alone (288 threads, __launch_bounds__(288, 1)) ptxas capped every thread at 168,
//   as for 384 (warps are spread over the 4 sub-partitions of 16K registers: 3 warps on one, 16384 / 96 -> 168);
//   hence a whole producer warpgroup and setmaxnreg: 168 at entry, producer 40, consumers 232 (40 + 232 + 232 = 504
//   <= 512 a sub-partition lane). A consumer holds SLABS * BN / 2 accumulators, up to (F + 1) * 4 * SLABS A
//   registers (ptxas keeps all 8 steps' apart: 8 * 4 * SLABS), the tile's W of its rows and addresses.
//   Shared memory, a stage = x 2 * BN * 128 + W FEAT * kWsTileBytes bytes, kStages of them (at most 8); the fp32 tile
//   BN x (FEAT + 4) x 4 aliases the ring.
//   Tensor time a stage (the SM's ~2048 dense bf16 MAC/clk: m64nBNk16 holds it BN / 2 clk): 8 x SLABS x 2 x BN / 2 =
//   (64, 2) 1024, (128, 1) 1024, (128, 2) 2048, (256, 1) 2048 clk. In flight a warpgroup: F = 3 steps of SLABS x BN /
//   2 clk at (128, 2) and (256, 1), F = 6 at (64, 2) and (128, 1): 384 clk of tensor work either way.
#pragma once

#include <cooperative_groups.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "device_common.cuh"
#include "wgmma_common.cuh"
#include "wgmma_rs.cuh"

namespace bitcompile {
namespace cuda {

template <int BN, int SLABS, int kWTileBytes>
struct WsShape {
  static constexpr int kConsumerThreads = 256;                   // two consumer warpgroups (warps 0-7)
  static constexpr int kThreads = kConsumerThreads + 128;        // + the producer warpgroup (warps 8-11)
  static constexpr int kRows = BN;                               // rows of x a block
  static constexpr int kFeatures = 64 * SLABS * 2;               // features a block
  static constexpr int kSteps = 8;                               // k16 steps a stage (128 k)
  static constexpr int kXBoxBytes = BN * 128;                    // one TMA box: BN rows x 64 k
  static constexpr int kXBytes = 2 * kXBoxBytes;
  static constexpr int kWBytes = kFeatures * kWTileBytes;
  static constexpr int kStageBytes = (kXBytes + kWBytes + 1023) / 1024 * 1024;
  static constexpr int kPartialStride = kFeatures + 4;           // floats a row of the fp32 tile (+4: no conflicts)
  static constexpr int kPartialBytes = BN * kPartialStride * 4;
  static constexpr int kStagesFit = (227 * 1024 - 1024 - 256) / kStageBytes;  // - alignment slack - barriers
  static constexpr int kStages = kStagesFit > 8 ? 8 : kStagesFit;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr int kBarOffset = kRingBytes > kPartialBytes ? kRingBytes : kPartialBytes;  // full[S], empty[S]
  static constexpr size_t kSmemBytes = kBarOffset + 16 * kStages + 1024;                    // + alignment slack
  // k16 steps (one wgmma group each) a warpgroup keeps in flight while it expands the next one: 3 x SLABS x BN / 2
  // = 384 clk of tensor work at (128, 2) and (256, 1); 6 x 64 = 384 at (64, 2) and (128, 1).
  static constexpr int kStepsInFlight = SLABS * BN <= 128 ? 6 : 3;
  static_assert(SLABS * BN <= 256, "accumulators: SLABS * BN / 2 registers a thread");
  static_assert(kStages >= 3, "ring depth");
  static_assert(kStepsInFlight < kSteps, "tile i - 1 is released during tile i");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static_assert(kFeatures % 32 == 0, "W copies: whole rounds of the producer warp");
};

#if BC_WGMMA_ENABLED
// Arrives on the mbarrier once every cp.async this thread issued before it has landed; .noinc: the barrier's
// expected count includes this arrival.
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// The whole block (the header's Roles and Protocol). Launched by wgmma_ws_launch with 384 threads, one block an SM.
template <typename T, int BN, int SLABS, int MC, typename Weights, typename MakeWeights>
__device__ __forceinline__ void wgmma_ws_block(const CUtensorMap& map_x, const CUtensorMap* map_w,
                                               const typename Weights::Word* __restrict__ w, MakeWeights make_weights,
                                               int m_rows, int n_rows, int k, int slices,
                                               const Epilogue& ep, T* __restrict__ out) {
  using Shape = WsShape<BN, SLABS, Weights::kWsTileBytes>;
  constexpr int S = Shape::kStages, kFeatures = Shape::kFeatures;
  // full[s]: lane 0's expect_tx (+ one cp.async arrival a producer lane where W is not a TMA box)
  constexpr int kFullArrivals = Weights::kWsTma ? 1 : 1 + 32;
  constexpr int kEmptyArrivals = 8 * MC;  // empty[s]: one a consumer warp of each block that the stage's x goes to
  // setmaxnreg: 168 registers at entry (384 threads, one block); then a sub-partition holds one warp of each
  // warpgroup: 40 + 232 + 232 = 504 <= 512 registers a lane (16K a sub-partition).
  constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
  extern __shared__ uint8_t smem_raw[];
  // 1024-byte aligned ring (the swizzle atoms); the generic pointer and the shared address move together.
  const uint32_t raw_address = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw_address + 1023u) & ~1023u;
  uint8_t* const smem = smem_raw + (base - raw_address);
  const uint32_t full_bar = base + Shape::kBarOffset;  // full[s] at full_bar + 8 s
  const uint32_t empty_bar = full_bar + 8 * S;         // empty[s] at empty_bar + 8 s

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rank = static_cast<int>(blockIdx.x) % slices;  // the cluster is `slices` blocks along x
  const int total_tiles = (k + 127) / 128;  // 128-k tiles; with k % 128 == 64 the last one is half
  const int half_tile = k % 128 != 0 ? total_tiles - 1 : -1;
  const int per_slice = (total_tiles + slices - 1) / slices;
  const int tile_begin = rank * per_slice;
  const int tiles = max(0, min(total_tiles, tile_begin + per_slice) - tile_begin);

  if (tid == 0) init_stage_ring(full_bar, empty_bar, S, kFullArrivals, kEmptyArrivals);
  namespace cg = cooperative_groups;
  if (MC > 1) {
    cg::this_cluster().sync();  // the peer's barriers are initialized before any multicast or arrival reaches them
  } else {
    __syncthreads();
  }

  if (warp >= 8) {
    // ---- producer warpgroup: warp 8 copies, warps 9-11 only take part in the cluster barriers ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (warp == 8) {
      const int64_t n0 = static_cast<int64_t>(blockIdx.x / slices) * kFeatures;
      const int m0 = static_cast<int>(blockIdx.y) * BN;
      int s = 0;
      uint32_t phase = 0;  // of round i / S
      for (int i = 0; i < tiles; ++i) {
        if (i >= S) mbar_wait(empty_bar + 8 * s, phase ^ 1u, 0, i);  // round i / S - 1 released it
        const int j = tile_begin + i;                                 // absolute 128-k tile
        const bool half = j == half_tile;
        const uint32_t stage = base + static_cast<uint32_t>(s * Shape::kStageBytes), full = full_bar + 8 * s;
        if (lane == 0) {
          // x (rows past M: zeros, counted) and, for a TMA W, its box (features past N and the half tile's k 64..127:
          // zeros, counted)
          const int x_bytes = half ? Shape::kXBoxBytes : Shape::kXBytes;
          mbar_arrive_expect_tx(full, x_bytes + (Weights::kWsTma ? Shape::kWBytes : 0));
          if constexpr (Weights::kWsTma) {
            constexpr int kTileWords = Weights::kWsTileBytes / static_cast<int>(sizeof(typename Weights::Word));
            tma_load_2d(stage + Shape::kXBytes, map_w, j * kTileWords, static_cast<int>(n0), full);
          }
          if (MC == 1) {
            tma_load_2d(stage, &map_x, j * 128, m0, full);
            if (!half) tma_load_2d(stage + Shape::kXBoxBytes, &map_x, j * 128 + 64, m0, full);
          } else {  // box r of the stage by cluster rank r, into both blocks
            const uint32_t box = cluster_cta_rank();
            if (box == 0 || !half) {
              tma_load_2d_multicast(stage + box * Shape::kXBoxBytes, &map_x, j * 128 + 64 * box, m0, full, 3);
            }
          }
        }
        if constexpr (!Weights::kWsTma) {
          Weights::template ws_copy<kFeatures>(w, Weights::row_stride(k), stage + Shape::kXBytes, j, half, n0, n_rows,
                                               lane);
          cp_async_mbarrier_arrive_noinc(full);
        }
        if (++s == S) {
          s = 0;
          phase ^= 1u;
        }
      }
      // Tail: the last (up to S) tiles' copies have landed before the producer may leave (with slices == 1 it
      // exits here while the consumers still work). Nothing refills those stages, so their phases stay put.
      for (int i = max(0, tiles - S); i < tiles; ++i) mbar_wait(full_bar + 8 * (i % S), (i / S) & 1u, 2, i);
    }
    if (slices > 1) {  // the two cluster barriers of finish_tile
      cg::this_cluster().sync();
      cg::this_cluster().sync();
    }
    if (MC > 1) cg::this_cluster().sync();  // the consumers' last one
  } else {
    // ---- consumer warpgroups ----
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
    const Weights weights = make_weights();
    // WGMMA_SERIALIZE=1 (debug builds): no step in flight while the next is expanded, each stage released as soon as
    // the next tile starts: a result that changes with it points at a race (A registers, stage reuse), not a layout.
    constexpr int kInFlight = WGMMA_SERIALIZE ? 0 : Shape::kStepsInFlight;
    const int wg = warp >> 2, g = lane >> 2, t = lane & 3;  // warpgroup, fragment row group, lane in quad
    float acc[SLABS][BN / 2];
#pragma unroll
    for (int slab = 0; slab < SLABS; ++slab)
#pragma unroll
      for (int v = 0; v < BN / 2; ++v) acc[slab][v] = 0.f;
    // This lane's W rows within a stage's W area: feature 64 (SLABS wg + slab) + 16 (warp % 4) + g (and + 8).
    const int w_row = 64 * SLABS * wg + 16 * (warp & 3) + g;
    int s = 0, previous_s = 0;
    uint32_t phase = 0;
    // Tile i of the slice in kSteps k16 steps (8: a whole tile; 4: the half tile, k 0..63). The half tile runs in
    // its own instance after the loop: its A registers are not the loop's, and no path leads from it back into the
    // loop (a break out of the unrolled steps did: ptxas then serialized every wgmma, C7513).
    auto consume = [&](int i, auto steps) {
      constexpr int kSteps = decltype(steps)::value;
      mbar_wait(full_bar + 8 * s, phase, 1, i);
      const uint32_t stage = base + static_cast<uint32_t>(s * Shape::kStageBytes);
      typename Weights::template WsRows<SLABS> rows;
      weights.ws_rows(smem + s * Shape::kStageBytes + Shape::kXBytes, w_row, rows);
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {  // one wgmma group a k16 step
        wgmma_wait<kInFlight>();  // step kk - kInFlight - 1 (of this tile or the previous one) is complete
        if (kk == kInFlight && i > 0 && lane == 0) {  // tile i - 1 complete: its stage is free, here and in the peer
          mbar_arrive(empty_bar + 8 * previous_s);
          if (MC > 1) mbar_arrive_cluster(empty_bar + 8 * previous_s, cluster_cta_rank() ^ 1u);
        }
        uint32_t a[SLABS][4];
        weights.ws_step(rows, kk, t, a);
#pragma unroll
        for (int slab = 0; slab < SLABS; ++slab)
#pragma unroll
          for (int v = 0; v < BN / 2; ++v) fence_operand(acc[slab][v]);
        wgmma_fence();
        const uint64_t desc = sw128_descriptor(stage + (kk >> 2) * Shape::kXBoxBytes + 32 * (kk & 3));
#pragma unroll
        for (int slab = 0; slab < SLABS; ++slab) WgmmaRs<T, BN>::run(acc[slab], a[slab], desc);
        wgmma_commit();
#pragma unroll
        for (int slab = 0; slab < SLABS; ++slab)
#pragma unroll
          for (int v = 0; v < BN / 2; ++v) fence_operand(acc[slab][v]);
      }
      previous_s = s;
      if (++s == S) {
        s = 0;
        phase ^= 1u;
      }
    };
    const bool has_half = tiles > 0 && tile_begin + tiles - 1 == half_tile;  // always the slice's last tile
    const int whole_tiles = tiles - (has_half ? 1 : 0);
    for (int i = 0; i < whole_tiles; ++i) consume(i, std::integral_constant<int, Shape::kSteps>());
    if (has_half) consume(whole_tiles, std::integral_constant<int, Shape::kSteps / 2>());
    wgmma_wait<0>();
#pragma unroll
    for (int slab = 0; slab < SLABS; ++slab)
#pragma unroll
      for (int v = 0; v < BN / 2; ++v) fence_operand(acc[slab][v]);
    weights.finish(acc);
    // Every consumer's wgmmas are complete (and so every copy the producer issued has landed): the ring becomes the
    // fp32 tile. Named barrier 1: the consumers only (the producer warpgroup may have left).
    asm volatile("bar.sync 1, %0;\n" ::"n"(Shape::kConsumerThreads) : "memory");
    float* const partial = reinterpret_cast<float*>(smem);
    store_accumulators<BN, SLABS, Shape::kPartialStride>(partial, acc, wg, warp & 3, g, t);
    finish_tile<T, BN, kFeatures, Shape::kConsumerThreads, Shape::kPartialStride, true>(
        partial, tid, rank, slices, static_cast<int64_t>(blockIdx.y) * BN,
        static_cast<int64_t>(blockIdx.x / slices) * kFeatures, m_rows, n_rows, ep, out);
    // Multicast: no block leaves while its peer may still arrive on its barriers (or, before that, send it x).
    if (MC > 1) cg::this_cluster().sync();
  }
}
#endif  // BC_WGMMA_ENABLED

// Launches a warp-specialized kernel `kernel` (parameters map_x, map_w, w, m_rows, n_rows, k, slices, ep, out;
// its block Shape; MC as its template) over ceil(N / FEAT) feature blocks x ceil(M / BN) row blocks: K split by
// split_k_slices (MC == 1), or pairs of blocks sharing x (MC == 2: no K split; with an odd number of feature blocks
// the last pair has one past N, which loads and computes but writes nothing; cudaErrorNotSupported before launching
// where the device fits no pair, and where it refuses one). A refused K-split cluster falls back to one block a
// feature block. x: a [m_rows, k] matrix of 2-byte elements, 16-byte aligned.
// map_w: the W tensor map of a Weights with kWsTma (unread otherwise).
template <typename Shape, auto kernel, int MC, typename T, typename W>
cudaError_t wgmma_ws_launch(const T* x, const CUtensorMap& map_w, W w, int64_t m_rows, int64_t n_rows, int64_t k,
                            const Epilogue& ep, T* out, int sm_count, int slices_wanted, cudaStream_t stream) {
  constexpr int BN = Shape::kRows;
  const int64_t feature_blocks = ceil_div(n_rows, Shape::kFeatures);
  const int64_t row_blocks = ceil_div(m_rows, BN);
  const int64_t total_tiles = ceil_div(k, 128);
  if (row_blocks > 65535 || feature_blocks * kWgmmaMaxSlices > INT_MAX) return cudaErrorNotSupported;
  ClusterRoom room;
  cudaError_t error = prepare_wgmma_launch<Shape, kernel>(room);
  if (error != cudaSuccess) return error;
  const int64_t cluster = MC > 1 ? (room.of(2) > 0 ? 2 : 1)
                                 : split_k_slices(feature_blocks * row_blocks, total_tiles, sm_count, room, slices_wanted);
  if (MC > 1 && cluster < 2) return cudaErrorNotSupported;
  const int64_t grid_x = MC > 1 ? ceil_div(feature_blocks, 2) * 2 : feature_blocks;
  // x as a [m_rows, k] matrix of 2-byte elements (the type does not matter to a copy), boxes of 64 k x BN rows.
  CUtensorMap map_x;
  if (!encode_sw128_map(&map_x, CU_TENSOR_MAP_DATA_TYPE_UINT16, x, m_rows, k, k * 2, 64, BN)) {
    return cudaErrorNotSupported;
  }
  auto launch = [&](int64_t size) {
    const ClusterLaunch config(dim3(static_cast<unsigned>(grid_x * (MC > 1 ? 1 : size)), static_cast<unsigned>(row_blocks), 1),
                               Shape::kThreads, Shape::kSmemBytes, size, stream);
    const int slices = static_cast<int>(MC > 1 ? 1 : size);
    return cudaLaunchKernelEx(&config.config, kernel, map_x, map_w, w, static_cast<int>(m_rows),
                              static_cast<int>(n_rows), static_cast<int>(k), slices, ep, out);
  };
  error = launch(cluster);
  if (error != cudaSuccess && cluster > 1) {
    (void)cudaGetLastError();
    if (MC > 1) return cudaErrorNotSupported;  // a pair refused all the same: the caller takes MC == 1
    error = launch(1);  // a cluster refused all the same: one block a feature block, over the whole K
  }
  return error != cudaSuccess ? error : cudaGetLastError();
}

// ---- The tile (128, 1), (192, 1) or (256, 1), M in one or two launches, by a cost model ---------------------
// The cluster rooms (cluster_room) of a kernel's three tiles.
struct WsRooms {
  ClusterRoom rows128, rows192, rows256;
};
template <typename Shape128, auto kernel128, typename Shape192, auto kernel192, typename Shape256, auto kernel256>
cudaError_t ws_rooms(WsRooms& rooms) {
  cudaError_t error = prepare_wgmma_launch<Shape128, kernel128>(rooms.rows128);
  if (error == cudaSuccess) error = prepare_wgmma_launch<Shape192, kernel192>(rooms.rows192);
  return error != cudaSuccess ? error : prepare_wgmma_launch<Shape256, kernel256>(rooms.rows256);
}

// A kernel's block times of the (192, 1) and (256, 1) tiles, in (128, 1) block times (each kernel's measured ones
// beside its dispatcher).
struct WsBlockTimes {
  double rows192, rows256;
};

// The K split (split_k_slices, as the launch takes it, at most `most_slices`) and the waves of `blocks` blocks of one
// tile over the SMs (as many as its clusters leave room for: wave_blocks).
struct WsWaves {
  int64_t slices, waves;
};
inline WsWaves ws_waves(int64_t blocks, int64_t tiles, const ClusterRoom& room, int sm_count,
                        int64_t most_slices = kWgmmaMaxSlices) {
  int64_t slices = split_k_slices(blocks, tiles, sm_count, room, 0);
  if (slices > most_slices) slices = most_slices;
  return {slices, ceil_div(blocks * slices, wave_blocks(slices, sm_count, room))};
}

// Relative time of `blocks` blocks of one tile (`block`: its time over the whole K): its waves (ws_waves), a block's
// time its slice's share of the 128-k tiles (the largest: ceil(tiles / slices)).
inline double ws_waves_cost(int64_t blocks, int64_t k, double block, const ClusterRoom& room, int sm_count,
                            int64_t most_slices = kWgmmaMaxSlices) {
  const int64_t tiles = ceil_div(k, 128);
  const WsWaves w = ws_waves(blocks, tiles, room, sm_count, most_slices);
  return static_cast<double>(w.waves) * block * static_cast<double>(ceil_div(tiles, w.slices)) /
         static_cast<double>(tiles);
}

// Relative time of a (rows, 1) tiling (128 features a block), in (128, 1) block times.
inline double ws_tiling_cost(int64_t m, int64_t n, int64_t k, int rows, int sm_count, const WsRooms& rooms,
                             const WsBlockTimes& times, int64_t most_slices = kWgmmaMaxSlices) {
  const ClusterRoom& room = rows == 256 ? rooms.rows256 : rows == 192 ? rooms.rows192 : rooms.rows128;
  const double block = rows == 256 ? times.rows256 : rows == 192 ? times.rows192 : 1.0;
  return ws_waves_cost(ceil_div(m, rows) * ceil_div(n, 128), k, block, room, sm_count, most_slices);
}

// ---- M <= 64: one row block of 32 rows (M <= 32) or 64, with 1 or 2 slabs a warpgroup (128 or 256 features a
// block), the cheaper by waves x (the slice's 128-k tiles + kWsSmallFixedTiles) x the tile's time a 128-k tile. The
// blocks' time is set by their features (the A expansion and the W stream), hardly by their rows: fewer features a
// block and more blocks, unless that takes a second wave or leaves the K split short (W1A16, graph us: 8192^2 M = 32
// (32, 1) x 2 slices 21.6 against (32, 2) x 3 25.3; 4096 x 11008 (32, 1) x 3 20.0 against (32, 2) x 6 20.0).
// Fitted (2026-12-04, H200, W1A16, graph us): 51 forced one-wave rows of pending/odd_slices.sweep and
// w1a16_small_tiles.sweep at N x K = 4096 x 11008, 4096^2, 8192^2, 11008 x 4096 within 10%; 28672 x 8192, not in the
// fit, within 3%. A block's fixed time (pipeline fill, the cluster's reduction, the Epilogue): 6.8 tiles; us a tile:
// 0.54 / 0.87 / 0.60 / 1.04 (binary_weight_wgmma.cu's kSignSmallTimes).
constexpr double kWsSmallFixedTiles = 6.8;
struct WsSmallTimes {  // time a 128-k tile of the (rows, slabs) tiles
  double rows32_slabs1, rows32_slabs2, rows64_slabs1, rows64_slabs2;
};
inline int ws_small_rows(int64_t m) { return m <= 32 ? 32 : 64; }
// The slabs of a `rows` (ws_small_rows) tiling.
inline int ws_small_slabs(int rows, int64_t n, int64_t k, int sm_count, const ClusterRoom& room1,
                          const ClusterRoom& room2, const WsSmallTimes& times) {
  const bool rows32 = rows == 32;
  const int64_t tiles = ceil_div(k, 128);
  const auto cost = [&](int64_t features, double tile, const ClusterRoom& room) {
    const WsWaves w = ws_waves(ceil_div(n, features), tiles, room, sm_count);
    return static_cast<double>(w.waves) * tile * (static_cast<double>(ceil_div(tiles, w.slices)) + kWsSmallFixedTiles);
  };
  const double one = cost(128, rows32 ? times.rows32_slabs1 : times.rows64_slabs1, room1);
  const double two = cost(256, rows32 ? times.rows32_slabs2 : times.rows64_slabs2, room2);
  return two < one ? 2 : 1;
}

// The cheapest tile of (256, 1), (192, 1), (128, 1) by ws_tiling_cost (the larger on a tie).
inline int ws_rows_by_cost(int64_t m, int64_t n, int64_t k, int sm_count, const WsRooms& rooms,
                           const WsBlockTimes& times, double* cost = nullptr) {
  int best = 256;
  double cheapest = ws_tiling_cost(m, n, k, 256, sm_count, rooms, times);
  for (const int rows : {192, 128}) {
    const double c = ws_tiling_cost(m, n, k, rows, sm_count, rooms, times);
    if (c < cheapest) {
      cheapest = c;
      best = rows;
    }
  }
  if (cost != nullptr) *cost = cheapest;
  return best;
}

// Rows of x for a first launch, the rest in a second (each on its own tile by ws_rows_by_cost), where the two cost
// less than one launch by ws_tiling_cost plus kWsSplitCost; 0: one launch. The first launch's rows are whole row
// blocks of 192 or 256 rows, and both launches keep more than kWsSplitMinRows rows. Why: a partial last wave of
// one launch costs a whole block time (W1A16, 8192^2: M = 640 in one launch takes two waves of (192, 1) blocks;
// 384 + 256 rows take one wave each, the second of 256-row blocks with K in two).
constexpr double kWsSplitCost = 0.1;  // a second launch's fixed cost, in (128, 1) block times
constexpr int64_t kWsSplitMinRows = 160;
inline int64_t ws_split_head(int64_t m, int64_t n, int64_t k, int sm_count, const WsRooms& rooms,
                             const WsBlockTimes& times) {
  double cheapest = 0.0;
  ws_rows_by_cost(m, n, k, sm_count, rooms, times, &cheapest);
  int64_t head = 0;
  for (const int64_t block : {int64_t{192}, int64_t{256}}) {
    for (int64_t rows = block; m - rows > kWsSplitMinRows; rows += block) {  // rows >= 192 > kWsSplitMinRows
      double first = 0.0, second = 0.0;
      ws_rows_by_cost(rows, n, k, sm_count, rooms, times, &first);
      ws_rows_by_cost(m - rows, n, k, sm_count, rooms, times, &second);
      if (first + second + kWsSplitCost < cheapest) {
        cheapest = first + second + kWsSplitCost;
        head = rows;
      }
    }
  }
  return head;
}

}  // namespace cuda
}  // namespace bitcompile
