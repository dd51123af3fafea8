// Device and launch helpers shared by the CUDA kernels of the binary ops (pack_signs.cu,
// binary_linear.cu, binary_weight_linear.cu, binary_conv2d.cu): the epilogue, warp sums, size checks,
// the dynamic shared memory opt-in. Torch-free, like the kernels.
#pragma once

#include <climits>
#include <cstdint>

#include <cuda_runtime.h>

#include "binary_kernels.cuh"

namespace bitcompile {
namespace cuda {

using ::bitcompile::from_float;
using ::bitcompile::to_float;

constexpr unsigned kFullMask = 0xffffffffu;

// Bits of word `word` that hold one of the `k` real values (the rest are tail bits).
__host__ __device__ __forceinline__ uint32_t valid_bits(int64_t k, int64_t word) {
  const int64_t left = k - word * 32;
  return left >= 32 ? 0xffffffffu : (left <= 0 ? 0u : (1u << left) - 1u);
}

// y = dot [* row_factor[row]] [* scale] [+ bias[col]]  (SPEC 2.2-2.4, fp32). The factors are read
// once per row / column of a thread's tile; absent ones are 1 and 0 (exact).
__device__ __forceinline__ float row_factor(const Epilogue& ep, int64_t row) {
  return ep.row_factor != nullptr ? ep.row_factor[row] : 1.f;
}
__device__ __forceinline__ float column_scale(const Epilogue& ep, int64_t col) {
  return ep.scale != nullptr ? ep.scale[ep.scale_count == 1 ? 0 : col] : 1.f;
}
__device__ __forceinline__ float column_bias(const Epilogue& ep, int64_t col) {
  return ep.bias != nullptr ? ep.bias[col] : 0.f;
}
__device__ __forceinline__ float epilogue_value(float dot, float factor, float scale, float bias) {
  return dot * factor * scale + bias;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Raises a kernel's dynamic shared memory limit once per device (a driver call on every launch costs
// microseconds, as much as a whole small GEMV). done_devices: a static of the launcher of this very kernel
// instantiation, bit d set once device d is done (racing callers both set it: harmless).
template <typename Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, size_t bytes, unsigned long long& done_devices) {
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return error;
  const unsigned long long bit = device < 64 ? (1ull << device) : 0ull;
  if (bit != 0 && (__atomic_load_n(&done_devices, __ATOMIC_ACQUIRE) & bit) != 0) return cudaSuccess;
  error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (error == cudaSuccess && bit != 0) __atomic_fetch_or(&done_devices, bit, __ATOMIC_RELEASE);
  return error;
}

// The current device's compute capability and SM count, asked of the driver once per device (a cudaGetDevice a
// call; three attribute queries a launch would cost as much as a small kernel's host path). Racing first callers
// write the same values.
struct DeviceFacts {
  int major = 0, minor = 0, sm_count = 0;
};
inline cudaError_t current_device_facts(DeviceFacts& facts) {
  static DeviceFacts known[64];
  static unsigned long long known_devices = 0;
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return error;
  const unsigned long long bit = device >= 0 && device < 64 ? (1ull << device) : 0ull;
  if (bit != 0 && (__atomic_load_n(&known_devices, __ATOMIC_ACQUIRE) & bit) != 0) {
    facts = known[device];
    return cudaSuccess;
  }
  error = cudaDeviceGetAttribute(&facts.major, cudaDevAttrComputeCapabilityMajor, device);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&facts.minor, cudaDevAttrComputeCapabilityMinor, device);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&facts.sm_count, cudaDevAttrMultiProcessorCount, device);
  if (error != cudaSuccess) return error;
  if (bit != 0) {
    known[device] = facts;
    __atomic_fetch_or(&known_devices, bit, __ATOMIC_RELEASE);
  }
  return cudaSuccess;
}

inline bool valid_sizes(int64_t rows, int64_t k) { return rows >= 0 && k >= 1 && k <= INT_MAX; }

}  // namespace cuda
}  // namespace bitcompile
