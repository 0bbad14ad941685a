// bench_data_parallel: how data-parallel training scales on this machine,
// measured in one run, and the parts the step-time model of
// docs/parallel.md is built from.
//
//   bench_data_parallel --model lenet        # or resnet18; --repeats, --steps
//
// It starts itself as workers and compares, in alternating rounds (the
// machine's load changes by the minute: only close rounds compare):
//   1 process x 2 threads      OMP_NUM_THREADS=2, one replica (the baseline)
//   2 MPI ranks x 1 thread     mpirun -np 2, gradients reduced during backward
//   2 MPI ranks, no overlap    the same, reduced after backward
// each training on the same global batch (--batch-size, split across the
// ranks) for --steps timed steps after --warmup, on fixed synthetic inputs
// (the step alone: forward, loss, backward, gradient all-reduce, SGD step).
// Efficiency = 2-rank images/s / baseline images/s. Then the model's parts:
// a 1-thread step at half the batch without communication (the compute each
// rank does), and the all-reduce of the model's gradient size alone on 2
// ranks; the model predicts the no-overlap step as their sum.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/random.h"
#include "nn/models.h"
#include "nn/optim.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"

#ifndef ANVIL_MPIEXEC  // a build without MPI: the program says so before it would be used
#define ANVIL_MPIEXEC "mpirun"
#endif

using namespace anvil;
namespace par = anvil::parallel;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string model = "lenet";
  int64_t batch = 256;
  int steps = 0, warmup = 0, repeats = 3;
  // worker
  bool worker = false, distributed = false, no_overlap = false, allreduce_only = false;
};

// Fixed inputs: the step's cost, not the data pipeline's.
double images_per_second(const Options& o, par::Communicator* comm) {
  const int rank = comm ? comm->rank() : 0, ranks = comm ? comm->size() : 1;
  const int64_t local = o.batch / ranks + (rank < o.batch % ranks ? 1 : 0);
  manual_seed(1);
  auto model = models::create(o.model, models::Init::Kaiming);
  optim::SGD sgd(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  std::unique_ptr<par::DataParallel> replicas;
  if (comm) {
    par::DataParallelOptions d;
    d.overlap = !o.no_overlap;
    replicas = std::make_unique<par::DataParallel>(*comm, *model, d);
  }
  Generator gen(7);
  const Tensor x = Tensor::randn({local, 1, 28, 28}, &gen);
  std::vector<int64_t> labels(static_cast<size_t>(local));
  for (int64_t i = 0; i < local; ++i) labels[size_t(i)] = i % 10;
  const Tensor y = Tensor::from_vector(labels, {local});
  auto step = [&] {
    sgd.zero_grad();
    if (replicas) replicas->begin_step(local, o.batch);
    Tensor loss = cross_entropy((*model)(x), y);
    (replicas ? scale(loss, double(local) / double(o.batch)) : loss).backward();
    if (replicas) replicas->after_backward();
    sgd.step();
    (void)loss.item();  // what a training loop waits for each step
  };
  for (int i = 0; i < o.warmup; ++i) step();
  if (comm) comm->barrier();
  const auto start = Clock::now();
  for (int i = 0; i < o.steps; ++i) step();
  if (comm) comm->barrier();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return double(o.batch) * o.steps / seconds;
}

// Seconds per all-reduce of the model's gradient bytes (ring, 2 ranks).
double allreduce_seconds(const Options& o, par::Communicator& comm) {
  auto model = models::create(o.model, models::Init::Kaiming);
  const Tensor flat = Tensor::zeros({model->num_parameters()});
  for (int i = 0; i < 3; ++i) comm.allreduce(flat);
  comm.barrier();
  const int n = std::max(5, o.steps);
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) comm.allreduce(flat);
  comm.barrier();
  return std::chrono::duration<double>(Clock::now() - start).count() / n;
}

int worker(const Options& o) {
  if (o.allreduce_only) {
    auto comm = par::mpi_world();
    const double s = allreduce_seconds(o, *comm);
    if (comm->rank() == 0) std::cout << nlohmann::json{{"allreduce_seconds", s}}.dump() << "\n";
    return 0;
  }
  if (!o.distributed) {
    std::cout << nlohmann::json{{"images_per_second", images_per_second(o, nullptr)}}.dump() << "\n";
    return 0;
  }
  auto comm = par::mpi_world();
  const double ips = images_per_second(o, comm.get());
  if (comm->rank() == 0) std::cout << nlohmann::json{{"images_per_second", ips}}.dump() << "\n";
  return 0;
}

