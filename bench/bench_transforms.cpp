// bench_transforms: images/s of the training transforms (data/transforms.h)
// on batches like the DataLoader's: 28 x 28 grey images, pixel / 255.
//
//   bench_transforms                       # batch 256, 28 -> 96, pad 4, 200 batches per row
//   bench_transforms --size 32 --batches 500 --repeats 3
//
// The transform runs on the DataLoader's single worker thread, so this is
// single-threaded. Each row times only the transform call: the batch's input
// pixels are restored (as the DataLoader's fill would) outside the timed
// region. Rows: the whole recipe (resize + crop + flip + normalise) on 28 x 28
// input, then each step alone (crop, flip and normalise on input already of
// the trained size), so the cost can be attributed. Best and median of
// --repeats windows are printed, from wall time and from the thread's CPU
// time (which leaves out time the thread spent descheduled on a busy machine).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "data/dataloader.h"
#include "data/transforms.h"

using namespace anvil::data;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  int64_t batch_size = 256;
  int64_t size = 96;
  int64_t pad = 4;
  int batches = 200;
  int warmup = 10;
  int repeats = 3;
};

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// A batch of n side x side grey images of deterministic pseudo-random pixels
// (values do not affect speed).
Batch make_input(int64_t n, int64_t side) {
  Batch b;
  b.size = n;
  b.channels = 1;
  b.rows = b.cols = side;
  b.images.resize(static_cast<size_t>(n * side * side));
  uint32_t state = 12345;
  for (float& v : b.images) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(state >> 24) / 255.0f;
  }
  for (int64_t i = 0; i < n; ++i) {
    b.labels.push_back(i % 10);
    b.indices.push_back(i);
  }
  return b;
}

struct Timing {
  std::vector<double> wall, cpu;  // seconds per batch, one value per repeat
};

Timing time_transform(const Options& o, const TransformOptions& topt, int64_t side) {
  BatchTransform t = make_transform(topt);
  const Batch input = make_input(o.batch_size, side);
  Batch b = input;
  Timing timing;
  for (int r = 0; r < o.repeats; ++r) {
    double wall = 0, cpu = 0;
    for (int i = -o.warmup; i < o.batches; ++i) {
      // Restore the input without giving up the grown buffer, as the
      // DataLoader's fill does.
      b.rows = input.rows;
      b.cols = input.cols;
      b.images.assign(input.images.begin(), input.images.end());
      b.epoch = static_cast<uint64_t>(i + o.warmup);  // fresh random choices each batch
      const double c0 = thread_cpu_seconds();
      const auto t0 = Clock::now();
      t(b);
      const auto t1 = Clock::now();
      const double c1 = thread_cpu_seconds();
      if (i >= 0) {
        wall += std::chrono::duration<double>(t1 - t0).count();
        cpu += c1 - c0;
      }
    }
    timing.wall.push_back(wall / o.batches);
    timing.cpu.push_back(cpu / o.batches);
  }
  return timing;
}

void report(const Options& o, const std::string& name, const TransformOptions& topt, int64_t side) {
  Timing t = time_transform(o, topt, side);
  std::sort(t.wall.begin(), t.wall.end());
  std::sort(t.cpu.begin(), t.cpu.end());
  const auto n = static_cast<double>(o.batch_size);
  fmt::print("{:<42} {:>11.0f} {:>11.0f} {:>11.0f} {:>11.0f} {:>9.2f}\n", name, n / t.wall.front(),
             n / t.wall[t.wall.size() / 2], n / t.cpu.front(), n / t.cpu[t.cpu.size() / 2], t.cpu.front() * 1e6 / n);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Throughput of the data transforms (single thread)"};
  app.add_option("--batch-size", o.batch_size, "images per batch")->check(CLI::PositiveNumber);
  app.add_option("--size", o.size, "resize 28 x 28 to size x size")->check(CLI::PositiveNumber);
  app.add_option("--pad", o.pad, "crop padding")->check(CLI::NonNegativeNumber);
  app.add_option("--batches", o.batches, "timed batches per repeat")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed batches before each repeat")->check(CLI::NonNegativeNumber);
  app.add_option("--repeats", o.repeats, "timed windows")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  TransformOptions full;
  full.resize = o.size;
  full.crop_padding = o.pad;
  full.horizontal_flip = true;
  full.mean = {0.2860406f};
  full.std = {0.3530242f};
  full.seed = 1;

  fmt::print("batch {} of 28x28 -> {}x{}, pad {}, {} batches x {} repeats, 1 thread\n", o.batch_size, o.size,
             o.size, o.pad, o.batches, o.repeats);
  fmt::print("{:<42} {:>23} {:>23} {:>9}\n", "", "img/s, wall time", "img/s, thread CPU time", "CPU us");
  fmt::print("{:<42} {:>11} {:>11} {:>11} {:>11} {:>9}\n", "transform", "best", "median", "best", "median",
             "per img");
  report(o, fmt::format("28 -> {0}, crop(pad {1}), flip, normalise", o.size, o.pad), full, 28);

  TransformOptions resize_only;
  resize_only.resize = o.size;
  report(o, fmt::format("resize 28 -> {}", o.size), resize_only, 28);

  // The other steps alone, on images already of the trained size.
  TransformOptions crop_only;
  crop_only.crop_padding = o.pad;
  report(o, fmt::format("crop(pad {}) at {}", o.pad, o.size), crop_only, o.size);
  TransformOptions flip_only;
  flip_only.horizontal_flip = true;
  report(o, fmt::format("flip (p = 0.5) at {}", o.size), flip_only, o.size);
  TransformOptions norm_only;
  norm_only.mean = full.mean;
  norm_only.std = full.std;
  report(o, fmt::format("normalise at {}", o.size), norm_only, o.size);
  return 0;
}
