// Torch binding of the CUDA binary ops: argument checks (csrc/checks.h, the same as the fake kernels in
// bitcompile/ops.py), contiguity, allocation of outputs and temporaries, the device guard and the
// current stream. The kernels themselves are torch-free (binary_kernels.cuh: pack_signs.cu, binary_linear.cu,
// binary_weight_linear.cu, binary_weight_wgmma.cu, binary_conv2d*.cu).
//
// Kernel choice is by shape and device only (no switches between kernel generations): binary_weight_linear runs its
// fused kernels up to binary_weight_linear_fused_rows rows of x (4096 where its wgmma kernels run: bf16/fp16 x,
// k % 64 == 0, an sm_90a build on a compute capability 9.0 GPU; 128 for other bf16/fp16 x, 2048 for fp32) and
// dequantize + cuBLAS above; the launchers choose the kernel and its tiles (binary_kernels.cuh). Every CUDA kernel
// needs sm_80, which bitcompile/_build.py checks before it builds; the wgmma kernels are only taken on sm_90a.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "binary_kernels.cuh"
#include "checks.h"
#include "inference_autograd.h"
#include "weight_memo.h"
#include "binding.h"

namespace {

namespace kernels = bitcompile::cuda;

using bitcompile::check_launch;
using bitcompile::float_type;

const uint32_t* words(const at::Tensor& t) { return reinterpret_cast<const uint32_t*>(t.const_data_ptr<int32_t>()); }
uint32_t* mutable_words(at::Tensor& t) { return reinterpret_cast<uint32_t*>(t.mutable_data_ptr<int32_t>()); }

// Scale and bias as fp32 vectors on the device (no host sync); they must outlive the launch, which the
// caching allocator guarantees for tensors freed after a launch on the same stream.
struct EpilogueInputs {
  at::Tensor scale, bias, row_mean;
  kernels::Epilogue epilogue;

