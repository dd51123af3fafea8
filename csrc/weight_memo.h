// The backend's weight ops without Python on a cache hit (bitcompile/weight_ops.py).
//
// linear_of_weight, conv2d_of_weight, packed_conv2d_of_weight and packed_conv2d_of_weight_with_signs take a live
// float weight and run a kernel op on its converted form, which weight_ops.py's cache keeps per version of the
// weight (packed_linear_group: its members' packed weights stacked, per version of theirs). Their Python kernel
// cost host time on every call: the dispatcher's way into Python and back, the cache's key in Python and the kernel
// op's call from Python (2-core CPU, benchmarks/weight_op_host.py: packed_conv2d_of_weight 25.4 us a call against
// 13.0 for its kernel op; a binary ResNet-18 forward makes 16 such calls and, in torch.compile's default mode, is
// host-bound on the GPU machine). This memo holds what that cache holds for the binary and APoT forms, keyed the
// same way (a tag, then for each tensor the converted weight depends on: device, dtype, storage, offset, sizes,
// strides; valid while each of those tensors has the version it had and its storage lives). The ops'
// BackendSelect kernel (below) looks a call up here first: a hit runs the kernel op at once, with the arguments the
// Python kernel would give it; anything else (a miss, a dense form, an inference tensor) goes on to the Python
// kernel, which converts (or finds the weight in its own cache) and tells this memo
// (bitcompile::remember_kernel_weight). Entries are only added for weights the Python cache keeps.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/library.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bitcompile {

// A converted weight (weight_ops.KernelWeight of kind "binary" or "apot") and, with an epilogue function, the scale
// and bias it computed.
struct MemoWeight {
  at::Tensor packed;                     // int32 sign words (bits 0) or uint8 codes
  std::optional<at::Tensor> alpha;       // the weight form's per-output scale
  std::optional<at::Tensor> code_values; // APoT: the level table
  std::optional<at::Tensor> scale, bias; // epilogue_fn's values
  int64_t bits = 0;
  bool x_binarized = false;              // quantize:"binary" binarizes activations too
};

class WeightMemo {
 public:
  static WeightMemo& instance() {
    static WeightMemo memo;
    return memo;
  }

  // The entry of (tag, inputs) while it is valid, else nullopt.
  std::optional<MemoWeight> find(const std::string& tag, at::TensorList inputs) {
    std::vector<int64_t> key;
    if (!key_of(inputs, key)) return std::nullopt;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = entries_.find(Key{tag, std::move(key)});
    if (found == entries_.end()) return std::nullopt;
    const Entry& entry = found->second;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (entry.versions[i] != inputs[i]._version() || entry.storages[i].expired()) return std::nullopt;
    }
    return entry.weight;
  }

  void remember(const std::string& tag, at::TensorList inputs, MemoWeight weight) {
    std::vector<int64_t> key;
    if (!key_of(inputs, key)) return;
    Entry entry{{}, {}, std::move(weight)};
    for (const at::Tensor& t : inputs) {
      entry.storages.push_back(t.storage().getWeakStorageImpl());
      entry.versions.push_back(t._version());
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (entries_.size() >= kPruneAt) prune();
    entries_.insert_or_assign(Key{tag, std::move(key)}, std::move(entry));
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.clear();
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }

 private:
  static constexpr size_t kPruneAt = 256;  // as weight_ops.py's cache: entries whose tensors are gone go then

  struct Key {
    std::string tag;
    std::vector<int64_t> geometry;
    bool operator==(const Key& other) const { return tag == other.tag && geometry == other.geometry; }
  };
  struct KeyHash {
    size_t operator()(const Key& key) const {
      size_t h = std::hash<std::string>()(key.tag);
      for (const int64_t v : key.geometry) h = h * 1000003u ^ std::hash<int64_t>()(v);
      return h;
    }
  };
  struct Entry {
    std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> storages;
    std::vector<int64_t> versions;
    MemoWeight weight;
  };

  // False for tensors the Python cache does not keep either (inference tensors: no version counter) and for
  // tensors without storage.
  static bool key_of(at::TensorList inputs, std::vector<int64_t>& key) {
    key.reserve(inputs.size() * 14);
    for (const at::Tensor& t : inputs) {
      if (!t.defined() || t.is_inference() || !t.has_storage()) return false;
      key.push_back(static_cast<int64_t>(t.device().type()));
      key.push_back(t.device().index());
      key.push_back(static_cast<int64_t>(t.scalar_type()));
      key.push_back(reinterpret_cast<int64_t>(t.storage().data()));
      key.push_back(t.storage_offset());
      key.push_back(t.dim());
      for (const int64_t size : t.sizes()) key.push_back(size);
      for (const int64_t stride : t.strides()) key.push_back(stride);
    }
    return true;
  }

  void prune() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      bool expired = false;
      for (const auto& storage : it->second.storages) expired = expired || storage.expired();
      it = expired ? entries_.erase(it) : std::next(it);
    }
  }

  std::mutex mutex_;
  std::unordered_map<Key, Entry, KeyHash> entries_;
};

