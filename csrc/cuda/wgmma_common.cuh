// Helpers shared by the Hopper wgmma kernels (binary_linear_wgmma.cu, binary_weight_wgmma.cu): the guard of sm_90a
// device code, wgmma fence / commit / wait, the shared-memory matrix descriptor of a K-major operand in the
// 128-byte swizzle, mbarrier waits and arrivals, the 2-D TMA load, and on the host the 2-D tensor map of such an
// operand. Torch-free.
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

// Matrix descriptor (PTX ISA "Matrix Descriptor Format") of a K-major operand in the 128-byte swizzle at shared
// address `start`, its 8-row x 128-byte atoms 1024-byte aligned and stacked along M / N: start >> 4 in bits 0-13,
// leading byte offset 16 (encoded 1; unused for swizzled K-major layouts) in 16-29, stride byte offset 1024 (the
// next 8 rows; encoded 64) in 32-45, base offset 0, swizzle mode 1 (128 bytes) in 62-63. A k step within the
// 128-byte row advances `start` by its byte offset (the hardware applies the XOR of address bits 4-6 with 7-9).
__device__ __forceinline__ uint64_t sw128_descriptor(uint32_t start) {
  constexpr uint64_t kLbo = 16 >> 4, kSbo = 1024 >> 4, kSwizzle128 = 1;
  return static_cast<uint64_t>((start & 0x3ffff) >> 4) | (kLbo << 16) | (kSbo << 32) | (kSwizzle128 << 62);
}

// ---- mbarrier (PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier") ----------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
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
// aligned), boxes of box_inner elements (box_inner * element size = 128 bytes: one swizzle span) x box_rows rows,
// SWIZZLE_128B, elements outside the matrix read as zero. False where the driver refuses it.
inline bool encode_sw128_map(CUtensorMap* map, CUtensorMapDataType type, const void* base, int64_t rows, int64_t inner,
                             int64_t row_bytes, int box_inner, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};  // bytes between rows
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_inner), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result = encode(map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS;
}

}  // namespace cuda
}  // namespace bitcompile
