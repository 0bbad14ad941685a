// The group of one rank (one_rank_group in communicator.h): a run on one
// device seen as data-parallel training over a single replica, so the
// trainer has one code path. No other rank exists, so there is nothing to
// send, receive or wait for: every collective leaves its tensor as it is,
// and scatter and all_gather copy it, on the device's compute stream, in
// order with the work around them.
#include <fmt/format.h>

#include <cstring>

#include "core/cuda_hooks.h"
#include "parallel/transport.h"

namespace anvil::parallel {
namespace {

// Every "exchange" meets only this rank's own call.
class OneRankChannel final : public HostChannel {
 public:
  std::vector<CallInfo> exchange(const CallInfo& mine, std::chrono::milliseconds,
                                 const std::string&) override {
    return {mine};
  }
  // The only peer is this rank itself (sendrecv's ring of one).
  std::vector<PeerCall> exchange_with(std::span<const int>, std::span<const PeerCall> mine,
                                      std::chrono::milliseconds, const std::string&) override {
    return {mine.begin(), mine.end()};
  }
  std::shared_ptr<HostChannel> split(int color, int, int, int, std::chrono::milliseconds,
                                     const std::string&) override {
    return color < 0 ? nullptr : std::make_shared<OneRankChannel>();
  }
};

class OneRankTransport final : public Transport {
 public:
  explicit OneRankTransport(Device device) : Transport(0, 1, device) {}
  OneRankTransport(const Place& place, Device device) : Transport(place, device) {}
  // Its group is itself again.
  std::unique_ptr<Transport> split(int color, int, const Place& place) override {
    if (color < 0) return nullptr;
    return std::make_unique<OneRankTransport>(place, device());
  }
  std::string_view name() const override { return "local"; }
  HostChannel& channel() override { return channel_; }
  // The work (copies only) runs on the compute stream, already in order.
  void begin() override {}
  void end() override { held_.clear(); }

  uint64_t post_messages(std::span<const Message> messages) override {
    // sendrecv's ring of one: a copy.
    if (messages.size() == 2 && messages[0].kind == Message::kSend &&
        messages[1].kind == Message::kRecv && messages[0].bytes == messages[1].bytes) {
      copy(messages[1].data, messages[0].data, messages[0].bytes, 0);
      return ++posted_;
    }
    for (const Message& m : messages)
      if (m.bytes > 0)
        throw CommError(error_prefix() + "a group of one rank has no other rank to " +
                        (m.kind == Message::kSend ? "send to" : "receive from"));
    return ++posted_;
  }
  void reduce(void*, const void*, int64_t, DType, float, uint64_t) override {
    // The collectives reduce only what other ranks sent.
    throw CommError(error_prefix() + "a group of one rank has nothing to reduce");
  }
  void copy(void* dst, const void* src, size_t bytes, uint64_t) override {
    if (bytes == 0 || dst == src) return;
    if (device().is_cpu()) std::memcpy(dst, src, bytes);
    else cuda_hooks::copy_async(device().index, Stream::Compute, dst, device(), src, device(), bytes);
  }
  // One rank's sum is its data, and its gather its shard.
  void native_allreduce(void*, int64_t, DType, ReduceOp) override {}
  void native_broadcast(void*, size_t, int) override {}
  void native_all_gather(const void* shard, void* output,
                         const std::vector<int64_t>& offsets) override {
    copy(output, shard, size_t(offsets[1] - offsets[0]), 0);
  }
  void native_reduce_scatter(const void* input, void* output, int64_t count, DType dtype,
                             ReduceOp) override {
    copy(output, input, size_t(count) * dtype_size(dtype), 0);
  }
  void synchronize() override { anvil::synchronize(device()); }
  void abort() noexcept override {}

 private:
  OneRankChannel channel_;
  uint64_t posted_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> one_rank_group(Device device) {
  // No wait on another rank, so no deadline to read from ANVIL_COMM_TIMEOUT
  // (a designated member skips its default, default_timeout()).
  return std::make_unique<Communicator>(std::make_unique<OneRankTransport>(device),
                                        CommOptions{.timeout = std::chrono::hours(24)});
}

}  // namespace anvil::parallel