// ---- The weight ops' BackendSelect kernel: the memo first -------------------------------------------------------
// BackendSelect sits below autograd, the Python key (fake tensors, TorchDispatchModes) and functionalization, and
// is in every call's key set, inference mode included: a kernel there sees each call that reaches the Python kernel
// below it, on plain tensors only. A hit runs the kernel op; anything else goes on to the Python kernel.
enum class WeightOp { kLinear, kConv, kPackedConv, kPackedConvWithSigns };

// Where a weight op's arguments sit in its schema (found by name once).
struct WeightOpArgs {
  size_t count, x, weight, scale, bias, epilogue_inputs, epilogue_fn, weight_form;
  size_t x_form = 0, row_scale = 0;                                    // linear_of_weight (x_form: conv2d_of_weight)
  size_t stride = 0, padding = 0, dilation = 0, pad_value = 0;         // the convs
  size_t residual = 0, out_dtype = 0;                                  // the packed convs

  WeightOpArgs(const c10::FunctionSchema& schema, WeightOp op)
      : count(schema.arguments().size()),
        x(index(schema, op == WeightOp::kLinear || op == WeightOp::kConv ? "x" : "x_bits")),
        weight(index(schema, "weight")),
        scale(index(schema, "scale")),
        bias(index(schema, "bias")),
        epilogue_inputs(index(schema, "epilogue_inputs")),
        epilogue_fn(index(schema, "epilogue_fn")),
        weight_form(index(schema, "weight_form")) {
    if (op == WeightOp::kLinear) {
      x_form = index(schema, "x_form");
      row_scale = index(schema, "row_scale");
      return;
    }
    stride = index(schema, "stride");
    padding = index(schema, "padding");
    dilation = index(schema, "dilation");
    pad_value = index(schema, "pad_value");
    if (op == WeightOp::kConv) {
      x_form = index(schema, "x_form");
    } else {
      residual = index(schema, "residual");
      out_dtype = index(schema, "out_dtype");
    }
  }

  static size_t index(const c10::FunctionSchema& schema, const char* name) {
    const auto found = schema.argumentIndexWithName(name);
    TORCH_INTERNAL_ASSERT(found.has_value(), "bitcompile: ", schema.name(), " has no argument ", name);
    return static_cast<size_t>(*found);
  }
};

// weight_ops._combined_scale: the weight form's alpha times the call's scale.
inline std::optional<at::Tensor> combined_scale(const std::optional<at::Tensor>& alpha,
                                                const std::optional<at::Tensor>& scale) {
  if (!alpha.has_value()) return scale;
  if (!scale.has_value()) return alpha;
  return at::mul(*alpha, scale->reshape(-1).to(at::kFloat));
}

inline c10::OperatorHandle kernel_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

// A memo hit's kernel-op call: the op (nullptr: no hit, or a call the memo does not serve) and its arguments.
using MemoCall = const c10::OperatorHandle* (*)(const c10::OperatorHandle& handle, c10::ArrayRef<c10::IValue> args,
                                                 torch::jit::Stack& call);

