// What every Transport shares: how its errors begin (and which are a peer's
// echo), its scratch memory, and the end of a collective done on the host.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>

#include "parallel/transport.h"

namespace anvil::parallel {

std::string Transport::identity() const {
  if (label_.empty()) return fmt::format("rank {} ({}, {})", rank_, name(), device_.str());
  return fmt::format("{}, rank {} of {} ({}, {}, world rank {})", label_, rank_, size_, name(),
                     device_.str(), world_rank(rank_));
}

std::string Transport::peer_name(int rank) const {
  if (label_.empty() || rank < 0 || rank >= size_) return fmt::format("rank {}", rank);
  return fmt::format("rank {} (world rank {})", rank, world_rank(rank));
}

std::string Transport::error_prefix() const {
  return fmt::format("{}: {}: ", identity(),
                     context_.empty() ? std::string("communicator") : context_);
}

std::string RankFailure::text() const {
  return fmt::format("another rank failed (world rank {}): {}", rank, what);
}

void Transport::throw_error(const std::string& message) {
  if (const std::optional<RankFailure> f = channel().peer_failure();
      f && f->rank != world_rank(rank_))
    throw PeerFailed(message, f->rank);
  throw CommError(message);
}

void* Transport::scratch(size_t bytes) {
  held_.push_back(Tensor::empty({int64_t(std::max<size_t>(bytes, 1))}, DType::UInt8, device_));
  return held_.back().raw_data();
}

std::unique_ptr<InFlight> Transport::end_later() {
  end();  // a transport that does the work on the host: nothing is left for later
  struct Done final : InFlight {
    void wait() override {}
  };
  return std::make_unique<Done>();
}

// A channel or transport without them (a test's stand-in) says so.
std::vector<PeerCall> HostChannel::exchange_with(std::span<const int>, std::span<const PeerCall>,
                                                 std::chrono::milliseconds,
                                                 const std::string& who) {
  throw CommError(who + "this channel has no point-to-point agreement");
}
std::shared_ptr<HostChannel> HostChannel::split(int, int, int, int, std::chrono::milliseconds,
                                                const std::string& who) {
  throw CommError(who + "this channel cannot be split");
}
std::unique_ptr<Transport> Transport::split(int, int, const Place&) {
  throw CommError(error_prefix() + "this transport cannot be split");
}

int64_t CallInfo::numel() const { return ndim < 0 ? 0 : shape_numel(tensor_shape()); }

}  // namespace anvil::parallel
