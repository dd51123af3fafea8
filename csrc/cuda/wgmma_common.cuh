// Device helpers shared by the Hopper wgmma kernels (binary_linear_wgmma.cu, binary_weight_wgmma.cu): the guard
// of sm_90a device code, wgmma fence / commit / wait, and the shared-memory matrix descriptor of a K-major
// operand in the 128-byte swizzle. Torch-free.
#pragma once

#include <cstdint>

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
#endif  // BC_WGMMA_ENABLED

}  // namespace cuda
}  // namespace bitcompile
