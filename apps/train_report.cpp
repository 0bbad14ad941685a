#include "apps/train_report.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/precision.h"
#include "kernels/cpu/cpu_kernels.h"

namespace anvil::app {
namespace {

// The running figures of a progress line. A pipeline's last stage alone has
// them, and rank 0 is its first: there, the batches done alone.
std::string running_figures(const train::EpochProgress& p, bool have_loss) {
  if (!have_loss) return "(running figures on the last stage)";
  const train::EpochStats s = p.stats();
  return fmt::format("loss {:.4f} acc {:.3f} {:.0f} img/s", s.loss, s.accuracy,
                     s.images_per_second());
}

// Progress on a terminal: a bar redrawn in place, at most five times a
// second (reading the running figures waits for the device, see
// train::EpochProgress), and always for the last batch.
train::Progress bar_progress(bool have_loss) {
  auto last = std::make_shared<std::chrono::steady_clock::time_point>();
  return [last, have_loss](const train::EpochProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.done != p.total && now - *last < std::chrono::milliseconds(200)) return;
    *last = now;
    constexpr int kWidth = 30;
    int filled = int(kWidth * p.done / std::max<int64_t>(p.total, 1));
    std::string bar(size_t(filled), '#');
    bar.resize(kWidth, '.');
    std::cout << fmt::format("\r  [{}] {}/{} {}", bar, p.done, p.total,
                             running_figures(p, have_loss))
              << std::flush;
  };
}

// Progress for a log file (stdout not a terminal): no bar redrawn in place,
// one plain line a minute at most, so a ResNet epoch of a quarter of an
// hour on a CPU shows it is alive while a LeNet epoch prints nothing extra.
train::Progress log_progress(bool have_loss) {
  auto last = std::make_shared<std::chrono::steady_clock::time_point>(
      std::chrono::steady_clock::now());
  return [last, have_loss](const train::EpochProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.done == p.total || now - *last < std::chrono::seconds(60)) return;
    *last = now;
    std::cout << fmt::format("  batch {}/{}: {}\n", p.done, p.total,
                             running_figures(p, have_loss))
              << std::flush;
  };
}

// GPipe's bubble: the fraction of a step each of N balanced stages idles
// with M micro-batches, (N - 1) / (M + N - 1).
double gpipe_bubble(int stages, int64_t micro_batches) {
  return double(stages - 1) / double(micro_batches + stages - 1);
}

std::string schedule_summary(const optim::ScheduleOptions& s) {
  std::string text = optim::schedule_shape_name(s.shape);
  if (s.shape == optim::ScheduleShape::Step)
    text += fmt::format(" (x{} every {} epochs)", s.gamma, s.step_epochs);
  if (s.shape == optim::ScheduleShape::Cosine) text += fmt::format(" (to {})", s.min_lr);
  if (s.warmup_epochs)
    text += fmt::format(", {} warmup epoch(s) from {}x", s.warmup_epochs, s.warmup_start_factor);
  return text;
}

// Where a replica prints: rank 0 to stdout, the others nowhere.
std::ostream& output_of(const Replica& r) {
  static std::ostream nowhere(nullptr);
  return r.rank() == 0 ? std::cout : nowhere;
}

// The devices, for the header: one device, or the ranks and how they talk.
std::string where(const Options& o, const Replica& r) {
  if (!r.data_parallel) return r.device.str();
  return fmt::format("{} {} ranks ({}{}, {} all-reduce{})", r.size(),
                     r.device.is_cuda() ? "GPU" : "CPU", r.comm->backend(),
                     r.device.is_cuda() ? "" : ", one process each", o.allreduce,
                     o.no_overlap ? ", no overlap" : "");
}

}  // namespace

Report::Report(const Run& run)
    : run_(run), out_(output_of(run.replica)), history_(run.resumed.history) {
  const Options& o = run.options;
  tty_ = run.replica.rank() == 0 && isatty(STDOUT_FILENO);
  if (o.metrics.empty() || run.replica.rank() != 0) return;
  metrics_.open(o.metrics, std::ios::trunc);
  if (!metrics_) throw UsageError(fmt::format("--metrics {}: cannot open for writing", o.metrics));
  for (auto& line : history_) metrics_ << line.dump() << '\n';
  metrics_ << std::flush;
}

