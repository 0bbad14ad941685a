// The agreement every rank reaches before data moves.
//
// Before each collective every rank posts what it is about to do (CallInfo)
// on the host channel and reads every other rank's. Ranks that disagree (a
// different collective, count, dtype, root, call number or chunk size) all
// stop there with the same message naming both sides; a rank that never
// posts is named by the others when their deadline passes. Only then does
// data move, so a mismatch can never turn into a hang or a corrupted buffer
// on the wire.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/transport.h"

namespace anvil::parallel {

namespace {

std::string op_name(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "average"; }

// "allreduce #3 (ring, sum) of float32 [1000]"
std::string describe(const CallInfo& c) {
  std::string s = fmt::format("{} #{}", collective_name(c.collective), c.seq);
  switch (c.collective) {
    case Collective::kAllreduce:
      s += fmt::format(" ({}, {})", algorithm_name(c.algorithm), op_name(c.op));
      break;
    case Collective::kReduceScatter:
      s += fmt::format(" ({}, {})", algorithm_name(c.algorithm), op_name(c.op));
      break;
    case Collective::kBroadcast:
      s += fmt::format(" ({}) from rank {}", algorithm_name(c.algorithm), c.root);
      break;
    case Collective::kAllGather: s += fmt::format(" ({})", algorithm_name(c.algorithm)); break;
    case Collective::kScatter: s += fmt::format(" from rank {}", c.root); break;
    case Collective::kSplit:
      s += c.color < 0 ? fmt::format(" (no group, key {})", c.key)
                       : fmt::format(" (color {}, key {})", c.color, c.key);
      break;
    default: break;
  }
  if (c.ndim >= 0) s += fmt::format(" of {} {}", dtype_name(c.dtype), shape_str(c.tensor_shape()));
  if (c.fingerprint != 0) s += fmt::format(" (fingerprint {:#018x})", c.fingerprint);
  return s;
}

// Whether two ranks' calls are compatible; `ref` is the rank the others are
// compared with (rank 0, or the root of a rooted collective).
bool compatible(const CallInfo& ref, const CallInfo& other) {
  if (ref.seq != other.seq || ref.collective != other.collective ||
      ref.fingerprint != other.fingerprint)
    return false;
  auto same_tensor = [&] {
    return ref.dtype == other.dtype && ref.ndim == other.ndim &&
           std::equal(ref.shape, ref.shape + std::max(ref.ndim, 0), other.shape);
  };
  switch (ref.collective) {
    case Collective::kAllreduce:
      return ref.algorithm == other.algorithm && ref.op == other.op && same_tensor();
    case Collective::kReduceScatter:
      return ref.algorithm == other.algorithm && ref.op == other.op && same_tensor();
    case Collective::kBroadcast:
      return ref.algorithm == other.algorithm && ref.root == other.root && same_tensor();
    case Collective::kScatter: return ref.root == other.root;
    case Collective::kAllGather:
      return ref.algorithm == other.algorithm && ref.dtype == other.dtype &&
             ref.ndim == other.ndim &&
             std::equal(ref.shape + 1, ref.shape + std::max(ref.ndim, 1), other.shape + 1);
    case Collective::kBarrier:
    case Collective::kSplit: return true;  // colors and keys differ by design
    case Collective::kSend:
    case Collective::kRecv: return false;  // point to point: agree_with_peers
  }
  return false;
}

}  // namespace

CallInfo CallInfo::of(Collective collective, const Tensor& t) {
  CallInfo c;
  c.collective = collective;
  c.dtype = t.dtype();
  if (t.dim() > CallInfo::kMaxDims)
    throw std::invalid_argument(fmt::format("{}: tensors of more than {} dimensions are not "
                                            "supported (got {})",
                                            collective_name(collective), CallInfo::kMaxDims,
                                            shape_str(t.shape())));
  c.ndim = int32_t(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) c.shape[d] = t.size(d);
  return c;
}

namespace {

// Whether the collective's schedule depends on the chunk size.
bool cut_in_chunks(const CallInfo& c) {
  return c.algorithm == Algorithm::kRing &&
         (c.collective == Collective::kAllreduce || c.collective == Collective::kBroadcast ||
          c.collective == Collective::kReduceScatter);
}

}  // namespace

std::vector<CallInfo> Communicator::agree(CallInfo mine) {
  mine.seq = ++seq_;
  // The caller read the chunk size once (the ring uses that same value);
  // only a collective cut in chunks compares it.
  if (!cut_in_chunks(mine)) mine.chunk_bytes = 0;
  const std::string what = describe(mine);
  transport_->set_context(what);
  if (debug_) {
    debug_call_ = what;
    debug_bytes_ = size_t(mine.numel()) * dtype_size(mine.dtype);
  }
  // Unchecked, the calls whose answer carries nothing the caller needs
  // skip the exchange.
  const bool answer_needed = mine.collective == Collective::kScatter ||
                             mine.collective == Collective::kAllGather ||
                             mine.collective == Collective::kBarrier ||
                             mine.collective == Collective::kSplit;
  if (!check_calls_.load() && !answer_needed) return {};
  std::vector<CallInfo> all =
      transport_->channel().exchange(mine, options_.timeout, transport_->error_prefix());
  ++checked_;
  // Rooted collectives compare with the root (whose tensor defines the
  // call), the others with rank 0; the first rank that differs is named.
  int ref = 0;
  if ((mine.collective == Collective::kBroadcast || mine.collective == Collective::kScatter) &&
      mine.root >= 0 && mine.root < size() && all[size_t(mine.root)].seq == mine.seq)
    ref = mine.root;
  for (int j = 0; j < size(); ++j) {
    if (compatible(all[size_t(ref)], all[size_t(j)])) continue;
    throw CommError(fmt::format("{}: ranks disagree on collective #{}: rank {} asked for {}, "
                                "rank {} asked for {}",
                                transport_->identity(), mine.seq, ref,
                                describe(all[size_t(ref)]), j, describe(all[size_t(j)])));
  }
  for (int j = 0; j < size(); ++j) {
    if (all[size_t(j)].chunk_bytes == all[size_t(ref)].chunk_bytes) continue;
    throw CommError(fmt::format(
        "{}: ranks disagree on collective #{} ({}): rank {} cuts it in chunks of {} bytes, "
        "rank {} in chunks of {} bytes (CommOptions::chunk_bytes must be the same on every "
        "rank)",
        transport_->identity(), mine.seq, describe(mine), ref,
        all[size_t(ref)].chunk_bytes, j, all[size_t(j)].chunk_bytes));
  }
  return all;
}

}  // namespace anvil::parallel

