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

void relu_forward(int64_t, const float*, float*, cudaStream_t) { todo("relu_forward"); }
void relu_backward(int64_t, const float*, const float*, float*, cudaStream_t) { todo("relu_backward"); }
void add(int64_t, const float*, const float*, float*, cudaStream_t) { todo("add"); }
void mul(int64_t, const float*, const float*, float*, cudaStream_t) { todo("mul"); }
void axpy(int64_t, float, const float*, float*, cudaStream_t) { todo("axpy"); }
void scale(int64_t, float, const float*, float*, cudaStream_t) { todo("scale"); }
void fill(int64_t, float, float*, cudaStream_t) { todo("fill"); }
void fill(int64_t, int64_t, int64_t*, cudaStream_t) { todo("fill"); }
void fill(int64_t, uint8_t, uint8_t*, cudaStream_t) { todo("fill"); }
void add_channel_bias(int64_t, int64_t, int64_t, const float*, const float*, float*, cudaStream_t) { todo("add_channel_bias"); }

}  // namespace anvil::cuda
