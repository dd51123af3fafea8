// What binary_weight_linear.cu calls in binary_weight_wgmma.cu: the Hopper wgmma kernel of binary_weight_linear,
// one of the kernels behind launch_binary_weight_linear (binary_kernels.cuh), not a launcher of its own.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "binary_kernels.cuh"

namespace bitcompile {
namespace cuda {

// Whether the wgmma kernel can take x of this type and k on the current device: bf16 / fp16, k % 64 == 0, a
// compute capability 9.0 device and a build with sm_90a device code (BITCOMPILE_SM90A: the kernel has no body in
// any other code). Pointer alignment is checked by the launcher.
bool binary_weight_wgmma_applies(FloatType type, int64_t k);

// Whether the last `tail` rows of an m-row x run better apart (on the small-M kernels, a second launch): the wgmma
// kernel applies and its tiling of the first m - tail rows costs less than of all m (ws_tiling_cost of the tile the
// dispatcher takes, a K split past 2 counted as 2: fewer waves or a split of 2 where one row past 256 would take a
// second 256-row tile).
bool binary_weight_wgmma_splits_tail(FloatType type, int64_t m_rows, int64_t tail, int64_t n_rows, int64_t k,
                                     int sm_count);

// y = x @ s(W).T, then the epilogue, on wgmma (bf16 / fp16 x, fp32 accumulation, out of x's type). Takes the tile
// and the K split from tuning (rows_per_pass, warpgroups, slabs, slices; 0: from the shape). cudaErrorNotSupported,
// before any launch, where it does not apply: binary_weight_wgmma_applies is false, x is not 16-byte aligned,
// w_bits not 8-byte aligned, out not 2-byte aligned, or the grid is too large.
cudaError_t launch_binary_weight_wgmma(const void* x, FloatType type, const uint32_t* w_bits, int64_t m_rows,
                                       int64_t n_rows, int64_t k, const Epilogue& epilogue, void* out, int sm_count,
                                       const WeightLinearTuning& tuning, cudaStream_t stream);

// ---- binary_weight_planes_wgmma.cu: few rows of x (M <= 32) as 24 bit planes a row on the b1 wgmma ----------------
// Whether it can take x of this type and k here: bf16 / fp16, ceil(k / 32) % 4 == 0 (16-byte rows of W and of the
// planes for TMA), k <= 2^21, a 9.0 device and sm_90a code.
bool binary_weight_planes_wgmma_applies(FloatType type, int64_t k);
// Bytes of device workspace it needs for m_rows rows of x (the planes, the rows' shifts, the stage sums).
size_t binary_weight_planes_wgmma_workspace_bytes(int64_t m_rows, int64_t k);
// y = x @ s(W).T, then the epilogue: x_row_planes_kernel, then the GEMM kernel launched dependent. Tile from tuning
// (rows_per_pass 1, 2, 4, 8 or 16: rows of x a block, 0 from M; slabs 1 or 2; slices 0 or 1-8).
// cudaErrorNotSupported before any launch where it does not apply (above), the workspace is missing, too small or
// not 16-byte aligned, or w_bits is not 16-byte aligned.
cudaError_t launch_binary_weight_planes_wgmma(const void* x, FloatType type, const uint32_t* w_bits, int64_t m_rows,
                                              int64_t n_rows, int64_t k, const Epilogue& epilogue, void* out,
                                              int sm_count, const WeightLinearTuning& tuning, void* workspace,
                                              size_t workspace_bytes, cudaStream_t stream);

}  // namespace cuda
}  // namespace bitcompile
