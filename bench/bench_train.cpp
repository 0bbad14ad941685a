// bench_train: times training on Fashion-MNIST in the manner of
// `caffe time`, and compares it with PyTorch in the same run.
//
//   bench_train                        # LeNet: 5 warm-up + 3 x 60 timed batches of 256, 2 threads
//   bench_train --model resnet18       # ResNet-18 (28x28): 2 warm-up + 5 timed batches
//   bench_train --model resnet18-96    # ResNet-18 on inputs resized to 96x96
//   bench_train --repeats 3            # three timed windows each, median and best
//   bench_train --no-torch --threads 1
//
// What it does:
//  1. Loads only the training images it needs and holds them in memory as one
//     float tensor (pixel / 255, as the DataLoader does; resized once up front
//     for resnet18-96); every step takes a zero-copy narrow() of it, so only
//     the training step is timed: zero_grad, train::forward_backward (forward,
//     cross-entropy, backward: train::train_epoch's step), SGD step and
//     loss.item() (train_epoch instead adds the loss and the correct
//     predictions to running totals; on the CPU the two cost the same).
//  2. Reports anvil's images/s (and the seconds an epoch of 60,000 images
//     would take) over --batches batches after --warmup batches (or over
//     --epochs whole epochs), per repeat. The model is models::create(--model)
//     with the seeds' init; the optimizer is SGD (--lr, --momentum).
//  3. Per-layer breakdown over --breakdown-iters further batches, one row per
//     top-level child of the model (LeNet: each layer; ResNet: the stem's
//     conv, bn and relu, resnet_block1..4, global_avg_pool, fc): each child's
//     forward is timed by calling the children one by one; each child's
//     backward by wrapping the backward functions of the autograd nodes that
//     child recorded. The same node timings are also summed per op kind
//     (conv, batch_norm, relu, add, ...). What backward() spends outside any
//     node (leaf-gradient copies and sums, graph bookkeeping) is shown apart,
//     as are zero_grad and the optimizer step.
//  4. Unless --no-torch (or torch cannot be imported by --python), starts
//     bench/train_torch.py --serve with the same settings and alternates
//     timed windows with it, anvil's and PyTorch's in ABBA order (on a busy
//     machine the load changes within seconds: only windows taken close
//     together compare fairly). Prints PyTorch's figures beside anvil's and
//     the ratio anvil / pytorch: the median over the paired windows.
//
// Defaults depend on the model (an explicit flag wins): the batch and lr are
// the seed recipe's (apps/recipes.json: LeNet 256 and 0.2, the ResNets 256
// and 0.1); LeNet runs 5 warm-up + 3 windows of 60 timed batches and a
// 10-iteration breakdown; the ResNets, whose step takes seconds at batch 256
// on two cores, 2 warm-up + 1 window of 5 timed batches and a 2-iteration
// breakdown. On a busy machine use --repeats 3 or more.
//
// Threads: --threads is applied with omp_set_num_threads before any kernel
// runs. anvil's own loops use OpenMP, and the OpenBLAS it links (the Debian
// openblas-openmp build) sizes its thread team from the OpenMP setting too, so
// one flag governs both. PyTorch gets the same number via torch.set_num_threads.
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/train_recipes.h"
#include "core/autocast.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/precision.h"
#include "core/random.h"
#include "data/idx.h"
#include "data/transforms.h"
#include "kernels/cpu/cpu_kernels.h"
#include "nn/models.h"
#include "nn/optim.h"
#include "nn/train.h"
#include "bench/train/breakdown.h"

using namespace anvil;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using bench::breakdown;
using bench::Breakdown;
using bench::LayerTimes;

