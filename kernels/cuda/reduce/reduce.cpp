// The reductions' entry points: argument checks, zeroing where a rung adds
// into its output, then the rung's launcher (reduce.h lists the rungs).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/reduce/reduce.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"

namespace anvil::cuda {
namespace {

void check_rung(const char* fn, int number, int count) {
  if (number < 1 || number > count)
    throw std::invalid_argument(std::string("cuda::") + fn + ": no rung " +
                                std::to_string(number) + " (there are 1 to " +
                                std::to_string(count) + ")");
}

void check_count(const char* what, int64_t v) {
  if (v < 0)
    throw std::invalid_argument(std::string(what) + " = " + std::to_string(v) + " is negative");
}

}  // namespace

size_t sum_workspace_floats(int number, int64_t n) {
  check_rung("sum", number, kSumRungs);
  check_count("cuda::sum_workspace_floats: n", n);
  return number == 4 ? sum_rungs::two_pass_workspace_floats(n) : 0;
}

void sum(int number, int64_t n, const float* x, float* out, float* workspace,
         cudaStream_t stream) {
  check_rung("sum", number, kSumRungs);
  check_count("cuda::sum: n", n);
  if (number != 4 || n == 0) {
    check(cudaMemsetAsync(out, 0, sizeof(float), stream), "cuda::sum: zeroing out");
    if (n == 0) return;
  }
  if (number == 4 && workspace == nullptr)
    throw std::invalid_argument("cuda::sum: rung 4 needs sum_workspace_floats(4, n) floats "
                                "of workspace");
  sum_rungs::kRungs[number - 1].launch(n, x, out, workspace, stream);
}

size_t channel_sum_workspace_floats(int number, int64_t outer, int64_t C, int64_t inner) {
  check_rung("channel_sum", number, kChannelSumRungs);
  check_count("cuda::channel_sum_workspace_floats: outer", outer);
  check_count("cuda::channel_sum_workspace_floats: C", C);
  check_count("cuda::channel_sum_workspace_floats: inner", inner);
  return number == 1 ? 0 : channel_sum_rungs::split_workspace_floats(outer, C, inner);
}

namespace {

template <class T>
void checked_channel_sum(int number, int64_t outer, int64_t C, int64_t inner, const T* dy,
                         float* db, float* workspace, cudaStream_t stream) {
  check_rung("channel_sum", number, kChannelSumRungs);
  check_count("cuda::channel_sum: outer", outer);
  check_count("cuda::channel_sum: C", C);
  check_count("cuda::channel_sum: inner", inner);
  if (C > INT32_MAX) throw std::invalid_argument("cuda::channel_sum: C is 2^31 or more");
  const channel_sum_rungs::Rung& rung = channel_sum_rungs::kRungs[number - 1];
  if constexpr (!std::is_same_v<T, float>)
    if (rung.launch_bf16 == nullptr)
      throw std::invalid_argument("cuda::channel_sum: rung " + std::to_string(number) + " (" +
                                  rung.name + ") reads float32 only");
  if (C == 0) return;
  if (number == 2 && workspace == nullptr)
    throw std::invalid_argument("cuda::channel_sum: rung 2 needs channel_sum_workspace_floats "
                                "floats of workspace");
  if constexpr (std::is_same_v<T, float>)
    rung.launch(outer, C, inner, dy, db, workspace, stream);
  else
    rung.launch_bf16(outer, C, inner, dy, db, workspace, stream);
}

}  // namespace

void channel_sum(int number, int64_t outer, int64_t C, int64_t inner, const float* dy, float* db,
                 float* workspace, cudaStream_t stream) {
  checked_channel_sum(number, outer, C, inner, dy, db, workspace, stream);
}
void channel_sum(int number, int64_t outer, int64_t C, int64_t inner, const bfloat16* dy,
                 float* db, float* workspace, cudaStream_t stream) {
  checked_channel_sum(number, outer, C, inner, dy, db, workspace, stream);
}

// ---- CudaBackend (cuda_backend.h) ----

void CudaBackend::channel_sum(int64_t outer, int64_t C, int64_t inner, const Tensor& dy,
                              const Tensor& db) {
  activate();
  Tensor ws = workspace(channel_sum_workspace_floats(kBestChannelSum, outer, C, inner));
  if (dy.dtype() == DType::BFloat16)
    cuda::channel_sum(kBestChannelSum, outer, C, inner, bf16s(dy), floats(db), floats(ws),
                      stream_);
  else
    cuda::channel_sum(kBestChannelSum, outer, C, inner, floats(dy), floats(db), floats(ws),
                      stream_);
}
void CudaBackend::sum(const Tensor& x, double scale, const Tensor& out) {
  activate();
  Tensor ws = workspace(sum_workspace_floats(kBestSum, x.numel()));
  cuda::sum(kBestSum, x.numel(), floats(x), floats(out), floats(ws), stream_);
  if (scale != 1.0) cuda::scale(1, static_cast<float>(scale), floats(out), floats(out), stream_);
}
void CudaBackend::check_labels(const Tensor& labels, int64_t classes) {
  activate();
  if (!label_record_ && capturing_)
    throw std::logic_error(
        "check_labels: the label record is made by a check outside a CUDA graph's capture (run "
        "a step eagerly first)");
  if (!label_record_) {
    // The device's record, cleared by a copy of -1s from the second half
    // of the pinned buffer (which stays -1s), queued like any other copy.
    const size_t bytes = kLabelRecordSlots * sizeof(int64_t);
    check(cudaMalloc(&label_record_, bytes), "cudaMalloc");
    check(cudaMallocHost(&label_record_host_, 2 * bytes), "cudaMallocHost");
    for (int i = 0; i < 2 * kLabelRecordSlots; ++i) label_record_host_[i] = -1;
    check(cudaMemcpyAsync(label_record_, label_record_host_ + kLabelRecordSlots, bytes,
                          cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync");
  }
  // A captured check runs at every replay: it records batch 0 (replayed() counts it).
  const int64_t batch = capturing_ ? 0 : ++labels_checked_;
  if (capturing_) ++captured_label_checks_;
  cuda::label_check(labels.numel(), int64s(labels), classes, batch, label_record_, stream_);
}

}  // namespace anvil::cuda
