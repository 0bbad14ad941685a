// One anvil-train run (apps/train_run.h): on one device, or as replicas of
// data-parallel training, one per GPU thread or per MPI process. Every run
// is a group of ranks (one device: a group of one) and each rank runs the
// same loop, run_replica, on its shard of every batch: set up
// (apps/train_setup.h), train and evaluate each epoch (apps/train_epoch.h),
// report (apps/train_report.h). Rank 0 prints and writes the files, and
// rank 0's settings are checked on every rank.
#include "apps/train_run.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "apps/evaluation.h"
#include "apps/train_checks.h"
#include "apps/train_epoch.h"
#include "apps/train_report.h"
#include "apps/train_profile.h"
#include "apps/train_setup.h"
#include "core/precision.h"
#include "core/profile.h"
#include "parallel/communicator.h"
#include "parallel/thread_ranks.h"

namespace anvil::app {
namespace {

int run_replica(const Options& o, const Settings& settings, const Replica& r) {
  profile::set_thread_rank(r.rank());
  std::unique_ptr<Run> run = setup_run(o, settings, r);
  Report report(*run);
  report.header();
  const int last_epoch =
      o.stop_after_epoch > 0 ? std::min(o.epochs, o.stop_after_epoch) : o.epochs;
  for (int epoch = int(run->resumed.epochs_done) + 1; epoch <= last_epoch; ++epoch) {
    report.epoch(run_epoch(*run, epoch, report.progress()));
    save_checkpoint(*run, epoch, report.history());
  }
  report.stopped(last_epoch);
  if (save_weights(*run)) report.saved(o.save);
  report.summary();
  return 0;
}

parallel::CommOptions comm_options(const Options& o) {
  parallel::CommOptions c;
  if (o.comm_timeout > 0) c.timeout = std::chrono::milliseconds(int64_t(o.comm_timeout * 1000));
  return c;
}

// One MPI process per rank: CPU ranks over MPI, or GPU ranks over NCCL on
// cuda:<local rank> when there are GPUs (and --device is not cpu).
int run_mpi_rank(const Options& o, const Settings& settings) {
  if (o.gpus > 0 || !o.devices.empty())
    throw UsageError("--distributed runs one rank per MPI process; --gpus and --devices run "
                     "them as threads of one process: choose one");
  if (!parallel::mpi_missing_reason().empty()) throw UsageError(parallel::mpi_missing_reason());
  bool gpu = false;
  if (o.device == "cuda") gpu = true;
  else if (o.device == "auto") gpu = device_count() > 0 && !devices_are_simulated() &&
                                     parallel::nccl_missing_reason().empty();
  else if (o.device != "cpu")
    throw UsageError(fmt::format("--device {} with --distributed: each rank takes the GPU of "
                                 "its local rank; give --device cuda (or cpu, or auto)",
                                 o.device));
  const parallel::CommOptions co = comm_options(o);
  // The ranks agree on their flags and data over MPI before the run's
  // communicator is made: ranks that differ in --device would otherwise
  // make different ones (NCCL and MPI) and wait on each other until the
  // deadline.
  std::unique_ptr<parallel::Communicator> world = parallel::mpi_world(co);
  try {
    agree_on_flags(o, *world);
  } catch (const std::exception& e) {
    world->abort(e.what());
    throw;
  }
  std::unique_ptr<parallel::Communicator> comm =
      gpu ? parallel::nccl_world(co) : std::move(world);
  try {
    if (comm->rank() == 0) check_files(o);
    check_ranks(o, check_layout(o, comm->size()));
  } catch (const std::exception& e) {
    comm->abort(e.what());
    throw;
  }
  Replica r;
  r.device = comm->device();
  r.comm = comm.get();
  r.data_parallel = true;
  try {
    return run_replica(o, settings, r);
  } catch (const std::exception& e) {
    // This rank leaves at once, without MPI_Finalize (which would wait for
    // the others): mpirun then ends the job instead of letting the other
    // ranks wait for this one until their deadline.
    comm->abort(e.what());
    throw;
  }
}

// One thread per GPU in this process, each with its replica; the data is
// read once and shared.
int run_gpu_threads(const Options& o, const Settings& settings) {
  const std::vector<Device> devices = replica_devices(o);
  if (!parallel::nccl_missing_reason().empty()) throw UsageError(parallel::nccl_missing_reason());
  check_files(o);
  check_ranks(o, check_layout(o, int(devices.size())));
  auto train_set = std::make_shared<const data::ImageSet>(
      data::load_mnist_split(o.data_dir, true, o.limit_train));
  auto test_set = std::make_shared<const data::ImageSet>(
      data::load_mnist_split(o.data_dir, false, o.limit_test));
  parallel::run_thread_ranks(devices, comm_options(o), "anvil-train",
                             [&](parallel::Communicator& comm) {
                               Replica r;
                               r.device = comm.device();
                               r.comm = &comm;
                               r.data_parallel = true;
                               r.train_set = train_set;
                               r.test_set = test_set;
                               run_replica(o, settings, r);
                             });
  return 0;
}

// One device: a group of one rank, with --eval-only's evaluation besides.
int run_one_device(const Options& o, const Settings& settings) {
  check_layout(o, 1);
  check_data_parallel_only(o);
  check_files(o);
  {
    // The model's own checks before the device is chosen, so that a mistyped
    // --model reports only its own error (not also the GPU probe's note).
    std::shared_ptr<nn::Module> model = create_model(o, settings.init);
    if (o.eval_only) {
      return evaluate_only(o, *model, choose_device(o.device));
    }
  }
  Replica r;
  r.device = choose_device(o.device);
  const std::unique_ptr<parallel::Communicator> group = parallel::one_rank_group(r.device);
  r.comm = group.get();
  return run_replica(o, settings, r);
}

}  // namespace

int run_training(const Options& o) {
  set_fp32_precision(parse_fp32_precision(o.fp32_precision));
  const Settings settings = parse_settings(o);
  const bool profiled = o.profile || !o.profile_trace.empty();
  profile::set_enabled(profiled);
  const int rc = o.distributed                         ? run_mpi_rank(o, settings)
                 : o.gpus > 0 || !o.devices.empty() ? run_gpu_threads(o, settings)
                                                     : run_one_device(o, settings);
  if (profiled) {
    profile::set_enabled(false);
    report_profile(o.profile, o.profile_trace, devices_are_simulated());
  }
  return rc;
}

}  // namespace anvil::app
