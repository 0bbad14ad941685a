#include "parallel/mesh.h"

#include <fmt/format.h>

#include <stdexcept>

namespace anvil::parallel {

namespace {
void check_shape(const MeshShape& shape) {
  if (shape.dp < 1 || shape.pp < 1 || shape.tp < 1)
    throw std::invalid_argument(
        fmt::format("mesh {}: every dimension needs at least 1 rank", shape.str()));
}
}  // namespace

std::string MeshShape::str() const { return fmt::format("dp {} × pp {} × tp {}", dp, pp, tp); }

MeshCoords mesh_coords(const MeshShape& shape, int rank) {
  check_shape(shape);
  if (rank < 0 || rank >= shape.size())
    throw std::invalid_argument(fmt::format("mesh {}: rank {} is not one of its {} ranks",
                                            shape.str(), rank, shape.size()));
  return {.dp = rank / shape.tp % shape.dp, .pp = rank / (shape.tp * shape.dp),
          .tp = rank % shape.tp};
}

int mesh_rank(const MeshShape& shape, const MeshCoords& c) {
  check_shape(shape);
  if (c.dp < 0 || c.dp >= shape.dp || c.pp < 0 || c.pp >= shape.pp || c.tp < 0 ||
      c.tp >= shape.tp)
    throw std::invalid_argument(fmt::format("mesh {}: coordinates dp {}, pp {}, tp {} are "
                                            "outside it",
                                            shape.str(), c.dp, c.pp, c.tp));
  return (c.pp * shape.dp + c.dp) * shape.tp + c.tp;
}

Mesh make_mesh(Communicator& world, const MeshShape& shape) {
  check_shape(shape);
  if (shape.size() != world.size())
    throw std::invalid_argument(fmt::format("mesh {} needs {} ranks, but the world has {}",
                                            shape.str(), shape.size(), world.size()));
  Mesh mesh;
  mesh.shape = shape;
  mesh.coords = mesh_coords(shape, world.rank());
  const MeshCoords& c = mesh.coords;
  // Each group: the ranks that share the other two coordinates (the color),
  // ranked by their own (the key). Colors number the groups in rank order.
  mesh.dp = world.split(c.pp * shape.tp + c.tp, c.dp, "dp");
  mesh.pp = world.split(c.dp * shape.tp + c.tp, c.pp, "pp");
  mesh.tp = world.split(c.pp * shape.dp + c.dp, c.tp, "tp");
  return mesh;
}

}  // namespace anvil::parallel
