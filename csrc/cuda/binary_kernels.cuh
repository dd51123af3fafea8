// Launchers of the CUDA kernels of the binary ops (pack_signs, binary_linear, binary_weight_linear,
// binary_conv2d). Torch-free on purpose (DESIGN.md "Tests"): raw device pointers, sizes, flags and
// a stream in, a cudaError_t out, so that the kernel files (pack_signs.cu, binary_linear.cu, binary_weight_linear.cu,
// binary_weight_wgmma.cu, binary_conv2d*.cu) compile with plain nvcc in CI and in the harness (benchmarks/kernels).
// The torch binding (checks, allocation, current stream) is binary_ops.cpp.
//
// Packed sign format (SPEC 2.1): uint32 words along the reduction dimension, value 32*w + j at bit j
// of word w, bit 1 for +1 (x >= 0), tail bits 0.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "float_types.cuh"

namespace bitcompile {
namespace cuda {

using ::bitcompile::FloatType;  // the type of an input or output buffer

// What turns an exact integer dot product into an output value:
//   y[row, col] = dot * row_factor[row] * scale[col or 0] + bias[col]
// Every pointer may be null (factor 1, no bias); all are fp32 device memory.
struct Epilogue {
  const float* scale = nullptr;  // scale_count entries: 1 (a scalar) or one per output column
  int64_t scale_count = 0;
  const float* bias = nullptr;        // one per output column
  const float* row_factor = nullptr;  // one per output row (binary_linear's row_scale: mean |x| over K)
  // The convs' residual (launch_binary_conv2d, channels_last outputs; null elsewhere): a tensor of the output's type
  // and layout whose element is added to each output after that output's rounding to the type, the sum rounded once
  // more (eager's `conv(...) + residual` of two tensors of that type).
  const void* residual = nullptr;
  // The convs' sign words of their outputs (launch_binary_conv2d, channels_last outputs; null elsewhere): words
  // [pixels, ceil(OC / 32)], bit c % 32 of word c / 32 set where output channel c's stored value (after the residual
  // and the rounding) is >= 0, bits past OC 0: pack_signs of the output, written beside it.
  uint32_t* out_signs = nullptr;
};

// Binarizes and packs the rows of a row-major [rows, k] matrix of `type`.
//   sign_zero = false: plus_bits = bit(x >= 0)                       (SPEC 2.1's s(x))
//   sign_zero = true:  plus_bits = bit(x > 0), minus_bits = bit(x < 0) (torch.sign: zeros are 0)
// plus_bits / minus_bits are [rows, ceil(k / 32)] words; minus_bits is only written with sign_zero.
// row_mean_abs (may be null) gets mean(|x|) over each row, in fp32.
// row_popcounts (may be null) gets the number of 1 bits of each row's plus_bits words ([rows] int32; with sign_zero
// too, the plus plane's), binary_linear's x_popcounts. Each kernel reduces it within one block (no atomics, so the
// buffer needs no zeroing), as it does mean(|x|).
// Rows of k % 32 == 0 at a 16-byte aligned x take 16-byte loads.
// dependent (sm_90): launched with programmatic dependent launch on the launch before it, which must have begun after
// all work that wrote x was complete (launch_conv_tap_table_first); the kernel reads x at once and its completion
// implies that launch's.
cudaError_t launch_pack_signs(const void* x, FloatType type, int64_t rows, int64_t k, bool sign_zero,
                              uint32_t* plus_bits, uint32_t* minus_bits, float* row_mean_abs, int32_t* row_popcounts,
                              cudaStream_t stream, bool dependent = false);

// Whether launch_binary_linear reads x_popcounts on the current device (where its wgmma kernels run: a 9.0 device and
// a build with sm_90a code), so that a caller asks launch_pack_signs for them only then. The compute capability is
// asked of the driver once per device.
cudaError_t binary_linear_reads_popcounts(bool& reads);

// binary_linear on b1 tensor cores (AND.POPC), for s(x) in {-1, +1}:
//   dot[m, n] = s(x[m]) . s(w[n]) over k features, then the epilogue; out is [m_rows, n_rows] of out_type.
// x_bits: [m_rows, ceil(k / 32)], w_bits: [n_rows, ceil(k / 32)] (both from launch_pack_signs' plus_bits).
// x_popcounts (may be null): the popcount of each row of x_bits, [m_rows] int32 (launch_pack_signs' row_popcounts).
// The wgmma kernel then reads them in its epilogue instead of counting x's rows a stage at a time; the mma.sync
// kernels ignore it (they count the fragments they load). Null: counted by the kernel.
// Kernels by device and shape: on sm_90 with ceil(k / 32) % 4 == 0 and 16-byte aligned bases, wgmma m64nNk256
// with TMA (binary_linear_wgmma.cu); otherwise mma.sync m16n8k256 (binary_linear.cu: a 4-stage cp.async
// pipeline for M > 64 with such rows, a register-staged kernel for the rest). Needs sm_80.
struct BinaryLinearTuning {  // for the kernel harness; the op passes none (everything from the shape)
  int kernel = 0;  // 0: by device and shape; 1: the mma.sync kernels; 2: wgmma (cudaErrorNotSupported if it does not apply)
  // The wgmma kernel only (0: from the shape):
  int tile_n = 0;   // output columns a tile: 128 or 256
  int store = 0;    // 1: st.global from registers; 2: TMA stores through shared memory (cudaErrorNotSupported where out
                    // or its row pitch is not 16-byte aligned); 0: TMA stores where they apply
  int stages = 0;   // ring depth (0: the deepest that fits beside the store buffers)
};
cudaError_t launch_binary_linear(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                 int64_t k, const Epilogue& epilogue, void* out, FloatType out_type,
                                 const int32_t* x_popcounts, cudaStream_t stream,
                                 const BinaryLinearTuning* tuning = nullptr);
// launch_binary_linear's sm_90 path (binary_linear_wgmma.cu: the persistent wgmma kernel); cudaErrorNotSupported
// where it does not apply.
cudaError_t launch_binary_linear_wgmma(const uint32_t* x_bits, const uint32_t* w_bits, int64_t m_rows, int64_t n_rows,
                                       int64_t k, const Epilogue& epilogue, void* out, FloatType out_type,
                                       const int32_t* x_popcounts, const BinaryLinearTuning& tuning,
                                       cudaStream_t stream);

// Geometry of a binary convolution; the input is packed per pixel along channels (NHWC words:
// [batch, height, width, ceil(channels / 32)]), the weight is [out_channels, kernel_h, kernel_w,
// ceil(channels / 32)] (pack_signs(W.permute(0, 2, 3, 1))). A linear layer is the 1x1 case.
struct ConvShape {
  int64_t batch = 0, channels = 0, height = 0, width = 0;
  int64_t out_channels = 0, out_height = 0, out_width = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1,
          dilation_w = 1;
  int pad_value = 0;  // what a padded position of s(x) is: 0, +1 or -1
};

// The conv kernels keep pixel offsets and dot products in 32 bits: false for geometry beyond that (a padding,
// stride or dilation whose offsets pass 2^29, or taps x channels >= 2^29, where 4 * popc(...) overflows),
// which launch_binary_conv2d refuses with cudaErrorNotSupported.
inline bool conv_geometry_fits(const ConvShape& s) {
  constexpr int64_t kOffsetLimit = 0x7fffffff / 4;
  return s.pad_h + (s.kernel_h - 1) * s.dilation_h <= kOffsetLimit &&
         s.pad_w + (s.kernel_w - 1) * s.dilation_w <= kOffsetLimit && (s.out_height - 1) * s.stride_h <= kOffsetLimit &&
         (s.out_width - 1) * s.stride_w <= kOffsetLimit && s.height <= kOffsetLimit && s.width <= kOffsetLimit &&
         s.kernel_h * s.kernel_w * ((s.channels + 31) / 32) * 32 < (int64_t{1} << 29);
}

// binary_conv2d as an implicit GEMM on b1 tensor cores (mma.sync m16n8k256 AND.POPC): rows = output pixels,
// K = taps x channel words. minus_bits null: s(x) = +-1 from plus_bits; minus_bits given: s(x) = bit(plus) -
// bit(minus) (torch.sign, 0 allowed). The epilogue's rows are the output pixels (batch, oh, ow), its columns
// the output channels. out_channels_last: out is laid out [batch, oh, ow, oc], else [batch, oc, oh, ow].
// A linear layer is the 1x1 case. Exact integer dots. Needs sm_80 and conv_geometry_fits(shape).
// tuning (null: chosen from the shape and device) lets the kernel harness force a kernel. On a 9.0 device the
// wgmma kernel (binary_conv2d_wgmma.cu, binary_conv2d_wgmma_kernel) serves one-plane convolutions from 3072 output pixels
// where it applies, the mma.sync kernels the rest.
struct ConvTuning {
  int kernel = 0;  // 0: by device and shape; 1: the mma.sync kernels; 2: the sm_90a
                   //   wgmma kernel (cudaErrorNotSupported where it does not apply: sign_zero, > 32 taps, channel words
                   //   % 4 != 0, operands not 16-byte aligned, not a 9.0 device with sm_90a code)
  int tile = 0;    // the one-plane mma.sync kernel's tile: 0 by the shape; 1: 128 x 64; 2: 64 x 32; 3: the halo
                   //   kernel (3x3 stride 1 or 2, pad 1, dilation 1, 33..64 channels; cudaErrorNotSupported elsewhere)
  int k_groups = 0;  // the 64 x 32 tile's K groups (stages dealt out in turn): 0 by the shape (2); 1; 2
};
// tap_table: device workspace of conv_tap_table_ints(shape) ints (may be null where that is 0, and is for two-plane
// input), into which the launch writes the weight's D_t table (conv_tap_table_kernel) before the wgmma kernel, the
// one-plane mma.sync kernel's 128 x 64 tile or the halo kernel reads it (cudaErrorInvalidValue if one of them is chosen
// and tap_table is null); its contents on return are not part of the interface. weights_ready: the launch just before this one on the
// stream is the launch_pack_signs that wrote plus_bits (and minus_bits), launched with nothing else in between; it
// began after all earlier work was complete, so the one-plane kernels, launched dependent on it (sm_90), read the
// weights (first stages, the D_t table) before waiting for its bits. False: they wait first (plus_bits from any
// earlier launch, the weights perhaps from the one just before).
inline int64_t conv_tap_table_ints(const ConvShape& s) {
  const int64_t taps = s.kernel_h * s.kernel_w;
  return taps <= 32 ? (taps + 1) * s.out_channels : 0;
}
// table_ready (with weights_ready): tap_table holds the weight's D_t table already, from
// launch_conv_tap_table_first before that launch_pack_signs (launched dependent), so the conv launch makes none.
cudaError_t launch_binary_conv2d(const uint32_t* plus_bits, const uint32_t* minus_bits, const uint32_t* w_bits,
                                 const ConvShape& shape, const Epilogue& epilogue, void* out, FloatType out_type,
                                 bool out_channels_last, int* tap_table, cudaStream_t stream,
                                 const ConvTuning* tuning = nullptr, bool weights_ready = false,
                                 bool table_ready = false);
// The head of a conv's chain where the wgmma conv runs: the weight's D_t table into tap_table
// (conv_tap_table_ints(shape) ints), launched after all earlier work (not dependent), then launch_pack_signs(...,
// dependent = true) of the conv's input, then launch_binary_conv2d(..., weights_ready = true, table_ready = true): the
// table is counted while x is packed, instead of between the packing and the conv. cudaErrorNotSupported (nothing
// launched; the conv launch then makes the table itself where its kernel reads one) where the wgmma conv does not run
// (a device other than 9.0, a build without sm_90a code) and for the shapes it does not take (fewer than 3072 output
// pixels, ceil(channels / 32) % 4 != 0, no table: conv_tap_table_ints 0; weights not 16-byte aligned).
cudaError_t launch_conv_tap_table_first(const uint32_t* w_bits, const ConvShape& shape, int* tap_table,
                                        cudaStream_t stream);
// The same conv of one-plane (pack_signs) input, its output as sign words: bit c % 32 of word c / 32 of output
// pixel p (out_words[p * ceil(out_channels / 32) + c / 32]) is 1 where the fp32 value of channel c is >= 0, the bits
// past out_channels 0. The values never reach global memory (the packed activation of a next binary conv).
cudaError_t launch_binary_conv2d_signs(const uint32_t* plus_bits, const uint32_t* w_bits, const ConvShape& shape,
                                       const Epilogue& epilogue, uint32_t* out_words, int* tap_table,
                                       cudaStream_t stream, const ConvTuning* tuning = nullptr);

// binary_weight_linear: y[m, n] = sum_k x[m, k] * s(w[n, k]) (fp32 accumulation), then the epilogue.
// x is row-major [m_rows, k] of `type`, out is [m_rows, n_rows] of the same type. Kernels, by M (tuning.kernel = 0):
// - bf16/fp16 x of M <= 3, and M = 4 at K > 4096: x as 24 fixed-point bit planes on the b1 tensor cores
//   (binary_weight_linear.cu, "binary_weight_planes");
// - bf16/fp16 x of M > 16 on a compute capability 9.0 device with sm_90a code: wgmma, W expanded from bits in
//   registers (binary_weight_wgmma.cu: the warp-specialized kernel, x by TMA into a swizzled shared-memory ring),
//   where k % 64 == 0, x is 16-byte, w_bits 8-byte and out 2-byte aligned;
// - otherwise the tensor-core pass kernel: every packed weight word read once per pass of up to 32 rows of x (16 for
//   fp32 x, which runs as an exact three-way bf16 split).
// K split over a thread block cluster. sm_count: multiprocessors of the device (sizes the K split). Needs sm_80; the
// binding sends more than binary_weight_linear_fused_rows rows to dequantize_signs + cuBLAS instead.
// tuning (null: chosen from the shape) lets the kernel harness (benchmarks/kernels) force a kernel and sweep its launch.
struct WeightLinearTuning {
  int rows_per_pass = 0;  // rows of x a block; 0: from M. Pass kernel: 8, 16 or 32 (fp32 x: 8 or 16); wgmma kernel:
                          //   32, 64, 128, 192 or 256 (the wgmma N; then slabs too)
  int slices = 0;         // blocks (a cluster) that split K: 1, 2, 4 or 8 (the wgmma kernel: any of 1 to 8); 0: from
                          //   the shape (about two blocks an SM, 8 / (M + 1) for the bit-plane kernel, one wave of one
                          //   block an SM for wgmma); a cluster that the device cannot co-schedule falls back to a
                          //   smaller one
  int kernel = 0;  // bf16/fp16: 0 chosen from M and the device (above), 1 the tensor-core pass kernel, 3 the (warp-
                   //   specialized) wgmma kernel (cudaErrorNotSupported where it does not apply, as for fp32 x; kernel
                   //   0 takes it from M = 17); 2, the all-threads wgmma kernel, was deleted (cudaErrorInvalidValue);
                   //   4 x as bit planes on the b1 wgmma (binary_weight_planes_wgmma.cu; kernel 0 takes it up to M = 32
                   //   where it applies): rows_per_pass 1, 2, 4, 8, 16, slabs 1 or 2 (not 2 at 16 rows), slices
  int slabs = 0;       // wgmma kernel: 64-feature slabs a warpgroup (two warpgroups), features a block = 128 * slabs;
                       //   tiles (rows, slabs) (32,1) (32,2) (64,1) (64,2) (128,1) (128,2) (192,1) (256,1); others:
                       //   cudaErrorInvalidValue
  int remainder = 0;   // kernel 0: -1 never splits off the last rows of M > 256 (binary_weight_linear.cu: remainder)
  int split = 0;       // bit-plane kernel (bf16/fp16 x, M <= 4): warps a 16-row tile, 1, 2 or 4 (at M = 4 it also
                       //   takes K <= 4096 to bit planes); 0: by the shape
                       //   (binary_weight_linear.cu: plane_split)
  int multicast = 0;   // warp-specialized wgmma kernel (kernel = 3): 1 each block loads its x tiles, 2 a cluster of two
                       //   blocks (neighbouring features, the same rows of x) share them by TMA multicast (no K split
                       //   then; tile (128, 2) only); 0: 2 where the K split is 1, else 1
  int head = 0;        // warp-specialized wgmma kernel with rows = 0 above 64 rows of x: rows of x of a first launch,
                       //   the rest in a second (wgmma_ws.cuh ws_split_head); 0: by the cost model, -1: one launch
};
// workspace: device memory of at least binary_weight_linear_workspace_bytes(type, m_rows, k) bytes, 16-byte
// aligned: for bf16/fp16 x, the bit planes of x at M <= 4 and x's groups for the 16-row pass kernel at M = 9..16
// (0 bytes otherwise; null or too small: those shapes run the pass kernel staging x itself).
size_t binary_weight_linear_workspace_bytes(FloatType type, int64_t m_rows, int64_t k);
cudaError_t launch_binary_weight_linear(const void* x, FloatType type, const uint32_t* w_bits, int64_t m_rows,
                                        int64_t n_rows, int64_t k, const Epilogue& epilogue, void* out,
                                        void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                        const WeightLinearTuning* tuning = nullptr);
// The largest M for which launch_binary_weight_linear beats dequantize_signs + cuBLAS on the current device (the
// binding's switch): 4096 where the wgmma kernels apply (bf16/fp16 x, k % 64 == 0, a 9.0 device, sm_90a code), 128
// for other bf16/fp16 x, 2048 for fp32 x. Pointer alignment is not asked: the binding copies a misaligned x or W of
// more than 128 rows for the wgmma kernels; below, unaligned x runs on the pass kernel (correct, slower).
int64_t binary_weight_linear_fused_rows(FloatType type, int64_t k);

// out[n, j] = (bit j of row n ? +1 : -1) * scale[n or 0] (scale may be null: 1), row-major [n_rows, k] of `type`,
// each value rounded once from fp32. For binary_weight_linear at large M through cuBLAS. out must be 16-byte aligned.
cudaError_t launch_dequantize_signs(const uint32_t* w_bits, int64_t n_rows, int64_t k, const float* scale,
                                    int64_t scale_count, void* out, FloatType type, cudaStream_t stream);

}  // namespace cuda
}  // namespace bitcompile
