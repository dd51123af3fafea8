// Device and launch helpers shared by the CUDA kernels of the binary ops (pack_signs.cu, binary_linear.cu,
// binary_linear_wgmma.cu, binary_weight_linear.cu, binary_weight_wgmma.cu, binary_conv2d.cu): the epilogue, warp
// sums, size checks, the dynamic shared memory opt-in, cached device facts, cluster launches. Torch-free, like the
// kernels.
#pragma once

#include <climits>
#include <cstdint>

#include <cuda_runtime.h>

#include "binary_kernels.cuh"

// BITCOMPILE_SM90A=1: the build has sm_90a device code (bitcompile/_build.py and benchmarks/kernels/build.sh set it
// where they compile for sm_90a). The wgmma kernels (binary_linear_wgmma.cu, binary_weight_wgmma.cu) have a body only
// in that code, a __trap() in any other, and the host code cannot see which device code a build holds: without it
// their launchers refuse (a TORCH_CUDA_ARCH_LIST of "9.0" without the "a", say) and the mma.sync kernels run.
#ifndef BITCOMPILE_SM90A
#define BITCOMPILE_SM90A 0
#endif

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

// Lane i holds v_i; returns in lane p the word whose bit i is bit p of v_i (a 32 x 32 bit transpose in five
// rounds of exchanges between lanes j apart: ~30 instructions against 64 for 32 ballots and selects).
__device__ __forceinline__ uint32_t transpose_bits(uint32_t v, int lane) {
  constexpr uint32_t kLow[5] = {0x0000FFFFu, 0x00FF00FFu, 0x0F0F0F0Fu, 0x33333333u, 0x55555555u};
#pragma unroll
  for (int r = 0; r < 5; ++r) {
    const int j = 16 >> r;
    const uint32_t other = __shfl_xor_sync(kFullMask, v, j);
    v = (lane & j) ? (v & ~kLow[r]) | ((other >> j) & kLow[r]) : (v & kLow[r]) | ((other << j) & ~kLow[r]);
  }
  return v;
}

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Raises a kernel's dynamic shared memory limit once per device (a driver call on every launch costs
// microseconds, as much as a whole small GEMV). done_devices: a static of the launcher of this very kernel
// instantiation, bit d set once device d is done (racing callers both set it: harmless). max_shared_carveout: also
// ask for the whole unified L1 as shared memory (a per-kernel hint; the others keep the driver's choice, which leaves
// them L1 cache).
template <typename Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, size_t bytes, unsigned long long& done_devices,
                               bool max_shared_carveout = false) {
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return error;
  const unsigned long long bit = device < 64 ? (1ull << device) : 0ull;
  if (bit != 0 && (__atomic_load_n(&done_devices, __ATOMIC_ACQUIRE) & bit) != 0) return cudaSuccess;
  error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (error == cudaSuccess && max_shared_carveout) {
    error = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  }
  if (error == cudaSuccess && bit != 0) __atomic_fetch_or(&done_devices, bit, __ATOMIC_RELEASE);
  return error;
}

// The current device's compute capability and SM count, asked of the driver once per device (a cudaGetDevice a
// call; three attribute queries a launch would cost as much as a small kernel's host path). Racing first callers
// write the same values.
struct DeviceFacts {
  int major = 0, minor = 0, sm_count = 0;
  bool cluster_launch = false;  // thread block clusters (sm_90 on)
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
  int cluster_launch = 0;
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device);
  if (error != cudaSuccess) return error;
  facts.cluster_launch = cluster_launch != 0;
  if (bit != 0) {
    known[device] = facts;
    __atomic_fetch_or(&known_devices, bit, __ATOMIC_RELEASE);
  }
  return cudaSuccess;
}

// Whether the wgmma kernels run on `device`: they exist only as sm_90a code (BITCOMPILE_SM90A), which runs on 9.0
// only (sm_100 has no wgmma). Their launchers refuse elsewhere, and what only they read is not made there.
inline bool wgmma_device(const DeviceFacts& device) {
  return BITCOMPILE_SM90A && device.major == 9 && device.minor == 0;
}

// Programmatic dependent launch (sm_90; no-ops before): a kernel that produces what the next launch on the stream
// reads calls launch_dependents() early, so that the next kernel, launched with ClusterLaunch's `dependent`, can
// start (its launch, block scheduling and prologue) while this one finishes; that kernel calls
// wait_for_prerequisite_grid() before its first global read of anything an earlier launch wrote: it returns once the
// previous grid has completed and its writes are visible (at once where the launch was not dependent).
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

inline bool valid_sizes(int64_t rows, int64_t k) { return rows >= 0 && k >= 1 && k <= INT_MAX; }

// A launch configuration of `threads` a block with clusters of `slices` blocks along x (none for slices = 1) and,
// with `dependent`, programmatic dependent launch (the kernel may start before the previous one on the stream ends
// and waits for it with griddepcontrol.wait). Not copyable: config points at the attributes.
struct ClusterLaunch {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attributes[2];