namespace {

constexpr int64_t kEpochImages = 60000;  // Fashion-MNIST's training set

// -1 in batches, warmup, repeats, breakdown_iters, batch_size and lr means
// "the model's default" (resolve_defaults).
struct Options {
  std::string model = "lenet";
  int batches = -1;
  int warmup = -1;
  int epochs = 0;
  int repeats = -1;
  int64_t batch_size = -1;
  int threads = 2;
  int breakdown_iters = -1;
  double lr = -1;
  double momentum = 0;
  uint64_t seed = 0;
  bool no_torch = false;
  std::string fp32_precision = "default";  // core/precision.h: anvil's side only
  std::string amp = "off";                 // core/autocast.h: anvil's side only
  std::string python = "/usr/bin/python3";
  std::string script;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
};

bool is_resnet(const std::string& model) { return model.starts_with("resnet18"); }

void resolve_defaults(Options& o) {
  const bool big = is_resnet(o.model);
  if (o.batches < 0) o.batches = big ? 5 : 60;
  if (o.warmup < 0) o.warmup = big ? 2 : 5;
  if (o.repeats < 0) o.repeats = big ? 1 : 3;
  if (o.breakdown_iters < 0) o.breakdown_iters = big ? 2 : 10;
  app::Options seed;  // the seed recipe's batch and rate for the model
  seed.model = o.model;
  seed = app::apply_recipe(seed);
  if (o.batch_size < 0) o.batch_size = seed.batch_size;
  if (o.lr < 0) o.lr = seed.lr;
}

// Input side length the model is trained at.
int64_t input_size(const std::string& model) { return model == "resnet18-96" ? 96 : 28; }

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  if (!(f >> a >> b >> c)) return "?";
  return fmt::format("{} {} {}", a, b, c);
}

// The script next to this source file: the compile definition when CMake
// provides it, else relative to the executable (build/<preset>/bench_train).
std::string default_script() {
  namespace fs = std::filesystem;
#ifdef ANVIL_SOURCE_DIR
  fs::path p = fs::path(ANVIL_SOURCE_DIR) / "bench" / "train_torch.py";
  if (fs::exists(p)) return p.string();
#endif
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.parent_path();
         dir = dir.parent_path()) {
      fs::path p = dir / "bench" / "train_torch.py";
      if (fs::exists(p)) return p.string();
    }
  }
  return "bench/train_torch.py";
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

// [start, end) of the batches of one epoch over count examples, file order.
std::vector<std::pair<int64_t, int64_t>> batch_slices(int64_t count, int64_t batch_size,
                                                      bool drop_last) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t s = 0; s < count; s += batch_size) {
    int64_t e = std::min(s + batch_size, count);
    if (drop_last && e - s < batch_size) break;
    out.emplace_back(s, e);
  }
  return out;
}

struct Dataset {
  Tensor images;  // [count, 1, size, size] float in [0, 1]
  Tensor labels;  // [count] int64
  int64_t count = 0;
};

// pixel / 255, bilinearly resized to size x size when that differs from the
// files' 28x28 (done once here, so resizing is not part of the timed step).
Dataset load_train(const std::string& dir, int64_t limit, int64_t size) {
  data::ImageSet set = data::load_mnist_split(dir, true, limit);
  Dataset d;
  d.count = set.count;
  const int64_t plane = set.rows * set.cols;
  std::vector<float> pixels(set.pixels.size());
  for (size_t i = 0; i < set.pixels.size(); ++i) pixels[i] = float(set.pixels[i]) / 255.0f;
  d.images = Tensor::empty({set.count, 1, size, size});
  float* p = d.images.data<float>();
  if (size == set.rows && size == set.cols) {
    std::copy(pixels.begin(), pixels.end(), p);
  } else {
    data::BilinearResize resize(set.rows, set.cols, size, size);
    for (int64_t i = 0; i < set.count; ++i)
      resize.apply(pixels.data() + i * plane, 1, p + i * size * size);
  }
  d.labels = Tensor::from_vector(set.labels, {set.count});
  return d;
}

// The trainer's step (train::forward_backward) with the SGD step around it;
// amp: under bfloat16 autocast, as anvil-train --amp bf16 runs it.
double train_step(nn::Module& model, optim::SGD& opt, const Tensor& x, const Tensor& y,
                  bool amp) {
  opt.zero_grad();
  AutocastGuard autocast(x.device().type, amp, DType::BFloat16, &opt.cast_cache());
  const train::StepResult s = train::forward_backward(model, x, y);
  opt.step();
  return s.loss.item();
}

