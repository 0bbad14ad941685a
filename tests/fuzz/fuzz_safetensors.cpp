// libFuzzer target: load_safetensors on the input as a file. Every input
// either loads or throws CheckpointError; a load has distinct names and
// tensors whose sizes agree with their shapes.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "nn/safetensors.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static anvil::fuzz::ScratchFile file("safetensors");
  const std::string& path = file.write(data, size);
  try {
    const anvil::nn::NamedTensors tensors = anvil::nn::load_safetensors(path);
    std::set<std::string> names;
    for (const auto& [name, t] : tensors) {
      if (!names.insert(name).second) anvil::fuzz::fail("a tensor name loaded twice: " + name);
      if (t.nbytes() != size_t(t.numel()) * anvil::dtype_size(t.dtype()))
        anvil::fuzz::fail("tensor " + name + ": size and shape disagree");
    }
  } catch (const anvil::nn::CheckpointError&) {
  }
  return 0;
}
