// train_step: training steps (forward, loss, backward, SGD) of one of
// anvil-train's models at a batch size, on one device, with a recipe's
// optimizer, and nothing else: no data set to read, no evaluation. It is
// what the simulator's launch audit records (tools/predict/launch-audit.sh;
// docs/kernels.md, "Launch audit"), where anvil-train would add an
// evaluation's launches to the step's.
//
//   ANVIL_SIM_LAUNCH_AUDIT=audit.jsonl ./build/sim/train_step --model resnet18 --batch-size 256
//
// It ends with the device's peak memory over the run, from the caching
// allocator's statistics (memory_stats).
//
// The images are a fixed synthetic pattern: a step launches the same kernels
// on the same shapes whatever the pixels are. The recipe (seed by default)
// gives the init, the SGD options and the label smoothing, so the step is the
// one anvil-train --recipe takes; its CPU-side transforms do not change what
// the device runs, except --resize, which sets the images' size here.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "apps/train_recipes.h"
#include "core/device.h"
#include "core/precision.h"
#include "core/storage.h"
#include "data/dataloader.h"
#include "data/idx.h"
#include "nn/models.h"
#include "nn/optim.h"
#include "nn/train.h"

using namespace anvil;

int main(int argc, char** argv) {
  CLI::App cli{"Training steps of a model on one device, for the simulator's launch audit"};
  app::Options o;
  std::string device = "cuda:0";
  int64_t batch = 0;  // 0: the recipe's
  int steps = 1;
  cli.add_option("--model", o.model, "lenet, resnet18 or resnet18-96")->capture_default_str();
  cli.add_option("--recipe", o.recipe, "seed or best: init, SGD options, label smoothing")
      ->capture_default_str();
  cli.add_option("--batch-size", batch, "Images per step (default: the recipe's)");
  cli.add_option("--steps", steps, "Training steps")->capture_default_str()->check(CLI::PositiveNumber);
  cli.add_option("--device", device, "cpu or cuda:N")->capture_default_str();
  cli.add_option("--fp32-precision", o.fp32_precision,
                 "float32 math of convolutions and matmuls: default, ieee or tf32 (core/precision.h)")
      ->capture_default_str()
      ->check(CLI::IsMember({"default", "ieee", "tf32"}));
  cli.add_option("--amp", o.amp, "Mixed precision: off or bf16 (core/autocast.h)")
      ->capture_default_str()
      ->check(CLI::IsMember({"off", "bf16"}));
  bool graphs = false;
  cli.add_flag("--cuda-graphs", graphs,
               "Steps after the first as CUDA graphs, as anvil-train's (off: every step eager, "
               "what the one-step audits record)");
  CLI11_PARSE(cli, argc, argv);
  try {
    o = app::apply_recipe(o);
    set_fp32_precision(parse_fp32_precision(o.fp32_precision));
    if (batch > 0) o.batch_size = batch;
    const Device dev = Device::parse(device);
    auto model = models::create(o.model, app::parse_init(o.init));
    model->to(dev);

    data::ImageSet set;
    set.count = o.batch_size * steps;
    set.rows = set.cols = o.model == "resnet18-96" ? 96 : o.resize > 0 ? o.resize : 28;
    set.pixels.resize(size_t(set.count * set.rows * set.cols));
    for (size_t i = 0; i < set.pixels.size(); ++i) set.pixels[i] = uint8_t(i * 31 % 251);
    set.labels.resize(size_t(set.count));
    for (int64_t i = 0; i < set.count; ++i) set.labels[size_t(i)] = i % 10;
    data::DataLoader loader(set, o.batch_size, false, false, o.seed);

    optim::SGD optimizer(model->parameters(), {.lr = o.lr, .momentum = o.momentum,
                                               .weight_decay = o.weight_decay,
                                               .nesterov = o.nesterov});
    train::EpochOptions epoch;
    epoch.label_smoothing = o.label_smoothing;
    epoch.amp = o.amp_bf16();
    epoch.cuda_graphs = graphs;
    const train::EpochStats stats = train::train_epoch(*model, optimizer, loader, dev, epoch);
    synchronize(dev);
    fmt::print("{} ({} recipe{}) on {}: {} step(s) of batch {}, loss {:.4f}, {:.1f} s\n", o.model,
               o.recipe, o.amp_bf16() ? ", amp bf16" : "", dev.str(), steps, o.batch_size,
               stats.loss, stats.seconds);
    // The caching allocator's high-water mark over the run: weights,
    // gradients, momentum, the activations backward keeps, kernels'
    // workspaces, and the batch itself.
    const MemoryStats m = memory_stats(dev);
    fmt::print("peak device memory: {:.1f} MiB allocated at most ({:.1f} MiB reserved now)\n",
               double(m.peak_allocated) / 1048576.0, double(m.reserved) / 1048576.0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