  EpilogueInputs(const std::optional<at::Tensor>& scale_in, const std::optional<at::Tensor>& bias_in) {
    if (scale_in.has_value()) {
      scale = bitcompile::as_float_vector(*scale_in);
      epilogue.scale = scale.const_data_ptr<float>();
      epilogue.scale_count = scale.numel();
    }
    if (bias_in.has_value()) {
      bias = bitcompile::as_float_vector(*bias_in);
      epilogue.bias = bias.const_data_ptr<float>();
    }
  }
};

// pack_signs(x): int32 words along the last dim, value 32*w + j at bit j of word w, bit 1 for x >= 0.
at::Tensor pack_signs_cuda(const at::Tensor& x) {
  const char* op = "pack_signs";
  bitcompile::check_float_input(op, x);
  BITCOMPILE_CHECK(x.dim() >= 1 && x.size(-1) >= 1, "bitcompile::", op, ": x must have a non-empty last dimension");
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t k = x.size(-1);
  const auto sizes = bitcompile::with_last_dim(x.sizes(), bitcompile::packed_words(k));
  at::Tensor out = at::empty(sizes, x.options().dtype(at::kInt));
  if (out.numel() == 0) return out;
  const at::Tensor input = x.contiguous();
  check_launch(kernels::launch_pack_signs(input.const_data_ptr(), float_type(input), input.numel() / k, k,
                                          /*sign_zero=*/false, mutable_words(out), nullptr, nullptr, nullptr,
                                          c10::cuda::getCurrentCUDAStream()),
               op);
  return out;
}

// y = (s(x) @ s(W).T) [* mean|x| per row] * scale + bias (SPEC 2.2); s = torch.sign with sign_zero.
at::Tensor binary_linear_cuda(const at::Tensor& x, const at::Tensor& w_packed, int64_t in_features,
                              const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& bias,
                              bool sign_zero, bool row_scale) {
  const char* op = "binary_linear";
  bitcompile::check_binary_linear(op, x, w_packed, in_features, scale, bias);
  const int64_t n = w_packed.size(0);
  c10::cuda::CUDAGuard guard(x.device());
  const auto sizes = bitcompile::with_last_dim(x.sizes(), n);
  at::Tensor out = at::empty(sizes, x.options());
  if (out.numel() == 0) return out;

  const int64_t k = in_features;
  const int64_t word_count = bitcompile::packed_words(k);
  const int64_t m = x.numel() / k;
  const at::Tensor input = x.contiguous();
  const at::Tensor weight = w_packed.contiguous();
  EpilogueInputs inputs(scale, bias);
  const auto stream = c10::cuda::getCurrentCUDAStream();

  // Activations: bits (two planes with sign_zero), for row_scale mean |x| per row and, for the W1A1 GEMM (one plane)
  // on a 9.x device, the popcount of each row's bits (its pa: the sm_90 wgmma kernel then does not count x's rows
  // itself; the mma.sync kernels of other devices do not read them), in one pass.
  const auto word_options = x.options().dtype(at::kInt);
  at::Tensor plus = at::empty({m, word_count}, word_options);
  at::Tensor minus = sign_zero ? at::empty({m, word_count}, word_options) : at::Tensor();
  bool reads_popcounts = false;
  check_launch(kernels::binary_linear_reads_popcounts(reads_popcounts), op);  // cached per device
  const bool count_rows = !sign_zero && reads_popcounts;
  at::Tensor popcounts = count_rows ? at::empty({m}, word_options) : at::Tensor();
  if (row_scale) {
    inputs.row_mean = at::empty({m}, x.options().dtype(at::kFloat));
    inputs.epilogue.row_factor = inputs.row_mean.const_data_ptr<float>();
  }
  check_launch(kernels::launch_pack_signs(input.const_data_ptr(), float_type(input), m, k, sign_zero,
                                          mutable_words(plus), sign_zero ? mutable_words(minus) : nullptr,
                                          row_scale ? inputs.row_mean.mutable_data_ptr<float>() : nullptr,
                                          count_rows ? popcounts.mutable_data_ptr<int32_t>() : nullptr, stream),
               op);

  if (!sign_zero) {
    check_launch(kernels::launch_binary_linear(words(plus), words(weight), m, n, k, inputs.epilogue,
                                               out.mutable_data_ptr(), float_type(out),
                                               count_rows ? popcounts.const_data_ptr<int32_t>() : nullptr, stream),
                 op);
  } else {
    // torch.sign inputs (two bit planes): a linear layer is a 1x1 convolution of m pixels with k channels.
    kernels::ConvShape shape;
    shape.batch = m;
    shape.channels = k;
    shape.height = shape.width = shape.out_height = shape.out_width = 1;
    shape.out_channels = n;
    check_launch(kernels::launch_binary_conv2d(words(plus), words(minus), words(weight), shape, inputs.epilogue,
                                               out.mutable_data_ptr(), float_type(out), /*out_channels_last=*/true,
                                               /*tap_table=*/nullptr, stream),
                 op);
  }
  return out;
}

// cuBLAS with its split-K partial sums kept in fp32 for the scope (SPEC 2.3's fp32 accumulation): torch's default
// lets cuBLAS reduce them in bf16 / fp16 (a bf16 M = 4097, N = 100, K = 1024 product was then 28x past the test's
// bound). The user's setting comes back at the end of the scope; the flags are process-wide, as torch's own.
class FullPrecisionReduction {
 public:
  FullPrecisionReduction()
      : fp16_(at::globalContext().allowFP16ReductionCuBLAS()), bf16_(at::globalContext().allowBF16ReductionCuBLAS()) {
    at::globalContext().setAllowFP16ReductionCuBLAS(false, split_k(fp16_));
    at::globalContext().setAllowBF16ReductionCuBLAS(false, split_k(bf16_));
  }
  ~FullPrecisionReduction() {
    at::globalContext().setAllowFP16ReductionCuBLAS(reduced(fp16_), split_k(fp16_));
    at::globalContext().setAllowBF16ReductionCuBLAS(reduced(bf16_), split_k(bf16_));
  }
  FullPrecisionReduction(const FullPrecisionReduction&) = delete;
  FullPrecisionReduction& operator=(const FullPrecisionReduction&) = delete;

