#include "data/device_prefetcher.h"

#include <cstring>

namespace anvil::data {
namespace {

// A pinned tensor of `shape` for the slot, reusing the old one when it fits.
Tensor pinned_buffer(Tensor& slot, const Shape& shape, DType dtype) {
  if (!slot.defined() || slot.shape() != shape)
    slot = Tensor::empty(shape, dtype).pin_memory();
  return slot;
}

}  // namespace

DevicePrefetcher::DevicePrefetcher(DataLoader& loader, Device device)
    : loader_(loader), device_(device) {
  check_cuda_device(device);
}

DevicePrefetcher::~DevicePrefetcher() {
  // Queued copies still read the pinned buffers: let them finish first.
  for (auto& s : staging_)
    if (s.copied) {
      try {
        s.copied->synchronize();
      } catch (...) {
        // A failing device cannot be helped here; the destructor must not throw.
      }
    }
}

void DevicePrefetcher::start_epoch() {
  loader_.start_epoch();
  has_pending_ = false;
  issue();
}

void DevicePrefetcher::start_epoch(uint64_t epoch) {
  loader_.start_epoch(epoch);
  has_pending_ = false;
  issue();
}

void DevicePrefetcher::issue() {
  has_pending_ = loader_.next(pending_.host);
  if (!has_pending_) return;
  const Batch& b = pending_.host;
  const Shape image_shape{b.size, b.channels, b.rows, b.cols};
  if (device_.is_cpu()) {
    pending_.images = Tensor::from_host(b.images.data(), image_shape, DType::Float32);
    pending_.labels = Tensor::from_host(b.labels.data(), {b.size}, DType::Int64);
    return;
  }
  Staging& slot = free_staging();
  pending_slot_ = size_t(&slot - staging_.data());
  slot.issued = ++issued_;
  Tensor host_images = pinned_buffer(slot.images, image_shape, DType::Float32);
  Tensor host_labels = pinned_buffer(slot.labels, {b.size}, DType::Int64);
  // A rank's shard of a batch may be empty: no bytes, and no pointers to copy from.
  if (host_images.nbytes() > 0)
    std::memcpy(host_images.raw_data(), b.images.data(), host_images.nbytes());
  if (host_labels.nbytes() > 0)
    std::memcpy(host_labels.raw_data(), b.labels.data(), host_labels.nbytes());
  pending_.images = Tensor::empty(image_shape, DType::Float32, device_);
  pending_.labels = Tensor::empty({b.size}, DType::Int64, device_);
  copy_async(pending_.images, host_images, Stream::Copy);
  copy_async(pending_.labels, host_labels, Stream::Copy);
  if (!slot.copied) slot.copied = std::make_unique<Event>(device_, /*timing=*/false);
  slot.copied->record(Stream::Copy);
}

DevicePrefetcher::Staging& DevicePrefetcher::free_staging() {
  // A copy issued a step or more ago has as a rule finished (a step is
  // longer than a batch's copy): its buffer is reused without the host
  // blocking, which a training step must not do.
  for (Staging& s : staging_)
    if (!s.copied || s.copied->ready()) return s;
  if (staging_.size() < kMaxStaging) return staging_.emplace_back();
  // Copies slower than the steps: wait for the oldest.
  Staging* oldest = &staging_[0];
  for (Staging& s : staging_)
    if (s.issued < oldest->issued) oldest = &s;
  oldest->copied->synchronize();
  return *oldest;
}

bool DevicePrefetcher::next(DeviceBatch& out) {
  if (!has_pending_) return false;
  if (!device_.is_cpu()) {
    // Kernels the caller issues from now on read the copied batch.
    staging_[pending_slot_].copied->wait(Stream::Compute);
  }
  std::swap(out, pending_);
  if (static_images_.defined() && out.images.shape() == static_images_.shape() &&
      out.labels.shape() == static_labels_.shape()) {
    static_images_.copy_(out.images);
    static_labels_.copy_(out.labels);
    out.images = static_images_;
    out.labels = static_labels_;
  }
  issue();
  return true;
}

void DevicePrefetcher::set_static_buffers(Tensor images, Tensor labels) {
  static_images_ = std::move(images);
  static_labels_ = std::move(labels);
}

}  // namespace anvil::data
