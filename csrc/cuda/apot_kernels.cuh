// APoT CUDA kernels (SPEC.md 2.5), torch-free: raw pointers, sizes and a stream in, cudaError_t out.
// The torch binding (checks, allocation, current stream, registration) is csrc/cuda/apot_ops.cpp.
//
// Storage (bitcompile/ops.py): codes along K, two a byte (element 2j in the low nibble, 2j+1 in
// the high one, an odd K leaves the last high nibble 0) for bits <= 4, one a byte for bits 5..8;
// row n of w_packed holds the codes of output n. All arrays are dense row-major.
// A code outside the table (only in a hand-made w_packed) reads as level 0.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "float_types.cuh"

namespace bitcompile {
namespace apot {

using ::bitcompile::FloatType;

// Batches of at most this many rows take linear_small_batch; larger ones take linear_wgmma (bf16 / fp16 x, below)
// or dequantize the weight (dequantize_weight) and run a cuBLAS GEMM. linear_small_batch reads W once per 16 rows
// of 16-bit x (8 of fp32) at about the cost of one row (tensor cores): H200, apot4 bf16 8192^2, us in a rotating
// graph (2026-12-04): M = 1 17.5, M = 8 19.3, M = 16 25.1, against ~40 for linear_wgmma at M = 17-64.
constexpr int64_t kSmallBatchRows = 16;

// codes [rows, k] uint8 (values already checked < 2**bits) -> out [rows, ceil(k / 2)] nibbles.
cudaError_t pack_nibbles(const uint8_t* codes, int64_t rows, int64_t k, uint8_t* out, cudaStream_t stream);

// out[n, j] = alpha[n or 0] * code_values[code[n, j]] in out_type, out dense [rows, k].
// code_values has 2**bits float entries; alpha_count is 1 or rows.
cudaError_t dequantize_weight(const uint8_t* w_packed, int64_t rows, int64_t k, int bits, const float* code_values,
                              const float* alpha, int64_t alpha_count, void* out, FloatType out_type,
                              cudaStream_t stream);

// Floats of device scratch memory linear_small_batch needs for these sizes on the current device
// (0: none). The kernel splits K over several blocks when N alone gives too few; on GPUs with
// thread-block clusters (sm_90) they add up on chip, elsewhere the partial sums go here.
int64_t linear_small_batch_workspace(int64_t m, int64_t k, int64_t n);

// y[m, n] = alpha[n] * sum_k x[m, k] * code_values[code[n, k]] + bias[n], fp32 accumulation, for
// m <= kSmallBatchRows (any m works, in launches of 16 rows of 16-bit x, 8 of fp32). x [m, k] and y [m, n] of
// x_type; bias may be null; workspace holds linear_small_batch_workspace(m, k, n) floats (or is null if 0).
// Integral tables (every level an integer multiple N of one value: the APoT schemes) enter as N, exact, and x as it
// is (bf16 x on a bf16 MMA, fp16 on fp16; fp32 x as fp16 hi + lo); any other table as fp16 hi + lo parts of
// level * 2^s (22 significant bits) against fp16 x (bf16 x exact up to a power-of-two scale per 128 columns). The
// products are summed in fp32 (tensor cores, 128 columns at a time, then fp32 adds).
// tuning (the kernel harness; null or 0: from the shape, plan_small_batch): tiles = 16-row tiles of W a block
// (1..4 for nibbles with 16-bit x, else 1..2), splits = blocks along K (1..8, a cluster where clusters launch);
// taken, where not null, receives the (tiles, splits) launched.
struct SmallBatchTuning {
  int tiles = 0;
  int splits = 0;
  int* taken = nullptr;
};
cudaError_t linear_small_batch(const void* x, FloatType x_type, int64_t m, int64_t k, const uint8_t* w_packed,
                               int64_t n, int bits, const float* code_values, const float* alpha,
                               int64_t alpha_count, const float* bias, void* y, float* workspace,
                               cudaStream_t stream, const SmallBatchTuning* tuning = nullptr);

// y as linear_small_batch, for any m, on Hopper wgmma (apot_wgmma.cu: tensor cores with the codes expanded through
// the table in registers, no dequantized copy of W): bf16 / fp16 x, bits 1..4, k % 64 == 0, x and w_packed 16-byte
// aligned, y 2-byte aligned, a compute capability 9.0 device and a build with sm_90a code (BITCOMPILE_SM90A);
// cudaErrorNotSupported, before any launch, elsewhere. The table entries enter the MMA rounded to x's type, alpha and
// bias in the fp32 epilogue. One kernel, warp-specialized (wgmma_ws.cuh). tuning (the kernel harness; null: from the
// shape): kernel 0 or 3 (3: forced, as in binary_weight_linear's tuning; other values: cudaErrorInvalidValue); rows =
// 32 | 64 | 128 | 192 | 256 rows of x a block, slices = the K split (a cluster of at most 8), head = the rows of a
// first launch (wgmma_ws.cuh ws_split_head).
// The op calls it for kSmallBatchRows < m <= kWgmmaMaxRows. H200, N = K = 8192 bf16, apot4, graph us (2026-12-04;
// M = 17 and 64 on the 128-row tile then, now on 32- and 64-row tiles: 35.4 and 38.1):
//   M                 17    64    65    96   128   160   256   512  1024  2048  4096
//   all-threads     40.9  42.2  52.1  52.5  54.6  82.5  81.1   (deleted)
//   warp-specialized 47.1 43.6  43.8  44.2  44.9  57.9  59.7 107.0 233.0 473.5 947.5 (218 / 431 / 852 do_bench)
// (N = 4096, K = 11008: M = 64 52.5 / 56.0, 96 68.0 / 57.0, 256 103.4 / 58.4.) A block of the warp-specialized
// kernel runs near the tensor cores' rate (M = 512: 128 blocks of 256 rows x 128 features, one wave, ~600 TFLOPS),
// but past one wave its tiles leave a partial one. do_bench at 8192^2, the op against bf16 F.linear (dequantize +
// cuBLAS costs that plus ~30-45 us, measured with an x off 16-byte alignment on both): M = 384 111.3 / 74.8, 512
// 114.2 / 95.8, 640 248.4 / 121.2, 768 253.6 / 149.1, 896 224.8 / 184.3, 1024 230.7 / 189.7, 2048 419.0 / 386.9 us.
// Hence kWgmmaMaxRows = 512, dequantize + cuBLAS above, until the forty-fifth session (2026-12-05) gave the kernel its
// codes by TMA (apot_wgmma.cu's header): H100, a rotating graph, us, the op against bf16 F.linear (the dense weight):
//   M                   384    512    640    768   1024   1536   2048   3072   4096
//   8192^2           0.95x  0.99x  0.85x  0.90x  0.95x  0.95x  0.99x  0.97x  1.00x   (1024: 192.4 against 183.4)
//   N 4096 K 11008   1.29x  0.95x  0.72x  0.90x  0.97x  1.05x  0.97x  1.00x  0.97x
//   N 11008 K 4096   0.69x  0.77x  0.76x  0.90x  0.82x  0.91x  0.94x  0.93x  0.96x
// where dequantize + cuBLAS costs F.linear plus ~30-45 us (the dequantized copy: 128 MiB at 8192^2) and measured
// 0.76x at M = 1024, 0.94x at 4096 (bench_ops, H100, the forty-fourth session). Hence kWgmmaMaxRows = 4096 (the
// largest M measured); dequantize + cuBLAS above, where its copy is a small part of the GEMM.
constexpr int64_t kWgmmaMaxRows = 4096;
struct WgmmaTuning {
  int rows = 0;
  int slices = 0;
  int kernel = 0;  // 0 or 3 (the one kernel; 2, the all-threads kernel, was deleted on 2026-12-04)
  int head = 0;    // the warp-specialized kernel with rows = 0 above 128 rows of x: rows of x of a first launch, the
                   //   rest in a second (wgmma_ws.cuh ws_split_head); 0: by the cost model, -1: one launch
};
cudaError_t linear_wgmma(const void* x, FloatType x_type, int64_t m, int64_t k, const uint8_t* w_packed, int64_t n,
                         int bits, const float* code_values, const float* alpha, int64_t alpha_count,
                         const float* bias, void* y, cudaStream_t stream, const WgmmaTuning* tuning = nullptr);

// row_sums[n] = sum_k numerators[code[n, k]] (int64).
cudaError_t code_row_sums(const uint8_t* w_packed, int64_t n, int64_t k, int bits, const int32_t* numerators,
                          int64_t* row_sums, cudaStream_t stream);

// y[m, n] = float(S * x_scale * alpha[n] / denominator + bias[n]) with the exact integer
// S = sum_k q[m, k] * N[code[n, k]] - zero_point * row_sums[n] (the epilogue in double).
// q [m, k] uint8; zero_point, x_scale, alpha, bias (may be null) in device memory;
// row_sums from code_row_sums.
// workspace: linear_int_workspace(m, k, n) int64 entries (or null if 0), for K split over blocks.
int64_t linear_int_workspace(int64_t m, int64_t k, int64_t n);
cudaError_t linear_int(const uint8_t* q, int64_t m, int64_t k, const int64_t* zero_point, const float* x_scale,
                       const uint8_t* w_packed, int64_t n, int bits, const int32_t* numerators, double denominator,
                       const float* alpha, int64_t alpha_count, const float* bias, const int64_t* row_sums,
                       float* y, int64_t* workspace, cudaStream_t stream);

}  // namespace apot
}  // namespace bitcompile
