// The host channel of ranks that are threads of one process (NCCL with one
// host thread per GPU): a board in shared memory where each rank pins what it
// is about to do and reads the others'. The k-th exchange of every rank meets
// the k-th of every other, as messages between processes would; a failure
// one rank reports ends the others' waits at once, each with PeerFailed.
#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

#include "parallel/transport.h"

namespace anvil::parallel {
namespace {

struct Board {
  explicit Board(int n) : size(n), exchanges(size_t(n), 0) {}
  const int size;
  std::mutex mutex;
  std::condition_variable posted;
  struct Round {
    std::vector<std::optional<CallInfo>> calls;
    int readers_left = 0;
  };
  std::map<uint64_t, Round> rounds;  // by exchange number
  std::vector<uint64_t> exchanges;   // how many each rank has started
  // Point to point: what rank a has posted for rank b and b has not yet
  // read, by (a, b), oldest first.
  std::map<std::pair<int, int>, std::deque<PeerCall>> mail;
  std::optional<RankFailure> failure;  // the first failure a rank reported
};

class BoardChannel final : public HostChannel {
 public:
  BoardChannel(std::shared_ptr<Board> board, std::string name, int rank)
      : board_(std::move(board)), name_(std::move(name)), rank_(rank) {}

  std::vector<CallInfo> exchange(const CallInfo& mine, std::chrono::milliseconds timeout,
                                 const std::string& who) override {
    Board& b = *board_;
    std::unique_lock lock(b.mutex);
    const uint64_t k = b.exchanges[size_t(rank_)]++;
    Board::Round& round = b.rounds[k];
    if (round.calls.empty()) {
      round.calls.resize(size_t(b.size));
      round.readers_left = b.size;
    }
    round.calls[size_t(rank_)] = mine;
    b.posted.notify_all();
    auto everyone = [&] {
      return b.failure ||
             std::all_of(round.calls.begin(), round.calls.end(),
                         [](const auto& c) { return c.has_value(); });
    };
    const bool in_time = b.posted.wait_for(lock, timeout, everyone);
    if (b.failure && !everyone_posted(round))
      throw PeerFailed(who + b.failure->text(), b.failure->rank);
    if (!in_time) {
      std::string missing;
      for (int j = 0; j < b.size; ++j) {
        if (round.calls[size_t(j)]) continue;
        missing += fmt::format("{}rank {} (it has made {} calls on this communicator; this is "
                               "call {})",
                               missing.empty() ? "" : ", ", j, b.exchanges[size_t(j)], k + 1);
      }
      throw CommError(fmt::format("{}{} did not join within {} (ANVIL_COMM_TIMEOUT)", who,
                                  missing, timeout_text(timeout)));
    }
    std::vector<CallInfo> out;
    for (const auto& c : round.calls) out.push_back(*c);
    if (--round.readers_left == 0) b.rounds.erase(k);
    return out;
  }

  std::vector<PeerCall> exchange_with(std::span<const int> peers, std::span<const PeerCall> mine,
                                      std::chrono::milliseconds timeout,
                                      const std::string& who) override {
    Board& b = *board_;
    std::unique_lock lock(b.mutex);
    for (size_t i = 0; i < peers.size(); ++i) b.mail[{rank_, peers[i]}].push_back(mine[i]);
    b.posted.notify_all();
    auto arrived = [&](int peer) { return !b.mail[{peer, rank_}].empty(); };
    auto everyone = [&] {
      return b.failure || std::all_of(peers.begin(), peers.end(), arrived);
    };
    b.posted.wait_for(lock, timeout, everyone);
    if (!std::all_of(peers.begin(), peers.end(), arrived)) {
      if (b.failure) throw PeerFailed(who + b.failure->text(), b.failure->rank);
      std::string missing;
      for (size_t i = 0; i < peers.size(); ++i)
        if (!arrived(peers[i]))
          missing += fmt::format("{}rank {}", missing.empty() ? "" : " and ", peers[i]);
      throw CommError(fmt::format("{}{} did not post its side of point-to-point call #{} "
                                  "within {} (ANVIL_COMM_TIMEOUT)",
                                  who, missing, mine[0].seq, timeout_text(timeout)));
    }
    std::vector<PeerCall> theirs;
    for (int peer : peers) {
      auto& queue = b.mail[{peer, rank_}];
      theirs.push_back(queue.front());
      queue.pop_front();
    }
    return theirs;
  }

  std::shared_ptr<HostChannel> split(int color, int, int rank, int size,
                                     std::chrono::milliseconds, const std::string&) override {
    // Every rank splits at the same point: the k-th split of each names the
    // same boards, one per color.
    const uint64_t k = splits_++;
    if (color < 0) return nullptr;
    return shared_board(fmt::format("{}/split {} color {}", name_, k, color), rank, size);
  }

  void report_failure(int rank, const std::string& what) noexcept override {
    try {
      std::lock_guard lock(board_->mutex);
      if (!board_->failure) board_->failure = RankFailure{rank, what};
      board_->posted.notify_all();
    } catch (...) {
    }
  }

  std::optional<RankFailure> peer_failure() const override {
    std::lock_guard lock(board_->mutex);
    return board_->failure;
  }

 private:
  static bool everyone_posted(const Board::Round& round) {
    return std::all_of(round.calls.begin(), round.calls.end(),
                       [](const auto& c) { return c.has_value(); });
  }
  std::shared_ptr<Board> board_;
  std::string name_;  // in the registry
  int rank_;
  uint64_t splits_ = 0;  // split() calls so far
};

}  // namespace

std::shared_ptr<HostChannel> shared_board(const std::string& name, int rank, int size) {
  static std::mutex registry_mutex;
  static std::map<std::string, std::weak_ptr<Board>> registry;
  std::shared_ptr<Board> board;
  {
    std::lock_guard lock(registry_mutex);
    std::erase_if(registry, [](const auto& e) { return e.second.expired(); });
    board = registry[name].lock();
    if (!board) {
      board = std::make_shared<Board>(size);
      registry[name] = board;
    }
  }
  if (board->size != size)
    throw CommError(fmt::format("rank {}: creating the communicator: this rank says {} ranks, "
                                "another said {}",
                                rank, size, board->size));
  return std::make_shared<BoardChannel>(std::move(board), name, rank);
}

}  // namespace anvil::parallel
