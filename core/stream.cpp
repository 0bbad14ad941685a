#include "core/stream.h"

#include <chrono>
#include <stdexcept>

#include <fmt/format.h>

#include "core/cuda_hooks.h"
#include "core/tensor.h"

namespace anvil {
namespace {

// The CPU runs work as it is issued, so a point in its "stream" is reached
// when it is recorded.
struct HostEvent final : Event::Impl {
  std::chrono::steady_clock::time_point time;
  void record(Stream) override { time = std::chrono::steady_clock::now(); }
  void wait(Stream) const override {}
  void synchronize() const override {}
  bool ready() const override { return true; }
  double elapsed_ms(const Impl& end) const override {
    const auto& e = static_cast<const HostEvent&>(end);
    return std::chrono::duration<double, std::milli>(e.time - time).count();
  }
};

}  // namespace

Event::Event(Device device, bool timing) : device_(device), timing_(timing) {
  if (device.is_cpu()) {
    impl_ = std::make_unique<HostEvent>();
  } else {
    check_cuda_device(device);
    impl_ = cuda_hooks::make_event(device.index, timing);
  }
}

Event::~Event() = default;
Event::Event(Event&&) noexcept = default;
Event& Event::operator=(Event&&) noexcept = default;

void Event::check_recorded(const char* what) const {
  if (!impl_) throw std::logic_error(fmt::format("Event::{}: the event was moved from", what));
  if (!recorded_)
    throw std::logic_error(
        fmt::format("Event::{}: the event on {} has not been recorded", what, device_.str()));
}

void Event::record(Stream stream) {
  if (!impl_) throw std::logic_error("Event::record: the event was moved from");
  impl_->record(stream);
  recorded_ = true;
}

void Event::wait(Stream stream) const {
  check_recorded("wait");
  impl_->wait(stream);
}

void Event::synchronize() const {
  check_recorded("synchronize");
  impl_->synchronize();
}

bool Event::ready() const {
  check_recorded("ready");
  return impl_->ready();
}

double Event::elapsed_ms(const Event& end) const {
  check_recorded("elapsed_ms");
  end.check_recorded("elapsed_ms");
  if (end.device_ != device_)
    throw std::invalid_argument(fmt::format(
        "Event::elapsed_ms: the events are on different devices ({} and {})", device_.str(),
        end.device_.str()));
  if (!timing_ || !end.timing_)
    throw std::invalid_argument("Event::elapsed_ms: an event was created with timing off");
  return impl_->elapsed_ms(*end.impl_);
}

void copy_async(const Tensor& dst, const Tensor& src, Stream stream) {
  if (src.shape() != dst.shape() || src.dtype() != dst.dtype())
    throw std::invalid_argument(
        fmt::format("copy_async: source {} {} does not match destination {} {}",
                    dtype_name(src.dtype()), shape_str(src.shape()), dtype_name(dst.dtype()),
                    shape_str(dst.shape())));
  if (src.device().is_cpu() && dst.device().is_cpu()) {
    Tensor out = dst;  // a handle to the same storage
    out.copy_(src);
    return;
  }
  const Device gpu = dst.device().is_cuda() ? dst.device() : src.device();
  check_cuda_device(src.device());
  check_cuda_device(dst.device());
  if (src.nbytes() == 0) return;
  cuda_hooks::copy_async(gpu.index, stream, dst.raw_data(), dst.device(), src.raw_data(),
                         src.device(), src.nbytes());
}

}  // namespace anvil
