// bench_model_parallel: data, pipeline and tensor parallelism side by side,
// each against one device measured in the same run.
//
//   mpirun -np 2 --oversubscribe -x OMP_NUM_THREADS=1 bench_model_parallel --model resnet18
//   mpirun -np 4 --oversubscribe -x OMP_NUM_THREADS=1 bench_model_parallel --model lenet
//   bench_model_parallel --gpus 2 --model resnet18      # one thread per GPU (or simulated GPU)
//
// For each layout of the N ranks (one device: rank 0 alone while the others
// wait; dp N; pp N; tp N; on 4 ranks also dp 2 × pp 2, dp 2 × tp 2 and pp 2
// × tp 2) it trains --warmup steps, then --steps timed steps of the global
// batch on fixed synthetic images (the training loop of anvil-train:
// train::train_epoch with its replicas and stages), in --repeats rounds that
// take the layouts in turn, so that the machine's load falls on all of them.
// It prints for each layout the median images/s and its ratio to one
// device's, and per rank (the largest over the ranks: what has to fit):
//   weights held   every parameter tensor the rank holds (every rank holds
//                  the whole model, which --save gathers into, and its own
//                  parts of the split layers)
//   trained        the parameters it updates (its gradients and its SGD
//                  momentum are each as large)
//   step peak      its allocator's peak during the timed steps above what
//                  was allocated before them, gradients dropped: the
//                  activations held, the gradients, the temporaries
//   sent / step    the data bytes it sent to other ranks per step
//                  (Communicator::bytes_sent over its groups), and the
//                  total over the ranks.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/device.h"
#include "core/random.h"
#include "core/storage.h"
#include "data/dataloader.h"
#include "nn/models.h"
#include "nn/optim.h"
#include "nn/train.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/pipeline.h"
#include "parallel/stages.h"
#include "parallel/tensor_parallel.h"

using namespace anvil;
namespace par = anvil::parallel;

