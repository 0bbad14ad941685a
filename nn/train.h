// The classification training loop shared by anvil-train, the benchmarks
// and the tests: one epoch of SGD over a DataLoader, and evaluation.
#pragma once
#include <functional>

#include "data/dataloader.h"
#include "nn/module.h"
#include "nn/optim.h"

namespace anvil::train {

struct EpochStats {
  double loss = 0;      // mean loss over the examples seen
  double accuracy = 0;  // fraction classified correctly
  int64_t examples = 0;
  double seconds = 0;
  double images_per_second() const { return seconds > 0 ? double(examples) / seconds : 0; }
};

// Called after each batch with (batches done, total batches, running stats).
using Progress = std::function<void(int64_t, int64_t, const EpochStats&)>;

// Copies a batch into tensors on `device`: images [N,C,H,W] float, labels [N] int64.
std::pair<Tensor, Tensor> batch_tensors(const data::Batch& batch, Device device);

// One epoch: loader.start_epoch() must not have been called for it yet.
EpochStats train_epoch(nn::Module& model, optim::SGD& optimizer, data::DataLoader& loader,
                       Device device, const Progress& progress = {});

// Eval mode, no gradients; restores the module's previous mode afterwards.
EpochStats evaluate(nn::Module& model, data::DataLoader& loader, Device device);

}  // namespace anvil::train
