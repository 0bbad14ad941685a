// bench_lenet: times LeNet training on Fashion-MNIST in the manner of
// `caffe time`, and compares it with PyTorch in the same run.
//
//   bench_lenet                      # 5 warm-up + 60 timed batches of 256, 2 threads
//   bench_lenet --repeats 3          # three timed windows, median and best
//   bench_lenet --no-torch --threads 1
//
// What it does:
//  1. Loads only the training images it needs and holds them in memory as one
//     float tensor (pixel / 255, as the DataLoader does); every step takes a
//     zero-copy narrow() of it, so only the training step is timed: forward,
//     cross-entropy, zero_grad, backward, SGD step and loss.item(), which is
//     what train::train_epoch does per batch, minus its accuracy bookkeeping.
//  2. Reports anvil's images/s over --batches batches after --warmup batches
//     (or over --epochs whole epochs), per repeat.
//  3. Per-layer breakdown over --breakdown-iters further batches: each layer's
//     forward is timed by calling the Sequential's layers one by one; each
//     layer's backward by wrapping the backward functions of the autograd
//     nodes that layer recorded; what backward() spends outside any node
//     (leaf-gradient copies and sums, graph bookkeeping) is shown apart, as
//     are zero_grad and the optimizer step.
//  4. Unless --no-torch (or torch cannot be imported by --python), runs
//     bench/lenet_torch.py with the same settings, reads its JSON line and
//     prints PyTorch's figures beside anvil's and the ratio anvil / pytorch.
//
// Threads: --threads is applied with omp_set_num_threads before any kernel
// runs. anvil's own loops use OpenMP, and the OpenBLAS it links (the Debian
// openblas-openmp build) sizes its thread team from the OpenMP setting too, so
// one flag governs both. PyTorch gets the same number via torch.set_num_threads.
#include <omp.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/random.h"
#include "data/idx.h"
#include "nn/models.h"
#include "nn/optim.h"

using namespace anvil;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

namespace {

struct Options {
  int batches = 60;
  int warmup = 5;
  int epochs = 0;
  int repeats = 1;
  int64_t batch_size = 256;
  int threads = 2;
  int breakdown_iters = 10;
  double lr = 0.2;
  uint64_t seed = 0;
  bool no_torch = false;
  std::string python = "/usr/bin/python3";
  std::string script;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
};

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
// provides it, else relative to the executable (build/<preset>/bench_lenet).
std::string default_script() {
  namespace fs = std::filesystem;
#ifdef ANVIL_SOURCE_DIR
  fs::path p = fs::path(ANVIL_SOURCE_DIR) / "bench" / "lenet_torch.py";
  if (fs::exists(p)) return p.string();
#endif
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.parent_path();
         dir = dir.parent_path()) {
      fs::path p = dir / "bench" / "lenet_torch.py";
      if (fs::exists(p)) return p.string();
    }
  }
  return "bench/lenet_torch.py";
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
  Tensor images;  // [count, 1, rows, cols] float in [0, 1]
  Tensor labels;  // [count] int64
  int64_t count = 0;
};

Dataset load_train(const std::string& dir, int64_t limit) {
  data::ImageSet set = data::load_mnist_split(dir, true, limit);
  Dataset d;
  d.count = set.count;
  d.images = Tensor::empty({set.count, 1, set.rows, set.cols});
  float* p = d.images.data<float>();
  for (size_t i = 0; i < set.pixels.size(); ++i) p[i] = float(set.pixels[i]) / 255.0f;
  d.labels = Tensor::from_vector(set.labels, {set.count});
  return d;
}

double train_step(nn::Module& model, optim::SGD& opt, const Tensor& x, const Tensor& y) {
  Tensor logits = model(x);
  Tensor loss = cross_entropy(logits, y);
  opt.zero_grad();
  loss.backward();
  opt.step();
  return loss.item();
}

// ---------------------------------------------------------------- breakdown

struct LayerTimes {
  std::string name;
  double forward = 0, backward = 0;  // seconds, summed over iterations
  int nodes = 0;                     // autograd nodes per iteration
};

struct Breakdown {
  std::vector<LayerTimes> layers;
  double loss_forward = 0, loss_backward = 0, zero_grad = 0, backward_total = 0, step = 0;
  int iterations = 0;
};