// ---------------------------------------------------------------- pytorch

bool torch_available(const std::string& python) {
  std::string cmd = shell_quote(python) + " -c 'import torch' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// PyTorch in a child process: train_torch.py --serve, driven one command
// at a time over its stdin and stdout, so that its timed windows can
// alternate with anvil's (on a busy machine the load changes within
// seconds, and only windows taken close together compare fairly).
class TorchPeer {
 public:
  // Starts the script and waits for its ready line (it loads the data,
  // builds the model and runs its warm-up first). Null, with error set, on
  // failure.
  static std::unique_ptr<TorchPeer> start(const Options& o, std::string& error) {
    std::string cmd = fmt::format(
        "exec {} {} --serve --model {} --threads {} --batch-size {} --warmup {} --batches {} "
        "--epochs {} --repeats {} --lr {} --momentum {} --seed {} --breakdown {} --data-dir {}",
        shell_quote(o.python), shell_quote(o.script), o.model, o.threads, o.batch_size, o.warmup,
        o.batches, o.epochs, o.repeats, o.lr, o.momentum, o.seed, o.breakdown_iters,
        shell_quote(o.data_dir));
    std::cout << "starting: " << cmd << "\n" << std::flush;
    int in[2], out[2];  // [0] read end, [1] write end
    if (pipe(in) != 0) {
      error = "pipe failed";
      return nullptr;
    }
    if (pipe(out) != 0) {
      close(in[0]);
      close(in[1]);
      error = "pipe failed";
      return nullptr;
    }
    const pid_t pid = fork();
    if (pid < 0) {
      for (int fd : {in[0], in[1], out[0], out[1]}) close(fd);
      error = "fork failed";
      return nullptr;
    }
    if (pid == 0) {  // child: only async-signal-safe calls until exec
      dup2(in[0], STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      for (int fd : {in[0], in[1], out[0], out[1]}) close(fd);
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    auto peer = std::unique_ptr<TorchPeer>(new TorchPeer(pid, fdopen(in[1], "w"), fdopen(out[0], "r")));
    std::optional<json> ready = peer->read_json(error);
    if (!ready) return nullptr;
    peer->info = *ready;
    return peer;
  }

  // Sends one command and returns its JSON answer (nullopt, error set, if
  // the script failed).
  std::optional<json> request(const std::string& command, std::string& error) {
    if (std::fprintf(to_, "%s\n", command.c_str()) < 0 || std::fflush(to_) != 0) {
      error = "cannot write to the script (it has exited)";
      return std::nullopt;
    }
    std::optional<json> answer = read_json(error);
    if (answer && answer->contains("error")) {
      error = (*answer)["error"].get<std::string>();
      return std::nullopt;
    }
    return answer;
  }

  ~TorchPeer() {
    std::fprintf(to_, "quit\n");
    std::fclose(to_);
    std::fclose(from_);
    int status = 0;
    waitpid(pid_, &status, 0);
  }

  json info;  // the ready line: torch version, threads, blas

 private:
  TorchPeer(pid_t pid, FILE* to, FILE* from) : pid_(pid), to_(to), from_(from) {}

  // The next line that is a JSON object; other output is passed through.
  std::optional<json> read_json(std::string& error) {
    char* buf = nullptr;
    size_t cap = 0;
    std::optional<json> result;
    while (getline(&buf, &cap, from_) >= 0) {
      std::string line(buf);
      if (line.empty() || line.front() != '{') {
        std::cout << "pytorch: " << line << std::flush;
        continue;
      }
      try {
        result = json::parse(line);
      } catch (const std::exception& e) {
        error = fmt::format("cannot parse its JSON: {}", e.what());
      }
      break;
    }
    std::free(buf);
    if (!result && error.empty()) error = "the script exited without answering";
    return result;
  }

  pid_t pid_;
  FILE* to_;
  FILE* from_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

int run(Options& o) {
  resolve_defaults(o);
  std::signal(SIGPIPE, SIG_IGN);  // a PyTorch child that dies must not take the bench with it
  omp_set_num_threads(o.threads);
  set_fp32_precision(parse_fp32_precision(o.fp32_precision));
  if (o.script.empty()) o.script = default_script();
  const int64_t size = input_size(o.model);
  std::cout << fmt::format("bench_train: {} (seed init, {}x{} inputs), SGD lr {} momentum {}, "
                           "batch {}, {} thread(s), load average {}\n",
                           o.model, size, size, o.lr, o.momentum, o.batch_size, o.threads,
                           load_average());
  std::cout << fmt::format("anvil's float32 math (--fp32-precision {}): {}{}\n", o.fp32_precision,
                           describe_fp32_math(DeviceType::CPU),
                           o.amp == "bf16" ? fmt::format("; amp bf16 (conv and linear in BF16, {})",
                                                         cpu::bf16_math_word())
                                           : "");

  // Only the images the run needs (all of them for --epochs).
  const int64_t need =
      o.epochs > 0 ? 0
                   : (int64_t(o.warmup) + int64_t(o.batches) * o.repeats +
                      (o.breakdown_iters > 0 ? 1 : 0)) *
                         o.batch_size;
  auto t_load = Clock::now();
  Dataset d = load_train(o.data_dir, need, size);
  std::cout << fmt::format("loaded {} training images from {} in {:.2f} s\n", d.count, o.data_dir,
                           seconds_since(t_load));
  auto full = batch_slices(d.count, o.batch_size, true);
  if (full.empty())
    throw std::runtime_error(fmt::format("only {} images, fewer than one batch of {}", d.count,
                                         o.batch_size));

  manual_seed(o.seed);
  auto model = models::create(o.model, models::Init::Seed);
  auto net = std::dynamic_pointer_cast<nn::Sequential>(model);
  if (!net) throw std::runtime_error(o.model + " is not a Sequential; the breakdown needs one");
  net->train();
  optim::SGD opt(net->parameters(), {.lr = o.lr, .momentum = o.momentum});

  // PyTorch starts first (its warm-up then runs alone, as anvil's does).
  std::unique_ptr<TorchPeer> torch;
  if (o.no_torch) {
    std::cout << "pytorch: skipped (--no-torch)\n";
  } else if (!torch_available(o.python)) {
    std::cout << fmt::format("pytorch: skipped ({} cannot import torch)\n", o.python);
  } else {
    std::string error;
    torch = TorchPeer::start(o, error);
    if (!torch) std::cout << "pytorch: failed: " << error << "\n";
  }
  const json torch_info = torch ? torch->info : json::object();
  auto torch_failed = [&](const std::string& error) {
    std::cout << "pytorch: failed: " << error << "\n";
    torch.reset();
  };

  size_t k = 0;  // next batch, cycling through the full batches in file order
  auto batch = [&](std::pair<int64_t, int64_t> r) {
    return std::pair{d.images.narrow(r.first, r.second - r.first),
                     d.labels.narrow(r.first, r.second - r.first)};
  };
  for (int i = 0; i < o.warmup; ++i) {
    auto [x, y] = batch(full[k++ % full.size()]);
    train_step(*net, opt, x, y, o.amp == "bf16");
  }

  // Timed windows, anvil's and PyTorch's in alternating order (ABBA...), so
  // that a load that drifts over the run favours neither.
  std::vector<double> rates, torch_rates, pair_ratios;
  int64_t timed_batches = 0;
  auto anvil_window = [&](int r) {
    std::vector<std::pair<int64_t, int64_t>> plan;
    if (o.epochs > 0) {
      auto epoch = batch_slices(d.count, o.batch_size, false);
      for (int e = 0; e < o.epochs; ++e) plan.insert(plan.end(), epoch.begin(), epoch.end());
    } else {
      for (int i = 0; i < o.batches; ++i) plan.push_back(full[k++ % full.size()]);
    }
    int64_t images = 0;
    double loss = 0;
    timed_batches = int64_t(plan.size());
    auto t0 = Clock::now();
    for (auto range : plan) {
      auto [x, y] = batch(range);
      loss = train_step(*net, opt, x, y, o.amp == "bf16");
      images += x.size(0);
    }
    double s = seconds_since(t0);
    rates.push_back(double(images) / s);
    std::cout << fmt::format("anvil   window {}: {} batches, {} images in {:.3f} s: {:.1f} img/s "
                             "(loss {:.4f}, load {})\n",
                             r + 1, timed_batches, images, s, rates.back(), loss, load_average())
              << std::flush;
  };
  auto torch_window = [&](int r) {
    if (!torch) return;
    std::string error;
    std::optional<json> w = torch->request("window", error);
    if (!w) return torch_failed(error);
    torch_rates.push_back((*w)["images_per_second"].get<double>());
    std::cout << fmt::format("pytorch window {}: {} batches, {} images in {:.3f} s: {:.1f} img/s "
                             "(loss {:.4f}, load {})\n",
                             r + 1, (*w)["batches"].get<int64_t>(), (*w)["images"].get<int64_t>(),
                             (*w)["seconds"].get<double>(), torch_rates.back(),
                             (*w)["loss"].get<double>(), load_average())
              << std::flush;
  };
  for (int r = 0; r < o.repeats; ++r) {
    if (r % 2 == 0) {
      anvil_window(r);
      torch_window(r);
    } else {
      torch_window(r);
      anvil_window(r);
    }
    if (torch && torch_rates.size() == rates.size())
      pair_ratios.push_back(rates.back() / torch_rates.back());
  }
  const double anvil_rate = median(rates);
  const double anvil_best = *std::max_element(rates.begin(), rates.end());

  std::optional<Breakdown> bd;
  std::optional<json> torch_bd;
  if (o.breakdown_iters > 0) {
    auto [x, y] = batch(full[k++ % full.size()]);
    bd = breakdown(*net, opt, x, y, o.breakdown_iters);
    if (torch) {
      std::string error;
      torch_bd = torch->request(fmt::format("breakdown {}", o.breakdown_iters), error);
      if (!torch_bd) torch_failed(error);
    }
  }

  // ---- report ----
  std::cout << "\n";
  if (bd) {
    const double ms = 1000.0 / bd->iterations;
    const json* tb = torch_bd ? &*torch_bd : nullptr;
    std::cout << fmt::format("per-layer time, ms per batch of {} (mean of {} iterations){}\n",
                             o.batch_size, bd->iterations,
                             tb ? "; pytorch beside it" : "");
    std::string head = fmt::format("  {:<3} {:<15} {:>9} {:>9} {:>9}", "#", "layer", "fwd", "bwd",
                                   "total");
    if (tb) head += fmt::format("   | {:>9} {:>9} {:>9} {:>7}", "torch fwd", "torch bwd",
                                "total", "ratio");
    std::cout << head << "\n";
    double fwd_sum = 0, node_sum = 0, tf_sum = 0, tbw_sum = 0;
    for (size_t i = 0; i < bd->layers.size(); ++i) {
      const LayerTimes& l = bd->layers[i];
      double f = l.forward * ms, bw = l.backward * ms;
      fwd_sum += f;
      node_sum += bw;
      std::string line =
          fmt::format("  {:<3} {:<15} {:>9.3f} {:>9.3f} {:>9.3f}", i, l.name, f, bw, f + bw);
      if (tb && i < (*tb)["layers"].size()) {
        double tf = (*tb)["layers"][i]["forward_ms"].get<double>();
        double tbw = (*tb)["layers"][i]["backward_ms"].get<double>();
        tf_sum += tf;
        tbw_sum += tbw;
        line += fmt::format("   | {:>9.3f} {:>9.3f} {:>9.3f} {:>6.2f}x", tf, tbw, tf + tbw,
                            (f + bw) / std::max(tf + tbw, 1e-9));
      }
      std::cout << line << "\n";
    }
    auto row = [&](const std::string& name, double f, double bw, std::optional<double> tf,
                   std::optional<double> tbw) {
      std::string line = fmt::format("  {:<19} {:>9.3f} {:>9.3f} {:>9.3f}", name, f, bw, f + bw);
      if (tb && tf && tbw)
        line += fmt::format("   | {:>9.3f} {:>9.3f} {:>9.3f} {:>6.2f}x", *tf, *tbw, *tf + *tbw,
                            (f + bw) / std::max(*tf + *tbw, 1e-9));
      std::cout << line << "\n";
    };
    auto tget = [&](const char* key) -> std::optional<double> {
      if (!tb || !tb->contains(key)) return std::nullopt;
      return (*tb)[key].get<double>();
    };
    const double loss_f = bd->loss_forward * ms, loss_b = bd->loss_backward * ms;
    const double engine = bd->backward_total * ms - node_sum - loss_b;
    row("cross_entropy", loss_f, loss_b, tget("loss_forward_ms"), tget("loss_backward_ms"));
    std::cout << fmt::format("  {:<19} {:>9} {:>9.3f} {:>9.3f}   (leaf-grad copies/sums, "
                             "graph walk)\n",
                             "autograd other", "", engine, engine);
    row("zero_grad", bd->zero_grad * ms, 0, tget("zero_grad_ms"), 0.0);
    row("sgd step+item", bd->step * ms, 0, tget("step_ms"), 0.0);
    const double total = fwd_sum + loss_f + bd->backward_total * ms + (bd->zero_grad + bd->step) * ms;
    std::optional<double> ttotal;
    if (tb)
      ttotal = tf_sum + tbw_sum + *tget("loss_forward_ms") + *tget("loss_backward_ms") +
               *tget("zero_grad_ms") + *tget("step_ms");
    std::string line = fmt::format("  {:<19} {:>9.3f} {:>9.3f} {:>9.3f}  = {:.1f} img/s", "step total",
                                   fwd_sum + loss_f, bd->backward_total * ms, total,
                                   o.batch_size * 1000.0 / total);
    if (ttotal)
      line += fmt::format("   | torch {:.3f} ms = {:.1f} img/s", *ttotal,
                          o.batch_size * 1000.0 / *ttotal);
    std::cout << line << "\n\n";

    // Backward per op kind: anvil's node timings against PyTorch's autograd
    // functions (from its profiler, one extra iteration), plus PyTorch's
    // forward per kind for reference.
    const json* tk = tb && tb->contains("kinds") ? &(*tb)["kinds"] : nullptr;
    std::cout << fmt::format("backward per op kind, ms per batch{}\n",
                             tk ? "; pytorch's from its profiler (forward for reference)" : "");
    std::map<std::string, double> kinds = bd->backward_by_kind;
    if (tk)
      for (auto it = tk->begin(); it != tk->end(); ++it) kinds.emplace(it.key(), 0.0);
    std::string khead = fmt::format("  {:<12} {:>9}", "kind", "anvil bwd");
    if (tk) khead += fmt::format(" {:>9} {:>7}   {:>9}", "torch bwd", "ratio", "torch fwd");
    std::cout << khead << "\n";
    for (auto& [kind, secs] : kinds) {
      std::string line = fmt::format("  {:<12} {:>9.3f}", kind, secs * ms);
      if (tk) {
        double tbk = 0, tfk = 0;
        if (tk->contains(kind)) {
          tbk = (*tk)[kind].value("backward_ms", 0.0);
          tfk = (*tk)[kind].value("forward_ms", 0.0);
        }
        line += fmt::format(" {:>9.3f} {:>6.2f}x   {:>9.3f}", tbk,
                            tbk > 0 ? secs * ms / tbk : 0.0, tfk);
      }
      std::cout << line << "\n";
    }
    std::cout << "\n";
  }

  // An epoch is 60,000 images at the median rate.
  std::cout << fmt::format("{} training, batch {}:\n", o.model, o.batch_size);
  std::cout << fmt::format("{:<10} {:>14} {:>14} {:>10}  {}\n", "framework", "img/s (median)",
                           "img/s (best)", "s/epoch", "details");
  std::cout << fmt::format("{:<10} {:>14.1f} {:>14.1f} {:>10.1f}  {} timed batches x {} "
                           "window(s), {} threads\n",
                           "anvil", anvil_rate, anvil_best, kEpochImages / anvil_rate,
                           timed_batches, o.repeats, o.threads);
  if (!torch_rates.empty()) {
    const double trate = median(torch_rates);
    const double tbest = *std::max_element(torch_rates.begin(), torch_rates.end());
    std::cout << fmt::format("{:<10} {:>14.1f} {:>14.1f} {:>10.1f}  torch {}, {} threads, "
                             "blas {}\n",
                             "pytorch", trate, tbest, kEpochImages / trate,
                             torch_info.value("torch_version", std::string("?")),
                             torch_info.value("threads", 0),
                             torch_info.value("blas", std::string("?")));
    std::cout << fmt::format("ratio anvil/pytorch: {:.3f} (median of the {} paired windows; "
                             "per window {:.3f}), {:.3f} (best / best)\n",
                             median(pair_ratios), pair_ratios.size(),
                             fmt::join(pair_ratios, ", "), anvil_best / tbest);
  }
  std::cout << fmt::format("load average at the end: {}\n", load_average());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"bench_train: time training on Fashion-MNIST, anvil vs PyTorch"};
  app.add_option("--model", o.model, "lenet, resnet18 or resnet18-96")
      ->capture_default_str()
      ->check(CLI::IsMember({"lenet", "resnet18", "resnet18-96"}));
  app.add_option("--batches", o.batches, "Timed batches per repeat (default: lenet 60, resnet 5)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", o.warmup, "Untimed batches first (default: lenet 5, resnet 2)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--epochs", o.epochs,
                 "Time whole epochs over all 60000 images instead of --batches (0 = off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--repeats", o.repeats,
                 "Timed windows per framework, alternating; the median and best are reported "
                 "(default: lenet 3, resnet 1)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--batch-size", o.batch_size, "Mini-batch size (default: the seed recipe's, 256)")
      ->check(CLI::Range(int64_t{1}, int64_t{60000}));
  app.add_option("--threads", o.threads, "OpenMP (and OpenBLAS) threads; torch threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--breakdown-iters", o.breakdown_iters,
                 "Iterations of the per-layer breakdown, 0 = none (default: lenet 10, resnet 2)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr", o.lr, "SGD learning rate (default: the seed recipe's, lenet 0.2, resnet 0.1)")
      ->check(CLI::PositiveNumber);
  app.add_option("--momentum", o.momentum, "SGD momentum")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", o.seed, "Initialisation seed")->capture_default_str();
  app.add_flag("--no-torch", o.no_torch, "Do not run the PyTorch comparison");
  app.add_option("--fp32-precision", o.fp32_precision,
                 "anvil's float32 convolutions and matmuls: default, ieee (no Winograd) or tf32 "
                 "(emulated); PyTorch's CPU is FP32 in all three")
      ->capture_default_str()
      ->check(CLI::IsMember({"default", "ieee", "tf32"}));
  app.add_option("--amp", o.amp,
                 "anvil's mixed precision: off or bf16 (conv and linear in bfloat16: AVX-512 "
                 "BF16 where the CPU has it, else emulated); PyTorch's side stays FP32")
      ->capture_default_str()
      ->check(CLI::IsMember({"off", "bf16"}));
  app.add_option("--python", o.python, "Python interpreter with torch")->capture_default_str();
  app.add_option("--script", o.script, "Path of train_torch.py (default: next to the sources)");
  app.add_option("--data-dir", o.data_dir, "Directory with the Fashion-MNIST IDX files")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "bench_train: error: " << e.what() << '\n';
    return 1;
  }
}
