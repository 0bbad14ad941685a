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

void max_pool2d_forward(const Pool2dShape&, const float*, float*, int64_t*, cudaStream_t) { todo("max_pool2d_forward"); }
void max_pool2d_backward(const Pool2dShape&, const float*, const int64_t*, float*, cudaStream_t) { todo("max_pool2d_backward"); }
void avg_pool2d_forward(const Pool2dShape&, const float*, float*, cudaStream_t) { todo("avg_pool2d_forward"); }
void avg_pool2d_backward(const Pool2dShape&, const float*, float*, cudaStream_t) { todo("avg_pool2d_backward"); }

}  // namespace anvil::cuda
