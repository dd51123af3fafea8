// Probe of the no-swizzle K-major wgmma b1 operand that a halo-tile conv would use (NOTES.md, sixty-second session):
// A's rows are consecutive 16-byte pixels of one buffer, the descriptor's start shifted by a tap's pixel offset, and
// the two 16-byte halves of a k256 step LBO bytes apart, LBO the two taps' pixel distance x 16 (core matrices that
// overlap when it is 16) or a chunk plane's size. One m64n8k256 AND.POPC a case against a host reference.
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I csrc benchmarks/kernels/wgmma_halo_probe.cu -o P
//   ./P        # a line a case ("ok" / "BAD"), then the planted case, which must say BAD; exit 1 on a wrong case
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/wgmma_common.cuh"

namespace {

constexpr int kPixels = 256;  // 16-byte pixels in the A buffer (one chunk plane), two planes
constexpr int kPlaneBytes = kPixels * 16;

// A: two chunk planes of kPixels 16-byte pixels; B: n8 x k256 in the canonical no-swizzle K-major layout (K half j
// at j * 128, row n at n * 16). Thread t of the warpgroup writes its accumulators d[0..3] (rows 16 w + l / 4 and + 8,
// columns 2 (l % 4) + 0 / 1) to out[row * 8 + col].
__global__ void probe_kernel(const uint4* a_global, const uint4* b_global, int start_pixel, int lbo_bytes, int* out) {
#if BC_WGMMA_ENABLED
  using namespace bitcompile::cuda;
  __shared__ __align__(128) uint4 a[2 * kPixels];
  __shared__ __align__(128) uint4 b[16];
  for (int i = threadIdx.x; i < 2 * kPixels; i += blockDim.x) a[i] = a_global[i];
  if (threadIdx.x < 16) b[threadIdx.x] = b_global[threadIdx.x];
  fence_proxy_async_shared();
  __syncthreads();
  const uint32_t a_base = static_cast<uint32_t>(__cvta_generic_to_shared(a)) + 16u * start_pixel;
  const uint32_t b_base = static_cast<uint32_t>(__cvta_generic_to_shared(b));
  // bits 0-13 start >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4 (the next 8 rows: 8 pixels = 128 bytes), swizzle 0
  const uint64_t desc_a = static_cast<uint64_t>((a_base & 0x3ffff) >> 4) |
                          (static_cast<uint64_t>(lbo_bytes >> 4) << 16) | (static_cast<uint64_t>(128 >> 4) << 32);
  const uint64_t desc_b = static_cast<uint64_t>((b_base & 0x3ffff) >> 4) | (static_cast<uint64_t>(128 >> 4) << 16) |
                          (static_cast<uint64_t>(128 >> 4) << 32);
  int d[4] = {0, 0, 0, 0};
  wgmma_fence();
  b1::wgmma_and_popc_n8(d, desc_a, desc_b);
  wgmma_commit();
  wgmma_wait<0>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = 16 * warp + lane / 4, col = 2 * (lane % 4);
  out[row * 8 + col] = d[0];
  out[row * 8 + col + 1] = d[1];
  out[(row + 8) * 8 + col] = d[2];
  out[(row + 8) * 8 + col + 1] = d[3];
#endif
}

int popc128(const uint4& x, const uint4& y) {
  return __builtin_popcount(x.x & y.x) + __builtin_popcount(x.y & y.y) + __builtin_popcount(x.z & y.z) +
         __builtin_popcount(x.w & y.w);
}

}  // namespace

int main() {
  std::vector<uint4> a(2 * kPixels), b(16);
  srand(12345);
  auto word = [] { return (static_cast<uint32_t>(rand()) << 16) ^ static_cast<uint32_t>(rand()); };
  for (auto& v : a) v = make_uint4(word(), word(), word(), word());
  for (auto& v : b) v = make_uint4(word(), word(), word(), word());
  uint4 *a_dev, *b_dev;
  int* out_dev;
  cudaMalloc(&a_dev, a.size() * sizeof(uint4));
  cudaMalloc(&b_dev, b.size() * sizeof(uint4));
  cudaMalloc(&out_dev, 64 * 8 * sizeof(int));
  cudaMemcpy(a_dev, a.data(), a.size() * sizeof(uint4), cudaMemcpyHostToDevice);
  cudaMemcpy(b_dev, b.data(), b.size() * sizeof(uint4), cudaMemcpyHostToDevice);
  // (start pixel, LBO in bytes, the reference's LBO: the planted case differs)
  struct Case {
    const char* name;
    int start, lbo, ref_lbo;
  };
  const Case cases[] = {
      {"taps (0,0),(0,1): LBO 16 (overlapping core matrices)", 0, 16, 16},
      {"start 1 pixel (16 bytes, not 128-aligned), LBO 16", 1, 16, 16},
      {"start 5, LBO 3 pixels", 5, 48, 48},
      {"start 3, LBO 30 pixels (next kernel row at W = 28)", 3, 30 * 16, 30 * 16},
      {"start 7, LBO one chunk plane (C = 256: two chunks a tap)", 7, kPlaneBytes, kPlaneBytes},
      {"planted: reference LBO 2 pixels, descriptor 1 (must be BAD)", 0, 16, 32},
  };
  int wrong = 0;
  for (const Case& c : cases) {
    cudaMemset(out_dev, 0xff, 64 * 8 * sizeof(int));
    probe_kernel<<<1, 128>>>(a_dev, b_dev, c.start, c.lbo, out_dev);
    const cudaError_t error = cudaDeviceSynchronize();
    if (error != cudaSuccess) {
      std::printf("%-62s CUDA error %s\n", c.name, cudaGetErrorString(error));
      return 2;
    }
    std::vector<int> out(64 * 8);
    cudaMemcpy(out.data(), out_dev, out.size() * sizeof(int), cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int m = 0; m < 64; ++m) {
      const int p0 = c.start + m, p1 = c.start + m + c.ref_lbo / 16;  // the two 16-byte halves of row m
      for (int n = 0; n < 8; ++n) {
        const int want = popc128(a[p0], b[n]) + popc128(a[p1], b[8 + n]);
        bad += out[m * 8 + n] != want;
      }
    }
    const bool planted = c.ref_lbo != c.lbo;
    std::printf("%-62s %s (%d of 512 wrong)\n", c.name, bad ? "BAD" : "ok", bad);
    wrong += planted ? (bad == 0) : (bad != 0);
  }
  std::printf("%s\n", wrong ? "PROBE FAILED" : "probe passed (the planted case caught)");
  return wrong ? 1 : 0;
}
