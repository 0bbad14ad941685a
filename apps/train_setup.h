// The setup of one anvil-train run: what a replica needs before its first
// epoch (the model, the data and its transforms, the loaders, the optimizer
// and schedule, the state of a resumed run, and the replicas' link), made in
// one place so that the epochs (apps/train_epoch.h) and the report
// (apps/train_report.h) only use it.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/train_recipes.h"
#include "core/device.h"
#include "data/dataloader.h"
#include "data/transforms.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "nn/schedule.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"

namespace anvil::app {

// Where and as what one copy of the training loop runs: one rank of a group.
// A run on one device is a group of one (parallel::one_rank_group), so the
// loop is the same for every run.
struct Replica {
  Device device;
  parallel::Communicator* comm = nullptr;  // the group; set before the run starts
  // Started as data-parallel replicas (--gpus, --devices, --distributed), of
  // any number: what the header, the metrics and the summary describe.
  bool data_parallel = false;
  // Read once and shared by the replicas of one process (null: read here).
  std::shared_ptr<const data::ImageSet> train_set, test_set;
  int rank() const { return comm->rank(); }
  int size() const { return comm->size(); }
};

// The train and test transforms: crop and flip for training only; both
// resize and normalise alike. Empty (no per-batch work) when nothing is on.
struct Transforms {
  data::BatchTransform train, test;
  std::string summary;  // for the run's header, e.g. "resize 96, normalise (mean 0.286, std 0.353)"
};
Transforms make_transforms(const Options& o, const data::ImageSet& train_set);

// The flags that need more than their validators, parsed once before any
// rank starts (so that a bad one fails before the data is read) and handed
// to every rank: --init, the schedule's flags with the checks across flags
// (check_settings), --allreduce.
struct Settings {
  models::Init init = models::Init::Seed;
  optim::ScheduleOptions schedule;
  parallel::Algorithm allreduce = parallel::Algorithm::kRing;
};
// Throws UsageError naming the flag.
Settings parse_settings(const Options& o);

// The --model, initialised from --seed with `init`; UsageError naming
// --model (or --bn-recalibrate, for a model without BatchNorm).
std::shared_ptr<nn::Module> create_model(const Options& o, models::Init init);

// --init-from's weights into `model`. A bfloat16 tensor of the file goes
// into its float32 weight widened exactly, as PyTorch's load_state_dict
// copies it (nn::load_state_dict). Returns the run's header line that says
// so ("" when nothing was widened).
std::string load_init_from(const Options& o, nn::Module& model);

// What anvil-train keeps in a checkpoint besides the weights: the settings
// it was trained with (a resumed run must use the same) and the metrics of
// the epochs done (so the resumed run's --metrics file is complete).
struct Resumed {
  int64_t epochs_done = 0;
  nlohmann::ordered_json history = nlohmann::ordered_json::array();  // rank 0's
};

// Everything a replica's epochs use, made by setup_run.
struct Run {
  Options options;   // the command line's, after the recipe
  Settings settings;  // parsed from `options`
  Replica replica;   // this rank: its device and group
  std::shared_ptr<nn::Module> model;  // on replica.device
  std::shared_ptr<const data::ImageSet> train_set, test_set;
  Transforms transforms;
  std::optional<data::DataLoader> train_loader, test_loader;  // this rank's shards
  // --bn-recalibrate: the epoch's first batches, in the same order, without
  // augmentation (the inputs evaluation sees); every rank reads them whole.
  std::optional<data::DataLoader> recalibration_loader;
  std::optional<optim::SGD> optimizer;
  std::optional<optim::LRSchedule> schedule;
  Resumed resumed;  // epochs_done agreed on by every rank
  std::string init_note;  // load_init_from's line for the header (rank 0's)
  // --pipeline-parallel or --tensor-parallel: this rank's place in the mesh
  // of dp × pp × tp ranks (replica.comm is the world). Without: unset, and
  // the run is data-parallel over replica.comm.
  std::optional<parallel::Mesh> mesh;
  std::unique_ptr<parallel::Pipeline> pipeline;  // this rank's stage of the model
  // --tensor-parallel: the model with its linear layers split over the tp
  // group (the other layers shared with `model`), what trains; `model`
  // gets the split layers' weights back before it is saved.
  std::shared_ptr<nn::Sequential> split;
  nn::Module& net() const { return split ? *split : *model; }  // what trains
  // Over the data-parallel group (its replicas of this rank's stage, or of
  // the whole model); does nothing for one rank.
  std::optional<parallel::DataParallel> replicas;
  parallel::Communicator& dp() const { return mesh ? *mesh->dp : *replica.comm; }
};

// Every rank of an MPI job (--distributed) against rank 0, before the run's
// communicator is made: the data files (size and checksum) and every flag of
// the option table (replica_settings). A rank that differs throws
// RankUsageError naming the first difference. A collective over `comm`.
void agree_on_flags(const Options& o, parallel::Communicator& comm);

// Builds the run: rank 0 reads --init-from or --resume, every rank then
// checks its flags against rank 0's and gets its weights (and momentum).
// A collective: every rank of the group calls it.
std::unique_ptr<Run> setup_run(const Options& o, const Settings& settings, const Replica& r);

}  // namespace anvil::app
