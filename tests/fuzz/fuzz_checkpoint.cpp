// libFuzzer target: a training checkpoint (nn/train.h) read into a small
// model with SGD momentum, as anvil-train --resume reads one: first
// read_run_state, then load_checkpoint. Every input either loads or throws
// CheckpointError; a file whose run state is refused is refused whole; and a
// refused file leaves the model's tensors and the momentum buffers as they were.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "nn/layers.h"
#include "nn/optim.h"
#include "nn/safetensors.h"
#include "nn/train.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace anvil;

// Conv, BatchNorm (with its int64 counter), Linear: every kind of tensor a
// checkpoint holds, small enough for seeds of a few hundred bytes.
std::shared_ptr<nn::Sequential> small_model() {
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Conv2d>(1, 2, 3));
  model->add(std::make_shared<nn::BatchNorm2d>(2));
  model->add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::Flatten>());
  model->add(std::make_shared<nn::Linear>(8, 3));
  return model;
}

// Every byte of the model's state and of the momentum buffers.
std::string snapshot(const nn::Module& model, const optim::SGD& optimizer) {
  std::string bytes;
  auto append = [&](const Tensor& t) {
    if (!t.defined()) {
      bytes += "<undefined>";
      return;
    }
    Tensor host = t.detach().to(Device::cpu());
    bytes.append(static_cast<const char*>(host.raw_data()), host.nbytes());
  };
  for (const auto& [name, t] : model.state_dict()) append(t);
  for (const Tensor& t : optimizer.momentum_buffers()) append(t);
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static anvil::fuzz::ScratchFile file("checkpoint");
  static std::shared_ptr<nn::Sequential> model = small_model();
  static optim::SGD optimizer(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  const std::string& path = file.write(data, size);

  bool state_ok = true;
  try {
    train::read_run_state(path);
  } catch (const nn::CheckpointError&) {
    state_ok = false;
  }
  const std::string before = snapshot(*model, optimizer);
  try {
    train::load_checkpoint(path, *model, optimizer);
    if (!state_ok) anvil::fuzz::fail("load_checkpoint accepted a file read_run_state refused");
  } catch (const nn::CheckpointError&) {
    if (snapshot(*model, optimizer) != before)
      anvil::fuzz::fail("a refused checkpoint changed the model or the optimizer");
  }
  return 0;
}