// Replaces node->backward with a version that adds its run time to *slot.
void time_node(Node* node, double* slot) {
  BackwardFn inner = std::move(node->backward);
  node->backward = [inner = std::move(inner), slot](const Tensor& g) {
    auto t0 = Clock::now();
    std::vector<Tensor> r = inner(g);
    *slot += seconds_since(t0);
    return r;
  };
}

// Every node reachable from `from` without passing through `stop`, each once.
std::vector<Node*> nodes_between(Node* from, Node* stop, std::unordered_set<Node*>& seen) {
  std::vector<Node*> out, stack;
  if (from && from != stop && seen.insert(from).second) stack.push_back(from);
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    out.push_back(n);
    for (const Edge& e : n->next) {
      Node* m = e.node.get();
      if (m && m != stop && seen.insert(m).second) stack.push_back(m);
    }
  }
  return out;
}

std::string short_name(const std::string& describe) {
  return describe.substr(0, describe.find('('));
}

Breakdown breakdown(nn::Sequential& net, optim::SGD& opt, const Tensor& x, const Tensor& y,
                    int iters) {
  Breakdown b;
  b.iterations = iters;
  const size_t n = net.size();
  b.layers.resize(n);
  for (size_t i = 0; i < n; ++i) b.layers[i].name = short_name(net[i].describe());
  for (int it = 0; it < iters; ++it) {
    // Only each layer's autograd node is kept, not its output: holding on to
    // outputs the graph does not save would change what the step allocates.
    std::vector<std::shared_ptr<Node>> node_of(n);
    Tensor h = x;
    for (size_t i = 0; i < n; ++i) {
      auto t0 = Clock::now();
      h = net[i](h);
      b.layers[i].forward += seconds_since(t0);
      node_of[i] = h.grad_fn();
    }
    auto t0 = Clock::now();
    Tensor loss = cross_entropy(h, y);
    b.loss_forward += seconds_since(t0);
    h = Tensor();

    // Attribute each node to the layer whose forward recorded it: walking back
    // from layer i's node until layer i-1's.
    std::unordered_set<Node*> seen;
    for (Node* node : nodes_between(loss.grad_fn().get(), node_of[n - 1].get(), seen))
      time_node(node, &b.loss_backward);
    for (size_t i = n; i-- > 0;) {
      Node* stop = i > 0 ? node_of[i - 1].get() : nullptr;
      auto nodes = nodes_between(node_of[i].get(), stop, seen);
      if (it == 0) b.layers[i].nodes = int(nodes.size());
      for (Node* node : nodes) time_node(node, &b.layers[i].backward);
    }
    node_of.clear();

    t0 = Clock::now();
    opt.zero_grad();
    b.zero_grad += seconds_since(t0);
    t0 = Clock::now();
    loss.backward();
    b.backward_total += seconds_since(t0);
    t0 = Clock::now();
    opt.step();
    loss.item();
    b.step += seconds_since(t0);
  }
  return b;
}

// ---------------------------------------------------------------- pytorch