 private:
  static bool reduced(at::CuBLASReductionOption o) { return o == at::CuBLASReductionOption::AllowReducedPrecisionWithSplitK; }
  static bool split_k(at::CuBLASReductionOption o) {
    return o != at::CuBLASReductionOption::DisallowReducedPrecisionDisallowSplitK;
  }
  at::CuBLASReductionOption fp16_, bf16_;
};

// y = x @ (s(W) * scale).T + bias with fp32 accumulation (SPEC 2.3).
at::Tensor binary_weight_linear_cuda(const at::Tensor& x, const at::Tensor& w_packed, int64_t in_features,
                                     const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& bias) {
  const char* op = "binary_weight_linear";
  bitcompile::check_binary_linear(op, x, w_packed, in_features, scale, bias);
  const int64_t n = w_packed.size(0);
  c10::cuda::CUDAGuard guard(x.device());
  const auto sizes = bitcompile::with_last_dim(x.sizes(), n);
  at::Tensor out = at::empty(sizes, x.options());
  if (out.numel() == 0) return out;

  const int64_t k = in_features;
  const int64_t m = x.numel() / k;
  at::Tensor input = x.contiguous();
  at::Tensor weight = w_packed.contiguous();
  EpilogueInputs inputs(scale, bias);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (m <= kernels::binary_weight_linear_fused_rows(float_type(input), k)) {
    // Fused kernels (bit planes, tensor-core passes, wgmma): W stays packed in memory; exact +-1 weights, fp32 sums
    // and epilogue. Past the pass kernel's 128 rows (kFusedRowsPass) bf16/fp16 x is here only where the wgmma kernels
    // apply, and they need 16-byte aligned operands (TMA): a view off that alignment (a slice of a larger buffer) is
    // copied once instead of running on the pass kernel.
    const auto misaligned = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 != 0; };
    if (m > 128 && float_type(input) != kernels::FloatType::kFloat32) {
      if (misaligned(input)) input = input.clone();
      if (misaligned(weight)) weight = weight.clone();
    }
    const size_t workspace_bytes = kernels::binary_weight_linear_workspace_bytes(float_type(input), m, k);
    at::Tensor workspace;  // x prepared for the kernels (bf16/fp16: bit planes at M <= 3, groups at M = 9..16)
    if (workspace_bytes > 0) workspace = at::empty({static_cast<int64_t>(workspace_bytes)}, x.options().dtype(at::kByte));
    check_launch(kernels::launch_binary_weight_linear(input.const_data_ptr(), float_type(input), words(weight), m, n, k,
                                                      inputs.epilogue, out.mutable_data_ptr(),
                                                      workspace_bytes > 0 ? workspace.mutable_data_ptr() : nullptr,
                                                      workspace_bytes, stream),
                 op);
    return out;
  }
  // Large M: compute-bound like a dense GEMM, so W = s(w) * scale in x's dtype (one pass) and cuBLAS
  // (fp32 accumulation, split-K sums included: FullPrecisionReduction; the bias in its epilogue).
  at::Tensor dense = at::empty({n, k}, x.options());
  check_launch(kernels::launch_dequantize_signs(words(weight), n, k, inputs.epilogue.scale, inputs.epilogue.scale_count,
                                                dense.mutable_data_ptr(), float_type(dense), stream),
               op);
  at::Tensor out_rows = out.view({m, n});
  const FullPrecisionReduction full_precision;
  if (bias.has_value()) {
    at::addmm_out(out_rows, bias->to(x.scalar_type()).reshape({n}), input.view({m, k}), dense.t());
  } else {
    at::mm_out(out_rows, input.view({m, k}), dense.t());
  }
  return out;
}

