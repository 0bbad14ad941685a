// One anvil-train run: the checks of its flags, then training on one device,
// or as data-parallel replicas (docs/parallel.md): one thread per GPU
// (--gpus N, --devices cuda:0,cuda:1) or one MPI process per rank
// (mpirun ... anvil-train --distributed). Rank 0 prints and writes every file.
#pragma once
#include "apps/train_recipes.h"

namespace anvil::app {

// Runs the training `o` describes; returns the exit status (0). Throws
// UsageError for bad input, other exceptions for failures along the way.
int run_training(const Options& o);

}  // namespace anvil::app
