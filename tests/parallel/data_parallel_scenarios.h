// Data-parallel training's test scenarios, written once for every backend
// (as scenarios.h): each rank trains its replica on its shard of every
// batch, and also, by itself, a reference model on the whole batches on one
// device, from the same initial weights; the replica must end where the
// reference does. Ranks other than 0 start their replica from other weights,
// so the broadcast of rank 0's is tested too.
#pragma once
#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/random.h"
#include "data/dataloader.h"
#include "nn/models.h"
#include "nn/optim.h"
#include "nn/train.h"
#include "core/ops.h"
#include "parallel/data_parallel.h"
#include "parallel/sync_batch_norm.h"
#include "tests/parallel/scenarios.h"

namespace parallel_test {

namespace models = anvil::models;
namespace train = anvil::train;
namespace data = anvil::data;

// `count` random 28x28 images with labels, the same on every rank.
inline data::ImageSet synthetic_images(int64_t count, uint64_t seed) {
  data::ImageSet set;
  set.count = count;
  set.rows = set.cols = 28;
  set.pixels.resize(size_t(count * 28 * 28));
  set.labels.resize(size_t(count));
  for (size_t i = 0; i < set.pixels.size(); ++i) set.pixels[i] = uint8_t(mix(seed ^ i) % 256);
  for (int64_t i = 0; i < count; ++i) set.labels[size_t(i)] = int64_t(mix(seed + 77 + uint64_t(i)) % 10);
  return set;
}

struct TrainSetup {
  // "lenet", "resnet18-narrow" (stage widths 4, 8, 8, 8), or "mlp" (784-16-10:
  // small enough for ThreadSanitizer, where a LeNet step takes minutes)
  std::string model = "lenet";
  int64_t images = 27;          // batches of 10, 10 and 7: shards of every size
  int64_t batch = 10;
  int epochs = 2;
  anvil::parallel::DataParallelOptions options;
  int64_t accumulate = 1;  // the replica's micro-batches per step (the reference: 1)
};

inline std::shared_ptr<anvil::nn::Module> make_model(const std::string& name, uint64_t seed) {
  anvil::Generator gen(seed);
  if (name == "lenet") return models::lenet(models::Init::Kaiming, &gen);
  if (name == "mlp") {
    namespace nn = anvil::nn;
    return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(784, 16, true, &gen),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(16, 10, true, &gen)});
  }
  models::ResNetConfig narrow;
  narrow.widths = {4, 8, 8, 8};
  return models::resnet18(narrow, models::Init::Kaiming, &gen);
}

inline std::vector<double> flat_parameters(Communicator& c, const anvil::nn::Module& m) {
  std::vector<double> out;
  for (const Tensor& p : m.parameters())
    for (double v : host(c, p)) out.push_back(v);
  return out;
}

// Trains the replica (on this rank's shards) and the reference (whole
// batches, one device) and compares weights, losses and accuracies. The
// reference is trained once, on rank 0, after the replicas (so that no rank
// waits in the replicas' collectives while it runs), and its figures reach
// every rank by broadcast: each rank compares its own replica with them.
inline Outcomes data_parallel_scenario(Communicator& c, const TrainSetup& s) {
  const anvil::Device device = c.device();
  const data::ImageSet set = synthetic_images(s.images, 5);
  const anvil::optim::SGDOptions sgd{.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4,
                                     .nesterov = true};
  auto replica = make_model(s.model, c.rank() == 0 ? 1 : 100 + uint64_t(c.rank()));
  replica->to(device);
  anvil::optim::SGD rep_opt(replica->parameters(), sgd);
  anvil::parallel::DataParallel replicas(c, *replica, s.options);  // rank 0's weights everywhere
  data::DataLoader rep_loader(set, s.batch, true, false, 3);
  rep_loader.set_shard(c.rank(), c.size());
  auto figures = [](const train::EpochStats& e) {
    return std::vector<double>{e.loss, e.accuracy, double(e.examples)};
  };
  std::vector<std::vector<double>> got;  // each epoch's figures, the weights, the evaluation's
  for (int e = 0; e < s.epochs; ++e) {
    train::EpochOptions rep_o;
    rep_o.replicas = &replicas;
    rep_o.accumulate = s.accumulate;
    got.push_back(figures(train::train_epoch(*replica, rep_opt, rep_loader, device, rep_o)));
  }
  got.push_back(flat_parameters(c, *replica));
  // Evaluation: each rank its shard of the set, summed.
  data::DataLoader rep_eval(set, 8, false, false, 0);
  rep_eval.set_shard(c.rank(), c.size());
  got.push_back(figures(train::evaluate(*replica, rep_eval, device, &replicas)));

  std::vector<std::vector<double>> want;
  if (c.rank() == 0) {
    auto reference = make_model(s.model, 1);
    reference->to(device);
    anvil::optim::SGD ref_opt(reference->parameters(), sgd);
    data::DataLoader ref_loader(set, s.batch, true, false, 3);
    for (int e = 0; e < s.epochs; ++e)
      want.push_back(figures(train::train_epoch(*reference, ref_opt, ref_loader, device)));
    want.push_back(flat_parameters(c, *reference));
    data::DataLoader ref_eval(set, 8, false, false, 0);
    want.push_back(figures(train::evaluate(*reference, ref_eval, device)));
  }
  want = broadcast_vectors(c, want, 0);

  const std::string tag =
      fmt::format("{} on {} ranks ({}, {} overlap, {} micro-batches per step)", s.model, c.size(),
                  anvil::parallel::algorithm_name(s.options.algorithm),
                  s.options.overlap ? "with" : "without", s.accumulate);
  Outcomes out;
  for (int e = 0; e < s.epochs; ++e)
    out.push_back({fmt::format("epoch {} loss and accuracy, {}", e, tag), got[size_t(e)],
                   want[size_t(e)], 1e-4});
  out.push_back({"weights, " + tag, got[size_t(s.epochs)], want[size_t(s.epochs)], 2e-4});
  out.push_back({"evaluation, " + tag, got[size_t(s.epochs) + 1], want[size_t(s.epochs) + 1], 1e-4});
  return out;
}

