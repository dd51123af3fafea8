// PLACEHOLDER to validate the build pipeline; replaced by the real CPU kernels.
#include <torch/library.h>
#include <ATen/ATen.h>
#include "checks.h"

namespace {
at::Tensor pack_signs_cpu(const at::Tensor& x) {
  bitcompile::check_float_input("pack_signs", x);
  auto k = x.size(-1);
  auto words = bitcompile::packed_words(k);
  auto sizes = x.sizes().vec(); sizes.back() = words;
  auto out = at::zeros(sizes, x.options().dtype(at::kInt));
  auto xf = x.to(at::kFloat).contiguous().reshape({-1, k});
  auto o = out.view({-1, words});
  auto xa = xf.accessor<float,2>(); auto oa = o.accessor<int,2>();
  for (int64_t r = 0; r < xf.size(0); ++r) for (int64_t j = 0; j < k; ++j) if (xa[r][j] >= 0) oa[r][j/32] |= (1u << (j%32));
  return out;
}
at::Tensor binary_linear_cpu(const at::Tensor& x, const at::Tensor& w, int64_t in_features, const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& bias, bool sign_zero, bool row_scale) {
  bitcompile::check_packed_linear("binary_linear", x, w, in_features, bitcompile::packed_words(in_features), at::kInt);
  return at::zeros({1});
}
}
TORCH_LIBRARY_IMPL(bitcompile, CPU, m) {
  m.impl("pack_signs", &pack_signs_cpu);
  m.impl("binary_linear", &binary_linear_cpu);
}
