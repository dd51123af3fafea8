// Helpers shared by the Hopper wgmma kernels (binary_linear_wgmma.cu, binary_weight_wgmma.cu, binary_conv2d_wgmma.cu):
// the guard of sm_90a device code, wgmma fence / commit / wait, the shared-memory matrix descriptor of a K-major
// operand in the 128-byte swizzle, mbarrier waits and arrivals, the 2-D TMA load, the b1 AND.POPC wgmma (m64nNk256, N =
// 8, 24, 48, 96, 128, 192, 256) with its accumulator fence, and on the host the 2-D tensor map of such an operand.
// Torch-free.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums only: the encoder is fetched through cudaGetDriverEntryPointByVersion
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

// wgmma exists only in sm_90a code (the "a" target); elsewhere the kernels compile to a trap their launchers never
// reach (BITCOMPILE_SM90A, device_common.cuh).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BC_WGMMA_ENABLED 1
#else
#define BC_WGMMA_ENABLED 0
#endif

namespace bitcompile {
namespace cuda {

#if BC_WGMMA_ENABLED
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most PENDING committed groups of this warpgroup's wgmmas are still in flight.
template <int PENDING>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
}

// Orders this thread's generic-proxy shared memory writes before later async-proxy reads of them (a TMA store, a
// wgmma operand), once an mbarrier or a barrier has passed them on.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Matrix descriptor (PTX ISA "Matrix Descriptor Format") of a K-major operand in the 128-byte swizzle at shared
// address `start`, its 8-row x 128-byte atoms 1024-byte aligned and stacked along M / N: start >> 4 in bits 0-13,
// leading byte offset 16 (encoded 1; unused for swizzled K-major layouts) in 16-29, stride byte offset 1024 (the
// next 8 rows; encoded 64) in 32-45, base offset 0, swizzle mode 1 (128 bytes) in 62-63. A k step within the
// 128-byte row advances `start` by its byte offset (the hardware applies the XOR of address bits 4-6 with 7-9).
__device__ __forceinline__ uint64_t sw128_descriptor(uint32_t start) {
  constexpr uint64_t kLbo = 16 >> 4, kSbo = 1024 >> 4, kSwizzle128 = 1;
  return static_cast<uint64_t>((start & 0x3ffff) >> 4) | (kLbo << 16) | (kSbo << 32) | (kSwizzle128 << 62);
}

// ---- Literal operand lists for the wgmma wrappers (inline asm takes no loops) -----------------------------------
// BC_WG_REGSn: the accumulator operands "%0, ..., %(n-1)"; BC_WG_ACCn(C): the n constraints C(d[0]), ..., C(d[n-1]).
#define BC_WG_REGS16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define BC_WG_REGS32 BC_WG_REGS16 \
  ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define BC_WG_REGS64 BC_WG_REGS32 \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" \
  ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define BC_WG_REGS96 BC_WG_REGS64 \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79" \
  ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define BC_WG_REGS128 BC_WG_REGS96 \
  ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111" \
  ", %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define BC_WG_REGS4 "%0, %1, %2, %3"
#define BC_WG_REGS12 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11"
#define BC_WG_REGS24 BC_WG_REGS16 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define BC_WG_REGS48 BC_WG_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define BC_WG_D8(C, b) \
  C(d[b + 0]), C(d[b + 1]), C(d[b + 2]), C(d[b + 3]), C(d[b + 4]), C(d[b + 5]), C(d[b + 6]), C(d[b + 7])
#define BC_WG_D32(C, b) BC_WG_D8(C, b), BC_WG_D8(C, b + 8), BC_WG_D8(C, b + 16), BC_WG_D8(C, b + 24)
#define BC_WG_ACC4(C) C(d[0]), C(d[1]), C(d[2]), C(d[3])
#define BC_WG_ACC12(C) BC_WG_D8(C, 0), C(d[8]), C(d[9]), C(d[10]), C(d[11])
#define BC_WG_ACC16(C) BC_WG_D8(C, 0), BC_WG_D8(C, 8)
#define BC_WG_ACC24(C) BC_WG_ACC16(C), BC_WG_D8(C, 16)
#define BC_WG_ACC48(C) BC_WG_ACC32(C), BC_WG_D8(C, 32), BC_WG_D8(C, 40)
#define BC_WG_ACC32(C) BC_WG_D32(C, 0)
#define BC_WG_ACC64(C) BC_WG_D32(C, 0), BC_WG_D32(C, 32)
#define BC_WG_ACC96(C) BC_WG_ACC64(C), BC_WG_D32(C, 64)
#define BC_WG_ACC128(C) BC_WG_ACC96(C), BC_WG_D32(C, 96)

// ---- b1 AND.POPC wgmma (binary_conv2d_wgmma.cu, binary_linear_wgmma.cu)-------------------------------------------
namespace b1 {
// Pins the accumulators at this point of the instruction stream: the compiler may neither move their reads above
// a wgmma.wait_group nor copy them between in-flight wgmmas.
template <int R>
__device__ __forceinline__ void fence_accumulators(int (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
// ---- wgmma b1 AND.POPC, both operands from shared memory; scale-d = 1 (D += A.B, accumulators zeroed first) ----
// D[64 x N] += popc(A[64 x 256] & B[N x 256]) over one k256 step; N / 2 s32 accumulators a thread.
#define BC_WGMMA_AND_POPC(N, REGS, ACC, DESCS)                                                              \
  __device__ __forceinline__ void wgmma_and_popc_n##N(int (&d)[N / 2], uint64_t desc_a, uint64_t desc_b) { \
    asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k256.s32.b1.b1.and.popc {" REGS "}, " DESCS ", 1;\n" \
                 : ACC("+r")                                                                                \
                 : "l"(desc_a), "l"(desc_b)                                                                 \
                 : "memory");                                                                               \
  }
BC_WGMMA_AND_POPC(8, BC_WG_REGS4, BC_WG_ACC4, "%4, %5")          // binary_conv2d_wgmma.cu's row popcounts
BC_WGMMA_AND_POPC(24, BC_WG_REGS12, BC_WG_ACC12, "%12, %13")    // the bit-plane tiles of
BC_WGMMA_AND_POPC(48, BC_WG_REGS24, BC_WG_ACC24, "%24, %25")    // binary_weight_planes_wgmma.cu:
BC_WGMMA_AND_POPC(96, BC_WG_REGS48, BC_WG_ACC48, "%48, %49")    // 24 planes a row of x, 1-8 rows
BC_WGMMA_AND_POPC(128, BC_WG_REGS64, BC_WG_ACC64, "%64, %65")
BC_WGMMA_AND_POPC(192, BC_WG_REGS96, BC_WG_ACC96, "%96, %97")
BC_WGMMA_AND_POPC(256, BC_WG_REGS128, BC_WG_ACC128, "%128, %129")
#undef BC_WGMMA_AND_POPC

template <int BN>
__device__ __forceinline__ void wgmma_and_popc(int (&d)[BN / 2], uint64_t desc_a, uint64_t desc_b) {
  static_assert(BN == 8 || BN == 24 || BN == 48 || BN == 96 || BN == 128 || BN == 192 || BN == 256, "an instantiated N");
  if constexpr (BN == 256) {
    wgmma_and_popc_n256(d, desc_a, desc_b);
  } else if constexpr (BN == 192) {
    wgmma_and_popc_n192(d, desc_a, desc_b);
  } else if constexpr (BN == 128) {
    wgmma_and_popc_n128(d, desc_a, desc_b);
  } else if constexpr (BN == 96) {
    wgmma_and_popc_n96(d, desc_a, desc_b);
  } else if constexpr (BN == 48) {
    wgmma_and_popc_n48(d, desc_a, desc_b);
  } else if constexpr (BN == 24) {
    wgmma_and_popc_n24(d, desc_a, desc_b);
  } else {
    wgmma_and_popc_n8(d, desc_a, desc_b);
  }
}
}  // namespace b1

// ---- mbarrier (PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier") ----------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// A ring of `stages` stages: full[s] at full_bar + 8 s, empty[s] at empty_bar + 8 s, with their arrival counts;
// the init fence makes them visible to the cluster and the async proxy. One thread calls it; the block (or the
// cluster, where peers arrive on them) synchronizes before any use.
__device__ __forceinline__ void init_stage_ring(uint32_t full_bar, uint32_t empty_bar, int stages,
                                                uint32_t full_arrivals, uint32_t empty_arrivals) {
  for (int s = 0; s < stages; ++s) {
    mbar_init(full_bar + 8 * s, full_arrivals);
    mbar_init(empty_bar + 8 * s, empty_arrivals);
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival, and `bytes` more transaction bytes that the phase waits for (complete_tx of async copies).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// Waits for the phase of the given parity to complete. With -DBITCOMPILE_WGMMA_WATCHDOG (debug builds only) a
// wait that spins ~4 s (clock64 at ~2 GHz) prints who waited on what (role and step: the kernel's own numbering)
// and traps, so a protocol bug fails the launch instead of hanging.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity, int role, int step) {
  if (mbar_try_wait(bar, parity)) return;
#ifdef BITCOMPILE_WGMMA_WATCHDOG
  const long long start = clock64();
#endif
  while (!mbar_try_wait(bar, parity)) {
#ifdef BITCOMPILE_WGMMA_WATCHDOG
    if (clock64() - start > (8ll << 30)) {
      printf("wgmma watchdog: block (%d, %d) thread %d role %d step %d parity %u\n", blockIdx.x, blockIdx.y,
             threadIdx.x, role, step, parity);
      __trap();
    }
#endif
  }
  (void)role;
  (void)step;
}
// 2-D TMA load of one box into shared memory, completion counted in bytes on `bar`. c0: the inner (contiguous)
// coordinate in elements, c1: the row.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// The same, multicast: the box lands at offset `dst` of the shared memory of every block of the cluster in `mask`
// (bit r: cluster rank r), completing on the mbarrier at offset `bar` of each of them.
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar,
                                                      uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
      : "memory");
}
// An arrival on the mbarrier at offset `bar` of cluster rank `rank`'s shared memory (release, cluster scope).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}
__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
#endif  // BC_WGMMA_ENABLED

// ---- Host: 2-D tensor maps -------------------------------------------------------------------------------------
// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda), looked up once.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encoder = []() -> PFN_cuTensorMapEncodeTiled_v12000 {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      return nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

// A row-major [rows, inner] matrix of `type` at `base` (row stride `row_bytes`, a multiple of 16; base 16-byte
// aligned), boxes of box_inner elements (box_inner * element size at most the swizzle span: 128 bytes for
// SWIZZLE_128B, 64 for SWIZZLE_64B) x box_rows rows, elements outside the matrix read as zero. False where the
// driver refuses it.
inline bool encode_tiled_map(CUtensorMap* map, CUtensorMapDataType type, const void* base, int64_t rows, int64_t inner,
                             int64_t row_bytes, int box_inner, int box_rows, CUtensorMapSwizzle swizzle) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};  // bytes between rows
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_inner), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result = encode(map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS;
}
// The same with SWIZZLE_128B and boxes of one swizzle span (box_inner * element size = 128 bytes).
inline bool encode_sw128_map(CUtensorMap* map, CUtensorMapDataType type, const void* base, int64_t rows, int64_t inner,
                             int64_t row_bytes, int box_inner, int box_rows) {
  return encode_tiled_map(map, type, base, rows, inner, row_bytes, box_inner, box_rows, CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace cuda
}  // namespace bitcompile