// The Python kernels' kernel-op call (weight_ops.py: _run_linear, _run_conv2d, _packed_conv2d_of_weight_impl and
// its with_signs twin) for a weight the memo holds; nullptr where that call is not one of these (a dense form, APoT
// weights with binarized activations, a packed input or a pad value, an epilogue function given scale or bias: the
// Python kernel raises).
template <WeightOp kOp>
const c10::OperatorHandle* weight_op_call(const c10::OperatorHandle& handle, c10::ArrayRef<c10::IValue> args,
                                          torch::jit::Stack& call) {
  static const WeightOpArgs pos(handle.schema(), kOp);
  const at::Tensor& weight = args[pos.weight].toTensor();
  const std::string& fn = args[pos.epilogue_fn].toStringRef();
  std::optional<at::Tensor> scale = args[pos.scale].toOptional<at::Tensor>();
  std::optional<at::Tensor> bias = args[pos.bias].toOptional<at::Tensor>();
  std::string tag = args[pos.weight_form].toStringRef();
  std::vector<at::Tensor> inputs{weight};
  if (!fn.empty()) {
    if (scale.has_value() || bias.has_value()) return nullptr;
    tag += "|epilogue:" + fn;
    if (!args[pos.epilogue_inputs].isNone()) {
      for (const at::Tensor input : args[pos.epilogue_inputs].toTensorList()) {
        if (!input.is_same(weight)) inputs.push_back(input);
      }
    }
  }
  const std::optional<MemoWeight> found = WeightMemo::instance().find(tag, inputs);
  if (!found.has_value()) return nullptr;
  if (!fn.empty()) {
    scale = found->scale;
    bias = found->bias;
  }
  const c10::IValue& x = args[pos.x];
  const std::optional<at::Tensor> total = combined_scale(found->alpha, scale);
  if constexpr (kOp == WeightOp::kLinear) {
    const bool float_x = !found->x_binarized && args[pos.x_form].toStringRef() == "float";
    const bool sign_zero = !found->x_binarized && args[pos.x_form].toStringRef() == "sign";
    const int64_t k = weight.size(1);
    if (found->bits == 0 && float_x) {
      static const c10::OperatorHandle linear = kernel_op("bitcompile::binary_weight_linear");
      call = {x, found->packed, k, total, bias};
      return &linear;
    }
    if (found->bits == 0) {
      static const c10::OperatorHandle linear = kernel_op("bitcompile::binary_linear");
      call = {x, found->packed, k, total, bias, sign_zero, args[pos.row_scale]};
      return &linear;
    }
    if (float_x && total.has_value() && found->code_values.has_value()) {
      static const c10::OperatorHandle linear = kernel_op("bitcompile::apot_linear");
      call = {x, found->packed, k, found->bits, *found->code_values, *total, bias};
      return &linear;
    }
    return nullptr;
  } else {
    const c10::IValue channels = weight.size(1);
    const c10::IValue kernel_size = std::vector<int64_t>{weight.size(2), weight.size(3)};
    const c10::IValue &stride = args[pos.stride], &padding = args[pos.padding], &dilation = args[pos.dilation];
    if constexpr (kOp == WeightOp::kConv) {
      const bool binarized = found->x_binarized || args[pos.x_form].toStringRef() != "float";
      const bool sign_zero = !found->x_binarized && args[pos.x_form].toStringRef() == "sign";
      if (found->bits == 0 && binarized) {
        static const c10::OperatorHandle conv = kernel_op("bitcompile::binary_conv2d");
        call = {x, found->packed, channels, kernel_size, stride, padding, dilation, total, bias, args[pos.pad_value],
                sign_zero};
        return &conv;
      }
      if (found->bits == 0) {
        static const c10::OperatorHandle conv = kernel_op("bitcompile::binary_weight_conv2d");
        call = {x, found->packed, channels, kernel_size, stride, padding, dilation, total, bias};
        return &conv;
      }
      if (!binarized && args[pos.pad_value].toDouble() == 0.0 && total.has_value() &&
          found->code_values.has_value()) {
        static const c10::OperatorHandle conv = kernel_op("bitcompile::apot_conv2d");
        call = {x, found->packed, channels, kernel_size, stride, padding, dilation, found->bits,
                *found->code_values, *total, bias};
        return &conv;
      }
      return nullptr;
    } else {
      if (found->bits != 0) return nullptr;
      static const c10::OperatorHandle conv = kernel_op(kOp == WeightOp::kPackedConv
                                                             ? "bitcompile::binary_conv2d_packed"
                                                             : "bitcompile::binary_conv2d_packed_with_signs");
      call = {x, found->packed, channels, kernel_size, stride, padding, dilation, total, bias, args[pos.residual],
              args[pos.out_dtype], args[pos.pad_value]};
      return &conv;
    }
  }
}

