#include "apps/train_setup.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "apps/train_checks.h"
#include "core/random.h"
#include "nn/models.h"
#include "nn/safetensors.h"
#include "nn/train.h"

namespace anvil::app {
namespace {

// The run's settings and counters are checked before any tensor is read into
// the model, so resuming with another --model (or --lr, ...) names the flag
// rather than a tensor.
Resumed resume_from(const Options& o, nn::Module& model, optim::SGD& optimizer,
                    int64_t batches_per_epoch) {
  train::RunState state = train::read_run_state(o.resume);
  const nlohmann::ordered_json saved =
      state.info.value("settings", nlohmann::ordered_json::object());
  if (!saved.is_object())
    throw nn::CheckpointError(fmt::format("{}: its 'settings' are not a JSON object", o.resume));
  const nlohmann::ordered_json settings = app::training_settings(o);
  for (auto& [key, value] : settings.items()) {
    if (!saved.contains(key))
      throw nn::CheckpointError(fmt::format("{}: has no setting '{}'", o.resume, key));
    if (saved[key] != value)
      throw nn::CheckpointError(fmt::format(
          "{}: was trained with --{} {}, this run has --{} {}; resume with the flags the run "
          "started with",
          o.resume, key, saved[key].dump(), key, value.dump()));
  }
  if (state.steps_done != state.epochs_done * batches_per_epoch)
    throw nn::CheckpointError(fmt::format(
        "{}: {} steps for {} epochs, but an epoch here has {} batches", o.resume, state.steps_done,
        state.epochs_done, batches_per_epoch));
  Resumed r;
  r.epochs_done = state.epochs_done;
  r.history = state.info.value("history", nlohmann::ordered_json::array());
  if (!r.history.is_array() || int64_t(r.history.size()) != state.epochs_done)
    throw nn::CheckpointError(fmt::format(
        "{}: its 'history' must be a list of one entry per epoch done ({})", o.resume,
        state.epochs_done));
  train::load_checkpoint(o.resume, model, optimizer);  // the tensors, checked before any is copied
  return r;
}

// A rank's settings against rank 0's: the first flag that differs, named.
void check_same_settings(const nlohmann::ordered_json& mine, const nlohmann::ordered_json& theirs,
                         int rank) {
  for (auto& [key, value] : mine.items())
    if (!theirs.contains(key) || theirs[key] != value)
      throw RankUsageError(fmt::format(
          "rank {} was started with --{} {}, rank 0 with --{} {}: every rank of a run needs "
          "the same flags",
          rank, key, value.dump(), key, theirs.contains(key) ? theirs[key].dump() : "(none)"));
}

// The Fashion-MNIST files in `dir`, as data::load_mnist_split finds them
// (plain or .gz), each with its size and checksum (64-bit FNV-1a): ranks
// whose --data-dir has the same path but not the same contents (another
// machine's copy) differ here.
nlohmann::ordered_json data_files(const std::string& dir) {
  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  for (const char* base : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    std::string found = "absent";
    for (const std::string& name : {std::string(base), std::string(base) + ".gz"}) {
      std::ifstream in(std::filesystem::path(dir) / name, std::ios::binary);
      if (!in) continue;
      uint64_t hash = 0xcbf29ce484222325ull, bytes = 0;
      std::vector<char> buffer(1 << 16);
      while (in) {
        in.read(buffer.data(), std::streamsize(buffer.size()));
        const size_t got = size_t(in.gcount());
        for (size_t k = 0; k < got; ++k) hash = (hash ^ uint8_t(buffer[k])) * 0x100000001b3ull;
        bytes += got;
      }
      found = fmt::format("{}: {} bytes, checksum {:#018x}", name, bytes, hash);
      break;
    }
    files[base] = found;
  }
  return files;
}

// Rank 0's run settings and epochs done, sent to every rank; a rank started
// with other flags names the first that differs. Returns rank 0's epochs done.
int64_t agree_on_run(const Options& o, const Replica& r, const Resumed& resumed) {
  nlohmann::ordered_json mine = {{"settings", app::replica_settings(o)},
                                 {"epochs_done", resumed.epochs_done}};
  const nlohmann::ordered_json root =
      nlohmann::ordered_json::parse(parallel::broadcast_text(*r.comm, mine.dump(), 0));
  check_same_settings(mine["settings"], root["settings"], r.rank());
  return root["epochs_done"].get<int64_t>();
}

// The data, its transforms and the loaders, each rank's loaders on its shard.
void load_data(Run& s) {
  const Options& o = s.options;
  s.train_set = s.replica.train_set ? s.replica.train_set
                              : std::make_shared<const data::ImageSet>(
                                    data::load_mnist_split(o.data_dir, true, o.limit_train));
  s.test_set = s.replica.test_set ? s.replica.test_set
                            : std::make_shared<const data::ImageSet>(
                                  data::load_mnist_split(o.data_dir, false, o.limit_test));
  s.transforms = make_transforms(o, *s.train_set);
  s.train_loader.emplace(s.train_set, o.batch_size, !o.no_shuffle, false, o.seed,
                         s.transforms.train);
  s.test_loader.emplace(s.test_set, o.batch_size, false, false, o.seed, s.transforms.test);
  // The stages of one pipeline load the same shard: that of their replica.
  s.train_loader->set_shard(s.dp().rank(), s.dp().size());
  s.test_loader->set_shard(s.dp().rank(), s.dp().size());
  if (o.sync_bn) check_sync_bn(o, *s.model, s.train_set->count, s.dp().size());
  if (o.bn_recalibrate > 0) {
    s.recalibration_loader.emplace(s.train_set, o.batch_size, !o.no_shuffle, false, o.seed,
                                   s.transforms.test);
    if (o.bn_recalibrate > s.recalibration_loader->num_batches())
      throw UsageError(fmt::format(
          "--bn-recalibrate {}: more than the {} training batches of {} images in an epoch",
          o.bn_recalibrate, s.recalibration_loader->num_batches(), o.batch_size));
  }
}

// The model's layers and their cut into --pipeline-parallel stages.
struct StageCut {
  std::vector<parallel::PipelineLayer> layers;
  std::vector<size_t> bounds;
};

StageCut cut_into_stages(const Options& o, nn::Module& model) {
  const int64_t side = o.resize ? o.resize : 28;
  StageCut st;
  try {
    st.layers = parallel::pipeline_layers(model, {1, side, side}, o.amp_bf16());
    std::vector<int64_t> costs;
    std::vector<std::string> names;
    for (const parallel::PipelineLayer& l : st.layers) {
      costs.push_back(l.flops);
      names.push_back(l.name);
    }
    // With tensor parallelism a stage begins where the activation is whole.
    const std::vector<bool> starts =
        o.tensor_parallel > 1
            ? parallel::stage_starts(names, dynamic_cast<const nn::Sequential&>(model),
                                     parallel::tensor_parallel_plan(o.model))
            : std::vector<bool>{};
    st.bounds = parallel::balance_stages(costs, o.pipeline_parallel, starts);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("--pipeline-parallel {} with --model {}: {}",
                                 o.pipeline_parallel, o.model, e.what()));
  }
  return st;
}

}  // namespace