// Runs a shell command and returns the last JSON line it printed.
nlohmann::json run_json(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) throw std::runtime_error("cannot run: " + cmd);
  std::string out, last;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) {
    out += buf;
    if (buf[0] == '{') last = buf;
  }
  const int rc = pclose(p);
  if (rc != 0 || last.empty())
    throw std::runtime_error(fmt::format("`{}` failed (status {}):\n{}", cmd, rc, out));
  return nlohmann::json::parse(last);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int launcher(const Options& o, const std::string& self) {
  const std::string args = fmt::format(" --worker --model {} --batch-size {} --steps {} --warmup {}",
                                       o.model, o.batch, o.steps, o.warmup);
  const std::string mpi = std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") +
                          ANVIL_MPIEXEC + " --oversubscribe -np 2 -x OMP_NUM_THREADS=1 ";
  const std::string single = "OMP_NUM_THREADS=2 " + self + args;
  const std::string ranks = mpi + self + args + " --distributed";
  const std::string no_overlap = ranks + " --no-overlap";
  std::vector<double> a, b, c;
  for (int r = 0; r < o.repeats; ++r) {
    a.push_back(run_json(single)["images_per_second"]);
    b.push_back(run_json(ranks)["images_per_second"]);
    c.push_back(run_json(no_overlap)["images_per_second"]);
    std::fprintf(stderr, "round %d: %.1f / %.1f / %.1f img/s\n", r + 1, a.back(), b.back(), c.back());
  }
  const double base = median(a), overlap = median(b), plain = median(c);
  // The model's parts.
  const double compute = double(o.batch / 2) /
                         run_json("OMP_NUM_THREADS=1 " + self +
                                  fmt::format(" --worker --model {} --batch-size {} --steps {} --warmup {}",
                                              o.model, o.batch / 2, o.steps, o.warmup))["images_per_second"]
                             .get<double>();
  const double comm = run_json(mpi + self + args + " --allreduce-only")["allreduce_seconds"];
  const double predicted = compute + comm;  // no overlap: one after the other
  fmt::print("# bench_data_parallel: {} at global batch {}, {} timed steps after {} warm-up; "
             "median of {} alternating rounds\n",
             o.model, o.batch, o.steps, o.warmup, o.repeats);
  fmt::print("{:<34} {:>10} {:>12}\n", "configuration", "img/s", "efficiency");
  fmt::print("{:<34} {:>10.1f} {:>12}\n", "1 process x 2 threads", base, "1.00");
  fmt::print("{:<34} {:>10.1f} {:>11.2f}x\n", "2 MPI ranks x 1 thread, overlap", overlap, overlap / base);
  fmt::print("{:<34} {:>10.1f} {:>11.2f}x\n", "2 MPI ranks x 1 thread, no overlap", plain, plain / base);
  fmt::print("# the step-time model's parts: compute at batch {} on 1 thread {:.2f} ms; "
             "ring all-reduce of the gradients ({:.1f} MB) on 2 ranks {:.2f} ms\n",
             o.batch / 2, compute * 1e3, 4e-6 * double(models::create(o.model)->num_parameters()),
             comm * 1e3);
  fmt::print("# predicted step without overlap {:.2f} ms ({:.1f} img/s); measured {:.2f} ms\n",
             predicted * 1e3, o.batch / predicted, o.batch / plain * 1e3);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_data_parallel: 2 MPI ranks x 1 thread against 1 process x 2 threads"};
  Options o;
  app.add_option("--model", o.model, "lenet or resnet18")->check(CLI::IsMember({"lenet", "resnet18"}));
  app.add_option("--batch-size", o.batch, "global batch")->check(CLI::Range(2, 100000));
  app.add_option("--steps", o.steps, "timed steps per round (default: lenet 30, resnet18 3)");
  app.add_option("--warmup", o.warmup, "untimed steps first (default: lenet 5, resnet18 1)");
  app.add_option("--repeats", o.repeats, "alternating rounds (the median is reported)")->check(CLI::Range(1, 100));
  app.add_flag("--worker", o.worker)->group("");
  app.add_flag("--distributed", o.distributed)->group("");
  app.add_flag("--no-overlap", o.no_overlap)->group("");
  app.add_flag("--allreduce-only", o.allreduce_only)->group("");
  CLI11_PARSE(app, argc, argv);
  if (o.steps == 0) o.steps = o.model == "lenet" ? 30 : 3;
  if (o.warmup == 0) o.warmup = o.model == "lenet" ? 5 : 1;
  try {
    if (!par::mpi_missing_reason().empty()) throw std::runtime_error(par::mpi_missing_reason());
    return o.worker ? worker(o) : launcher(o, argv[0]);
  } catch (const std::exception& e) {
    std::cerr << "bench_data_parallel: " << e.what() << "\n";
    return 1;
  }
}
