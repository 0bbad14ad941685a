// The chunk size a collective agrees on is the one its ring uses: read once
// per collective (CommOptions::chunk_bytes, set_chunk_bytes), so that a
// change between the agreement and the ring cannot cut one rank's messages
// differently from what every rank agreed. A transport of two ranks whose
// peer is a stand-in (its "exchange" answers with this rank's own call, its
// receives are zeros) records the messages the ring posts; the setter is
// called from inside the agreement, where another thread's call could land.
#include <catch2/catch.hpp>

#include <cstring>
#include <span>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/transport.h"

namespace par = anvil::parallel;

namespace {

class StandInChannel final : public par::HostChannel {
 public:
  par::Communicator* comm = nullptr;
  size_t set_during_agreement = 0;
  std::vector<par::CallInfo> exchange(const par::CallInfo& mine, std::chrono::milliseconds,
                                      const std::string&) override {
    if (comm != nullptr && set_during_agreement > 0) comm->set_chunk_bytes(set_during_agreement);
    return {mine, mine};
  }
};

class RecordingTransport final : public par::Transport {
 public:
  RecordingTransport() : Transport(0, 2, anvil::Device::cpu()) {}
  StandInChannel channel_;
  std::vector<size_t> message_bytes;
  std::string_view name() const override { return "stand-in"; }
  par::HostChannel& channel() override { return channel_; }
  void begin() override {}
  void end() override { held_.clear(); }
  bool host_synchronous() const override { return true; }
  uint64_t post_messages(std::span<const par::Message> messages) override {
    for (const par::Message& m : messages) {
      message_bytes.push_back(m.bytes);
      if (m.kind == par::Message::kRecv && m.bytes > 0) std::memset(m.data, 0, m.bytes);
    }
    return ++tickets_;
  }
  void reduce(void*, const void*, int64_t, anvil::DType, float, uint64_t) override {}
  void copy(void* dst, const void* src, size_t bytes, uint64_t) override {
    if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
  }
  void native_allreduce(void*, int64_t, anvil::DType, par::ReduceOp) override {}
  void native_broadcast(void*, size_t, int) override {}
  void native_all_gather(const void*, void*, const std::vector<int64_t>&) override {}
  void native_reduce_scatter(const void*, void*, int64_t, anvil::DType, par::ReduceOp) override {}
  void synchronize() override {}
  void abort() noexcept override {}

 private:
  uint64_t tickets_ = 0;
};

}  // namespace

TEST_CASE("comm: a collective's ring cuts its messages at the chunk size it agreed on",
          "[comm]") {
  auto owned = std::make_unique<RecordingTransport>();
  RecordingTransport& t = *owned;
  par::CommOptions options;
  options.chunk_bytes = 1 << 20;  // 4 KiB tensors: one message per ring step
  par::Communicator comm(std::move(owned), options);
  t.channel_.comm = &comm;
  t.channel_.set_during_agreement = 64;  // after the agreement read 1 MiB
  const anvil::Tensor x = anvil::Tensor::ones({1024}, anvil::DType::Float32);
  auto check = [&] {
    REQUIRE(!t.message_bytes.empty());
    for (size_t bytes : t.message_bytes) {
      INFO("a message of " << bytes << " bytes");
      REQUIRE(bytes > 64);
    }
  };
  SECTION("allreduce") {
    comm.allreduce(x, par::ReduceOp::kSum, par::Algorithm::kRing);
    check();
  }
  SECTION("broadcast") {
    comm.broadcast(x, 0, par::Algorithm::kRing);
    check();
  }
}
