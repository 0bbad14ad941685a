// The CUDA backend's memory movement and the helpers every family's methods
// share (cuda_backend.h lists the methods; each family's are beside its
// kernels).
#include "kernels/cuda/cuda_backend.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/reduce/reduce.h"

namespace anvil::cuda {

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  const size_t bytes = src.nbytes();
  if (bytes == 0) return;
  if (src.device().is_cuda() && src.device().index != device_)
    synchronize(src.device());  // the source's producer runs on its own device's stream
  activate();
  cudaMemcpyKind kind = src.device().is_cpu()   ? cudaMemcpyHostToDevice
                        : dst.device().is_cpu() ? cudaMemcpyDeviceToHost
                                                : cudaMemcpyDeviceToDevice;
  // Peer copies between devices go through unified addressing (cudaMemcpyDefault).
  if (kind == cudaMemcpyDeviceToDevice && src.device() != dst.device()) kind = cudaMemcpyDefault;
  // A copy into pageable host memory blocks: the label record comes back with it.
  if (dst.device().is_cpu()) queue_label_record();
  check(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), bytes, kind, stream_), "cudaMemcpyAsync");
  // A host destination must hold the data on return; a pageable host source
  // has been staged by the time cudaMemcpyAsync returns, but a pinned one is
  // read only when the copy runs: the caller may change it as soon as this
  // returns.
  if (dst.device().is_cpu() || kind == cudaMemcpyDefault || src.is_pinned()) wait();
}

void CudaBackend::copy_rows(const Tensor& src, int64_t src_stride, const Tensor& dst,
                            int64_t dst_stride, int64_t rows, int64_t width) {
  if (src.device() != dst.device())
    throw std::logic_error("cuda backend asked to copy rows across devices");
  activate();
  cuda::copy_rows(rows, width, dtype_size(src.dtype()), src.raw_data(), src_stride, dst.raw_data(),
                  dst_stride, stream_);
}

void CudaBackend::activate() const { check(cudaSetDevice(device_), "cudaSetDevice"); }

void CudaBackend::queue_label_record() {
  if (labels_checked_ == 0 || label_record_queued_) return;
  // Bring the record back and clear it, in the stream's order: no wait of
  // its own.
  const size_t bytes = kLabelRecordSlots * sizeof(int64_t);
  check(cudaMemcpyAsync(label_record_host_, label_record_, bytes, cudaMemcpyDeviceToHost,
                        stream_),
        "cudaMemcpyAsync");
  check(cudaMemcpyAsync(label_record_, label_record_host_ + kLabelRecordSlots, bytes,
                        cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync");
  label_record_queued_ = true;
}

void CudaBackend::wait() {
  queue_label_record();
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  if (!std::exchange(label_record_queued_, false)) return;
  const int64_t checked = std::exchange(labels_checked_, 0);
  const int64_t* record = label_record_host_;
  if (record[kLabelRecordIndex] < 0) return;
  const std::string which = record[kLabelRecordBatch] > 0
                                ? fmt::format("label check {} of the {}", record[kLabelRecordBatch], checked)
                                : fmt::format("a label check of a CUDA graph's replay, of the {}", checked);
  throw std::invalid_argument(label_error(
      record[kLabelRecordLabel], record[kLabelRecordClasses], record[kLabelRecordIndex],
      record[kLabelRecordSize],
      fmt::format("found on cuda:{} when the host next waited for it: {} since the wait before",
                  device_, which)));
}

void CudaBackend::begin_capture() {
  capturing_ = true;
  captured_label_checks_ = 0;
}

int64_t CudaBackend::end_capture() {
  capturing_ = false;
  return std::exchange(captured_label_checks_, 0);
}

void CudaBackend::replayed(int64_t label_checks) { labels_checked_ += label_checks; }

Tensor CudaBackend::workspace(size_t floats) const {
  if (floats == 0) return Tensor();
  return Tensor::empty({int64_t(floats)}, DType::Float32, Device::cuda(device_));
}

bool CudaBackend::bf16_operands(const char* op, const Tensor& a, const Tensor& b,
                                const Tensor& out) const {
  const bool bf16_in = a.dtype() == DType::BFloat16 || b.dtype() == DType::BFloat16;
  if (out.dtype() == DType::BFloat16 && !bf16_in)
    throw std::invalid_argument(std::string("cuda backend ") + op +
                                ": a bfloat16 output needs a bfloat16 operand");
  return bf16_in;
}

Tensor CudaBackend::bf16_operand(const Tensor& t) {
  if (t.dtype() == DType::BFloat16) return t;
  Tensor copy = Tensor::empty(t.shape(), DType::BFloat16, t.device());
  convert(t, copy);
  return copy;
}

}  // namespace anvil::cuda