// The kernels' conv shape of a checked geometry.
kernels::ConvShape conv_shape(const char* op, const bitcompile::ConvGeometry& g, double pad_value) {
  kernels::ConvShape shape;
  shape.batch = g.batch;
  shape.channels = g.channels;
  shape.height = g.height;
  shape.width = g.width;
  shape.out_channels = g.out_channels;
  shape.out_height = g.out_height;
  shape.out_width = g.out_width;
  shape.kernel_h = g.kernel_h;
  shape.kernel_w = g.kernel_w;
  shape.stride_h = g.stride_h;
  shape.stride_w = g.stride_w;
  shape.pad_h = g.pad_h;
  shape.pad_w = g.pad_w;
  shape.dilation_h = g.dilation_h;
  shape.dilation_w = g.dilation_w;
  shape.pad_value = static_cast<int>(pad_value);
  BITCOMPILE_CHECK(kernels::conv_geometry_fits(shape), "bitcompile::", op,
                   ": padding, stride, dilation or input size too large for the CUDA kernels' 32-bit offsets (or taps x ",
                   "channels >= 2^29)");
  return shape;
}

// The one-plane kernels' D_t workspace (launch_binary_conv2d's tap_table): a few KB from the caching allocator (graph
// capture safe), undefined for two-plane input.
at::Tensor conv_tap_table(const kernels::ConvShape& shape, const at::TensorOptions& options, bool sign_zero) {
  const int64_t ints = kernels::conv_tap_table_ints(shape);
  return sign_zero || ints == 0 ? at::Tensor() : at::empty({ints}, options.dtype(at::kInt));
}
int* table_ints(const at::Tensor& table) { return table.defined() ? table.mutable_data_ptr<int>() : nullptr; }

// y = conv2d(pad(s(x), pad_value), s(W)) * scale[OC] + bias, w_packed = pack_signs(W.permute(0, 2, 3, 1))
// (SPEC 2.4); the output keeps x's memory format (as the fake kernel: suggest_memory_format).
at::Tensor binary_conv2d_cuda(const at::Tensor& x, const at::Tensor& w_packed, int64_t in_channels,
                              at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                              at::IntArrayRef dilation, const std::optional<at::Tensor>& scale,
                              const std::optional<at::Tensor>& bias, double pad_value, bool sign_zero) {
  const char* op = "binary_conv2d";
  const bitcompile::ConvGeometry g = bitcompile::check_binary_conv2d(x, w_packed, in_channels, kernel_size, stride,
                                                                     padding, dilation, scale, bias, pad_value);
  c10::cuda::CUDAGuard guard(x.device());

  // Same strides as the fake kernel's x.new_empty(...).contiguous(memory_format=...), without its copy.
  const at::MemoryFormat format = x.suggest_memory_format();
  const std::vector<int64_t> sizes = {g.batch, g.out_channels, g.out_height, g.out_width};
  at::Tensor out = at::empty(sizes, x.options());
  if (!out.is_contiguous(format)) out = at::empty(sizes, x.options().memory_format(format));
  if (out.numel() == 0) return out;
  // Where both layouts hold (size-1 dimensions) they address the same memory.
  const bool out_channels_last = !out.is_contiguous();

  // Activation bits per pixel along channels (NHWC words); free for channels_last inputs.
  const at::Tensor pixels = x.permute({0, 2, 3, 1}).contiguous();
  const int64_t pixel_count = g.batch * g.height * g.width;
  const int64_t word_count = bitcompile::packed_words(g.channels);
  const auto word_options = x.options().dtype(at::kInt);
  at::Tensor plus = at::empty({pixel_count, word_count}, word_options);
  at::Tensor minus = sign_zero ? at::empty({pixel_count, word_count}, word_options) : at::Tensor();
  const at::Tensor weight = w_packed.contiguous();
  EpilogueInputs inputs(scale, bias);
  const kernels::ConvShape shape = conv_shape(op, g, pad_value);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  // where the wgmma conv runs: the weight's D_t table first, counted while x is packed (launch_conv_tap_table_first)
  at::Tensor tap_table = conv_tap_table(shape, x.options(), sign_zero);
  bool table_first = false;
  if (tap_table.defined()) {
    const cudaError_t error =
        kernels::launch_conv_tap_table_first(words(weight), shape, table_ints(tap_table), stream);
    if (error != cudaErrorNotSupported) check_launch(error, op);
    table_first = error == cudaSuccess;
  }
  check_launch(kernels::launch_pack_signs(pixels.const_data_ptr(), float_type(pixels), pixel_count, g.channels,
                                          sign_zero, mutable_words(plus), sign_zero ? mutable_words(minus) : nullptr,
                                          nullptr, nullptr, stream, /*dependent=*/table_first),
               op);
  check_launch(kernels::launch_binary_conv2d(words(plus), sign_zero ? words(minus) : nullptr, words(weight), shape,
                                             inputs.epilogue, out.mutable_data_ptr(), float_type(out), out_channels_last,
                                             table_ints(tap_table), stream, /*tuning=*/nullptr,
                                             /*weights_ready=*/true, /*table_ready=*/table_first),
               op);
  return out;
}

