// A world of dp × pp × tp ranks as a mesh (PyTorch's DeviceMesh): each rank
// belongs to one group per dimension, the ranks that differ from it in that
// coordinate only.
//   dp  data parallel: replicas of the same part of the model, which
//       all-reduce their gradients (parallel/data_parallel.h)
//   pp  pipeline parallel: the stages, which pass activations forward and
//       gradients back, point to point
//   tp  tensor parallel: the ranks that share each layer's channels, which
//       all-reduce (or all-gather) activations inside the layer pairs
//
// Rank order: tp fastest, then dp, then pp (Megatron-LM's order):
//   world rank = (pp * dp_size + dp) * tp_size + tp.
// Consecutive ranks are the GPUs of one machine (mpirun fills a host's slots
// in order; --gpus N numbers one machine's GPUs), so the fastest links go to
// the dimension that needs them most. Tensor parallelism exchanges
// activations at every pair of layers, forward and backward, with nothing to
// overlap them with: its groups are neighbours, on one NVLink domain. Data
// parallelism all-reduces the gradients once a step, much of it overlapped
// with the backward pass, so it comes next. The pipeline sends one
// activation per micro-batch across each stage boundary, the fewest bytes,
// so its groups span the slowest links, between machines.
#pragma once
#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace anvil::parallel {

struct MeshShape {
  int dp = 1;
  int pp = 1;
  int tp = 1;
  int size() const { return dp * pp * tp; }
  std::string str() const;  // "dp 2 × pp 1 × tp 2"
};

// A rank's coordinates in the mesh.
struct MeshCoords {
  int dp = 0;
  int pp = 0;
  int tp = 0;
  bool operator==(const MeshCoords&) const = default;
};

// World rank <-> coordinates, in the order above. Out-of-range values throw
// std::invalid_argument.
MeshCoords mesh_coords(const MeshShape& shape, int rank);
int mesh_rank(const MeshShape& shape, const MeshCoords& coords);

// One rank's place and its three groups (a dimension of size 1 is a group of
// this rank alone, so callers need not ask which dimensions are split).
struct Mesh {
  MeshShape shape;
  MeshCoords coords;
  std::unique_ptr<Communicator> dp, pp, tp;
};

// Every rank of `world` calls it (three splits, in the order dp, pp, tp).
// The groups are ranked by their coordinate, and named "dp group 1 of 2",
// ... in errors and ANVIL_COMM_DEBUG (groups numbered as the ranks they
// hold). A shape whose size is not world's, or with a dimension below 1,
// throws std::invalid_argument naming both, before any rank splits.
Mesh make_mesh(Communicator& world, const MeshShape& shape);

}  // namespace anvil::parallel
