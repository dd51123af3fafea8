// Torch binding of the CUDA binary ops: argument checks (csrc/checks.h, the same as the fake kernels in
// bitcompile/ops.py), contiguity, allocation of outputs and temporaries, the device guard and the
// current stream. The kernels themselves are torch-free, in binary_kernels.cu.
//
// BITCOMPILE_CUDA_POPCOUNT_LINEAR=1 runs binary_linear on the CUDA-core popcount kernel instead of the
// b1 tensor cores (a debugging aid: both must agree exactly). GPUs older than sm_80 always run every op on
// the CUDA-core kernels (tensor_cores_usable()).
//
// BITCOMPILE_CUDA_LEGACY selects, per part, the kernels of before the speed work (read once per process).
// DEFAULT (unset, "1" or "all"): every part on those kernels, which passed the CUDA tests on the H200. The
// speed-work kernels compile cleanly and were checked in emulation, but have not run on a GPU yet
// (2026-11-30): "0" or "none" switches all of them on, and a comma-separated list (e.g.
// BITCOMPILE_CUDA_LEGACY=conv,pack) keeps only the parts named on their old kernels: weight_linear, conv,
// conv_pipeline, linear, pack. Make the new kernels the default once the CUDA tests pass with "0".
//   weight_linear (binary_weight_linear): the CUDA-core GEMV kernel for every M (instead of the bf16/fp16 tensor-core
//     kernel up to BITCOMPILE_CUDA_W1A16_GEMM_ROWS rows and dequantize + cuBLAS above);
//   conv (binary_conv2d, binary_linear with sign_zero): the CUDA-core popcount kernel (instead of the implicit
//     GEMM on b1 tensor cores with two activation bit planes);
//   linear (binary_linear): the register-staged b1 MMA kernel for every M (instead of the 4-stage cp.async kernel
//     for M > 64 with K % 128 == 0);
//   pack (pack_signs, also inside binary_linear and binary_conv2d): one value a lane (instead of 16-byte loads
//     where K % 32 == 0).
//   conv_pipeline: binary_conv2d's one-plane form on the register-staged kernel (instead of the 4-stage
//     cp.async kernel used where the channel words are a multiple of 4); "conv" covers it too.
// BITCOMPILE_CUDA_CONV_TWO_PLANES=1 keeps binary_conv2d without sign_zero on the two-plane tensor-core kernel
// (instead of the one-plane form with per-tap weight popcounts in the epilogue).
// BITCOMPILE_CUDA_W1A16_GEMM_ROWS=<rows> (default 256; fp32 inputs: 8 times as many) is the largest M that
// binary_weight_linear runs on its tensor-core kernel; larger M dequantizes W to x's dtype with the scale
// folded in (one pass) and calls cuBLAS (at::addmm / at::mm, fp32 accumulation).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "binary_kernels.cuh"
#include "checks.h"
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

bool popcount_linear_forced() {
  static const bool forced = [] {
    const char* value = std::getenv("BITCOMPILE_CUDA_POPCOUNT_LINEAR");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }();
  return forced;
}

// An attribute of the current device (a cheap host-side read); 0 if it cannot be read.
int current_device_attribute(cudaDeviceAttr attribute) {
  int device = 0;
  int value = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&value, attribute, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return value;
}

// The tensor-core kernels need sm_80 (mma.sync b1 AND.POPC, bf16 m16n8k16, cp.async); on older GPUs
// (Turing) they are built as traps (binary_kernels.cu) and every op runs on the CUDA-core kernels.
bool tensor_cores_usable() { return current_device_attribute(cudaDevAttrComputeCapabilityMajor) >= 8; }

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// BITCOMPILE_CUDA_LEGACY: "1" or "all", or a comma-separated list of the parts to put back on their old
// kernels: pack, linear (binary_linear without sign_zero), conv (binary_conv2d and binary_linear with
// sign_zero), weight_linear. Read once per process.
bool legacy_kernels(const char* part) {
  if (!tensor_cores_usable()) return true;
  static const std::string value = [] {
    const char* text = std::getenv("BITCOMPILE_CUDA_LEGACY");
    return std::string(text != nullptr ? text : "");
  }();
  // Unset: every part on the kernels that passed the CUDA tests on the H200; the speed-work kernels
  // have not run on a GPU yet (2026-11-30) and are switched on with BITCOMPILE_CUDA_LEGACY=0.
  if (value.empty() || value == "1" || value == "all") return true;
  if (value == "0" || value == "none") return false;
  const std::string wanted(part);
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string::npos) end = value.size();
    if (value.compare(start, end - start, wanted) == 0) return true;
    start = end + 1;
  }
  return false;
}

bool conv_two_planes() {
  static const bool two = env_flag("BITCOMPILE_CUDA_CONV_TWO_PLANES");
  return two;
}

int64_t w1a16_gemm_rows() {
  static const int64_t rows = [] {
    const char* value = std::getenv("BITCOMPILE_CUDA_W1A16_GEMM_ROWS");
    if (value == nullptr || *value == '\0') return static_cast<int64_t>(256);
    char* end = nullptr;
    const long long parsed = std::strtoll(value, &end, 10);
    return (end != nullptr && *end == '\0' && parsed >= 0) ? static_cast<int64_t>(parsed) : static_cast<int64_t>(256);
  }();
  return rows;
}