bool torch_available(const std::string& python) {
  std::string cmd = shell_quote(python) + " -c 'import torch' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// Runs the script and returns its JSON line, or an error message.
std::optional<json> run_torch(const Options& o, std::string& error) {
  std::string cmd = fmt::format(
      "{} {} --threads {} --batch-size {} --warmup {} --batches {} --epochs {} --repeats {} "
      "--lr {} --seed {} --breakdown {} --data-dir {}",
      shell_quote(o.python), shell_quote(o.script), o.threads, o.batch_size, o.warmup, o.batches,
      o.epochs, o.repeats, o.lr, o.seed, o.breakdown_iters, shell_quote(o.data_dir));
  std::cout << "running: " << cmd << "\n" << std::flush;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) {
    error = "popen failed";
    return std::nullopt;
  }
  std::string output;
  std::array<char, 4096> buf;
  size_t got;
  while ((got = fread(buf.data(), 1, buf.size(), pipe)) > 0) output.append(buf.data(), got);
  int status = pclose(pipe);
  if (status != 0) {
    error = fmt::format("the script exited with status {}", WEXITSTATUS(status));
    return std::nullopt;
  }
  std::istringstream lines(output);
  std::string line, last;
  while (std::getline(lines, line))
    if (!line.empty() && line.front() == '{') last = line;
  if (last.empty()) {
    error = "no JSON line in its output";
    return std::nullopt;
  }
  try {
    return json::parse(last);
  } catch (const std::exception& e) {
    error = fmt::format("cannot parse its JSON: {}", e.what());
    return std::nullopt;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

int run(Options& o) {
  omp_set_num_threads(o.threads);
  if (o.script.empty()) o.script = default_script();
  std::cout << fmt::format("bench_lenet: LeNet (seed init), SGD lr {}, batch {}, {} thread(s), "
                           "load average {}\n",
                           o.lr, o.batch_size, o.threads, load_average());

  // Only the images the run needs (all of them for --epochs).
  const int64_t need =
      o.epochs > 0 ? 0
                   : (int64_t(o.warmup) + int64_t(o.batches) * o.repeats +
                      (o.breakdown_iters > 0 ? 1 : 0)) *
                         o.batch_size;
  auto t_load = Clock::now();
  Dataset d = load_train(o.data_dir, need);
  std::cout << fmt::format("loaded {} training images from {} in {:.2f} s\n", d.count, o.data_dir,
                           seconds_since(t_load));
  auto full = batch_slices(d.count, o.batch_size, true);
  if (full.empty())
    throw std::runtime_error(fmt::format("only {} images, fewer than one batch of {}", d.count,
                                         o.batch_size));

  manual_seed(o.seed);
  auto net = models::lenet(models::Init::Seed);
  net->train();
  optim::SGD opt(net->parameters(), {.lr = o.lr});

  size_t k = 0;  // next batch, cycling through the full batches in file order
  auto batch = [&](std::pair<int64_t, int64_t> r) {
    return std::pair{d.images.narrow(r.first, r.second - r.first),
                     d.labels.narrow(r.first, r.second - r.first)};
  };
  for (int i = 0; i < o.warmup; ++i) {
    auto [x, y] = batch(full[k++ % full.size()]);
    train_step(*net, opt, x, y);
  }

  std::vector<double> rates;
  int64_t images = 0, timed_batches = 0;
  double loss = 0;
  for (int r = 0; r < o.repeats; ++r) {
    std::vector<std::pair<int64_t, int64_t>> plan;
    if (o.epochs > 0) {
      auto epoch = batch_slices(d.count, o.batch_size, false);
      for (int e = 0; e < o.epochs; ++e) plan.insert(plan.end(), epoch.begin(), epoch.end());
    } else {
      for (int i = 0; i < o.batches; ++i) plan.push_back(full[k++ % full.size()]);
    }
    images = 0;
    timed_batches = int64_t(plan.size());
    auto t0 = Clock::now();
    for (auto range : plan) {
      auto [x, y] = batch(range);
      loss = train_step(*net, opt, x, y);
      images += x.size(0);
    }
    double s = seconds_since(t0);
    rates.push_back(double(images) / s);
    std::cout << fmt::format("anvil   repeat {}: {} batches, {} images in {:.3f} s: {:.0f} img/s "
                             "(loss {:.4f})\n",
                             r + 1, timed_batches, images, s, rates.back(), loss);
  }
  const double anvil_rate = median(rates);
  const double anvil_best = *std::max_element(rates.begin(), rates.end());

  std::optional<Breakdown> bd;
  if (o.breakdown_iters > 0) {
    auto [x, y] = batch(full[k++ % full.size()]);
    bd = breakdown(*net, opt, x, y, o.breakdown_iters);
  }

  // PyTorch, same settings, same run.
  std::optional<json> torch;
  if (o.no_torch) {
    std::cout << "pytorch: skipped (--no-torch)\n";
  } else if (!torch_available(o.python)) {
    std::cout << fmt::format("pytorch: skipped ({} cannot import torch)\n", o.python);
  } else {
    std::string error;
    torch = run_torch(o, error);
    if (!torch) std::cout << "pytorch: failed: " << error << "\n";
  }

  // ---- report ----
  std::cout << "\n";
  if (bd) {
    const double ms = 1000.0 / bd->iterations;
    const json* tb = torch && torch->contains("breakdown") ? &(*torch)["breakdown"] : nullptr;
    std::cout << fmt::format("per-layer time, ms per batch of {} (mean of {} iterations){}\n",
                             o.batch_size, bd->iterations,
                             tb ? "; pytorch beside it" : "");
    std::string head = fmt::format("  {:<3} {:<10} {:>9} {:>9} {:>9}", "#", "layer", "fwd", "bwd",
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
          fmt::format("  {:<3} {:<10} {:>9.3f} {:>9.3f} {:>9.3f}", i, l.name, f, bw, f + bw);
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
      std::string line = fmt::format("  {:<14} {:>9.3f} {:>9.3f} {:>9.3f}", name, f, bw, f + bw);
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
    std::cout << fmt::format("  {:<14} {:>9} {:>9.3f} {:>9.3f}   (leaf-grad copies/sums, "
                             "graph walk)\n",
                             "autograd other", "", engine, engine);
    row("zero_grad", bd->zero_grad * ms, 0, tget("zero_grad_ms"), 0.0);
    row("sgd step+item", bd->step * ms, 0, tget("step_ms"), 0.0);
    const double total = fwd_sum + loss_f + bd->backward_total * ms + (bd->zero_grad + bd->step) * ms;
    std::optional<double> ttotal;
    if (tb)
      ttotal = tf_sum + tbw_sum + *tget("loss_forward_ms") + *tget("loss_backward_ms") +
               *tget("zero_grad_ms") + *tget("step_ms");
    std::string line = fmt::format("  {:<14} {:>9.3f} {:>9.3f} {:>9.3f}  = {:.0f} img/s", "step total",
                                   fwd_sum + loss_f, bd->backward_total * ms, total,
                                   o.batch_size * 1000.0 / total);
    if (ttotal)
      line += fmt::format("   | torch {:.3f} ms = {:.0f} img/s", *ttotal,
                          o.batch_size * 1000.0 / *ttotal);
    std::cout << line << "\n\n";
  }

  std::cout << fmt::format("{:<10} {:>14} {:>14}  {}\n", "framework", "img/s (median)",
                           "img/s (best)", "details");
  std::cout << fmt::format("{:<10} {:>14.0f} {:>14.0f}  {} timed batches x {} repeat(s), "
                           "{} threads\n",
                           "anvil", anvil_rate, anvil_best, timed_batches, o.repeats, o.threads);
  if (torch) {
    double trate = (*torch)["images_per_second"].get<double>();
    double tbest = torch->value("best_images_per_second", trate);
    std::cout << fmt::format("{:<10} {:>14.0f} {:>14.0f}  torch {}, {} threads, blas {}\n",
                             "pytorch", trate, tbest,
                             torch->value("torch_version", std::string("?")),
                             torch->value("threads", 0),
                             torch->value("blas", std::string("?")));
    std::cout << fmt::format("ratio anvil/pytorch: {:.3f} (median), {:.3f} (best)\n",
                             anvil_rate / trate, anvil_best / tbest);
  }
  std::cout << fmt::format("load average at the end: {}\n", load_average());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"bench_lenet: time LeNet training on Fashion-MNIST, anvil vs PyTorch"};
  app.add_option("--batches", o.batches, "Timed batches (per repeat)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", o.warmup, "Untimed batches first")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--epochs", o.epochs,
                 "Time whole epochs over all 60000 images instead of --batches (0 = off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--repeats", o.repeats, "Timed windows; the median and best are reported")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--batch-size", o.batch_size, "Mini-batch size")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{60000}));
  app.add_option("--threads", o.threads, "OpenMP (and OpenBLAS) threads; torch threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--breakdown-iters", o.breakdown_iters,
                 "Iterations of the per-layer breakdown (0 = none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr", o.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--seed", o.seed, "Initialisation seed")->capture_default_str();
  app.add_flag("--no-torch", o.no_torch, "Do not run the PyTorch comparison");
  app.add_option("--python", o.python, "Python interpreter with torch")->capture_default_str();
  app.add_option("--script", o.script, "Path of lenet_torch.py (default: next to the sources)");
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
    std::cerr << "bench_lenet: error: " << e.what() << '\n';
    return 1;
  }
}
