// Groups (Communicator::split, make_mesh) and point to point, written once
// for every backend as tests/parallel/scenarios.h's are: each scenario runs
// on one rank of a world and returns what it got next to what it should have
// got, computed on the host from the ranks' coordinates alone.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "parallel/mesh.h"
#include "tests/parallel/scenarios.h"

namespace parallel_test {

using anvil::parallel::make_mesh;
using anvil::parallel::mesh_rank;
using anvil::parallel::MeshCoords;
using anvil::parallel::MeshShape;

// A tensor's bytes, one double each: compared with tol 0, a bit-exact check
// for any dtype.
inline std::vector<double> bytes_of(Communicator& c, const Tensor& t) {
  c.synchronize();
  const Tensor h = t.to(anvil::Device::cpu());
  const auto* p = static_cast<const unsigned char*>(h.raw_data());
  return std::vector<double>(p, p + h.nbytes());
}

// Rank r's tensor of `dtype` and `shape` for point-to-point tests: values
// every rank can make, all bits in play (random float32 and bfloat16 words,
// int64 near 2^57). Made on the host (no kernel to simulate), then moved.
inline Tensor p2p_tensor(const Communicator& c, int r, DType dtype, const Shape& shape,
                         uint64_t seed) {
  const int64_t n = anvil::shape_numel(shape);
  if (dtype == DType::Int64) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int_value(r, i + int64_t(seed));
    return Tensor::from_vector(v, shape).to(c.device());
  }
  return Tensor::from_vector(make(r, n, false, seed), shape).to(dtype).to(c.device());
}

// The ranks `group` holds, by their world rank, in the group's rank order.
inline std::vector<double> members_of(Communicator& group, int world_rank) {
  Tensor me = Tensor::from_vector(std::vector<int64_t>{world_rank}, {1, 1}, group.device());
  return host(group, group.all_gather(me));
}

// Splits of the world: by parity with the keys reversed, everyone in one
// group (ties by rank), rank 0 in none. Each group's size, its members in
// order, an all-reduce (the group's sum, not the world's) and a broadcast
// from its rank 0.
inline Outcomes split_scenario(Communicator& world) {
  Outcomes out;
  const int n = world.size(), me = world.rank();
  struct Split {
    std::string what;
    int color, key;
    std::vector<int> members;  // world ranks, in the group's order
  };
  std::vector<Split> splits;
  {
    Split s{"parity, keys reversed", me % 2, -me, {}};
    for (int r = n - 1; r >= 0; --r)
      if (r % 2 == me % 2) s.members.push_back(r);
    splits.push_back(s);
  }
  {
    Split s{"one group, equal keys", 7, 0, {}};
    for (int r = 0; r < n; ++r) s.members.push_back(r);
    splits.push_back(s);
  }
  {
    Split s{"rank 0 in no group", me == 0 ? Communicator::kNoColor : 3, 5, {}};
    if (me != 0)
      for (int r = 1; r < n; ++r) s.members.push_back(r);
    splits.push_back(s);
  }
  for (const Split& s : splits) {
    const std::string tag = fmt::format("split ({}) of {} ranks", s.what, n);
    std::unique_ptr<Communicator> group = world.split(s.color, s.key, "test");
    if (s.members.empty()) {
      out.push_back({tag + ": no group", {double(group == nullptr)}, {1.0}, 0});
      continue;
    }
    const int want_rank =
        int(std::find(s.members.begin(), s.members.end(), me) - s.members.begin());
    out.push_back({tag + ": rank and size",
                   {double(group->rank()), double(group->size())},
                   {double(want_rank), double(s.members.size())},
                   0});
    out.push_back({tag + ": backend, device, deadline",
                   {double(group->backend() == world.backend()),
                    double(group->device() == world.device()),
                    double(group->options().timeout == world.options().timeout)},
                   {1.0, 1.0, 1.0},
                   0});
    out.push_back({tag + ": members in order", members_of(*group, me),
                   std::vector<double>(s.members.begin(), s.members.end()), 0});
    Tensor t = on(*group, make(me, 1001, true));
    group->allreduce(t);
    std::vector<double> want(1001, 0.0);
    for (int r : s.members)
      for (int64_t i = 0; i < 1001; ++i) want[size_t(i)] += exact_value(r, i);
    out.push_back({tag + ": all-reduce is the group's sum", host(*group, t), want, 0});
    Tensor b = on(*group, make(me, 33, false, 5));
    group->broadcast(b, 0);
    const std::vector<float> root = make(s.members.front(), 33, false, 5);
    out.push_back({tag + ": broadcast from its rank 0", host(*group, b),
                   std::vector<double>(root.begin(), root.end()), 0});
  }
  // The world still works after its groups, and its collectives' numbers
  // went on (each split is one of them).
  Tensor t = on(world, std::vector<float>{1.0f});
  world.allreduce(t);
  out.push_back({"the world's all-reduce after the splits", host(world, t), {double(n)}, 0});
  return out;
}

