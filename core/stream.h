// Streams and events: what a program needs to overlap host-to-device copies
// with compute, and to time work on a GPU.
//
// Each CUDA device has two streams. Kernels and ordinary copies run on its
// compute stream, in the order they were issued; the copy stream carries
// asynchronous copies (e.g. the next mini-batch) so they run while the
// compute stream is busy. An Event marks a point in one stream's work:
// another stream can be told to wait for it (no host blocking), the host can
// wait for it, and two events give the GPU time between them.
//
//   Event copied(device);
//   copy_async(x_gpu, x_pinned, Stream::Copy);   // returns at once
//   copied.record(Stream::Copy);
//   copied.wait(Stream::Compute);                // kernels issued from now on see x_gpu
//
// On the CPU work is synchronous: an event holds the host clock when it was
// recorded, wait() and synchronize() return at once, and copy_async is a copy.
#pragma once
#include <cstdint>
#include <memory>

#include "core/device.h"

namespace anvil {

class Tensor;

enum class Stream : uint8_t { Compute, Copy };

class Event {
 public:
  // `timing` false makes a lighter event that cannot give elapsed_ms
  // (cudaEventDisableTiming), for pure synchronisation.
  explicit Event(Device device = Device::cpu(), bool timing = true);
  ~Event();
  Event(Event&&) noexcept;
  Event& operator=(Event&&) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  Device device() const { return device_; }
  // Marks the point after all work issued so far to `stream` of the device.
  void record(Stream stream = Stream::Compute);
  // Work issued to `stream` after this call starts only once the recorded
  // point is reached; the host does not wait. Throws if never recorded.
  void wait(Stream stream = Stream::Compute) const;
  // The host waits until the recorded point is reached.
  void synchronize() const;
  // True once the recorded point is reached (never blocks).
  bool ready() const;
  // Milliseconds from this event to `end` (both recorded, both timing events
  // of the same device); waits for `end`.
  double elapsed_ms(const Event& end) const;

  // Backend-specific state (a cudaEvent_t); implemented per backend.
  struct Impl {
    virtual ~Impl() = default;
    virtual void record(Stream stream) = 0;
    virtual void wait(Stream stream) const = 0;
    virtual void synchronize() const = 0;
    virtual bool ready() const = 0;
    virtual double elapsed_ms(const Impl& end) const = 0;
  };

 private:
  void check_recorded(const char* what) const;
  Device device_;
  bool timing_ = true;
  bool recorded_ = false;
  std::unique_ptr<Impl> impl_;
};

// dst <- src (same shape and dtype; at least one of them on a CUDA device),
// issued to `stream` of that CUDA device. A host-to-device copy from pinned
// memory (Tensor::pin_memory) returns at once: record an Event after it and
// make the compute stream wait before using dst, and keep src unchanged
// until the event is reached. From pageable memory the source is staged
// before the call returns. A device-to-host copy returns once done.
// Between two CPU tensors it is a plain copy.
void copy_async(const Tensor& dst, const Tensor& src, Stream stream = Stream::Copy);

}  // namespace anvil