// The conv launch of both packed ops on x_bits = pack_signs(x.permute(0, 2, 3, 1)), without the packing pass: into
// out, int32 (the values' sign words) or a float type (channels_last; a residual is added by the epilogue, after
// rounding to the type, as eager's add); out_signs (float out, or null): the stored values' sign words beside them.
void launch_packed_conv(const char* op, const bitcompile::ConvGeometry& g, const at::Tensor& x_bits,
                        const at::Tensor& w_packed, const std::optional<at::Tensor>& scale,
                        const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual,
                        double pad_value, at::Tensor& out, uint32_t* out_signs) {
  const at::Tensor pixels = x_bits.contiguous();
  const at::Tensor weight = w_packed.contiguous();
  EpilogueInputs inputs(scale, bias);
  const kernels::ConvShape shape = conv_shape(op, g, pad_value);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor tap_table = conv_tap_table(shape, x_bits.options(), /*sign_zero=*/false);
  if (out.scalar_type() == at::kInt) {
    check_launch(kernels::launch_binary_conv2d_signs(words(pixels), words(weight), shape, inputs.epilogue,
                                                     mutable_words(out), table_ints(tap_table), stream),
                 op);
    return;
  }
  // a residual read with the output's indexing: channels_last too (a copy where it is not)
  at::Tensor residual_nhwc;
  if (residual.has_value()) {
    residual_nhwc = residual->contiguous(at::MemoryFormat::ChannelsLast);
    inputs.epilogue.residual = residual_nhwc.const_data_ptr();
  }
  inputs.epilogue.out_signs = out_signs;
  // channels_last (also where size-1 dimensions make the tensor contiguous too: both layouts address the same memory)
  check_launch(kernels::launch_binary_conv2d(words(pixels), nullptr, words(weight), shape, inputs.epilogue,
                                             out.mutable_data_ptr(), float_type(out), /*out_channels_last=*/true,
                                             table_ints(tap_table), stream),
               op);
}

// The packed ops' outputs: float [N, OC, OH, OW] channels_last in out_dtype; sign words int32 [N, OH, OW, words].
at::Tensor packed_conv_output(const bitcompile::ConvGeometry& g, const at::Tensor& x_bits, at::ScalarType out_dtype) {
  return at::empty({g.batch, g.out_channels, g.out_height, g.out_width},
                   x_bits.options().dtype(out_dtype).memory_format(at::MemoryFormat::ChannelsLast));
}
at::Tensor packed_conv_sign_words(const bitcompile::ConvGeometry& g, const at::Tensor& x_bits) {
  return at::empty({g.batch, g.out_height, g.out_width, bitcompile::packed_words(g.out_channels)}, x_bits.options());
}

