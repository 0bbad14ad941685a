// Checkpoints in the safetensors format (8-byte little-endian header
// length, a JSON header of {name: {dtype, shape, data_offsets}}, then the raw
// little-endian tensor bytes), readable by PyTorch's safetensors.torch.
#pragma once
#include <stdexcept>
#include <string>

#include "nn/module.h"

namespace anvil::nn {

struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Writes atomically: a temporary file next to path, renamed over it only
// once complete, so a failure never leaves a half-written checkpoint.
void save_safetensors(const std::string& path, const NamedTensors& tensors);
// Reads every tensor onto the CPU, in file order. Errors name the file.
NamedTensors load_safetensors(const std::string& path);

// Copies a state dict into the module's parameters and buffers. Every name
// and shape must match exactly (PyTorch's strict=True), and every dtype, but
// for one conversion: a bfloat16 tensor goes into a float32 one, widened
// exactly (each bfloat16 value is a float32 value), as PyTorch's
// load_state_dict copies a bfloat16 state dict (safetensors.torch.save_file
// of model.to(torch.bfloat16)) into a float32 model. The error names the
// offending tensor; `source` names the origin in messages. Returns how many
// tensors were widened.
int64_t load_state_dict(Module& module, const NamedTensors& state, const std::string& source);
// The checks load_state_dict makes before it copies anything: the same names
// as module.state_dict(), each of the same shape and dtype (or bfloat16 for
// float32). Throws CheckpointError naming `source` and the tensor.
void check_state_dict(const Module& module, const NamedTensors& state, const std::string& source);

}  // namespace anvil::nn
