// Argument checks shared by the CPU and CUDA bindings of every bitcompile op.
// They mirror the fake kernels' checks in bitcompile/ops.py, so eager calls and traced calls
// reject the same inputs with the same messages: "bitcompile::<op>: <what is wrong>".
//
// Messages are built by BITCOMPILE_CHECK, which formats numbers with snprintf instead of
// std::ostream: on the GPU test machine (torch 2.11 + its image's g++), the ostream code the
// compiler instantiated inside our library for integers disagreed with the loaded libstdc++ and
// crashed the process (SIGSEGV in basic_ostream::_M_insert<long>) exactly when an error was being
// raised. Strings, dtypes and devices are appended as text.
#pragma once

#include <ATen/ATen.h>

#include <cstdio>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace bitcompile {

namespace detail {
inline void append(std::string& out, const char* text) { out += text; }
inline void append(std::string& out, const std::string& text) { out += text; }
// dtypes as Python spells them, so eager (C++) and traced (fake kernel) errors read the same.
inline void append(std::string& out, c10::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: out += "torch.float32"; return;
    case at::kHalf: out += "torch.float16"; return;
    case at::kBFloat16: out += "torch.bfloat16"; return;
    case at::kDouble: out += "torch.float64"; return;
    case at::kByte: out += "torch.uint8"; return;
    case at::kChar: out += "torch.int8"; return;
    case at::kShort: out += "torch.int16"; return;
    case at::kInt: out += "torch.int32"; return;
    case at::kLong: out += "torch.int64"; return;
    case at::kBool: out += "torch.bool"; return;
    default: out += c10::toString(dtype);
  }
}
inline void append(std::string& out, const c10::Device& device) { out += device.str(); }
template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
inline void append(std::string& out, T value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%lld", static_cast<long long>(value));
  out += buffer;
}
inline void append(std::string& out, double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", value);
  out += buffer;
}
inline void append(std::string& out, bool value) { out += value ? "true" : "false"; }
inline void append(std::string& out, at::IntArrayRef values) {
  out += "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += ", ";
    append(out, values[i]);
  }
  out += "]";
}
template <typename... Args>
std::string message(const Args&... args) {
  std::string out;
  (append(out, args), ...);
  return out;
}
}  // namespace detail

// TORCH_CHECK with the message built by detail::message (only when the check fails).
#define BITCOMPILE_CHECK(cond, ...) TORCH_CHECK(cond, ::bitcompile::detail::message(__VA_ARGS__))

inline int64_t packed_words(int64_t in_features) { return (in_features + 31) / 32; }

inline int64_t packed_code_bytes(int64_t in_features, int64_t bits) {
  return bits <= 4 ? (in_features + 1) / 2 : in_features;
}

// `sizes` with the last dimension replaced: the output shape of the linear ops (N features) and of the
// packing ops (packed width), which keep every leading dimension of their input.
inline std::vector<int64_t> with_last_dim(at::IntArrayRef sizes, int64_t last) {
  std::vector<int64_t> out = sizes.vec();
  out.back() = last;
  return out;
}

inline void check_float_input(const char* op, const at::Tensor& x, const char* name = "x") {
  auto dtype = x.scalar_type();
  BITCOMPILE_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16, "bitcompile::", op, ": ", name,
              " must be float32, float16 or bfloat16, got ", dtype);
}

inline void check_same_device(const char* op, const at::Tensor& x, const at::Tensor& other, const char* name) {
  BITCOMPILE_CHECK(other.device() == x.device(), "bitcompile::", op, ": ", name, " is on ", other.device(),
              " but x is on ", x.device());
}

inline void check_same_device(const char* op, const at::Tensor& x, const std::optional<at::Tensor>& other,
                              const char* name) {
  if (other.has_value()) check_same_device(op, x, *other, name);
}