namespace anvil::parallel {

namespace {

bool same_tensor(const CallInfo& a, const CallInfo& b) {
  if (a.ndim < 0 || b.ndim < 0) return a.ndim < 0 && b.ndim < 0;
  return a.dtype == b.dtype && a.ndim == b.ndim && std::equal(a.shape, a.shape + a.ndim, b.shape);
}

// "rank 0 sends float32 [4, 8] to rank 1": one side of a point-to-point call.
std::string describe_side(const Transport& t, int rank, const PeerCall& c, int peer) {
  std::string s = t.peer_name(rank);
  const bool sends = c.send.ndim >= 0, receives = c.recv.ndim >= 0;
  if (sends)
    s += fmt::format(" sends {} {} to {}", dtype_name(c.send.dtype),
                     shape_str(c.send.tensor_shape()), t.peer_name(peer));
  if (sends && receives) s += " and";
  if (receives)
    s += fmt::format(" receives {} {} from {}", dtype_name(c.recv.dtype),
                     shape_str(c.recv.tensor_shape()), t.peer_name(peer));
  return s;
}

}  // namespace

void Communicator::agree_with_peers(std::vector<int> peers, std::vector<PeerCall> mine) {
  if (peer_calls_.empty()) peer_calls_.assign(size_t(size()), 0);
  for (size_t i = 0; i < peers.size(); ++i) mine[i].seq = ++peer_calls_[size_t(peers[i])];
  if (!check_calls_.load()) return;
  const std::vector<PeerCall> theirs = transport_->channel().exchange_with(
      peers, mine, options_.timeout, transport_->error_prefix());
  ++checked_;
  for (size_t i = 0; i < peers.size(); ++i) {
    const PeerCall& a = mine[i];
    const PeerCall& b = theirs[i];
    if (a.seq == b.seq && same_tensor(a.send, b.recv) && same_tensor(a.recv, b.send)) continue;
    // The same words on both ranks: the lower rank's side first.
    const int peer = peers[i];
    const bool first = rank() < peer;
    const std::string mine_text = describe_side(*transport_, rank(), a, peer);
    const std::string their_text = describe_side(*transport_, peer, b, rank());
    std::string hint;
    if (a.seq != b.seq)
      hint = fmt::format(" ({} is at its call #{} with {}, {} at #{})",
                         transport_->peer_name(rank()), a.seq, transport_->peer_name(peer),
                         transport_->peer_name(peer), b.seq);
    else if (a.recv.ndim < 0 && b.recv.ndim < 0)
      hint = " (both send, neither receives: one must recv, or both sendrecv)";
    else if (a.send.ndim < 0 && b.send.ndim < 0)
      hint = " (both receive, neither sends)";
    throw CommError(fmt::format(
        "{}point-to-point call #{} between {} and {} does not match: {}; {}{}",
        transport_->error_prefix(),
        std::min(a.seq, b.seq), transport_->peer_name(std::min(rank(), peer)),
        transport_->peer_name(std::max(rank(), peer)), first ? mine_text : their_text,
        first ? their_text : mine_text, hint));
  }
}

}  // namespace anvil::parallel
