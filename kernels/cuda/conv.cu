// STUB: replaced by the real kernels in this session's work.
#include <stdexcept>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/cuda_kernels.h"

namespace anvil::cuda {
namespace {
[[noreturn]] void todo(const char* name) {
  throw std::runtime_error(std::string("cuda::") + name + ": not implemented yet");
}
}  // namespace

size_t conv2d_workspace_floats(int, const Conv2dShape&) { todo("conv2d_workspace_floats"); }
void conv2d_forward(int, const Conv2dShape&, const float*, const float*, const float*, float*,
                    float*, cudaStream_t) { todo("conv2d_forward"); }
void conv2d_backward_data(int, const Conv2dShape&, const float*, const float*, float*, float*,
                          cudaStream_t) { todo("conv2d_backward_data"); }
void conv2d_backward_weight(int, const Conv2dShape&, const float*, const float*, float*, float*,
                            float*, cudaStream_t) { todo("conv2d_backward_weight"); }

}  // namespace anvil::cuda