// Multiprocessors of the current device (sizes the tensor-core kernel's split of K); 0 if unknown.
int multiprocessor_count() { return current_device_attribute(cudaDevAttrMultiProcessorCount); }

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
                                          /*sign_zero=*/false, mutable_words(out), nullptr, nullptr,
                                          c10::cuda::getCurrentCUDAStream(), /*vector_loads=*/!legacy_kernels("pack")),
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

  // Activations: bits (two planes with sign_zero) and, for row_scale, mean |x| per row, in one pass.
  const auto word_options = x.options().dtype(at::kInt);
  at::Tensor plus = at::empty({m, word_count}, word_options);
  at::Tensor minus = sign_zero ? at::empty({m, word_count}, word_options) : at::Tensor();
  if (row_scale) {
    inputs.row_mean = at::empty({m}, x.options().dtype(at::kFloat));
    inputs.epilogue.row_factor = inputs.row_mean.const_data_ptr<float>();
  }
  check_launch(kernels::launch_pack_signs(input.const_data_ptr(), float_type(input), m, k, sign_zero,
                                          mutable_words(plus), sign_zero ? mutable_words(minus) : nullptr,
                                          row_scale ? inputs.row_mean.mutable_data_ptr<float>() : nullptr, stream,
                                          /*vector_loads=*/!legacy_kernels("pack")),
               op);

  if (!sign_zero && !popcount_linear_forced() && tensor_cores_usable()) {
    const auto launch = legacy_kernels("linear") ? kernels::launch_binary_linear_mma
                                                    : kernels::launch_binary_linear_mma_pipelined;
    check_launch(launch(words(plus), words(weight), m, n, k, inputs.epilogue, out.mutable_data_ptr(), float_type(out),
                        stream),
                 op);
  } else {
    // A linear layer is a 1x1 convolution of m pixels with k channels.
    kernels::ConvShape shape;
    shape.batch = m;
    shape.channels = k;
    shape.height = shape.width = shape.out_height = shape.out_width = 1;
    shape.out_channels = n;
    const auto launch = (popcount_linear_forced() || legacy_kernels("conv")) ? kernels::launch_binary_conv2d
                                                                          : kernels::launch_binary_conv2d_mma;
    check_launch(launch(words(plus), sign_zero ? words(minus) : nullptr, words(weight), shape, inputs.epilogue,
                        out.mutable_data_ptr(), float_type(out), /*out_channels_last=*/true, stream),
                 op);
  }
  return out;
}

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
  const at::Tensor input = x.contiguous();
  const at::Tensor weight = w_packed.contiguous();
  EpilogueInputs inputs(scale, bias);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (legacy_kernels("weight_linear")) {
    check_launch(kernels::launch_binary_weight_linear(input.const_data_ptr(), float_type(input), words(weight), m, n, k,
                                                      inputs.epilogue, out.mutable_data_ptr(), stream),
                 op);
    return out;
  }
  const int64_t gemm_rows = x.scalar_type() == at::kFloat ? 8 * w1a16_gemm_rows() : w1a16_gemm_rows();
  if (m <= gemm_rows) {
    // Tensor cores, W read once per pass of up to 32 rows of x; exact +-1 weights, fp32 sums and epilogue.
    check_launch(kernels::launch_binary_weight_linear_tc(input.const_data_ptr(), float_type(input), words(weight), m, n,
                                                         k, inputs.epilogue, out.mutable_data_ptr(),
                                                         multiprocessor_count(), stream),
                 op);
    return out;
  }
  // Large M: compute-bound like a dense GEMM, so W = s(w) * scale in x's dtype (one pass) and cuBLAS
  // (fp32 accumulation, the bias in its epilogue), as F.linear with that weight.
  at::Tensor dense = at::empty({n, k}, x.options());
  check_launch(kernels::launch_dequantize_signs(words(weight), n, k, inputs.epilogue.scale, inputs.epilogue.scale_count,
                                                dense.mutable_data_ptr(), float_type(dense), stream),
               op);
  at::Tensor out_rows = out.view({m, n});
  if (bias.has_value()) {
    at::addmm_out(out_rows, bias->to(x.scalar_type()).reshape({n}), input.view({m, k}), dense.t());
  } else {
    at::mm_out(out_rows, input.view({m, k}), dense.t());
  }
  return out;
}

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
  const auto stream = c10::cuda::getCurrentCUDAStream();
  check_launch(kernels::launch_pack_signs(pixels.const_data_ptr(), float_type(pixels), pixel_count, g.channels,
                                          sign_zero, mutable_words(plus), sign_zero ? mutable_words(minus) : nullptr,
                                          nullptr, stream, /*vector_loads=*/!legacy_kernels("pack")),
               op);

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
  shape.two_planes = conv_two_planes();
  shape.pipelined = !legacy_kernels("conv_pipeline");
  // b1 tensor cores (implicit GEMM, two activation bit planes); the legacy CUDA-core kernel on request.
  const auto launch = legacy_kernels("conv") ? kernels::launch_binary_conv2d : kernels::launch_binary_conv2d_mma;
  check_launch(launch(words(plus), sign_zero ? words(minus) : nullptr, words(weight), shape, inputs.epilogue,
                      out.mutable_data_ptr(), float_type(out), out_channels_last, stream),
               op);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(bitcompile, CUDA, m) {
  m.impl("pack_signs", &pack_signs_cuda);
  m.impl("binary_linear", &binary_linear_cuda);
  m.impl("binary_weight_linear", &binary_weight_linear_cuda);
  m.impl("binary_conv2d", &binary_conv2d_cuda);
}