// A mesh of `shape` over the world: each rank's coordinates, and in each of
// its groups the rank, size and an all-reduce of the world ranks + 1, which
// must be the sum over that group's members (found from the coordinates).
inline Outcomes mesh_scenario(Communicator& world, const MeshShape& shape) {
  Outcomes out;
  const int me = world.rank();
  anvil::parallel::Mesh mesh = make_mesh(world, shape);
  const MeshCoords c = mesh.coords;
  const std::string tag = fmt::format("mesh {}", shape.str());
  out.push_back({tag + ": coordinates round-trip", {double(mesh_rank(shape, c))}, {double(me)}, 0});
  struct Dim {
    const char* name;
    Communicator* group;
    int size, coord;
    MeshCoords (*at)(MeshCoords, int);
  };
  const Dim dims[] = {
      {"dp", mesh.dp.get(), shape.dp, c.dp, [](MeshCoords m, int i) { m.dp = i; return m; }},
      {"pp", mesh.pp.get(), shape.pp, c.pp, [](MeshCoords m, int i) { m.pp = i; return m; }},
      {"tp", mesh.tp.get(), shape.tp, c.tp, [](MeshCoords m, int i) { m.tp = i; return m; }},
  };
  for (const Dim& d : dims) {
    const std::string what = fmt::format("{}: {} group", tag, d.name);
    out.push_back({what + " rank and size", {double(d.group->rank()), double(d.group->size())},
                   {double(d.coord), double(d.size)}, 0});
    Tensor t = on(*d.group, std::vector<float>{float(me + 1)});
    d.group->allreduce(t);
    double want = 0;
    for (int i = 0; i < d.size; ++i) want += mesh_rank(shape, d.at(c, i)) + 1;
    out.push_back({what + " all-reduce is the group's sum", host(*d.group, t), {want}, 0});
  }
  return out;
}

// Every dp × pp × tp whose product is the world's size.
inline std::vector<MeshShape> mesh_shapes(int n) {
  std::vector<MeshShape> shapes;
  for (int dp = 1; dp <= n; ++dp)
    for (int pp = 1; dp * pp <= n; ++pp)
      if (n % (dp * pp) == 0) shapes.push_back({dp, pp, n / (dp * pp)});
  return shapes;
}