  ClusterLaunch(dim3 grid, int threads, size_t smem, int64_t slices, cudaStream_t stream, bool dependent = false) {
    config.gridDim = grid;
    config.blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    int count = 0;
    if (slices > 1) {
      attributes[count].id = cudaLaunchAttributeClusterDimension;
      attributes[count].val.clusterDim.x = static_cast<unsigned>(slices);
      attributes[count].val.clusterDim.y = 1;
      attributes[count].val.clusterDim.z = 1;
      ++count;
    }
    if (dependent) {
      attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attributes[count].val.programmaticStreamSerializationAllowed = 1;
      ++count;
    }
    config.attrs = attributes;
    config.numAttrs = count;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// The blocks of a kernel the current device runs at once in clusters of 2 to 8 blocks (0: that cluster is refused,
// or clusters are not supported before sm_90). Clusters are placed within a GPC, so past 2 blocks a cluster can leave
// SMs idle: H200, one 200 KiB block an SM, 132 SMs: clusters of 2 hold 132 blocks, of 4 and of 8 only 120.
// Asked up front (cudaOccupancyMaxActiveClusters, not a stream operation) rather than learned from a refused launch,
// which inside a CUDA-graph capture would invalidate the capture; after the kernel's shared memory opt-in.
struct ClusterRoom {
  static constexpr int kLargest = 8;  // a portable cluster
  int64_t blocks[kLargest - 1] = {};  // clusters of 2, 3, ..., 8
  int64_t of(int64_t size) const { return size >= 2 && size <= kLargest ? blocks[size - 2] : 0; }
  // The largest cluster of a power of two blocks, at most `slices` (a power of two), that holds blocks; 1 where none
  // does.
  int64_t largest_within(int64_t slices) const {
    while (slices > 1 && of(slices) == 0) slices /= 2;
    return slices > 1 ? slices : 1;
  }
};
// The answers, cached per device: a static of the launcher of one kernel instantiation (racing callers store the
// same values before they set the device's bit).
struct ClusterRoomCache {
  int blocks[64][ClusterRoom::kLargest - 1];
  unsigned long long known;
};
template <typename Kernel>
ClusterRoom cluster_room(Kernel kernel, int threads, size_t smem, ClusterRoomCache& cache) {
  constexpr int kSizes = ClusterRoom::kLargest - 1;
  ClusterRoom room;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return room;
  }
  const unsigned long long bit = device < 64 ? 1ull << device : 0ull;
  if (bit != 0 && (__atomic_load_n(&cache.known, __ATOMIC_ACQUIRE) & bit) != 0) {
    for (int i = 0; i < kSizes; ++i) room.blocks[i] = __atomic_load_n(&cache.blocks[device][i], __ATOMIC_RELAXED);
    return room;
  }
  int supported = 0;
  bool failed = cudaDeviceGetAttribute(&supported, cudaDevAttrClusterLaunch, device) != cudaSuccess;
  for (int i = 0; i < kSizes && !failed && supported; ++i) {
    const int size = i + 2;
    int count = 0;
    const ClusterLaunch launch(dim3(static_cast<unsigned>(size), 1, 1), threads, smem, size, nullptr);
    if (cudaOccupancyMaxActiveClusters(&count, kernel, &launch.config) != cudaSuccess) {
      (void)cudaGetLastError();  // this size holds nothing; the next size is still asked
      count = 0;
    }
    room.blocks[i] = static_cast<int64_t>(count) * size;
  }
  if (failed) (void)cudaGetLastError();  // only the queries' own errors are cleared, not an earlier launch's
  if (bit != 0) {
    for (int i = 0; i < kSizes; ++i)
      __atomic_store_n(&cache.blocks[device][i], static_cast<int>(room.blocks[i]), __ATOMIC_RELAXED);
    __atomic_fetch_or(&cache.known, bit, __ATOMIC_RELEASE);
  }
  return room;
}

// Blocks of a kernel an SM holds at `threads` and `smem` (cudaOccupancyMaxActiveBlocksPerMultiprocessor; 0 where the
// query fails), cached per device: a static of the caller, one kernel instantiation at one block shape.
struct OccupancyCache {
  int blocks[64];
  unsigned long long known;
};
template <typename Kernel>
int blocks_per_sm(Kernel kernel, int threads, size_t smem, OccupancyCache& cache) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  const unsigned long long bit = device < 64 ? 1ull << device : 0ull;
  if (bit != 0 && (__atomic_load_n(&cache.known, __ATOMIC_ACQUIRE) & bit) != 0)
    return __atomic_load_n(&cache.blocks[device], __ATOMIC_RELAXED);
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    blocks = 0;
  }
  if (bit != 0) {
    __atomic_store_n(&cache.blocks[device], blocks, __ATOMIC_RELAXED);
    __atomic_fetch_or(&cache.known, bit, __ATOMIC_RELEASE);
  }
  return blocks;
}

// The largest cluster of at most `slices` blocks (a power of two <= 8) that the current device can co-schedule with
// this kernel's threads and shared memory (cluster_room); 1 where none does.
template <typename Kernel>
int64_t fitting_cluster(Kernel kernel, int64_t slices, int threads, size_t smem, ClusterRoomCache& cache) {
  if (slices <= 1) return 1;
  return cluster_room(kernel, threads, smem, cache).largest_within(slices);
}

}  // namespace cuda
}  // namespace bitcompile
