// Host helpers shared by the torch bindings of the CUDA op families (binary_ops.cpp, apot_ops.cpp).
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include "checks.h"
#include "float_types.cuh"

namespace bitcompile {

// The launchers' FloatType of a float32 / float16 / bfloat16 tensor (the ops check dtypes first).
inline FloatType float_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return FloatType::kFloat32;
    case at::kHalf:
      return FloatType::kFloat16;
    case at::kBFloat16:
      return FloatType::kBFloat16;
    default:
      BITCOMPILE_CHECK(false, "bitcompile: no CUDA kernel for dtype ", t.scalar_type());
  }
  return FloatType::kFloat32;  // not reached
}

// A launcher's cudaError_t as an error naming the op.
inline void check_launch(cudaError_t error, const char* op) {
  BITCOMPILE_CHECK(error == cudaSuccess, "bitcompile::", op, ": CUDA kernel failed: ", cudaGetErrorString(error));
}

}  // namespace bitcompile