// packed_linear_group (weight_ops.py): its members stacked (packed, scale, bias and the APoT table in the entry,
// keyed on every member tensor as the Python kernel's cache is), then binary_weight_linear or apot_linear.
inline const c10::OperatorHandle* group_call(const c10::OperatorHandle& handle, c10::ArrayRef<c10::IValue> args,
                                             torch::jit::Stack& call) {
  static const bool schema_as_read = handle.schema().arguments().size() == 7 &&
                                     handle.schema().arguments()[6].name() == "bits";
  TORCH_INTERNAL_ASSERT(schema_as_read, "bitcompile: packed_linear_group's schema is not the one weight_memo.h reads");
  std::vector<at::Tensor> inputs;  // x, w_packed, in_features, scale, bias, code_values, bits: the four lists
  for (size_t list = 1; list < 6; ++list) {
    if (list == 2) continue;
    for (const at::Tensor t : args[list].toTensorList()) inputs.push_back(t);
  }
  const int64_t bits = args[6].toInt();
  const std::optional<MemoWeight> found = WeightMemo::instance().find("group:" + std::to_string(bits), inputs);
  if (!found.has_value()) return nullptr;
  if (bits == 0) {
    static const c10::OperatorHandle linear = kernel_op("bitcompile::binary_weight_linear");
    call = {args[0], found->packed, args[2], found->scale, found->bias};
    return &linear;
  }
  if (!found->scale.has_value() || !found->code_values.has_value()) return nullptr;
  static const c10::OperatorHandle linear = kernel_op("bitcompile::apot_linear");
  call = {args[0], found->packed, args[2], bits, *found->code_values, *found->scale, found->bias};
  return &linear;
}

// A weight op's BackendSelect kernel: on plain CPU or CUDA tensors, kFind's kernel-op call in place of the op's
// arguments where the memo has it; else the op's kernel below (its Python kernel).
template <MemoCall kFind>
void memo_backend_select(const c10::OperatorHandle& handle, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const c10::DispatchKeySet below = keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER,
                                                               c10::DispatchKey::BackendSelect);
  const c10::DispatchKey backend = below.highestPriorityTypeId();
  const size_t count = handle.schema().arguments().size();
  torch::jit::Stack call;
  const c10::OperatorHandle* op = backend == c10::DispatchKey::CPU || backend == c10::DispatchKey::CUDA
                                      ? kFind(handle, torch::jit::last(*stack, count), call)
                                      : nullptr;
  if (op == nullptr) return handle.redispatchBoxed(below, stack);
  op->redispatchBoxed(below, &call);
  torch::jit::drop(*stack, count);
  for (c10::IValue& output : call) torch::jit::push(*stack, std::move(output));
}

// bitcompile::remember_kernel_weight and forget_kernel_weights (weight_ops.py calls them).
inline void remember_kernel_weight(at::TensorList inputs, c10::string_view tag, const at::Tensor& packed,
                                   const std::optional<at::Tensor>& alpha, const std::optional<at::Tensor>& code_values,
                                   const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& bias,
                                   int64_t bits, bool x_binarized) {
  WeightMemo::instance().remember(std::string(tag), inputs,
                                  MemoWeight{packed, alpha, code_values, scale, bias, bits, x_binarized});
}

inline int64_t forget_kernel_weights() {
  const int64_t entries = static_cast<int64_t>(WeightMemo::instance().size());
  WeightMemo::instance().clear();
  return entries;
}

// The memo's kernels, registered once a process by the first binary library to load (the CPU and the CUDA one
// both include this header; BackendSelect is one key for all backends, and the memo the kernels share is that
// library's): the five weight ops' BackendSelect kernels, remember_kernel_weight and forget_kernel_weights.
struct WeightMemoRegistration {
  std::unique_ptr<torch::Library> library;

  WeightMemoRegistration() {
    const auto remember = c10::Dispatcher::singleton().findSchema({"bitcompile::remember_kernel_weight", ""});
    if (!remember.has_value() || remember->hasKernelForDispatchKey(c10::DispatchKey::BackendSelect)) return;
    library = std::make_unique<torch::Library>(torch::Library::IMPL, "bitcompile", c10::DispatchKey::BackendSelect,
                                               __FILE__, __LINE__);
    library->impl("remember_kernel_weight", &remember_kernel_weight);
    library->impl("forget_kernel_weights", &forget_kernel_weights);
    using torch::CppFunction;
    library->impl("linear_of_weight",
                  CppFunction::makeFromBoxedFunction<&memo_backend_select<&weight_op_call<WeightOp::kLinear>>>());
    library->impl("conv2d_of_weight",
                  CppFunction::makeFromBoxedFunction<&memo_backend_select<&weight_op_call<WeightOp::kConv>>>());
    library->impl("packed_conv2d_of_weight",
                  CppFunction::makeFromBoxedFunction<&memo_backend_select<&weight_op_call<WeightOp::kPackedConv>>>());
    library->impl("packed_conv2d_of_weight_with_signs",
                  CppFunction::makeFromBoxedFunction<
                      &memo_backend_select<&weight_op_call<WeightOp::kPackedConvWithSigns>>>());
    library->impl("packed_linear_group", CppFunction::makeFromBoxedFunction<&memo_backend_select<&group_call>>());
  }
};

}  // namespace bitcompile
