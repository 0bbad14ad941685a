// A DataLoader's batches as tensors on a device, the next batch copied while
// the current one is computed (PyTorch's pin_memory + non_blocking copies on a
// side stream, in one object).
//
//   DevicePrefetcher batches(loader, Device::cuda(0));
//   batches.start_epoch();
//   DeviceBatch b;
//   while (batches.next(b)) train_step(b.images, b.labels);
//
// On a CUDA device each batch is staged into one of two pinned host buffers
// and copied to the device on the copy stream (core/stream.h); next() makes
// the compute stream wait for that copy, then at once issues the copy of the
// following batch, so it runs under the kernels the caller issues next. A
// pinned buffer is refilled only after the copy that read it has finished:
// one whose copy has finished is reused, else a new one is made (up to
// kMaxStaging, then the host waits for the oldest copy), so that a steady
// step does not block the host (two buffers are enough where a step takes
// longer than a batch's copy). On the CPU the batch is wrapped into tensors
// directly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/stream.h"
#include "core/tensor.h"
#include "data/dataloader.h"

namespace anvil::data {

struct DeviceBatch {
  Tensor images;  // [N, C, H, W] float32 on the device
  Tensor labels;  // [N] int64 on the device
  Batch host;     // the batch as the DataLoader produced it (labels, indices, sizes)
};

class DevicePrefetcher {
 public:
  // The loader must outlive the prefetcher and is driven only through it.
  DevicePrefetcher(DataLoader& loader, Device device);
  ~DevicePrefetcher();
  DevicePrefetcher(const DevicePrefetcher&) = delete;
  DevicePrefetcher& operator=(const DevicePrefetcher&) = delete;

  Device device() const { return device_; }
  // Starts the loader's next epoch and the copy of its first batch.
  void start_epoch();
  // Starts epoch `epoch` of the loader (e.g. to resume a run).
  void start_epoch(uint64_t epoch);
  // Moves the next batch into `out` (false once the epoch is exhausted).
  // Throws what the loader throws.
  bool next(DeviceBatch& out);
  // A CUDA graph's static input buffers (nn/train.cpp): from now on next()
  // copies each batch of their shapes into them (on the compute stream,
  // once its copy from the host is done) and hands them out in `out`; a
  // batch of other shapes (a short last batch) is handed out in tensors of
  // its own. Undefined tensors end it.
  void set_static_buffers(Tensor images, Tensor labels);

 private:
  static constexpr size_t kMaxStaging = 4;
  struct Staging {
    Tensor images, labels;  // pinned host memory
    std::unique_ptr<Event> copied;  // recorded after the copies that read them
    uint64_t issued = 0;            // when its last copy was issued (issue()'s count)
  };
  void issue();  // loads the next batch and starts its copy (if any)
  // A staging buffer no queued copy reads any more.
  Staging& free_staging();

  DataLoader& loader_;
  Device device_;
  std::vector<Staging> staging_;
  size_t pending_slot_ = 0;  // the staging buffer of pending_'s copy
  uint64_t issued_ = 0;
  bool has_pending_ = false;
  DeviceBatch pending_;
  Tensor static_images_, static_labels_;
};

}  // namespace anvil::data
