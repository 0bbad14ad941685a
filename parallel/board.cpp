// The host channel of ranks that are threads of one process (NCCL with one
// host thread per GPU): a board in shared memory where each rank pins what it
// is about to do and reads the others'. The k-th exchange of every rank meets
// the k-th of every other, as messages between processes would; a failure
// one rank reports ends the others' waits at once, each with PeerFailed. A
// failure reported on a board reaches the boards split from it (and theirs):
// a rank that gives up on the world ends the waits of every group too, which
// would otherwise wait for it (or for a rank that waits for it) until their
// deadline.
#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

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
  std::vector<std::weak_ptr<Board>> groups;  // the boards split from this one
};

// `failure` on `board`, unless it has one, and the board's first failure on
// every board split from it: a rank that fails because of another (its
// PeerFailed) must not reach a group before the cause does, while the
// cause's report is still on its way down.
void report(Board& board, const RankFailure& failure) {
  std::vector<std::shared_ptr<Board>> groups;
  RankFailure first;
  {
    std::lock_guard lock(board.mutex);
    if (!board.failure) board.failure = failure;
    first = *board.failure;
    board.posted.notify_all();
    for (const std::weak_ptr<Board>& g : board.groups)
      if (std::shared_ptr<Board> live = g.lock()) groups.push_back(std::move(live));
  }
  for (const std::shared_ptr<Board>& g : groups) report(*g, first);
}

// The board of `name` in the registry (made by the first rank to ask).
std::shared_ptr<Board> board_named(const std::string& name, int rank, int size) {
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
  return board;
}

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
    const std::string name = fmt::format("{}/split {} color {}", name_, k, color);
    std::shared_ptr<Board> group = board_named(name, rank, size);
    std::optional<RankFailure> failed;
    {
      // Registered (once, by its first rank) under this board's lock, so
      // that a failure reported here either finds it or is found here.
      std::lock_guard lock(board_->mutex);
      std::erase_if(board_->groups, [](const auto& g) { return g.expired(); });
      if (std::none_of(board_->groups.begin(), board_->groups.end(),
                       [&](const auto& g) { return g.lock() == group; }))
        board_->groups.push_back(group);
      failed = board_->failure;
    }
    if (failed) report(*group, *failed);
    return std::make_shared<BoardChannel>(std::move(group), name, rank);
  }

  void report_failure(int rank, const std::string& what) noexcept override {
    try {
      report(*board_, RankFailure{rank, what});
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
  return std::make_shared<BoardChannel>(board_named(name, rank, size), name, rank);
}

}  // namespace anvil::parallel
