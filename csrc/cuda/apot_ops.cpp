// Torch binding of the APoT CUDA kernels (csrc/cuda/apot_kernels.cu): argument checks (checks.h,
// the same as the fake kernels in ops.py), contiguous operands, output allocation, the current
// stream, and the choice between the small-batch kernel, the Hopper wgmma kernel and dequantize + cuBLAS / cuDNN.
// c10::cuda::getCurrentCUDAStream is the stream at::cuda::getCurrentCUDAStream returns; its header
// spares this file the cuBLAS/cuSPARSE headers of ATen/cuda/CUDAContext.h.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "checks.h"
#include "inference_autograd.h"
#include "cuda/apot_kernels.cuh"
#include "binding.h"

namespace {

using bitcompile::packed_code_bytes;
namespace apot = bitcompile::apot;

using bitcompile::check_launch;
using bitcompile::float_type;

// alpha * code_values[code] as a dense [rows, k] tensor of `dtype`, on the weight's device.
at::Tensor dequantize(const char* op, const at::Tensor& w_packed, int64_t k, int64_t bits,
                      const at::Tensor& code_values, const at::Tensor& alpha_f, at::ScalarType dtype) {
  const int64_t rows = w_packed.size(0);
  auto out = at::empty({rows, k}, w_packed.options().dtype(dtype));
  check_launch(apot::dequantize_weight(w_packed.data_ptr<uint8_t>(), rows, k, static_cast<int>(bits),
                                       code_values.data_ptr<float>(), alpha_f.data_ptr<float>(), alpha_f.numel(),
                                       out.data_ptr(), float_type(out), c10::cuda::getCurrentCUDAStream()),
               op);
  return out;
}

// ---------------------------------------------------------------------------------------------
at::Tensor pack_codes_cuda(const at::Tensor& codes, int64_t bits) {
  const char* op = "pack_codes";
  bitcompile::check_pack_codes(codes, bits);
  c10::cuda::CUDAGuard guard(codes.device());
  const int64_t k = codes.size(-1);
  const int64_t width = packed_code_bytes(k, bits);
  const auto sizes = bitcompile::with_last_dim(codes.sizes(), width);
  if (codes.numel() == 0) return at::empty(sizes, codes.options().dtype(at::kByte));
  // Packing is not a hot path: the range check syncs with the host to raise a clear error.
  const int64_t limit = int64_t(1) << bits;
  auto bounds = at::stack({codes.min().to(at::kLong), codes.max().to(at::kLong)}).cpu();
  const int64_t low = bounds[0].item<int64_t>(), high = bounds[1].item<int64_t>();
  BITCOMPILE_CHECK(low >= 0 && high < limit, "bitcompile::pack_codes: code out of range for bits=", bits, ": got ",
              low < 0 ? low : high, ", codes must be in 0..", limit - 1);
  auto bytes = codes.reshape({-1, k}).to(at::kByte).contiguous();  // every code fits a byte now
  if (bits > 4) return bytes.reshape(sizes);
  auto out = at::empty(sizes, codes.options().dtype(at::kByte));
  check_launch(apot::pack_nibbles(bytes.data_ptr<uint8_t>(), bytes.size(0), k, out.data_ptr<uint8_t>(),
                                  c10::cuda::getCurrentCUDAStream()),
               op);
  return out;
}

// ---------------------------------------------------------------------------------------------
at::Tensor apot_linear_cuda(const at::Tensor& x, const at::Tensor& w_packed, int64_t in_features, int64_t bits,
                            const at::Tensor& code_values, const at::Tensor& alpha,
                            const std::optional<at::Tensor>& bias) {
  const char* op = "apot_linear";
  bitcompile::check_apot_linear(op, x, w_packed, in_features, bits, code_values, alpha, bias);
  c10::cuda::CUDAGuard guard(x.device());

  const int64_t k = in_features;
  const int64_t n = w_packed.size(0);
  const auto out_sizes = bitcompile::with_last_dim(x.sizes(), n);
  auto x2 = x.reshape({-1, k}).contiguous();
  const int64_t m = x2.size(0);
  if (m == 0 || n == 0) return at::zeros(out_sizes, x.options());

  auto w = w_packed.contiguous();
  auto table = code_values.contiguous();
  auto alpha_f = bitcompile::as_float_vector(alpha);
  auto bias_f = bias.has_value() ? bitcompile::as_float_vector(*bias) : at::Tensor();
  const float* const bias_ptr = bias.has_value() ? bias_f.data_ptr<float>() : nullptr;
  if (m <= apot::kSmallBatchRows) {
    // Bandwidth-bound: read the packed weight once per 16 rows of 16-bit x (8 of fp32), decode it through a table
    // onto the tensor cores (APoT levels as exact integers, other tables as fp16 hi + lo), fp32 accumulation.
    auto y = at::empty({m, n}, x2.options());
    auto workspace = at::empty({apot::linear_small_batch_workspace(m, k, n)}, x2.options().dtype(at::kFloat));
    check_launch(apot::linear_small_batch(x2.data_ptr(), float_type(x2), m, k, w.data_ptr<uint8_t>(), n,
                                          static_cast<int>(bits), table.data_ptr<float>(), alpha_f.data_ptr<float>(),
                                          alpha_f.numel(), bias_ptr, y.data_ptr(),
                                          workspace.numel() ? workspace.data_ptr<float>() : nullptr,
                                          c10::cuda::getCurrentCUDAStream()),
                 op);
    return y.reshape(out_sizes);
  }
  if (m <= apot::kWgmmaMaxRows && x2.scalar_type() != at::kFloat && bits <= 4) {
    // Hopper: the codes expanded through the table in registers onto wgmma, no dequantized copy of W
    // (apot_wgmma.cu); where it does not apply (another GPU, no sm_90a code, k % 64 != 0, misaligned
    // operands) it answers cudaErrorNotSupported before launching and the path below runs.
    auto y = at::empty({m, n}, x2.options());
    const cudaError_t status =
        apot::linear_wgmma(x2.data_ptr(), float_type(x2), m, k, w.data_ptr<uint8_t>(), n, static_cast<int>(bits),
                           table.data_ptr<float>(), alpha_f.data_ptr<float>(), alpha_f.numel(), bias_ptr,
                           y.data_ptr(), c10::cuda::getCurrentCUDAStream());
    if (status != cudaErrorNotSupported) {
      check_launch(status, op);
      return y.reshape(out_sizes);
    }
  }
  // Compute-bound: dequantize W once into x's dtype (one pass over N * K, small against the
  // GEMM) and let cuBLAS multiply; the packed weight is what is stored, the decoded one is a
  // per-call temporary.
  auto weight = dequantize(op, w, k, bits, table, alpha_f, x.scalar_type());
  auto y = at::mm(x2, weight.t());
  if (bias.has_value()) y.add_(bias_f);
  return y.reshape(out_sizes);
}

// ---------------------------------------------------------------------------------------------
at::Tensor apot_linear_int_cuda(const at::Tensor& q_x, const at::Tensor& x_scale, const at::Tensor& x_zero_point,
                                const at::Tensor& w_packed, int64_t in_features, int64_t bits,
                                const at::Tensor& code_numerators, double denominator, const at::Tensor& alpha,
                                const std::optional<at::Tensor>& bias) {
  const char* op = "apot_linear_int";
  bitcompile::check_apot_linear_int(q_x, x_scale, x_zero_point, w_packed, in_features, bits, code_numerators,
                                    denominator, alpha, bias);
  c10::cuda::CUDAGuard guard(q_x.device());

  const int64_t k = in_features;
  const int64_t n = w_packed.size(0);
  const auto out_sizes = bitcompile::with_last_dim(q_x.sizes(), n);
  auto q2 = q_x.reshape({-1, k}).contiguous();
  const int64_t m = q2.size(0);
  auto y = at::empty({m, n}, q_x.options().dtype(at::kFloat));
  if (m == 0 || n == 0) return y.reshape(out_sizes);

  auto stream = c10::cuda::getCurrentCUDAStream();
  auto w = w_packed.contiguous();
  auto numerators = code_numerators.contiguous();
  // Scalars stay on the device (no host sync): the zero point as an integer (truncated like the
  // reference's .to(int64)), the scales as fp32.
  auto zero_point = x_zero_point.reshape({-1}).to(at::kLong).contiguous();
  auto scale = bitcompile::as_float_vector(x_scale);
  auto alpha_f = bitcompile::as_float_vector(alpha);
  auto bias_f = bias.has_value() ? bitcompile::as_float_vector(*bias) : at::Tensor();
  auto row_sums = at::empty({n}, w.options().dtype(at::kLong));
  auto workspace = at::empty({apot::linear_int_workspace(m, k, n)}, w.options().dtype(at::kLong));
  check_launch(apot::code_row_sums(w.data_ptr<uint8_t>(), n, k, static_cast<int>(bits), numerators.data_ptr<int32_t>(),
                                   row_sums.data_ptr<int64_t>(), stream),
               op);
  check_launch(apot::linear_int(q2.data_ptr<uint8_t>(), m, k, zero_point.data_ptr<int64_t>(), scale.data_ptr<float>(),
                                w.data_ptr<uint8_t>(), n, static_cast<int>(bits), numerators.data_ptr<int32_t>(),
                                denominator, alpha_f.data_ptr<float>(), alpha_f.numel(),
                                bias.has_value() ? bias_f.data_ptr<float>() : nullptr, row_sums.data_ptr<int64_t>(),
                                y.data_ptr<float>(), workspace.numel() ? workspace.data_ptr<int64_t>() : nullptr,
                                stream),
               op);
  return y.reshape(out_sizes);
}

// ---------------------------------------------------------------------------------------------
// The conv is compute-bound: dequantize the weight into x's dtype and run cuDNN; the stored
// weight stays packed. Codes are those of W.permute(0, 2, 3, 1).reshape(OC, KH*KW*C).
at::Tensor apot_conv2d_cuda(const at::Tensor& x, const at::Tensor& w_packed, int64_t in_channels,
                            at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                            at::IntArrayRef dilation, int64_t bits, const at::Tensor& code_values,
                            const at::Tensor& alpha, const std::optional<at::Tensor>& bias) {
  const char* op = "apot_conv2d";
  const auto g = bitcompile::check_apot_conv2d(x, w_packed, in_channels, kernel_size, stride, padding, dilation,
                                               bits, code_values, alpha, bias);
  const int64_t out_channels = w_packed.size(0);
  const int64_t reduction = in_channels * g.kernel_h * g.kernel_w;
  c10::cuda::CUDAGuard guard(x.device());

  const auto memory_format = x.suggest_memory_format();
  auto decoded = dequantize(op, w_packed.contiguous(), reduction, bits, code_values.contiguous(),
                            bitcompile::as_float_vector(alpha), x.scalar_type());
  auto weight = decoded.view({out_channels, g.kernel_h, g.kernel_w, in_channels})
                    .permute({0, 3, 1, 2})
                    .contiguous(memory_format);
  // fp32 stays fp32 (the op's contract, SPEC 2.5): cuDNN would otherwise take TF32 by default
  // (torch.backends.cudnn.allow_tf32), a 1e-3 relative error. at::conv2d with TF32 off.
  auto& context = at::globalContext();
  const bool allow_tf32 = false;
  auto y = at::_convolution(x, weight, std::nullopt, stride, padding, dilation, /*transposed=*/false,
                            /*output_padding=*/{0, 0}, /*groups=*/1, context.benchmarkCuDNN(),
                            context.deterministicCuDNN(), context.userEnabledCuDNN(), allow_tf32);
  if (bias.has_value()) y.add_(bitcompile::as_float_vector(*bias).view({1, -1, 1, 1}));
  return y.contiguous(memory_format);
}

}  // namespace

TORCH_LIBRARY_IMPL(bitcompile, CUDA, m) {
  m.impl("pack_codes", &pack_codes_cuda);
  m.impl("apot_linear", &apot_linear_cuda);
  m.impl("apot_linear_int", &apot_linear_int_cuda);
  m.impl("apot_conv2d", &apot_conv2d_cuda);
}

// No gradient, and no Python on the way to the kernel (inference_autograd.h).
TORCH_LIBRARY_IMPL(bitcompile, AutogradCUDA, m) {
  bitcompile::register_inference_autograd(m, {"pack_codes", "apot_linear", "apot_linear_int", "apot_conv2d"});
}
