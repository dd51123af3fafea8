// The Autograd kernel of the inference ops (bitcompile/ops.py, "Inference ops under autograd"), in C++.
//
// The dispatcher runs an op's Autograd kernel on every call, under torch.no_grad() and inside compiled graphs too.
// ops.py's Python one (torch.library.register_autograd) cost 5-10 us a call on the CPU, more than the small CPU
// kernels themselves and more than a small GPU kernel takes: eager GPU calls were host-bound. This one does what
// ops.py's does, at the cost of a loop over the arguments: without grad it runs the op below autograd (the
// device kernel's own ATen calls too, issue 12); with an input that requires grad, a float output gets a
// backward that calls bitcompile::not_differentiable for each input that needs a gradient, which raises with
// the op's name and its training form. It stays an op call, so AOTAutograd can still trace a training graph
// around a quantize_'d layer.
//
// Each family library registers it for its own backend key (AutogradCPU in csrc/cpu, AutogradCUDA in
// csrc/cuda): a backend key never collides with ops.py's registration at the Autograd alias key, which the
// dispatcher only uses where no backend key has a kernel, and no op is registered twice at one key. Before a
// device's library loads (the lazy loader's first call, fake-tensor tracing, opcheck) and for other backends
// (Meta), the Python kernel serves.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace bitcompile {

// What to train with instead, as ops.py's _TRAINING_FORMS and weight_ops.py's TRAINING_FORM say
// (tests/test_requires_grad.py checks that the C++ and Python kernels give the same error).
inline const char* training_form(const std::string& op) {
  static constexpr const char* weight_ops = "torch.compile(backend='bitcompile') with grad enabled (the *_ste ops)";
  static const std::pair<const char*, const char*> forms[] = {
      {"pack_signs", "a float weight (pack_signs gives integers)"},
      {"pack_codes", "a float weight (pack_codes gives integers)"},
      {"binary_linear", "binary_linear_ste (or ste_sign + F.linear)"},
      {"binary_weight_linear", "binary_weight_linear_ste (or F.linear(x, ste_sign(W)))"},
      {"binary_conv2d", "binary_conv2d_ste (or ste_sign + F.conv2d)"},
      {"binary_conv2d_packed", "binary_conv2d_ste (or ste_sign + F.conv2d)"},
      {"binary_conv2d_packed_with_signs", "binary_conv2d_ste (or ste_sign + F.conv2d)"},
      {"apot_linear", "bitcompile.nn.APoTLinear (fake quantization with an STE)"},
      {"apot_linear_int", "bitcompile.nn.APoTLinear (fake quantization with an STE)"},
      {"apot_conv2d", "bitcompile.nn.APoTConv2d (fake quantization with an STE)"},
      {"linear_of_weight", weight_ops},
      {"conv2d_of_weight", weight_ops},
      {"packed_conv2d_of_weight", weight_ops},
      {"packed_conv2d_of_weight_with_signs", weight_ops},
      {"packed_linear_group", weight_ops},
  };
  for (const auto& form : forms) {
    if (op == form.first) return form.second;
  }
  return "a differentiable form of the op";  // not reached: every op registered below has a form
}

// The op's run below autograd, inside a custom Function whose backward calls not_differentiable for each input that
// required grad. A torch::autograd::Function rather than a Node of our own: compiled autograd knows how to call its
// backward (not traceable: at run time, where it raises as the Python kernel's does).
struct NotDifferentiable : torch::autograd::Function<NotDifferentiable> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList needs_grad,
                                                const std::string& op,
                                                c10::function_ref<torch::autograd::variable_list()> run) {
    c10::impl::GenericList sizes(c10::AnyType::get());
    c10::impl::GenericList dtypes(c10::AnyType::get());
    for (const at::Tensor& input : needs_grad) {
      sizes.push_back(input.sym_sizes());
      dtypes.push_back(input.scalar_type());
    }
    ctx->saved_data["op"] = op;
    ctx->saved_data["sizes"] = std::move(sizes);
    ctx->saved_data["dtypes"] = std::move(dtypes);
    torch::autograd::variable_list outputs = run();
    for (const at::Tensor& output : outputs) {  // sign words
      if (!at::isFloatingType(output.scalar_type())) ctx->mark_non_differentiable({output});
    }
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto not_differentiable =
        c10::Dispatcher::singleton().findSchemaOrThrow("bitcompile::not_differentiable", "");
    const std::string op = ctx->saved_data["op"].toStringRef();
    const auto sizes = ctx->saved_data["sizes"].toListRef();
    const auto dtypes = ctx->saved_data["dtypes"].toListRef();
    at::Tensor grad;  // the first output's with one output; with the sign words beside it, the float output's
    for (const at::Tensor& g : grads) {
      if (g.defined()) {
        grad = g;
        break;
      }
    }
    torch::autograd::variable_list result(sizes.size() + 2);  // the inputs, then op and run
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (!ctx->needs_input_grad(i)) continue;
      torch::jit::Stack stack{grad, sizes[i], dtypes[i], op, training_form(op)};
      not_differentiable.callBoxed(stack);
      result[i] = stack.back().toTensor();
    }
    return result;
  }
};

inline void inference_op_autograd(const c10::OperatorHandle& handle, c10::DispatchKeySet keys,
                                  torch::jit::Stack* stack) {
  const auto run = [&] {
    at::AutoDispatchBelowADInplaceOrView guard;
    handle.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  };
  std::vector<at::Tensor> needs_grad;
  if (at::GradMode::is_enabled()) {
    for (const c10::IValue& argument : torch::jit::last(*stack, handle.schema().arguments().size())) {
      if (argument.isTensor() && argument.toTensor().requires_grad()) needs_grad.push_back(argument.toTensor());
      if (argument.isTensorList()) {  // the weight ops' epilogue_inputs
        for (const at::Tensor input : argument.toTensorList()) {
          if (input.requires_grad()) needs_grad.push_back(input);
        }
      }
    }
  }
  if (needs_grad.empty()) return run();
  const std::string& name = handle.schema().name();
  const size_t returns = handle.schema().returns().size();  // a tensor, or (with_signs ops) the output and its words
  torch::autograd::variable_list outputs =
      NotDifferentiable::apply(at::TensorList(needs_grad), name.substr(name.find("::") + 2), [&] {
        run();
        torch::autograd::variable_list result;
        for (const c10::IValue& value : torch::jit::last(*stack, returns)) result.push_back(value.toTensor());
        torch::jit::drop(*stack, returns);
        return result;
      });
  for (at::Tensor& output : outputs) torch::jit::push(*stack, std::move(output));
}

inline void register_inference_autograd(torch::Library& m, std::initializer_list<const char*> ops) {
  for (const char* op : ops) m.impl(op, torch::CppFunction::makeFromBoxedFunction<&inference_op_autograd>());
}

}  // namespace bitcompile