// For a given rank count, two runs end in bitwise the same weights.
inline Outcomes data_parallel_determinism_scenario(Communicator& c) {
  TrainSetup s;
  s.epochs = 1;
  std::vector<std::vector<double>> runs;
  for (int run = 0; run < 2; ++run) {
    const data::ImageSet set = synthetic_images(s.images, 5);
    auto model = make_model("lenet", 1);
    model->to(c.device());
    anvil::optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
    anvil::parallel::DataParallel replicas(c, *model, s.options);
    data::DataLoader loader(set, s.batch, true, false, 3);
    loader.set_shard(c.rank(), c.size());
    train::EpochOptions o;
    o.replicas = &replicas;
    train::train_epoch(*model, opt, loader, c.device(), o);
    runs.push_back(flat_parameters(c, *model));
  }
  return {{fmt::format("two data-parallel runs on {} ranks: the same bits", c.size()), runs[0],
           runs[1], 0}};
}

// sync_batch_norm on each rank's rows of x equals batch_norm on all of x:
// the output and dx row by row, dgamma and dbeta once summed over the ranks,
// and the running statistics.
inline Outcomes sync_batch_norm_scenario(Communicator& c) {
  using anvil::Shape;
  const int64_t rows = 7, C = 3, H = 4, W = 5;
  const anvil::Device d = c.device();
  std::vector<float> all = make(0, rows * C * H * W, false, 21), up = make(0, rows * C * H * W, false, 22);
  for (float& v : all) v = 3.0f + 2.0f * v;  // far from zero: the two-pass variance matters
  const int64_t first = first_row(rows, c.size(), c.rank());
  const int64_t mine = first_row(rows, c.size(), c.rank() + 1) - first;
  const int64_t per_row = C * H * W;
  auto rows_of = [&](const std::vector<float>& v) {
    return std::vector<float>(v.begin() + first * per_row, v.begin() + (first + mine) * per_row);
  };
  auto leaf = [&](const std::vector<float>& v, const Shape& shape) {
    Tensor t = Tensor::from_vector(v, shape, d);
    t.set_requires_grad(true);
    return t;
  };
  // Reference: one device, the whole batch.
  Tensor x = leaf(all, {rows, C, H, W}), g = leaf({1.5f, 0.5f, -1.0f}, {C}),
         b = leaf({0.1f, -0.2f, 0.3f}, {C});
  Tensor rm = Tensor::zeros({C}, anvil::DType::Float32, d), rv = Tensor::ones({C}, anvil::DType::Float32, d);
  Tensor y = anvil::batch_norm(x, g, b, rm, rv, true, 0.1, 1e-5);
  anvil::sum(anvil::mul(y, Tensor::from_vector(up, {rows, C, H, W}, d))).backward();
  // Each rank: its rows.
  Tensor xs = leaf(rows_of(all), {mine, C, H, W}), gs = leaf({1.5f, 0.5f, -1.0f}, {C}),
         bs = leaf({0.1f, -0.2f, 0.3f}, {C});
  Tensor rms = Tensor::zeros({C}, anvil::DType::Float32, d), rvs = Tensor::ones({C}, anvil::DType::Float32, d);
  Tensor ys = anvil::parallel::sync_batch_norm(c, xs, gs, bs, rms, rvs, 0.1, 1e-5, rows * H * W);
  anvil::sum(anvil::mul(ys, Tensor::from_vector(rows_of(up), {mine, C, H, W}, d))).backward();
  Tensor dgamma = gs.grad().clone(), dbeta = bs.grad().clone();
  c.allreduce(dgamma);
  c.allreduce(dbeta);
  auto slice = [&](const Tensor& t) {
    const std::vector<double> v = host(c, t);
    return std::vector<double>(v.begin() + first * per_row, v.begin() + (first + mine) * per_row);
  };
  return {{"sync_batch_norm: y", host(c, ys), slice(y), 1e-5},
          {"sync_batch_norm: dx", host(c, xs.grad()), slice(x.grad()), 1e-4},
          {"sync_batch_norm: dgamma, dbeta", [&] {
             auto v = host(c, dgamma);
             for (double e : host(c, dbeta)) v.push_back(e);
             return v;
           }(), [&] {
             auto v = host(c, g.grad());
             for (double e : host(c, b.grad())) v.push_back(e);
             return v;
           }(), 1e-4},
          {"sync_batch_norm: running statistics", [&] {
             auto v = host(c, rms);
             for (double e : host(c, rvs)) v.push_back(e);
             return v;
           }(), [&] {
             auto v = host(c, rm);
             for (double e : host(c, rv)) v.push_back(e);
             return v;
           }(), 1e-5}};
}