// scale: absent, one element, or one per output; bias: absent or one per output.
inline void check_scale_bias(const char* op, const at::Tensor& x, int64_t out_features,
                             const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& bias) {
  check_same_device(op, x, scale, "scale");
  check_same_device(op, x, bias, "bias");
  if (scale.has_value()) {
    BITCOMPILE_CHECK(scale->numel() == 1 || (scale->dim() == 1 && scale->size(0) == out_features), "bitcompile::", op,
                ": scale must be a scalar or have ", out_features, " elements (one per output), got shape ",
                scale->sizes());
    BITCOMPILE_CHECK(scale->is_floating_point(), "bitcompile::", op, ": scale must be floating point, got ",
                scale->scalar_type());
  }
  if (bias.has_value()) {
    BITCOMPILE_CHECK(bias->dim() == 1 && bias->size(0) == out_features, "bitcompile::", op, ": bias must have shape (",
                out_features, ",), got ", bias->sizes());
    BITCOMPILE_CHECK(bias->is_floating_point(), "bitcompile::", op, ": bias must be floating point, got ",
                bias->scalar_type());
  }
}

// x [..., K] against a weight packed as [N, expected_width] of `dtype`.
inline void check_packed_linear(const char* op, const at::Tensor& x, const at::Tensor& w_packed, int64_t in_features,
                                int64_t expected_width, at::ScalarType dtype) {
  BITCOMPILE_CHECK(x.dim() >= 1, "bitcompile::", op, ": x must have at least one dimension");
  BITCOMPILE_CHECK(w_packed.dim() == 2, "bitcompile::", op, ": w_packed must be 2-D (out_features, words), got ",
              w_packed.dim(), "-D");
  BITCOMPILE_CHECK(w_packed.scalar_type() == dtype, "bitcompile::", op, ": w_packed must be ", dtype, ", got ",
              w_packed.scalar_type());
  BITCOMPILE_CHECK(in_features >= 1, "bitcompile::", op, ": in_features must be positive, got ", in_features);
  BITCOMPILE_CHECK(x.size(-1) == in_features, "bitcompile::", op, ": x has ", x.size(-1),
              " features, the weight was packed for ", in_features);
  BITCOMPILE_CHECK(w_packed.size(1) == expected_width, "bitcompile::", op, ": w_packed is ", w_packed.size(1),
              " wide, ", in_features, " features need ", expected_width);
  check_same_device(op, x, w_packed, "w_packed");
}

struct ConvGeometry {
  int64_t batch, channels, height, width;      // input
  int64_t out_channels, out_height, out_width;  // output
  int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
};