void Report::header() {
  const Options& o = run_.options;
  out_ << fmt::format("training {} ({} parameters) on {}: {} train / {} test images, "
                      "batch {}, lr {}, {} epochs\n",
                      o.model, run_.model->num_parameters(), where(o, run_.replica),
                      run_.train_set->count, run_.test_set->count, o.batch_size, o.lr, o.epochs);
  out_ << fmt::format(
      "  recipe {}: init {}, SGD momentum {}{}, weight decay {}, schedule {}, transforms {}{}\n",
      o.recipe, o.init, o.momentum, o.nesterov ? " (nesterov)" : "", o.weight_decay,
      schedule_summary(run_.settings.schedule), run_.transforms.summary,
      o.label_smoothing > 0 ? fmt::format(", label smoothing {}", o.label_smoothing) : "");
  out_ << fmt::format("  float32 math (--fp32-precision {}): {}\n", o.fp32_precision,
                      describe_fp32_math(run_.replica.device.type));
  if (o.amp_bf16())
    out_ << fmt::format("  amp bf16: conv and linear in BF16 ({}), activations bfloat16; "
                        "loss, BatchNorm statistics, master weights, gradients and momentum "
                        "float32\n",
                        run_.replica.device.is_cuda() ? "tensor cores" : cpu::bf16_math_word());
  if (run_.replica.data_parallel)
    out_ << fmt::format("  gradients all-reduced in {} (--grad-dtype {}){}\n",
                        o.grad_bf16() ? "bfloat16" : "float32", o.grad_dtype,
                        o.grad_bf16() ? ": half the bytes; rounded to bfloat16, summed in "
                                        "float32 arithmetic, widened back into float32"
                                      : "");
  if (run_.replica.device.is_cuda()) {
    const std::string why =
        o.profile ? "the profiler (--profile) times every launch with events of its own"
                  : train::graphs_unavailable(run_.replica.device, &*run_.replicas,
                                              run_.pipeline.get());
    out_ << (!o.cuda_graphs ? std::string("  CUDA graphs off (--no-cuda-graphs): every step launches its kernels\n")
             : why.empty() ? std::string("  CUDA graphs (--cuda-graphs): each steady step is one graph launch\n")
                           : fmt::format("  CUDA graphs not used: {}\n", why));
  }
  if (o.accumulate > 1)
    out_ << fmt::format("  gradient accumulation: each step's batch{} as {} micro-batches, "
                        "reduced once per step\n",
                        run_.replica.data_parallel ? " (each rank's share)" : "", o.accumulate);
  if (run_.pipeline) {
    const parallel::Pipeline& p = *run_.pipeline;
    out_ << fmt::format(
        "  pipeline parallel: {} stages, {} schedule, {} micro-batches per step{} (mesh {}); "
        "GPipe's bubble (N-1)/(M+N-1) = {:.1f}%; stages cut by forward FLOPs per image (conv "
        "and linear: 2 per multiply-add; other layers: 1 per output element):\n",
        p.stages(), o.pipeline_schedule, o.micro_batches,
        run_.mesh->shape.dp > 1 ? " (each replica's share)" : "", run_.mesh->shape.str(),
        100.0 * gpipe_bubble(p.stages(), o.micro_batches));
    for (const std::string& line : parallel::describe_stages(p.layers(), p.bounds()))
      out_ << "    " << line << '\n';
  }
  if (run_.split)
    out_ << fmt::format(
        "  tensor parallel over {} ranks (mesh {}): {}\n", o.tensor_parallel,
        run_.mesh->shape.str(), parallel::describe_plan(parallel::tensor_parallel_plan(o.model)));
  if (o.bn_recalibrate > 0)
    out_ << fmt::format("  BatchNorm statistics re-estimated over {} training batches before "
                        "each evaluation\n",
                        o.bn_recalibrate);
  out_ << run_.init_note;
  if (!o.resume.empty())
    out_ << fmt::format("resumed from {} after epoch {}/{}\n", o.resume,
                        run_.resumed.epochs_done, o.epochs);
  out_ << std::flush;
}

train::Progress Report::progress() const {
  if (run_.replica.rank() != 0) return {};
  const bool have_loss = !run_.pipeline;  // rank 0 is a pipeline's first stage
  return tty_ ? bar_progress(have_loss) : log_progress(have_loss);
}

nlohmann::ordered_json Report::metrics_record(const EpochResult& e) const {
  const Options& o = run_.options;
  nlohmann::ordered_json line = {{"epoch", e.epoch},
                                 {"train_loss", e.train.loss},
                                 {"train_acc", e.train.accuracy},
                                 {"test_loss", e.test.loss},
                                 {"test_acc", e.test.accuracy},
                                 {"epoch_seconds", e.train.seconds},
                                 {"images_per_second", e.train.images_per_second()},
                                 {"device", run_.replica.device.str()},
                                 {"model", o.model},
                                 {"recipe", o.recipe},
                                 {"fp32_math", describe_fp32_math(run_.replica.device.type)},
                                 {"batch_size", o.batch_size},
                                 {"accumulate", o.accumulate},
                                 {"amp", o.amp},
                                 {"lr", o.lr},
                                 {"last_lr", e.train.last_lr}};
  if (run_.replica.data_parallel) {
    line["ranks"] = run_.replica.size();
    line["allreduce"] = o.allreduce;
    line["sync_bn"] = o.sync_bn;
    line["grad_dtype"] = o.grad_dtype;
  }
  if (run_.split) line["tensor_parallel"] = o.tensor_parallel;
  if (run_.pipeline) {
    line["pipeline_parallel"] = o.pipeline_parallel;
    line["micro_batches"] = o.micro_batches;
    line["pipeline_schedule"] = o.pipeline_schedule;
  }
  if (e.test_running_stats) {
    line["bn_recalibrate"] = o.bn_recalibrate;
    line["test_loss_running_stats"] = e.test_running_stats->loss;
    line["test_acc_running_stats"] = e.test_running_stats->accuracy;
  }
  return line;
}

