// The vocabulary of an SGD step over many tensors at once: what the op
// (core/ops.h, sgd_step_) and the backends (core/backend.h, sgd_step) take.
#pragma once
#include "core/tensor.h"

namespace anvil {

// One parameter's part in an SGD step (sgd_step_ in core/ops.h; kernels/sgd.h
// has the update, PyTorch's): all float32 of the parameter's shape, on its device.
struct SgdTensors {
  Tensor param;         // updated in place
  Tensor grad;
  Tensor momentum_buf;  // undefined with momentum 0
  Tensor param_copy;    // undefined, or bfloat16: gets the updated param rounded to nearest even
                        // (the copy autocast reads, core/autocast.h)
  bool first_step = false;  // the buffer is set to the step's g, its contents not read
};
struct SgdHyper {
  float lr = 0, momentum = 0, weight_decay = 0;
  bool nesterov = false;
  // When defined, a float32 scalar on the tensors' device from which the
  // kernel reads the learning rate when it runs, in place of lr: a step
  // captured in a CUDA graph then follows the schedule (nn/optim.h).
  Tensor lr_on_device;
};

}  // namespace anvil
