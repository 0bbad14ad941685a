// Pipeline-parallel training's test scenarios, written once for every
// backend (as data_parallel_scenarios.h): on a world of dp × pp ranks, each
// rank trains its stage of a pipeline (parallel/pipeline.h) and, by itself
// within its data-parallel group, a reference: the whole model with
// accumulate = M, which over a group of one is one device's step. Both start
// from the same weights (a stage whose rank builds other weights gets rank
// 0's); the pipeline must end where the reference does, bit for bit: each
// micro-batch goes through the same layers, and the gradients add up over
// the micro-batches in the same order, so no sum changes its order (over 2
// data-parallel replicas, a + b, in either bucketing). Compared: every
// epoch's loss, accuracy and examples, this rank's stage's weights and
// buffers, the evaluation through the stages, and on world rank 0 the whole
// model and momentum gathered from the stages (what a checkpoint holds).
// With tensor parallelism too (a mesh with tp > 1: each stage's layers split
// over its tp group, parallel/tensor_parallel.h) the reference is the whole
// model split the same way over the same tp group, and the pipeline must
// again end where it does, bit for bit (the split layers' sums are the same
// sums). Against one device the split layers sum in another order, which
// the tensor-parallel tests bound (test_tensor_parallel.cpp); it is not
// compared here, because the difference need not stay within a rounding
// bound over several steps: a residual block's ReLU input is a difference,
// bn + shortcut, so an input within that rounding of zero is common, and on
// one side of zero or the other it gates its element's whole gradient (seen
// on 27 images with OpenBLAS's AVX2 kernels: -7e-7 on one device, +4e-8
// split, and the first convolution's momentum 10% apart two steps later).
#pragma once
#include <fmt/format.h>

#include <map>
#include <string>
#include <vector>

#include "parallel/mesh.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "tests/parallel/data_parallel_scenarios.h"
#include "tests/parallel/split_scenarios.h"

