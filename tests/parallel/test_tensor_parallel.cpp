// Tensor parallel (parallel/tensor_parallel.h): LeNet with its linear layers
// 7 and 9 split over the ranks (column-parallel, then row-parallel) against
// one device. The first forward's logits lie within the bound that the new
// order of the sums allows, derived below; after 3 steps of SGD (1 on the
// simulator) the weights
// (the shards gathered into one model) and the epoch's figures lie within
// the data-parallel tests' tolerance, and the layers every rank runs whole
// (the convolutions) are bit for bit the same on every rank. Over MPI on the
// processes mpiexec starts (the tag [mpi_model_parallel]: 2 and 4 ranks)
// and over NCCL on 2 simulated GPUs.
#include <catch2/catch.hpp>

#include <cmath>

#include "core/autograd.h"
#include "parallel/tensor_parallel.h"
#include "tests/parallel/data_parallel_scenarios.h"
#include "tests/parallel/ranks.h"
#include "tests/parallel/split_scenarios.h"

using namespace parallel_test;
namespace par = anvil::parallel;

namespace {

double gamma(double m) {
  const double u = std::ldexp(1.0, -24);
  return m * u / (1 - m * u);
}

// The first `n` images of `set` as a batch on `device`.
Tensor first_images(const data::ImageSet& set, int64_t n, anvil::Device device) {
  std::vector<float> v;
  for (int64_t i = 0; i < n * 784; ++i) v.push_back(float(set.pixels[size_t(i)]) / 255.0f);
  return Tensor::from_vector(v, {n, 1, 28, 28}, device);
}

std::vector<double> doubles(const Tensor& t) {
  std::vector<double> out;
  for (float f : t.detach().to(anvil::Device::cpu()).to_vector()) out.push_back(f);
  return out;
}

// `images` in batches of 8: 3 steps over MPI, 1 on the simulator's GPUs.
Outcomes tensor_parallel_scenario(Communicator& comm, int64_t images) {
  namespace nn = anvil::nn;
  const anvil::Device device = comm.device();
  const int n = comm.size();
  const data::ImageSet set = synthetic_images(images, 5);
  const anvil::optim::SGDOptions sgd{.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4,
                                     .nesterov = true};
  auto reference = std::dynamic_pointer_cast<nn::Sequential>(make_model("lenet", 1));
  auto whole = std::dynamic_pointer_cast<nn::Sequential>(make_model("lenet", 1));
  reference->to(device);
  whole->to(device);
  auto split = par::split_tensor_parallel(comm, *whole, par::lenet_tensor_pairs());
  Outcomes out;
  const std::string tag =
      fmt::format("LeNet's linear layers over {} ranks, {} steps", n, images / 8);

  // The first forward. Both compute the convolutions alike (the same input h
  // of layer 7), then z = b9 + W9 relu(b7 + W7 h). One device sums each
  // output of layer 9 over 128 terms and the bias; the split layers over
  // 128/n terms, then the ring adds the n partial sums and the bias follows:
  // by the usual bound on a sum of m terms, each within gamma(m) of the
  // exact sum of the terms' magnitudes (S2: sum_k |a_k W9_jk| + |b9_j|). Each
  // layer-7 output a_k is a sum of 801 terms either way, computed by
  // different GEMMs, so the two a_k differ by at most 2 gamma(801) S1_k
  // (S1_k: sum_i |h_i W7_ki| + |b7_k|), carried to z_j through |W9_jk|.
  {
    anvil::NoGradGuard no_grad;
    const Tensor x = first_images(set, 8, device);
    Tensor h = x;
    for (size_t i = 0; i < 7; ++i) h = (*reference)[i](h);
    const auto& l7 = dynamic_cast<const nn::Linear&>((*reference)[7]);
    const auto& l9 = dynamic_cast<const nn::Linear&>((*reference)[9]);
    const std::vector<double> hv = doubles(h), w7 = doubles(l7.weight), b7 = doubles(l7.bias),
                              w9 = doubles(l9.weight), b9 = doubles(l9.bias);
    std::vector<double> bound;
    for (int64_t e = 0; e < 8; ++e) {
      std::vector<double> a(128), s1(128);
      for (int64_t k = 0; k < 128; ++k) {
        double sum = b7[size_t(k)];
        s1[size_t(k)] = std::fabs(b7[size_t(k)]);
        for (int64_t i = 0; i < 800; ++i) {
          const double t = hv[size_t(e * 800 + i)] * w7[size_t(k * 800 + i)];
          sum += t;
          s1[size_t(k)] += std::fabs(t);
        }
        a[size_t(k)] = std::max(sum, 0.0);
      }
      for (int64_t j = 0; j < 10; ++j) {
        double s2 = std::fabs(b9[size_t(j)]), carried = 0;
        for (int64_t k = 0; k < 128; ++k) {
          s2 += std::fabs(a[size_t(k)] * w9[size_t(j * 128 + k)]);
          carried += std::fabs(w9[size_t(j * 128 + k)]) * s1[size_t(k)];
        }
        bound.push_back((gamma(129) + gamma(128.0 / n + n)) * s2 + 2 * gamma(801) * carried);
      }
    }
    out.push_back({"first forward's logits within the bound, " + tag, doubles((*split)(x)),
                   doubles((*reference)(x)), 0, bound});
  }
  // Steps of SGD, then the split layers gathered into one model.
  anvil::optim::SGD ref_opt(reference->parameters(), sgd), opt(split->parameters(), sgd);
  data::DataLoader ref_loader(set, 8, true, false, 3), loader(set, 8, true, false, 3);
  const train::EpochStats want = train::train_epoch(*reference, ref_opt, ref_loader, device);
  const train::EpochStats got = train::train_epoch(*split, opt, loader, device);
  out.push_back({"the epoch's loss, accuracy and examples, " + tag,
                 {got.loss, got.accuracy, double(got.examples)},
                 {want.loss, want.accuracy, double(want.examples)}, 1e-4});
  par::gather_tensor_parallel(*split, *whole);
  out.push_back({"weights after the steps, " + tag, flat_parameters(comm, *whole),
                 flat_parameters(comm, *reference), 2e-4});
  // The replicated layers: rank 0's bytes on every rank.
  const Tensor conv = (*whole)[3].parameters()[0];
  Tensor root = conv.detach().clone();
  comm.broadcast(root, 0);
  out.push_back({"the convolution's weights, bit for bit rank 0's, " + tag, bytes_of(comm, conv),
                 bytes_of(comm, root), 0});
  return out;
}

}  // namespace

