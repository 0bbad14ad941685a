// anvil-train's checks made before any training: the device, the files a
// run reads and writes, and the flags that need something of the model or of
// the rank count. Each throws UsageError naming the flag.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "apps/train_recipes.h"
#include "core/device.h"
#include "nn/module.h"

namespace anvil::app {

// --device: "auto" (a GPU when there is one), "cpu" or "cuda:N".
Device choose_device(const std::string& text);
// The GPUs of --gpus N (cuda:0 .. cuda:N-1) or --devices cuda:a,cuda:b,...
std::vector<Device> replica_devices(const Options& o);

// The checks of the files a run reads and writes, made before any training
// (by rank 0 alone in an MPI job: the other ranks write nothing).
void check_files(const Options& o);
// The global batch must give every one of `ranks` data-parallel replicas an image.
void check_ranks(const Options& o, int ranks);
// The layout of --pipeline-parallel P and --tensor-parallel T over `ranks`
// ranks: a multiple of P × T, none of the flags a pipeline does not take
// (--accumulate: give --micro-batches; --bn-recalibrate), a model
// with a plan of its split layers for T > 1; --micro-batches only with a
// pipeline. Returns the data-parallel replicas (ranks / (P × T)).
int check_layout(const Options& o, int ranks);
// --sync-bn needs BatchNorm layers, replicas, and a part of every
// micro-batch of every batch (the last batch too) for every rank.
void check_sync_bn(const Options& o, nn::Module& model, int64_t examples, int ranks);
// The flags that only data-parallel runs (--gpus, --devices, --distributed)
// take: --sync-bn, and --grad-dtype other than float32.
void check_data_parallel_only(const Options& o);
// --bn-recalibrate needs a model with BatchNorm layers.
void check_bn_recalibrate(const Options& o, nn::Module& model);

}  // namespace anvil::app
