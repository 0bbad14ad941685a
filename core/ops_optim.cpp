// The optimizer's multi-tensor ops (see core/ops.h): their checks, then one
// Backend call for all the tensors.
#include <stdexcept>

#include <fmt/format.h>

#include "core/backend.h"
#include "core/ops.h"
#include "core/ops_util.h"

namespace anvil {

using namespace ops_detail;

namespace {

// Every tensor's device is the first's; names the entry that differs.
void check_device(const char* op, const Tensor& t, const Tensor& first, size_t entry,
                  const char* what) {
  if (t.device() != first.device())
    throw std::invalid_argument(fmt::format("{}: {} of tensor {} is on {}, tensor 0 on {}", op,
                                            what, entry, t.device().str(),
                                            first.device().str()));
}

void check_like(const char* op, const Tensor& t, const Tensor& param, size_t entry,
                const char* what) {
  if (t.shape() != param.shape())
    throw std::invalid_argument(fmt::format("{}: {} of tensor {} is {}, its parameter {}", op,
                                            what, entry, shape_str(t.shape()),
                                            shape_str(param.shape())));
}

}  // namespace

void sgd_step_(std::span<const SgdTensors> tensors, const SgdHyper& h) {
  if (tensors.empty()) return;
  const Tensor& first = tensors[0].param;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SgdTensors& t = tensors[i];
    const std::string entry = fmt::format("tensor {}", i);
    check_float32("sgd_step_", (entry + "'s parameter").c_str(), t.param);
    check_float32("sgd_step_", (entry + "'s gradient").c_str(), t.grad);
    check_device("sgd_step_", t.param, first, i, "the parameter");
    check_device("sgd_step_", t.grad, first, i, "the gradient");
    check_like("sgd_step_", t.grad, t.param, i, "the gradient");
    if (h.momentum != 0) {
      check_float32("sgd_step_", (entry + "'s momentum buffer").c_str(), t.momentum_buf);
      check_device("sgd_step_", t.momentum_buf, first, i, "the momentum buffer");
      check_like("sgd_step_", t.momentum_buf, t.param, i, "the momentum buffer");
    }
    if (t.param_copy.defined()) {
      if (t.param_copy.dtype() != DType::BFloat16)
        throw std::invalid_argument(fmt::format("sgd_step_: the copy of tensor {} is {}, not bfloat16",
                                                i, dtype_name(t.param_copy.dtype())));
      check_device("sgd_step_", t.param_copy, first, i, "the bfloat16 copy");
      check_like("sgd_step_", t.param_copy, t.param, i, "the bfloat16 copy");
    }
  }
  if (h.lr_on_device.defined()) {
    check_float32("sgd_step_", "the learning rate on the device", h.lr_on_device);
    if (h.lr_on_device.numel() != 1 || h.lr_on_device.device() != first.device())
      throw std::invalid_argument(fmt::format(
          "sgd_step_: the learning rate on the device must be one float on {}, got {} on {}",
          first.device().str(), shape_str(h.lr_on_device.shape()),
          h.lr_on_device.device().str()));
  }
  backend(first).sgd_step(tensors, h);
}

void zero_(std::span<const Tensor> tensors) {
  if (tensors.empty()) return;
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_float32("zero_", fmt::format("tensor {}", i).c_str(), tensors[i]);
    check_device("zero_", tensors[i], tensors[0], i, "the data");
  }
  backend(tensors[0]).zero_tensors(tensors);
}

}  // namespace anvil