TEST_CASE("mpi: LeNet's linear layers split over the ranks end where one device does",
          "[mpi_model_parallel]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  par::CommOptions o;
  o.timeout = std::chrono::seconds(60);
  auto world = par::mpi_world(o);
  if (world->size() < 2) return skip("needs 2 or more MPI ranks");
  require_outcomes(tensor_parallel_scenario(*world, 24), world->rank());
}

TEST_CASE("nccl: LeNet's linear layers split over 2 GPUs end where one device does",
          "[nccl][tensor_parallel][tsan]") {
  if (gpus(2) == 0) return;
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  skip("a LeNet step on the simulator takes minutes under the sanitizers");
#else
  const par::NcclId id = par::nccl_unique_id();
  const auto per_rank = each_rank(2, [&](int r) {
    auto comm = par::nccl_communicator(id, r, 2, anvil::Device::cuda(r), options(120));
    return tensor_parallel_scenario(*comm, 8);
  });
  for (int r = 0; r < 2; ++r) require_outcomes(per_rank[size_t(r)], r);
#endif
}

TEST_CASE("tensor parallel: a pair that is not two Linear layers is refused", "[comm]") {
  auto one = par::one_rank_group(anvil::Device::cpu());
  auto lenet = anvil::models::lenet();
  CHECK_THROWS_WITH(par::split_tensor_parallel(*one, *lenet, {{3, 9}}),
                    Catch::Matchers::Contains("layers 3 and 9 are not a Linear and the Linear"));
  CHECK_THROWS_WITH(par::split_tensor_parallel(*one, *lenet, {{9, 7}}),
                    Catch::Matchers::Contains("layers 9 and 7"));
  // Over a group of one the split model is the model.
  auto split = par::split_tensor_parallel(*one, *lenet, par::lenet_tensor_pairs());
  const Tensor x = Tensor::ones({2, 1, 28, 28});
  CHECK(doubles((*split)(x)) == doubles((*lenet)(x)));
  CHECK(split->state_dict().size() == lenet->state_dict().size());
}