namespace parallel_test {

struct PipelineSetup {
  std::string model = "lenet";  // as TrainSetup's
  MeshShape mesh{.dp = 1, .pp = 2};
  anvil::parallel::Schedule schedule = anvil::parallel::Schedule::kOneFOneB;
  int64_t micro_batches = 3;
  int64_t images = 27;  // batches of 10, 10 and 7
  int64_t batch = 10;
  int epochs = 1;
  bool amp = false;  // bfloat16 autocast: bfloat16 activations cross the stages
};

inline std::string describe(const PipelineSetup& s) {
  return fmt::format("{}, {}, {}, {} micro-batches, {} images in batches of {}{}", s.model,
                     s.mesh.str(), anvil::parallel::schedule_name(s.schedule), s.micro_batches,
                     s.images, s.batch, s.amp ? ", bf16 autocast" : "");
}

// The layers a test model splits for tensor parallelism.
inline anvil::parallel::TensorParallelPlan test_plan(const std::string& model) {
  if (model == "mlp") return {.linear_pairs = {{1, 3}}};
  return anvil::parallel::tensor_parallel_plan(model == "lenet" ? "lenet" : "resnet18");
}

inline std::vector<double> epoch_figures(const train::EpochStats& e) {
  return {e.loss, e.accuracy, double(e.examples)};
}

inline Outcomes pipeline_scenario(Communicator& world, const PipelineSetup& s) {
  namespace par = anvil::parallel;
  const anvil::Device device = world.device();
  par::Mesh mesh = par::make_mesh(world, s.mesh);
  const data::ImageSet set = synthetic_images(s.images, 5);
  const anvil::optim::SGDOptions sgd{.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4,
                                     .nesterov = true};
  const std::string tag = describe(s) + fmt::format(", world rank {}", world.rank());
  Outcomes out;

  // The reference: the whole model (split over this rank's tp group as the
  // stages are), data-parallel over this rank's dp group.
  const bool split = s.mesh.tp > 1;
  auto reference = make_model(s.model, 1);
  reference->to(device);
  auto& ref_whole = dynamic_cast<anvil::nn::Sequential&>(*reference);
  std::shared_ptr<anvil::nn::Sequential> ref_parts;
  if (split) ref_parts = par::split_tensor_parallel(*mesh.tp, ref_whole, test_plan(s.model));
  anvil::nn::Module& ref_net = split ? *ref_parts : *reference;  // what trains
  anvil::optim::SGD ref_opt(ref_net.parameters(), sgd);
  par::DataParallel ref_replicas(*mesh.dp, ref_net, {});
  data::DataLoader ref_loader(set, s.batch, true, false, 3);
  ref_loader.set_shard(mesh.dp->rank(), mesh.dp->size());

  // The pipeline: every rank the whole model (others than rank 0 from other
  // weights, which the broadcast replaces), cut on the CPU, then moved; with
  // tensor parallelism, the stages' layers those of its split.
  auto model = make_model(s.model, world.rank() == 0 ? 1 : 200 + uint64_t(world.rank()));
  std::vector<par::PipelineLayer> layers = par::pipeline_layers(*model, {1, 28, 28}, s.amp);
  std::vector<int64_t> costs;
  std::vector<std::string> names;
  for (const par::PipelineLayer& l : layers) {
    costs.push_back(l.flops);
    names.push_back(l.name);
  }
  model->to(device);
  par::broadcast_state(world, *model, nullptr);
  auto& whole = dynamic_cast<anvil::nn::Sequential&>(*model);
  const std::vector<bool> starts =
      split ? par::stage_starts(names, whole, test_plan(s.model)) : std::vector<bool>{};
  std::shared_ptr<anvil::nn::Sequential> parts;
  if (split) parts = par::split_tensor_parallel(*mesh.tp, whole, test_plan(s.model));
  anvil::optim::SGD opt(split ? parts->parameters() : model->parameters(), sgd);
  par::Pipeline pipeline(*mesh.pp, split ? par::with_modules_of(layers, *parts) : layers,
                         par::balance_stages(costs, s.mesh.pp, starts), s.schedule, device);
  par::DataParallel replicas(*mesh.dp, pipeline.stage(), {});
  data::DataLoader loader(set, s.batch, true, false, 3);
  loader.set_shard(mesh.dp->rank(), mesh.dp->size());
  anvil::nn::Module& net = split ? *parts : *model;  // what trains (and what eval() switches)
  auto values = [&](const Tensor& t) { return bytes_of(world, t); };

  for (int e = 0; e < s.epochs; ++e) {
    train::EpochOptions ref_o, o;
    ref_o.replicas = &ref_replicas;
    ref_o.accumulate = s.micro_batches;
    ref_o.amp = o.amp = s.amp;
    o.replicas = &replicas;
    o.stages = &pipeline;
    o.accumulate = s.micro_batches;
    const train::EpochStats want = train::train_epoch(ref_net, ref_opt, ref_loader, device, ref_o);
    const train::EpochStats got = train::train_epoch(net, opt, loader, device, o);
    out.push_back({fmt::format("epoch {} loss, accuracy, examples, {}", e, tag),
                   epoch_figures(got), epoch_figures(want), 0});
  }
  // Evaluation through the stages, each replica its shard.
  data::DataLoader ref_eval(set, 8, false, false, 0), eval(set, 8, false, false, 0);
  ref_eval.set_shard(mesh.dp->rank(), mesh.dp->size());
  eval.set_shard(mesh.dp->rank(), mesh.dp->size());
  out.push_back({"evaluation, " + tag,
                 epoch_figures(train::evaluate(net, eval, device, &replicas, s.amp, &pipeline)),
                 epoch_figures(train::evaluate(ref_net, ref_eval, device, &ref_replicas, s.amp)),
                 0});
  // The split layers' parts into every rank's whole models (and momentum).
  std::vector<Tensor> momentum = opt.momentum_buffers(), ref_m = ref_opt.momentum_buffers();
  if (split) {
    par::gather_tensor_parallel(*mesh.tp, *parts, whole);
    momentum = par::gather_momentum(*mesh.tp, *parts, momentum, whole);
    par::gather_tensor_parallel(*mesh.tp, *ref_parts, ref_whole);
    ref_m = par::gather_momentum(*mesh.tp, *ref_parts, ref_m, ref_whole);
  }
  // This rank's stage against the same tensors of the reference.
  std::map<std::string, Tensor> ref_state;
  for (auto& [name, t] : reference->state_dict()) ref_state[name] = t;
  const size_t stage = size_t(pipeline.stage_index());
  const par::Stage own(par::with_modules_of(layers, whole), pipeline.bounds()[stage],
                       pipeline.bounds()[stage + 1]);
  for (auto& [name, t] : own.state_dict())
    out.push_back({fmt::format("stage {}'s '{}', {}", stage, name, tag), values(t),
                   values(ref_state.at(name)), 0});
  // The whole model and momentum on world rank 0, from the first pipeline's stages.
  if (mesh.coords.dp == 0 && mesh.coords.tp == 0) pipeline.gather_to_first(*model, &momentum);
  if (world.rank() == 0) {
    const auto gathered = model->state_dict(), want = reference->state_dict();
    for (size_t i = 0; i < gathered.size(); ++i)
      out.push_back({fmt::format("gathered '{}', {}", gathered[i].first, tag),
                     values(gathered[i].second), values(want[i].second), 0});
    for (size_t i = 0; i < momentum.size(); ++i) {
      const bool both = momentum[i].defined() && ref_m[i].defined();
      out.push_back({fmt::format("gathered momentum {}, {}", i, tag),
                     both ? values(momentum[i]) : std::vector<double>{double(momentum[i].defined())},
                     both ? values(ref_m[i]) : std::vector<double>{double(ref_m[i].defined())},
                     0});
    }
  }
  return out;
}

// The setups a world of `ranks` runs: both schedules, micro-batch counts
// below, at and above the stage count, and some micro-batches empty (a last
// batch of 1 cut into 3), on LeNet and a narrow ResNet-18 (BatchNorm sees
// each micro-batch), cut into as many stages as the world allows, and LeNet
// under bfloat16 autocast; over 4 ranks also 2 replicas of a 2-stage
// pipeline, and 2 stages split over 2 ranks each (pp 2 × tp 2; LeNet under
// autocast too).
inline std::vector<PipelineSetup> pipeline_setups(int ranks, bool small) {
  using anvil::parallel::Schedule;
  std::vector<PipelineSetup> out;
  auto add = [&](std::string model, MeshShape mesh, Schedule schedule, int64_t m,
                 int64_t images = 27) {
    PipelineSetup s;
    s.model = std::move(model);
    s.mesh = mesh;
    s.schedule = schedule;
    s.micro_batches = m;
    s.images = images;
    out.push_back(s);
  };
  if (small) {  // ThreadSanitizer: the threads' exchanges, one batch
    add("mlp", {.dp = 1, .pp = 2}, Schedule::kOneFOneB, 3, 10);
    add("mlp", {.dp = 1, .pp = 2}, Schedule::kGPipe, 2, 10);
    return out;
  }
  const MeshShape pipe{.dp = 1, .pp = ranks};
  add("lenet", pipe, Schedule::kOneFOneB, 4);
  add("lenet", pipe, Schedule::kGPipe, 4);
  add("lenet", pipe, Schedule::kOneFOneB, 1);
  add("mlp", pipe, Schedule::kOneFOneB, 3, 21);  // the last batch, of 1: two empty micro-batches
  add("resnet18-narrow", pipe, Schedule::kOneFOneB, 3);
  add("resnet18-narrow", pipe, Schedule::kGPipe, 2);
  add("lenet", pipe, Schedule::kOneFOneB, 2);
  out.back().amp = true;
  if (ranks == 4) {
    add("lenet", {.dp = 2, .pp = 2}, Schedule::kOneFOneB, 3);
    add("resnet18-narrow", {.dp = 2, .pp = 2}, Schedule::kGPipe, 2);
    // 2 stages, each split over 2 ranks.
    add("lenet", {.dp = 1, .pp = 2, .tp = 2}, Schedule::kOneFOneB, 3);
    add("resnet18-narrow", {.dp = 1, .pp = 2, .tp = 2}, Schedule::kGPipe, 2);
    add("lenet", {.dp = 1, .pp = 2, .tp = 2}, Schedule::kOneFOneB, 2, 10);  // one step
    out.back().amp = true;
  }
  return out;
}

}  // namespace parallel_test