// Point to point, bit for bit: even ranks send to the next odd one, which
// receives, in float32, bfloat16 and int64, shapes empty to 2-D; then the
// ring both ways with sendrecv; then the same inside a group (the parity
// split, whose ranks name each other by group rank).
inline Outcomes p2p_scenario(Communicator& world) {
  Outcomes out;
  auto run = [&](Communicator& c, const std::string& where) {
    const int n = c.size(), r = c.rank();
    if (n < 2) return;
    const int partner = r % 2 == 0 ? r + 1 : r - 1;
    const bool paired = partner < n;  // the last even rank of an odd count sits out
    uint64_t seed = 11;
    for (DType dtype : {DType::Float32, DType::BFloat16, DType::Int64}) {
      for (const Shape& shape : {Shape{0}, Shape{1}, Shape{1001}, Shape{3, 7}}) {
        ++seed;
        const std::string tag = fmt::format("{}: {} {} from rank {} to rank {}", where,
                                            anvil::dtype_name(dtype), anvil::shape_str(shape),
                                            r % 2 == 0 ? r : partner, r % 2 == 0 ? partner : r);
        if (!paired) continue;
        if (r % 2 == 0) {
          c.send(p2p_tensor(c, r, dtype, shape, seed), partner);
        } else {
          Tensor got = Tensor::zeros(shape, dtype, c.device());
          c.recv(got, partner);
          out.push_back({tag, bytes_of(c, got), bytes_of(c, p2p_tensor(c, partner, dtype, shape,
                                                                        seed)),
                         0});
        }
      }
    }
    // Round the ring, one way and back.
    for (int step : {1, n - 1}) {
      const int to = (r + step) % n, from = (r + n - step) % n;
      Tensor got = Tensor::zeros({4, 5}, DType::BFloat16, c.device());
      c.sendrecv(p2p_tensor(c, r, DType::BFloat16, {4, 5}, 99), to, got, from);
      out.push_back({fmt::format("{}: sendrecv to rank {}, from rank {}", where, to, from),
                     bytes_of(c, got), bytes_of(c, p2p_tensor(c, from, DType::BFloat16, {4, 5}, 99)),
                     0});
    }
  };
  run(world, fmt::format("world of {}", world.size()));
  std::unique_ptr<Communicator> group = world.split(world.rank() % 2, world.rank(), "parity");
  run(*group, fmt::format("parity group of {}", group->size()));
  return out;
}

// Communicator::bytes_sent: the ring all-reduce of n x 1000 floats sends
// 2 (n - 1) x 1000 of them from every rank (its n - 1 segments of 1000 in
// each half); a send of 10 floats adds 40 bytes to the sender and nothing to
// the receiver; a group counts its own (the world's count stays).
inline Outcomes bytes_sent_scenario(Communicator& world) {
  const int n = world.size(), r = world.rank();
  Outcomes out;
  auto sent_by = [&](Communicator& c, const std::function<void()>& work) {
    const uint64_t before = c.bytes_sent();
    work();
    c.synchronize();
    return double(c.bytes_sent() - before);
  };
  Tensor t = on(world, std::vector<float>(size_t(n) * 1000, 1.f));
  out.push_back({fmt::format("bytes sent by the ring all-reduce of {} x 1000 floats", n),
                 {sent_by(world, [&] { world.allreduce(t); })}, {2.0 * (n - 1) * 1000 * 4}, 0});
  if (n >= 2) {
    Tensor p = on(world, std::vector<float>(10, 2.f));
    const double sent = sent_by(world, [&] {
      if (r == 0) world.send(p, 1);
      if (r == 1) world.recv(p, 0);
    });
    out.push_back({"bytes sent by a send of 10 floats from rank 0 to rank 1", {sent},
                   {r == 0 ? 40.0 : 0.0}, 0});
  }
  auto group = world.split(r % 2, r, "parity");
  const int m = group->size();
  Tensor g = on(*group, std::vector<float>(size_t(m) * 1000, 1.f));
  const uint64_t world_before = world.bytes_sent();
  out.push_back({"bytes sent by a group's all-reduce, the group's count",
                 {sent_by(*group, [&] { group->allreduce(g); })}, {2.0 * (m - 1) * 1000 * 4}, 0});
  out.push_back({"bytes sent by a group's all-reduce, the world's count",
                 {double(world.bytes_sent() - world_before)}, {0}, 0});
  return out;
}

}  // namespace parallel_test
