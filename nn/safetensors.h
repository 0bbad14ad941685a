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

// Copies a state dict into the module's parameters and buffers. Every name,
// shape and dtype must match exactly (PyTorch's strict=True); the error
// names the offending tensor. `source` names the origin in messages.
void load_state_dict(Module& module, const NamedTensors& state, const std::string& source);
// The checks load_state_dict makes before it copies anything: the same names
// as module.state_dict(), each of the same shape and dtype. Throws
// CheckpointError naming `source` and the tensor.
void check_state_dict(const Module& module, const NamedTensors& state, const std::string& source);

}  // namespace anvil::nn