inline std::vector<std::pair<std::string, Scenario>> data_parallel_scenarios() {
  auto setup = [](std::string model, anvil::parallel::Algorithm a, bool overlap, size_t bucket) {
    TrainSetup s;
    s.model = std::move(model);
    s.options.algorithm = a;
    s.options.overlap = overlap;
    s.options.bucket_bytes = bucket;
    return s;
  };
  using anvil::parallel::Algorithm;
  return {
      {"lenet, ring, overlap, 64 KiB buckets",
       [=](Communicator& c) {
         return data_parallel_scenario(c, setup("lenet", Algorithm::kRing, true, 64 << 10));
       }},
      {"lenet, naive, no overlap, one bucket",
       [=](Communicator& c) {
         return data_parallel_scenario(c, setup("lenet", Algorithm::kNaive, false, 25 << 20));
       }},
      {"lenet, native, overlap, one bucket per parameter",
       [=](Communicator& c) {
         return data_parallel_scenario(c, setup("lenet", Algorithm::kNative, true, 1));
       }},
      {"mlp, ring, overlap, 3 micro-batches per step",
       [=](Communicator& c) {
         // Shards of 5 (or 4 and 3) cut into 3: micro-batches of 1 and 2, and
         // in the last batch's shards of 3 or 2, an empty one.
         TrainSetup s = setup("mlp", Algorithm::kRing, true, 4 << 10);
         s.accumulate = 3;
         return data_parallel_scenario(c, s);
       }},
      {"determinism", data_parallel_determinism_scenario},
      {"sync_batch_norm op", sync_batch_norm_scenario},
      {"narrow resnet18, sync BatchNorm, ring, overlap",
       [=](Communicator& c) {
         TrainSetup s = setup("resnet18-narrow", Algorithm::kRing, true, 16 << 10);
         s.options.sync_batch_norm = true;
         s.epochs = 1;
         return data_parallel_scenario(c, s);
       }},
  };
}

// A rank with no example in a batch skips backward and reduces its buckets
// after it, in index order; the others reduce theirs from backward's hooks,
// which finish a layer's weight before its bias and a downsampling block's
// shortcut before the convolutions registered ahead of it. The buckets must
// still meet in one order, from a bucket per parameter up to the default.
// LeNet and the MLP: batches of 2 and 1 (on 3 ranks a rank is empty in
// both; in the last, rank 0 alone has an example). The ResNet, whose
// BatchNorm equals one device only where one rank holds the whole batch:
// batches of 1 (and under ThreadSanitizer, where a step on the simulator
// takes minutes, one batch of 1 for every model).
inline std::vector<std::pair<std::string, Scenario>> empty_rank_scenarios(
    const std::vector<std::string>& model_names, const std::vector<size_t>& bucket_sizes) {
#if defined(__SANITIZE_THREAD__)
  const bool tsan = true;
#else
  const bool tsan = false;
#endif
  std::vector<std::pair<std::string, Scenario>> out;
  for (const std::string& model : model_names)
    for (size_t bucket : bucket_sizes) {
      TrainSetup s;
      s.model = model;
      s.epochs = 1;
      const bool ones = tsan || model == "resnet18-narrow";
      s.images = tsan ? 1 : ones ? 2 : 3;
      s.batch = ones ? 1 : 2;
      s.options.bucket_bytes = bucket;
      out.emplace_back(fmt::format("{}, {} images in batches of {}, {} B buckets", model,
                                   s.images, s.batch, bucket),
                       [s](Communicator& c) { return data_parallel_scenario(c, s); });
    }
  return out;
}

}  // namespace parallel_test