// binary_conv2d on x_bits: the output channels_last in out_dtype, or (int32) the values' sign words, written by the
// conv's epilogue; a residual is added by the epilogue.
at::Tensor binary_conv2d_packed_cuda(const at::Tensor& x_bits, const at::Tensor& w_packed, int64_t in_channels,
                                     at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                                     at::IntArrayRef dilation, const std::optional<at::Tensor>& scale,
                                     const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual,
                                     at::ScalarType out_dtype, double pad_value) {
  const bitcompile::ConvGeometry g = bitcompile::check_binary_conv2d_packed(
      x_bits, w_packed, in_channels, kernel_size, stride, padding, dilation, scale, bias, pad_value, out_dtype,
      residual);
  c10::cuda::CUDAGuard guard(x_bits.device());
  at::Tensor out =
      out_dtype == at::kInt ? packed_conv_sign_words(g, x_bits) : packed_conv_output(g, x_bits, out_dtype);
  if (out.numel() == 0) return out;
  launch_packed_conv("binary_conv2d_packed", g, x_bits, w_packed, scale, bias, residual, pad_value, out, nullptr);
  return out;
}

// binary_conv2d_packed (float out_dtype) and the output's sign words, both written by the conv's epilogue
// (Epilogue::out_signs: the stored values' signs, after the residual and the rounding).
std::tuple<at::Tensor, at::Tensor> binary_conv2d_packed_with_signs_cuda(
    const at::Tensor& x_bits, const at::Tensor& w_packed, int64_t in_channels, at::IntArrayRef kernel_size,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, const std::optional<at::Tensor>& scale,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual, at::ScalarType out_dtype,
    double pad_value) {
  const bitcompile::ConvGeometry g = bitcompile::check_binary_conv2d_packed_with_signs(
      x_bits, w_packed, in_channels, kernel_size, stride, padding, dilation, scale, bias, pad_value, out_dtype, residual);
  c10::cuda::CUDAGuard guard(x_bits.device());
  at::Tensor out = packed_conv_output(g, x_bits, out_dtype);
  at::Tensor out_bits = packed_conv_sign_words(g, x_bits);
  if (out.numel() == 0) return {out, out_bits};
  launch_packed_conv("binary_conv2d_packed_with_signs", g, x_bits, w_packed, scale, bias, residual, pad_value, out,
                     mutable_words(out_bits));
  return {out, out_bits};
}

}  // namespace

TORCH_LIBRARY_IMPL(bitcompile, CUDA, m) {
  m.impl("pack_signs", &pack_signs_cuda);
  m.impl("binary_linear", &binary_linear_cuda);
  m.impl("binary_weight_linear", &binary_weight_linear_cuda);
  m.impl("binary_conv2d", &binary_conv2d_cuda);
  m.impl("binary_conv2d_packed", &binary_conv2d_packed_cuda);
  m.impl("binary_conv2d_packed_with_signs", &binary_conv2d_packed_with_signs_cuda);
}

// The weight ops' memo (weight_memo.h), if no library loaded before this one registered it.
static const bitcompile::WeightMemoRegistration weight_memo_registration;

// No gradient, and no Python on the way to the kernel (inference_autograd.h).
TORCH_LIBRARY_IMPL(bitcompile, AutogradCUDA, m) {
  bitcompile::register_inference_autograd(
      m, {"pack_signs", "binary_linear", "binary_weight_linear", "binary_conv2d", "binary_conv2d_packed",
         "binary_conv2d_packed_with_signs"});
  // The backend's weight ops take the same C++ Autograd kernel, as on the CPU (csrc/cpu/binary_ops.cpp says why).
  bitcompile::register_inference_autograd(
      m, {"linear_of_weight", "conv2d_of_weight", "packed_conv2d_of_weight", "packed_conv2d_of_weight_with_signs",
          "packed_linear_group"});
}