void Report::epoch(const EpochResult& e) {
  if (tty_) out_ << "\r\033[K";  // the progress bar
  out_ << fmt::format(
              "epoch {:>3}/{}: train loss {:.4f}, train acc {:.4f}, test acc {:.4f}{}, {:.2f} s, "
              "{:.0f} img/s, lr {:.4g}\n",
              e.epoch, run_.options.epochs, e.train.loss, e.train.accuracy, e.test.accuracy,
              e.test_running_stats ? fmt::format(" (running statistics: {:.4f})",
                                                 e.test_running_stats->accuracy)
                                   : std::string(),
              e.train.seconds, e.train.images_per_second(), e.train.last_lr)
       << std::flush;
  const nlohmann::ordered_json line = metrics_record(e);
  if (metrics_) metrics_ << line.dump() << '\n' << std::flush;
  history_.push_back(line);
  total_seconds_ += e.train.seconds;
  ++epochs_run_;
  last_test_ = e.test;
}

void Report::stopped(int last_epoch) {
  const Options& o = run_.options;
  const int64_t done_before = run_.resumed.epochs_done;
  if (!o.checkpoint.empty() && epochs_run_ > 0)
    out_ << "checkpoint " << o.checkpoint << " holds epoch " << done_before + epochs_run_ << '\n';
  if (done_before > 0 && done_before >= last_epoch)
    out_ << fmt::format("nothing to train: {} already holds epoch {} of {}\n", o.resume,
                        done_before, o.epochs);
  else if (last_epoch < o.epochs)
    out_ << fmt::format("stopped after epoch {} of {} (--stop-after-epoch){}\n", last_epoch,
                        o.epochs,
                        o.checkpoint.empty() ? "" : "; continue with --resume " + o.checkpoint);
}

void Report::saved(const std::string& path) { out_ << "saved " << path << '\n'; }

void Report::pipeline_summary() {
  const parallel::Pipeline& p = *run_.pipeline;
  const parallel::PipelineStats& st = p.stats();
  parallel::Communicator& world = *run_.replica.comm;
  const std::vector<int64_t> mine = {st.steps,
                                     int64_t(st.step_seconds * 1e6),
                                     int64_t(st.compute_seconds * 1e6),
                                     st.bytes_sent,
                                     st.peak_in_flight,
                                     st.peak_step_bytes};
  const int64_t k = int64_t(mine.size());
  const Tensor all = world.all_gather(Tensor::from_vector(mine, {1, k}, world.device()));
  world.synchronize();
  const std::vector<int64_t> v = all.to_int_vector();
  out_ << fmt::format("pipeline ({} schedule, {} stages, {} micro-batches; GPipe's bubble "
                      "{:.1f}%), over the steps after the first:\n",
                      run_.options.pipeline_schedule, p.stages(), run_.options.micro_batches,
                      100.0 * gpipe_bubble(p.stages(), run_.options.micro_batches));
  for (int rank = 0; rank < world.size(); ++rank) {
    const int64_t* r = v.data() + rank * k;
    const parallel::MeshCoords c = parallel::mesh_coords(run_.mesh->shape, rank);
    const int64_t steps = r[0];
    if (steps == 0) {
      out_ << fmt::format("  rank {} (stage {}, replica {}): no step after the first\n", rank,
                          c.pp, c.dp);
      continue;
    }
    const double step = double(r[1]) / 1e6, compute = double(r[2]) / 1e6;
    out_ << fmt::format(
        "  rank {} (stage {}, replica {}): idle {:.1f}% of {:.3f} s in {} steps ({:.1f} ms a "
        "step), sent {:.3f} MB a step, at most {} micro-batches' activations held, step peak "
        "+{:.2f} MiB allocated\n",
        rank, c.pp, c.dp, step > 0 ? 100.0 * (step - compute) / step : 0.0, step, steps,
        1e3 * step / double(steps), double(r[3]) / double(steps) / 1e6, r[4],
        double(r[5]) / 1048576.0);
  }
}

void Report::summary() {
  if (run_.pipeline) pipeline_summary();
  const Replica& r = run_.replica;
  if (epochs_run_ > 0)
    out_ << fmt::format("test acc: {:.2f}, {:.1f} sec/epoch on [{}]\n", last_test_.accuracy,
                        total_seconds_ / epochs_run_,
                        r.data_parallel
                            ? fmt::format("{} x {}", r.size(), r.device.is_cuda() ? "GPU" : "cpu")
                            : r.device.str());
  out_ << std::flush;
}

}  // namespace anvil::app