namespace {

struct Options {
  std::string model = "resnet18";
  int64_t batch = 32;
  int64_t micro_batches = 4;
  int64_t width = 1;  // ResNet-18's stage widths times this
  int steps = 0, warmup = 1, repeats = 3;
  int gpus = 0;  // 0: MPI ranks on the CPU
};

struct Layout {
  std::string name;
  par::MeshShape mesh;
  bool alone = false;  // one device: rank 0 alone
};

// One rank's figures for one layout and round.
struct Measured {
  double seconds = 0, held = 0, trained = 0, peak = 0, sent = 0;
};

std::vector<Layout> layouts(int n) {
  std::vector<Layout> out = {{"one device", {}, true},
                             {fmt::format("dp {}", n), {.dp = n}},
                             {fmt::format("pp {}", n), {.pp = n}},
                             {fmt::format("tp {}", n), {.tp = n}}};
  if (n == 4) {
    out.push_back({"dp 2 x pp 2", {.dp = 2, .pp = 2}});
    out.push_back({"dp 2 x tp 2", {.dp = 2, .tp = 2}});
    out.push_back({"pp 2 x tp 2", {.pp = 2, .tp = 2}});
  }
  return out;
}

std::shared_ptr<nn::Sequential> make_model(const Options& o) {
  Generator gen(1);  // the same weights on every rank
  if (o.model == "lenet") return models::lenet(models::Init::Kaiming, &gen);
  models::ResNetConfig c;
  for (auto& w : c.widths) w *= o.width;
  return models::resnet18(c, models::Init::Kaiming, &gen);
}

data::ImageSet images(int64_t count) {
  data::ImageSet set;
  set.count = count;
  set.rows = set.cols = 28;
  Generator gen(5);
  const std::vector<float> u = Tensor::rand({count * 784}, &gen).to_vector();
  for (float v : u) set.pixels.push_back(uint8_t(v * 255));
  for (int64_t i = 0; i < count; ++i) set.labels.push_back(i % 10);
  return set;
}

double bytes_of(const std::vector<Tensor>& ts) {
  double b = 0;
  for (const Tensor& t : ts) b += double(t.nbytes());
  return b;
}

// One layout's run on this rank (a collective of the ranks in it).
Measured run_layout(par::Communicator& world, const Options& o, const Layout& l) {
  if (l.alone && world.rank() != 0) return {};
  std::unique_ptr<par::Communicator> one;
  par::Communicator* comm = &world;
  if (l.alone) {
    one = par::one_rank_group(world.device());
    comm = one.get();
  }
  const Device device = comm->device();
  par::Mesh mesh = par::make_mesh(*comm, l.mesh);
  auto model = make_model(o);
  const bool split = l.mesh.tp > 1, piped = l.mesh.pp > 1;
  const par::TensorParallelPlan plan = par::tensor_parallel_plan(o.model);
  std::vector<par::PipelineLayer> layers;
  std::vector<size_t> bounds;
  if (piped) {
    layers = par::pipeline_layers(*model, {1, 28, 28}, false);
    std::vector<int64_t> costs;
    std::vector<std::string> names;
    for (const auto& layer : layers) {
      costs.push_back(layer.flops);
      names.push_back(layer.name);
    }
    bounds = par::balance_stages(costs, l.mesh.pp,
                                 split ? par::stage_starts(names, *model, plan) : std::vector<bool>{});
  }
  model->to(device);
  std::shared_ptr<nn::Sequential> parts;
  if (split) parts = par::split_tensor_parallel(*mesh.tp, *model, plan);
  nn::Module& net = split ? *parts : *model;
  optim::SGD sgd(net.parameters(), {.lr = 0.01, .momentum = 0.9});
  std::unique_ptr<par::Pipeline> pipeline;
  if (piped)
    pipeline = std::make_unique<par::Pipeline>(
        *mesh.pp, split ? par::with_modules_of(layers, *parts) : layers, bounds,
        par::Schedule::kOneFOneB, device);
  par::DataParallel replicas(*mesh.dp, piped ? pipeline->stage() : net, {});
  const data::ImageSet warm_set = images(o.batch * o.warmup), timed_set = images(o.batch * o.steps);
  data::DataLoader warm(warm_set, o.batch, false, false, 1);
  data::DataLoader timed(timed_set, o.batch, false, false, 1);
  warm.set_shard(mesh.dp->rank(), mesh.dp->size());
  timed.set_shard(mesh.dp->rank(), mesh.dp->size());
  train::EpochOptions eo;
  eo.replicas = &replicas;
  eo.stages = pipeline.get();
  eo.accumulate = piped ? o.micro_batches : 1;
  train::train_epoch(net, sgd, warm, device, eo);

  sgd.zero_grad();
  comm->synchronize();
  auto sent = [&] { return double(mesh.dp->bytes_sent() + mesh.pp->bytes_sent() + mesh.tp->bytes_sent()); };
  const double sent_before = sent();
  const MemoryStats before = memory_stats(device);
  reset_peak_memory_stats(device);
  comm->barrier();
  const auto start = std::chrono::steady_clock::now();
  train::train_epoch(net, sgd, timed, device, eo);
  synchronize(device);  // a GPU's work done, not only issued
  comm->synchronize();
  Measured m;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.peak = double(memory_stats(device).peak_allocated) - double(before.allocated);
  m.sent = (sent() - sent_before) / o.steps;
  // Every parameter tensor held once: the whole model's and the parts.
  std::set<const void*> seen;
  for (const nn::Module* m2 : {static_cast<nn::Module*>(model.get()), &net})
    for (const Tensor& p : m2->parameters())
      if (seen.insert(p.raw_data()).second) m.held += double(p.nbytes());
  m.trained = bytes_of(piped ? pipeline->stage().parameters() : net.parameters());
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Every layout, every round, on this rank; rank 0 prints.
void run_all(par::Communicator& world, const Options& o) {
  const int n = world.size();
  const std::vector<Layout> all = layouts(n);
  std::map<std::string, std::vector<double>> rate;  // images/s per round
  std::map<std::string, std::vector<Measured>> last;   // every rank's, the last round
  for (int r = 0; r < o.repeats; ++r)
    for (const Layout& l : all) {
      world.barrier();
      const Measured m = run_layout(world, o, l);
      world.barrier();
      const Tensor mine = Tensor::from_vector(
          std::vector<float>{float(m.seconds), float(m.held), float(m.trained), float(m.peak),
                             float(m.sent)},
          {1, 5}, world.device());
      const std::vector<float> every = world.all_gather(mine).to(Device::cpu()).to_vector();
      std::vector<Measured> ranks;
      double slowest = 0;
      for (int k = 0; k < n; ++k) {
        const float* e = &every[size_t(k) * 5];
        ranks.push_back({e[0], e[1], e[2], e[3], e[4]});
        slowest = std::max(slowest, double(e[0]));
      }
      rate[l.name].push_back(double(o.batch) * o.steps / slowest);
      last[l.name] = ranks;
      if (world.rank() == 0)
        std::fprintf(stderr, "round %d: %s %.1f img/s\n", r + 1, l.name.c_str(), rate[l.name].back());
    }
  if (world.rank() != 0) return;
  const double base = median(rate["one device"]);
  const double mb = 1e6;
  fmt::print("# bench_model_parallel: {} (widths x{}), global batch {}, {} micro-batches for a "
             "pipeline (1F1B), {} timed steps after {}; {} ranks ({}, {}); median of {} rounds\n",
             o.model, o.width, o.batch, o.micro_batches, o.steps, o.warmup, n, world.backend(),
             world.device().is_cpu() ? "cpu, one process each" : "one GPU each", o.repeats);
  fmt::print("{:<13} {:>9} {:>8} {:>13} {:>11} {:>11} {:>13} {:>12}\n", "layout", "img/s",
             "vs one", "weights held", "trained", "step peak", "sent / step", "all ranks");
  for (const Layout& l : all) {
    Measured worst;
    double total = 0;
    for (const Measured& m : last[l.name]) {
      worst.held = std::max(worst.held, m.held);
      worst.trained = std::max(worst.trained, m.trained);
      worst.peak = std::max(worst.peak, m.peak);
      worst.sent = std::max(worst.sent, m.sent);
      total += m.sent;
    }
    const double ips = median(rate[l.name]);
    fmt::print("{:<13} {:>9.1f} {:>7.2f}x {:>10.1f} MB {:>8.1f} MB {:>8.1f} MB {:>10.2f} MB "
               "{:>9.2f} MB\n",
               l.name, ips, ips / base, worst.held / mb, worst.trained / mb, worst.peak / mb,
               worst.sent / mb, total / mb);
  }
  fmt::print("# per rank, the largest over the ranks; one device's 'vs one' is 1 by definition\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_model_parallel: data, pipeline and tensor parallelism against one device"};
  Options o;
  app.add_option("--model", o.model, "lenet or resnet18")->check(CLI::IsMember({"lenet", "resnet18"}));
  app.add_option("--batch-size", o.batch, "global batch")->check(CLI::Range(4, 100000));
  app.add_option("--micro-batches", o.micro_batches, "a pipeline's micro-batches per step")
      ->check(CLI::Range(1, 1024));
  app.add_option("--width-multiplier", o.width, "ResNet-18's stage widths times this")
      ->check(CLI::Range(1, 16));
  app.add_option("--steps", o.steps, "timed steps per layout and round (default: lenet 20, resnet18 2)");
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::Range(1, 100));
  app.add_option("--repeats", o.repeats, "rounds (the median is reported)")->check(CLI::Range(1, 100));
  app.add_option("--gpus", o.gpus, "N threads, one per GPU, over NCCL (0: MPI ranks on the CPU)")
      ->check(CLI::Range(0, 64));
  CLI11_PARSE(app, argc, argv);
  if (o.steps == 0) o.steps = o.model == "lenet" ? 20 : 2;
  try {
    if (o.gpus == 0) {
      if (!par::mpi_missing_reason().empty()) throw std::runtime_error(par::mpi_missing_reason());
      auto world = par::mpi_world();
      run_all(*world, o);
      return 0;
    }
    if (!par::nccl_missing_reason().empty()) throw std::runtime_error(par::nccl_missing_reason());
    if (device_count() < o.gpus)
      throw std::runtime_error(fmt::format("--gpus {}: the machine has {} GPU(s)", o.gpus, device_count()));
    const par::NcclId id = par::nccl_unique_id();
    std::vector<std::thread> threads;
    std::vector<std::string> errors(size_t(o.gpus));
    for (int r = 0; r < o.gpus; ++r)
      threads.emplace_back([&, r] {
        try {
          auto world = par::nccl_communicator(id, r, o.gpus, Device::cuda(r));
          run_all(*world, o);
        } catch (const std::exception& e) {
          errors[size_t(r)] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    for (const std::string& e : errors)
      if (!e.empty()) throw std::runtime_error(e);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_model_parallel: " << e.what() << "\n";
    return 1;
  }
}