Transforms make_transforms(const Options& o, const data::ImageSet& train_set) {
  data::TransformOptions test;
  test.resize = o.resize;
  test.seed = o.seed;
  std::vector<std::string> parts;
  if (o.resize) parts.push_back(fmt::format("resize {}", o.resize));
  if (o.normalize) {
    // The training set's statistics, for the test set too (as torchvision
    // recipes do), so the test images are not looked at before evaluation.
    data::ChannelStats stats = data::channel_stats(train_set);
    test.mean = stats.mean;
    test.std = stats.std;
    parts.push_back(fmt::format("normalise (mean {:.4f}, std {:.4f})", stats.mean[0], stats.std[0]));
  }
  data::TransformOptions train = test;
  if (o.augment) {
    train.crop_padding = o.crop_padding;
    train.horizontal_flip = true;
    parts.push_back(o.crop_padding ? fmt::format("random crop (padding {}) + flip", o.crop_padding)
                                   : std::string("flip"));
  }
  Transforms t;
  bool train_work = o.resize || o.normalize || o.augment;
  bool test_work = o.resize || o.normalize;
  if (train_work) t.train = data::make_transform(train);
  if (test_work) t.test = data::make_transform(test);
  for (auto& p : parts) t.summary += (t.summary.empty() ? "" : ", ") + p;
  if (t.summary.empty()) t.summary = "none";
  return t;
}

Settings parse_settings(const Options& o) {
  Settings s;
  s.init = app::parse_init(o.init);
  s.schedule = app::check_settings(o);
  s.allreduce = parallel::parse_algorithm(o.allreduce);  // (a CLI validator names the flag first)
  return s;
}

std::shared_ptr<nn::Module> create_model(const Options& o, models::Init init) {
  manual_seed(o.seed);
  std::shared_ptr<nn::Module> model;
  try {
    model = models::create(o.model, init);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("--model: {}", e.what()));
  }
  check_bn_recalibrate(o, *model);
  return model;
}

std::string load_init_from(const Options& o, nn::Module& model) {
  const nn::NamedTensors file = nn::load_safetensors(o.init_from);
  const int64_t widened = nn::load_state_dict(model, file, o.init_from);
  if (widened == 0) return "";
  return fmt::format("  --init-from {}: {} of its {} tensors are bfloat16, widened exactly into "
                     "the float32 weights (as PyTorch's load_state_dict copies them)\n",
                     o.init_from, widened, file.size());
}

