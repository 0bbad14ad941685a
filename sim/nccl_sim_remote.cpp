// The simulated NCCL between processes (sim/nccl_sim_ops.h): one rank per
// process, as `mpirun -np N` runs anvil-train --distributed --device cuda,
// each process with its own simulated GPUs. Their memory is not shared, so
// a rank's part of an operation goes through a file of the clique's
// directory, /dev/shm/anvil-nccl-sim-<id> (tmpfs: memory, not a disk):
//   join-R          rank R has joined
//   s-A-B-K         the K-th send from rank A to rank B: its bytes (the
//                   receiver reads it, then removes it)
//   c-K-R           rank R's part of collective K: what it asked for, then
//                   its send buffer; every rank reads every part and computes
//                   its own result (sim/nccl_sim_collectives.cpp, in rank
//                   order, so the same on every rank and as between threads)
//   left-R          rank R has destroyed its communicator
// A rank writes its part when its item reaches the head of its stream (so
// the data is ready), to a temporary name that it then renames: a file that
// exists is whole. Sends complete once written; a receive or collective
// completes once its partners' files are there. A rank removes its part of
// collective K-1 when K completes: every rank had then read it (each
// communicator issues its calls on one stream, in order). The last rank to
// leave removes the directory. A process that dies leaves it behind; the
// next id made on the machine (remote_sweep) removes every directory whose
// creator no longer runs and that nobody has written to for a minute.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/nccl_sim_ops.h"
#include "sim/sim_internal.h"

namespace anvil_sim_nccl::detail {

struct Remote {
  std::string dir;
  int rank = 0;
  int nranks = 0;
  mutable bool all_joined = false;
};

namespace {

constexpr char kPrefix[] = "anvil-nccl-sim-";

// Where the cliques' directories go: /dev/shm, or /tmp without it.
std::string base_directory() {
  struct stat st {};
  return stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
}

// The id's words (ncclGetUniqueId): a random salt, a counter, the creator's pid.
std::string directory_of(const ncclUniqueId& id) {
  uint64_t words[3];
  std::memcpy(words, id.internal, sizeof words);
  char name[96];
  std::snprintf(name, sizeof name, "%s%016llx-%llu-%llu", kPrefix,
                static_cast<unsigned long long>(words[0]),
                static_cast<unsigned long long>(words[1]),
                static_cast<unsigned long long>(words[2]));
  return base_directory() + "/" + name;
}

// Removes directory `dir` and the files in it.
void remove_directory(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
        ::unlink((dir + "/" + e->d_name).c_str());
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Writes `parts` to `path` whole: to a temporary name, then renamed.
void publish(const std::string& path, std::initializer_list<std::pair<const void*, size_t>> parts) {
  const std::string temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0)
    throw std::runtime_error("simulated NCCL: cannot create " + temporary + ": " +
                             std::strerror(errno));
  for (const auto& [data, bytes] : parts) {
    const char* p = static_cast<const char*>(data);
    for (size_t done = 0; done < bytes;) {
      const ssize_t n = ::write(fd, p + done, bytes - done);
      if (n <= 0) {
        ::close(fd);
        throw std::runtime_error("simulated NCCL: cannot write " + temporary + ": " +
                                 std::strerror(errno));
      }
      done += size_t(n);
    }
  }
  ::close(fd);
  if (::rename(temporary.c_str(), path.c_str()) != 0)
    throw std::runtime_error("simulated NCCL: cannot rename " + temporary + ": " +
                             std::strerror(errno));
}

// The whole file, or false while it does not exist.
bool read_whole(const std::string& path, std::vector<unsigned char>& out) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  struct stat st {};
  ::fstat(fd, &st);
  out.resize(size_t(st.st_size));
  for (size_t done = 0; done < out.size();) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n <= 0) {
      ::close(fd);
      throw std::runtime_error("simulated NCCL: cannot read " + path);
    }
    done += size_t(n);
  }
  ::close(fd);
  return true;
}

// What a rank asked for, ahead of its data in c-K-R.
struct Header {
  int32_t kind, dtype, redop, root;
  uint64_t count;
};

std::string name(const Remote& r, const std::string& file) { return r.dir + "/" + file; }
std::string part_of(const Remote& r, uint64_t number, int rank) {
  return name(r, "c-" + std::to_string(number) + "-" + std::to_string(rank));
}

}  // namespace

bool remote_clique(const ncclUniqueId& id) {
  uint64_t pid = 0;
  std::memcpy(&pid, id.internal + 2 * sizeof(uint64_t), sizeof pid);
  return pid != uint64_t(::getpid()) || exists(directory_of(id));
}