inline int64_t conv_output_size(const char* op, int64_t size, int64_t kernel, int64_t stride, int64_t padding,
                                int64_t dilation) {
  int64_t out = (size + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1;
  BITCOMPILE_CHECK(size + 2 * padding - dilation * (kernel - 1) - 1 >= 0 && out >= 1, "bitcompile::", op,
              ": input of size ", size, " is too small for kernel ", kernel, " (dilation ", dilation, ", padding ",
              padding, ")");
  return out;
}

// The geometry of a conv over an input of batch x channels x height x width (checked parameters).
inline ConvGeometry conv_geometry(const char* op, int64_t batch, int64_t channels, int64_t height, int64_t width,
                                  int64_t out_channels, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                  at::IntArrayRef padding, at::IntArrayRef dilation) {
  BITCOMPILE_CHECK(kernel_size.size() == 2 && stride.size() == 2 && padding.size() == 2 && dilation.size() == 2,
              "bitcompile::", op, ": kernel_size, stride, padding and dilation must have 2 values each");
  BITCOMPILE_CHECK(kernel_size[0] >= 1 && kernel_size[1] >= 1, "bitcompile::", op, ": kernel_size must be >= 1, got ",
              kernel_size);
  BITCOMPILE_CHECK(stride[0] >= 1 && stride[1] >= 1, "bitcompile::", op, ": stride must be >= 1, got ", stride);
  BITCOMPILE_CHECK(dilation[0] >= 1 && dilation[1] >= 1, "bitcompile::", op, ": dilation must be >= 1, got ", dilation);
  BITCOMPILE_CHECK(padding[0] >= 0 && padding[1] >= 0, "bitcompile::", op, ": padding must be >= 0, got ", padding);
  ConvGeometry g;
  g.batch = batch;
  g.channels = channels;
  g.height = height;
  g.width = width;
  g.out_channels = out_channels;
  g.kernel_h = kernel_size[0];
  g.kernel_w = kernel_size[1];
  g.stride_h = stride[0];
  g.stride_w = stride[1];
  g.pad_h = padding[0];
  g.pad_w = padding[1];
  g.dilation_h = dilation[0];
  g.dilation_w = dilation[1];
  g.out_height = conv_output_size(op, g.height, g.kernel_h, g.stride_h, g.pad_h, g.dilation_h);
  g.out_width = conv_output_size(op, g.width, g.kernel_w, g.stride_w, g.pad_w, g.dilation_w);
  return g;
}

// A float NCHW x of in_channels channels.
inline ConvGeometry check_conv_geometry(const char* op, const at::Tensor& x, int64_t in_channels,
                                        int64_t out_channels, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                        at::IntArrayRef padding, at::IntArrayRef dilation) {
  BITCOMPILE_CHECK(x.dim() == 4, "bitcompile::", op, ": x must be 4-D (N, C, H, W), got ", x.dim(), "-D");
  BITCOMPILE_CHECK(x.size(1) == in_channels, "bitcompile::", op, ": x has ", x.size(1),
              " channels, the weight was packed for ", in_channels);
  return conv_geometry(op, x.size(0), x.size(1), x.size(2), x.size(3), out_channels, kernel_size, stride, padding,
                       dilation);
}

// The binary conv weight: pack_signs(W.permute(0, 2, 3, 1)) = [OC, KH, KW, ceil(C / 32)] int32.
inline void check_binary_conv_weight(const char* op, const at::Tensor& x, const at::Tensor& w_packed,
                                     int64_t in_channels, at::IntArrayRef kernel_size) {
  BITCOMPILE_CHECK(w_packed.scalar_type() == at::kInt, "bitcompile::", op, ": w_packed must be int32, got ",
              w_packed.scalar_type());
  BITCOMPILE_CHECK(kernel_size.size() == 2, "bitcompile::", op, ": kernel_size must have 2 values");
  BITCOMPILE_CHECK(w_packed.dim() == 4 && w_packed.size(1) == kernel_size[0] && w_packed.size(2) == kernel_size[1] &&
                  w_packed.size(3) == packed_words(in_channels),
              "bitcompile::", op, ": w_packed must have shape (out_channels, ", kernel_size[0], ", ", kernel_size[1],
              ", ", packed_words(in_channels), "), got ", w_packed.sizes());
  check_same_device(op, x, w_packed, "w_packed");
}

inline void check_pad_value(const char* op, double pad_value) {
  BITCOMPILE_CHECK(pad_value == 0.0 || pad_value == 1.0 || pad_value == -1.0, "bitcompile::", op,
              ": pad_value must be 0, 1 or -1, got ", pad_value);
}

// APoT tables: code_values (float32) or code_numerators (int32), 2**bits entries.
inline void check_code_table(const char* op, const at::Tensor& x, int64_t bits, const at::Tensor& table,
                             const char* name, at::ScalarType dtype) {
  BITCOMPILE_CHECK(bits >= 1 && bits <= 8, "bitcompile::", op, ": bits must be in 1..8, got ", bits);
  BITCOMPILE_CHECK(table.dim() == 1 && table.size(0) == (int64_t(1) << bits), "bitcompile::", op, ": ", name,
              " must have 2**bits = ", (int64_t(1) << bits), " entries, got shape ", table.sizes());
  BITCOMPILE_CHECK(table.scalar_type() == dtype, "bitcompile::", op, ": ", name, " must be ", dtype, ", got ",
              table.scalar_type());
  check_same_device(op, x, table, name);
}

inline void check_alpha(const char* op, const at::Tensor& x, const at::Tensor& alpha, int64_t out_features) {
  BITCOMPILE_CHECK(alpha.is_floating_point(), "bitcompile::", op, ": alpha must be floating point, got ",
              alpha.scalar_type());
  BITCOMPILE_CHECK(alpha.numel() == 1 || (alpha.dim() == 1 && alpha.size(0) == out_features), "bitcompile::", op,
              ": alpha must be a scalar or have ", out_features, " elements, got shape ", alpha.sizes());
  check_same_device(op, x, alpha, "alpha");
}

// binary_linear / binary_weight_linear: float x [..., K], w_packed int32 [N, ceil(K / 32)], scale, bias.
inline void check_binary_linear(const char* op, const at::Tensor& x, const at::Tensor& w_packed, int64_t in_features,
                                const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& bias) {
  check_float_input(op, x);
  check_packed_linear(op, x, w_packed, in_features, packed_words(in_features), at::kInt);
  check_scale_bias(op, x, w_packed.size(0), scale, bias);
}

// binary_conv2d / binary_weight_conv2d: float NCHW x, w_packed = pack_signs(W.permute(0, 2, 3, 1)), scale, bias;
// returns the geometry.
inline ConvGeometry check_binary_conv_operands(const char* op, const at::Tensor& x, const at::Tensor& w_packed,
                                               int64_t in_channels, at::IntArrayRef kernel_size,
                                               at::IntArrayRef stride, at::IntArrayRef padding,
                                               at::IntArrayRef dilation, const std::optional<at::Tensor>& scale,
                                               const std::optional<at::Tensor>& bias) {
  check_float_input(op, x);
  const int64_t out_channels = w_packed.dim() >= 1 ? w_packed.size(0) : 0;
  const ConvGeometry g = check_conv_geometry(op, x, in_channels, out_channels, kernel_size, stride, padding, dilation);
  check_binary_conv_weight(op, x, w_packed, in_channels, kernel_size);
  check_scale_bias(op, x, out_channels, scale, bias);
  return g;
}

inline ConvGeometry check_binary_conv2d(const at::Tensor& x, const at::Tensor& w_packed, int64_t in_channels,
                                        at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                                        at::IntArrayRef dilation, const std::optional<at::Tensor>& scale,
                                        const std::optional<at::Tensor>& bias, double pad_value) {
  const ConvGeometry g = check_binary_conv_operands("binary_conv2d", x, w_packed, in_channels, kernel_size, stride,
                                                    padding, dilation, scale, bias);
  check_pad_value("binary_conv2d", pad_value);
  return g;
}

inline ConvGeometry check_binary_weight_conv2d(const at::Tensor& x, const at::Tensor& w_packed, int64_t in_channels,
                                               at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                               at::IntArrayRef padding, at::IntArrayRef dilation,
                                               const std::optional<at::Tensor>& scale,
                                               const std::optional<at::Tensor>& bias) {
  return check_binary_conv_operands("binary_weight_conv2d", x, w_packed, in_channels, kernel_size, stride, padding,
                                    dilation, scale, bias);
}

// binary_conv2d_packed: x_bits = pack_signs(x.permute(0, 2, 3, 1)), int32 [N, H, W, ceil(C / 32)], the output
// dtype float32 / float16 / bfloat16, or int32 for sign words; a residual of the output's shape and (float) dtype;
// returns the geometry.
inline ConvGeometry check_binary_conv2d_packed(const at::Tensor& x_bits, const at::Tensor& w_packed,
                                               int64_t in_channels, at::IntArrayRef kernel_size,
                                               at::IntArrayRef stride, at::IntArrayRef padding,
                                               at::IntArrayRef dilation, const std::optional<at::Tensor>& scale,
                                               const std::optional<at::Tensor>& bias, double pad_value,
                                               at::ScalarType out_dtype,
                                               const std::optional<at::Tensor>& residual = std::nullopt,
                                               const char* op = "binary_conv2d_packed") {
  BITCOMPILE_CHECK(x_bits.scalar_type() == at::kInt, "bitcompile::", op,
                   ": x_bits must be int32 (pack_signs words), got ", x_bits.scalar_type());
  BITCOMPILE_CHECK(x_bits.dim() == 4 && x_bits.size(3) == packed_words(in_channels), "bitcompile::", op,
                   ": x_bits must have shape (N, H, W, ", packed_words(in_channels), ") for ", in_channels,
                   " channels, got ", x_bits.sizes());
  BITCOMPILE_CHECK(out_dtype == at::kFloat || out_dtype == at::kHalf || out_dtype == at::kBFloat16 ||
                       out_dtype == at::kInt,
                   "bitcompile::", op, ": out_dtype must be float32, float16, bfloat16 or int32 (sign words), got ",
                   out_dtype);
  const int64_t out_channels = w_packed.dim() >= 1 ? w_packed.size(0) : 0;
  const ConvGeometry g = conv_geometry(op, x_bits.size(0), in_channels, x_bits.size(1), x_bits.size(2), out_channels,
                                       kernel_size, stride, padding, dilation);
  check_binary_conv_weight(op, x_bits, w_packed, in_channels, kernel_size);
  check_pad_value(op, pad_value);
  check_scale_bias(op, x_bits, out_channels, scale, bias);
  if (residual.has_value()) {
    BITCOMPILE_CHECK(out_dtype != at::kInt, "bitcompile::", op,
                     ": a residual needs a float out_dtype (int32 outputs are sign words)");
    const std::vector<int64_t> shape = {g.batch, g.out_channels, g.out_height, g.out_width};
    BITCOMPILE_CHECK(residual->sizes() == at::IntArrayRef(shape), "bitcompile::", op,
                     ": residual must have the output's shape ", at::IntArrayRef(shape), ", got ", residual->sizes());
    BITCOMPILE_CHECK(residual->scalar_type() == out_dtype, "bitcompile::", op, ": residual must be ", out_dtype,
                     " (out_dtype), got ", residual->scalar_type());
    check_same_device(op, x_bits, *residual, "residual");
  }
  return g;
}

// binary_conv2d_packed_with_signs: binary_conv2d_packed's arguments, with a float out_dtype (the words are the
// second output).
inline ConvGeometry check_binary_conv2d_packed_with_signs(
    const at::Tensor& x_bits, const at::Tensor& w_packed, int64_t in_channels, at::IntArrayRef kernel_size,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, const std::optional<at::Tensor>& scale,
    const std::optional<at::Tensor>& bias, double pad_value, at::ScalarType out_dtype,
    const std::optional<at::Tensor>& residual) {
  const char* op = "binary_conv2d_packed_with_signs";
  BITCOMPILE_CHECK(out_dtype != at::kInt, "bitcompile::", op, ": out_dtype must be float32, float16 or bfloat16, got ",
                   out_dtype);
  return check_binary_conv2d_packed(x_bits, w_packed, in_channels, kernel_size, stride, padding, dilation, scale, bias,
                                    pad_value, out_dtype, residual, op);
}

// pack_codes(codes, bits): integer codes, a non-empty last dimension.
inline void check_pack_codes(const at::Tensor& codes, int64_t bits) {
  BITCOMPILE_CHECK(bits >= 1 && bits <= 8, "bitcompile::pack_codes: bits must be in 1..8, got ", bits);
  const auto dtype = codes.scalar_type();
  BITCOMPILE_CHECK(dtype == at::kByte || dtype == at::kInt || dtype == at::kLong || dtype == at::kShort ||
                       dtype == at::kChar,
                   "bitcompile::pack_codes: codes must be an integer tensor, got ", dtype);
  BITCOMPILE_CHECK(codes.dim() >= 1 && codes.size(-1) >= 1,
                   "bitcompile::pack_codes: codes must have a non-empty last dimension");
}

// apot_linear(x, w_packed, in_features, bits, code_values, alpha, bias).
inline void check_apot_linear(const char* op, const at::Tensor& x, const at::Tensor& w_packed, int64_t in_features,
                              int64_t bits, const at::Tensor& code_values, const at::Tensor& alpha,
                              const std::optional<at::Tensor>& bias) {
  check_float_input(op, x);
  check_code_table(op, x, bits, code_values, "code_values", at::kFloat);
  check_packed_linear(op, x, w_packed, in_features, packed_code_bytes(in_features, bits), at::kByte);
  check_alpha(op, x, alpha, w_packed.size(0));
  check_scale_bias(op, x, w_packed.size(0), std::nullopt, bias);
}

// apot_linear_int(q_x, x_scale, x_zero_point, w_packed, in_features, bits, code_numerators, denominator, alpha, bias).
inline void check_apot_linear_int(const at::Tensor& q_x, const at::Tensor& x_scale, const at::Tensor& x_zero_point,
                                  const at::Tensor& w_packed, int64_t in_features, int64_t bits,
                                  const at::Tensor& code_numerators, double denominator, const at::Tensor& alpha,
                                  const std::optional<at::Tensor>& bias) {
  const char* op = "apot_linear_int";
  BITCOMPILE_CHECK(q_x.scalar_type() == at::kByte, "bitcompile::", op, ": q_x must be uint8, got ", q_x.scalar_type());
  BITCOMPILE_CHECK(x_scale.numel() == 1 && x_zero_point.numel() == 1, "bitcompile::", op,
                   ": x_scale and x_zero_point must be scalars (per-tensor)");
  check_code_table(op, q_x, bits, code_numerators, "code_numerators", at::kInt);
  BITCOMPILE_CHECK(denominator > 0, "bitcompile::", op, ": denominator must be positive, got ", denominator);
  check_packed_linear(op, q_x, w_packed, in_features, packed_code_bytes(in_features, bits), at::kByte);
  check_alpha(op, q_x, alpha, w_packed.size(0));
  check_same_device(op, q_x, x_scale, "x_scale");
  check_same_device(op, q_x, x_zero_point, "x_zero_point");
  check_scale_bias(op, q_x, w_packed.size(0), std::nullopt, bias);
}

// apot_conv2d: codes of W.permute(0, 2, 3, 1).reshape(OC, KH*KW*C) packed row-wise; returns the geometry.
inline ConvGeometry check_apot_conv2d(const at::Tensor& x, const at::Tensor& w_packed, int64_t in_channels,
                                      at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                                      at::IntArrayRef dilation, int64_t bits, const at::Tensor& code_values,
                                      const at::Tensor& alpha, const std::optional<at::Tensor>& bias) {
  const char* op = "apot_conv2d";
  check_float_input(op, x);
  const int64_t out_channels = w_packed.dim() >= 1 ? w_packed.size(0) : 0;
  const auto g = check_conv_geometry(op, x, in_channels, out_channels, kernel_size, stride, padding, dilation);
  check_code_table(op, x, bits, code_values, "code_values", at::kFloat);
  BITCOMPILE_CHECK(w_packed.scalar_type() == at::kByte && w_packed.dim() == 2, "bitcompile::", op,
                   ": w_packed must be 2-D uint8, got ", w_packed.dim(), "-D ", w_packed.scalar_type());
  const int64_t reduction = in_channels * g.kernel_h * g.kernel_w;
  BITCOMPILE_CHECK(w_packed.size(1) == packed_code_bytes(reduction, bits), "bitcompile::", op, ": w_packed is ",
                   w_packed.size(1), " wide, ", reduction, " codes of ", bits, " bits need ",
                   packed_code_bytes(reduction, bits));
  check_same_device(op, x, w_packed, "w_packed");
  check_alpha(op, x, alpha, out_channels);
  check_scale_bias(op, x, out_channels, std::nullopt, bias);
  return g;
}

// A scale-like operand (scalar or per output) as a contiguous float32 vector of 1 or N entries,
// on x's device; the kernels read element 0 or element n. No host sync (SPEC 2.2).
inline at::Tensor as_float_vector(const at::Tensor& t) { return t.reshape({-1}).to(at::kFloat).contiguous(); }

}  // namespace bitcompile