void agree_on_flags(const Options& o, parallel::Communicator& comm) {
  const nlohmann::ordered_json mine = {{"data", data_files(o.data_dir)},
                                       {"settings", app::replica_settings(o)}};
  const nlohmann::ordered_json root =
      nlohmann::ordered_json::parse(parallel::broadcast_text(comm, mine.dump(), 0));
  for (auto& [base, found] : mine["data"].items())
    if (root["data"].value(base, "") != found)
      throw RankUsageError(fmt::format(
          "rank {}'s --data-dir {} has {}, rank 0's --data-dir {} has {}: every rank of a run "
          "needs the same data",
          comm.rank(), o.data_dir, found.get<std::string>(),
          root["settings"].value("data-dir", std::string("?")),
          root["data"].value(base, std::string("absent"))));
  check_same_settings(mine["settings"], root["settings"], comm.rank());
}

std::unique_ptr<Run> setup_run(const Options& o, const Settings& settings, const Replica& r) {
  auto run = std::make_unique<Run>();
  Run& s = *run;
  s.options = o;
  s.settings = settings;
  s.replica = r;
  s.model = create_model(o, settings.init);
  StageCut stages;
  const int pp = o.pipeline_parallel, tp = o.tensor_parallel;
  if (pp > 1 || tp > 1)
    s.mesh = parallel::make_mesh(*r.comm, {.dp = r.size() / (pp * tp), .pp = pp, .tp = tp});
  if (pp > 1) stages = cut_into_stages(o, *s.model);  // on the CPU, before the weights move
  if (!o.init_from.empty() && r.rank() == 0)  // the other ranks get rank 0's weights
    s.init_note = load_init_from(o, *s.model);
  s.model->to(r.device);
  load_data(s);
  const optim::SGDOptions sgd{.lr = o.lr, .momentum = o.momentum,
                              .weight_decay = o.weight_decay, .nesterov = o.nesterov};
  // Over the whole model first, whatever the layout: a checkpoint is the
  // whole model's, and so is its momentum.
  s.optimizer.emplace(s.model->parameters(), sgd);
  s.schedule.emplace(settings.schedule);
  if (!o.resume.empty() && r.rank() == 0)
    s.resumed = resume_from(o, *s.model, *s.optimizer, s.train_loader->num_batches());
  s.resumed.epochs_done = agree_on_run(o, r, s.resumed);
  parallel::DataParallelOptions dp;
  dp.algorithm = settings.allreduce;
  dp.bucket_bytes = size_t(o.bucket_mb * 1048576.0);
  dp.overlap = !o.no_overlap;
  dp.sync_batch_norm = o.sync_bn;
  dp.grad_dtype = o.grad_bf16() ? DType::BFloat16 : DType::Float32;
  if (pp > 1 || tp > 1)
    // Every rank holds the whole model: world rank 0's weights (and, resumed,
    // its momentum) everywhere; each runs and updates its part.
    parallel::broadcast_state(*r.comm, *s.model, o.resume.empty() ? nullptr : &*s.optimizer,
                              parallel::broadcast_algorithm(dp.algorithm));
  if (tp > 1) {
    try {
      s.split = parallel::split_tensor_parallel(
          *s.mesh->tp, dynamic_cast<nn::Sequential&>(*s.model),
          parallel::tensor_parallel_plan(o.model));
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("--tensor-parallel {}: {}", tp, e.what()));
    }
    // What trains is the split model: its optimizer takes this rank's parts
    // of the whole model's momentum.
    const std::vector<Tensor> parts = parallel::shard_momentum(
        *s.split, *s.model, s.optimizer->momentum_buffers(), s.mesh->tp->rank());
    s.optimizer.emplace(s.split->parameters(), sgd);
    s.optimizer->load_momentum_buffers(parts);
  }
  if (pp > 1) {
    s.pipeline = std::make_unique<parallel::Pipeline>(
        *s.mesh->pp,
        s.split ? parallel::with_modules_of(std::move(stages.layers), *s.split)
                : std::move(stages.layers),
        std::move(stages.bounds), parallel::parse_schedule(o.pipeline_schedule), r.device);
    s.replicas.emplace(s.dp(), s.pipeline->stage(), dp);
    return run;
  }
  s.replicas.emplace(s.dp(), s.net(), dp);  // rank 0's weights everywhere
  if (!o.resume.empty() && !s.mesh) s.replicas->broadcast_state(&*s.optimizer);  // and its momentum
  return run;
}

}  // namespace anvil::app