std::shared_ptr<Remote> remote_join(const ncclUniqueId& id, int rank, int nranks) {
  auto r = std::make_shared<Remote>();
  r->dir = directory_of(id);
  r->rank = rank;
  r->nranks = nranks;
  if (::mkdir(r->dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw std::runtime_error("simulated NCCL: cannot create " + r->dir + ": " +
                             std::strerror(errno));
  publish(name(*r, "join-" + std::to_string(rank)), {});
  anvil::sim::detail::remote_comm_opened();
  return r;
}

int remote_joined(const Remote& r) {
  if (r.all_joined) return r.nranks;
  int joined = 0;
  for (int j = 0; j < r.nranks; ++j) joined += exists(name(r, "join-" + std::to_string(j)));
  r.all_joined = joined == r.nranks;
  return joined;
}

bool remote_progress(Op& op) {
  const Remote& r = *op.comm->remote;
  const int me = op.comm->rank;
  const size_t bytes = op.count * dtype_bytes(op.dtype);
  switch (op.kind) {
    case Op::kSend:
      publish(name(r, "s-" + std::to_string(me) + "-" + std::to_string(op.peer) + "-" +
                          std::to_string(op.number)),
              {{op.src, bytes}});
      return true;
    case Op::kRecv: {
      const std::string path = name(r, "s-" + std::to_string(op.peer) + "-" + std::to_string(me) +
                                           "-" + std::to_string(op.number));
      std::vector<unsigned char> data;
      if (!read_whole(path, data)) return false;
      ::unlink(path.c_str());
      if (data.size() != bytes)
        throw std::runtime_error("simulated NCCL: ncclSend #" + std::to_string(op.number) +
                                 " of " + std::to_string(data.size()) + " bytes from rank " +
                                 std::to_string(op.peer) + " meets ncclRecv of " +
                                 std::to_string(bytes) + " bytes at rank " + std::to_string(me));
      if (bytes) std::memcpy(op.dst, data.data(), bytes);
      return true;
    }
    default: break;
  }
  // A collective: this rank's part, then every rank's.
  if (!op.published) {
    const Header h{int32_t(op.kind), int32_t(op.dtype), int32_t(op.redop), op.root, op.count};
    publish(part_of(r, op.number, me), {{&h, sizeof h}, {op.src, op.src_bytes()}});
    op.published = true;
  }
  for (int j = 0; j < r.nranks; ++j)
    if (!exists(part_of(r, op.number, j))) return false;
  std::vector<std::vector<unsigned char>> parts(size_t(r.nranks));
  std::vector<std::vector<unsigned char>> results(size_t(r.nranks));
  std::vector<OpPtr> ops;
  for (int j = 0; j < r.nranks; ++j) {
    std::vector<unsigned char>& part = parts[size_t(j)];
    if (!read_whole(part_of(r, op.number, j), part) || part.size() < sizeof(Header))
      throw std::runtime_error("simulated NCCL: rank " + std::to_string(j) + "'s part of " +
                               "collective #" + std::to_string(op.number) + " is damaged");
    Header h;
    std::memcpy(&h, part.data(), sizeof h);
    auto peer = std::make_shared<CommState>();
    peer->rank = j;
    peer->nranks = r.nranks;
    auto o = std::make_shared<Op>();
    o->kind = Op::Kind(h.kind);
    o->comm = peer;
    o->count = h.count;
    o->dtype = ncclDataType_t(h.dtype);
    o->redop = ncclRedOp_t(h.redop);
    o->root = h.root;
    o->number = op.number;
    o->src = part.data() + sizeof h;
    if (j == me) {
      o->dst = op.dst;
    } else {
      results[size_t(j)].resize(o->dst_bytes());
      o->dst = results[size_t(j)].data();
    }
    ops.push_back(o);
  }
  // The parts' sizes agree with what each asked for before anything is read.
  for (int j = 0; j < r.nranks; ++j)
    if (parts[size_t(j)].size() - sizeof(Header) < ops[size_t(j)]->src_bytes())
      throw std::runtime_error("simulated NCCL: rank " + std::to_string(j) + "'s part of " +
                               "collective #" + std::to_string(op.number) + " is short");
  run_collective(ops);
  if (op.number > 0) ::unlink(part_of(r, op.number - 1, me).c_str());
  return true;
}

void remote_leave(const Remote& r) {
  anvil::sim::detail::remote_comm_closed();
  try {
    publish(name(r, "left-" + std::to_string(r.rank)), {});
  } catch (const std::exception&) {
    return;  // the directory is gone or unwritable: nothing to tidy
  }
  for (int j = 0; j < r.nranks; ++j)
    if (!exists(name(r, "left-" + std::to_string(j)))) return;
  // Every rank has left: nobody reads these files any more.
  remove_directory(r.dir);
}

void remote_sweep(int64_t idle_seconds) {
  const std::string base = base_directory();
  DIR* d = ::opendir(base.c_str());
  if (!d) return;
  std::vector<std::string> stale;
  const time_t now = ::time(nullptr);
  while (dirent* e = ::readdir(d)) {
    const char* n = e->d_name;
    if (std::strncmp(n, kPrefix, sizeof kPrefix - 1) != 0) continue;
    // The creator's pid: the name's last number.
    const char* dash = std::strrchr(n, '-');
    char* end = nullptr;
    const long long pid = dash ? std::strtoll(dash + 1, &end, 10) : 0;
    if (pid <= 0 || !end || *end != '\0') continue;
    // A live clique writes its directory at every step: a recent one may
    // belong to ranks still running even if their creator has died.
    struct stat st {};
    const std::string path = base + "/" + n;
    if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        now - st.st_mtime < idle_seconds)
      continue;
    if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH) stale.push_back(path);
  }
  ::closedir(d);
  for (const std::string& path : stale) remove_directory(path);
}

}  // namespace anvil_sim_nccl::detail
