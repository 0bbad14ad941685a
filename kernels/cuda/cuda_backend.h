// Internal to kernels/cuda: the pieces cuda_device.cpp assembles per device.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>

#include "core/backend.h"
#include "core/storage.h"
#include "kernels/cuda/runtime.h"

namespace anvil::cuda {

// A caching allocator over cudaMalloc for one device (cuda_allocator.cpp).
std::unique_ptr<Allocator> make_caching_allocator(int device);
// Its graph pools (cuda_graph.cpp; `a` is such an allocator): from
// begin_graph_pool until end_graph_pool, the calling thread's requests are
// served from a new private pool, whose id it returns; its blocks go to no
// other request until release_graph_pool (the graph is destroyed).
uint64_t begin_graph_pool(Allocator& a);
void end_graph_pool(Allocator& a);
void release_graph_pool(Allocator& a, uint64_t pool);

// The Backend of one device (core/backend.h documents each method): kernels
// launched on the device's compute stream, scratch memory from its caching
// allocator. Each method is defined beside the kernels it launches, in that
// family's host file: an op's CUDA code is in one place. Kernels run
// asynchronously; a method that hands a value to the host (a copy to the
// CPU) waits for the stream first. check_labels does not wait: a kernel
// keeps the first bad label in a record on the device, which every wait
// brings back with it and which then throws.
class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, cudaStream_t stream) : device_(device), stream_(stream) {}

  // copy in cuda_backend.cpp; the others in their family's host file:
  // gemm/gemm.cpp, conv/conv.cpp, reduce/reduce.cpp (channel_sum, sum,
  // check_labels), softmax/softmax.cpp (with count_correct),
  // batch_norm/batch_norm.cpp, pool.cpp, sgd.cpp, elementwise.cpp (fill,
  // convert and the rest).
#include "kernels/backend_overrides.inc"

  // Waits for the compute stream (before a value goes to the host). Where
  // labels were checked since the last wait, the label record comes back
  // with the same wait (a copy queued before it), and a bad label found
  // throws std::invalid_argument (label_error()), once.
  void wait();

  // CUDA graphs (cuda_graph.cpp). Between begin_capture and end_capture
  // this backend's work is captured, not run: its label checks are counted
  // for the graph (end_capture returns how many), not for the next wait,
  // and each replay of the graph adds them back (replayed), so that the
  // wait after a replay brings the label record back. A captured check
  // records batch 0, which the error names as a graph's.
  void begin_capture();
  int64_t end_capture();
  void replayed(int64_t label_checks);

 private:
  // Kernels launch on the current device: make it this backend's.
  void activate() const;
  // Queues the copy of the label record to the host, and its clearing, where
  // labels were checked since the last wait and they are not queued yet.
  void queue_label_record();
  // Scratch for one kernel, from the caching allocator; undefined for 0.
  // Freed when the caller returns, which is safe: later work on the same
  // stream runs after the kernel that used it.
  Tensor workspace(size_t floats) const;
  // Do the operands go to the BF16 rungs as bfloat16? Yes when either is
  // bfloat16: its values are BF16's whatever the precision setting. A
  // float32 partner is then rounded into a bfloat16 copy (bf16_operand),
  // as those rungs round it while staging. The output is float32 or
  // bfloat16 (rounded in the rungs' epilogues); a bfloat16 output with no
  // bfloat16 operand throws (`op` names the method in the error).
  bool bf16_operands(const char* op, const Tensor& a, const Tensor& b, const Tensor& out) const;
  // t, or a bfloat16 copy of a float32 t, rounded to nearest even.
  Tensor bf16_operand(const Tensor& t);

  const int device_;
  const cudaStream_t stream_;
  // check_labels' record (reduce/reduce.h, label_check): kLabelRecordSlots
  // int64 on the device, and pinned host memory for its copy and for the -1s
  // that clear it; made at the first check, never freed (as the device's
  // state). labels_checked_: checks queued since the last wait;
  // label_record_queued_: the record's copy is queued, for the next wait.
  int64_t* label_record_ = nullptr;
  int64_t* label_record_host_ = nullptr;
  int64_t labels_checked_ = 0;
  bool label_record_queued_ = false;
  bool capturing_ = false;
  int64_t captured_label_checks_ = 0;
};

// A tensor's elements as the kernels take them (device pointers); null for
// an undefined tensor (an absent bias).
inline float* floats(const Tensor& t) {
  return t.defined() ? static_cast<float*>(t.raw_data()) : nullptr;
}
inline const int64_t* int64s(const Tensor& t) { return static_cast<const int64_t*>(t.raw_data()); }
inline const bfloat16* bf16s(const Tensor& t) { return t.data<bfloat16>(); }

// True once the device's state (allocator, streams, backend) exists: a
// device no tensor or stream has used yet is false, and asking does not
// create a context on it.
bool initialised(int device);

// The device's compute stream and copy stream (created with the device's state).
cudaStream_t compute_stream(int device);
cudaStream_t copy_stream(int device);

// For tests of the pinned host allocator (cuda_stream.cpp): the next free
// of a pinned block fails with `err`, as on a device left in an error state
// by a faulted kernel; and how many blocks such failures leaked.
void fail_next_pinned_free(cudaError_t err);
size_t pinned_blocks_leaked();

}  // namespace anvil::cuda
