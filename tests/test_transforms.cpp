// Tests for data/transforms.h: bilinear resize against PyTorch goldens
// (tests/golden/transforms_golden.json, written by
// tests/golden/make_transform_golden.py), pad + crop, flip, normalisation,
// channel statistics, the reproducibility of the random choices, and the
// transform inside a DataLoader.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "data/dataloader.h"
#include "data/idx.h"
#include "data/transforms.h"
#include "tests/golden_util.h"
#include "tests/test_util.h"

#ifndef ANVIL_TEST_DATA_DIR
#error "ANVIL_TEST_DATA_DIR must name the tests/ directory"
#endif

using namespace anvil::data;
using Catch::Contains;
using json = nlohmann::json;

namespace {

const json& golden() { return anvil::testing::golden_file("transforms_golden.json"); }

// A batch built by hand: image i, element k (CHW order) holds value(i, k);
// example i has index first_index + i in its set.
template <typename F>
Batch make_batch(int64_t n, int64_t channels, int64_t h, int64_t w, F value, uint64_t epoch = 0,
                 int64_t first_index = 0) {
  Batch b;
  b.size = n;
  b.channels = channels;
  b.rows = h;
  b.cols = w;
  b.epoch = epoch;
  const int64_t numel = channels * h * w;
  b.images.resize(static_cast<size_t>(n * numel));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < numel; ++k) b.images[i * numel + k] = value(i, k);
    b.labels.push_back(i % 10);
    b.indices.push_back(first_index + i);
  }
  return b;
}

// `count` distinct grey images whose pixels are mostly non-zero.
ImageSet make_set(int64_t count, int64_t rows, int64_t cols) {
  ImageSet s;
  s.count = count;
  s.rows = rows;
  s.cols = cols;
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t k = 0; k < rows * cols; ++k) s.pixels.push_back(static_cast<uint8_t>((i * 37 + k * 11 + 1) % 256));
    s.labels.push_back(i % 10);
  }
  return s;
}

std::vector<float> image_of(const Batch& b, int64_t i) {
  const int64_t numel = b.channels * b.rows * b.cols;
  return std::vector<float>(b.images.begin() + i * numel, b.images.begin() + (i + 1) * numel);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// What make_transform(opt) should turn batch `in` into, composed from the
// building blocks in the documented order.
Batch composed(const Batch& in, const TransformOptions& opt) {
  Batch out = in;
  const int64_t ch = in.channels, h = in.rows, w = in.cols;
  const int64_t oh = opt.resize > 0 ? opt.resize : h, ow = opt.resize > 0 ? opt.resize : w;
  out.rows = oh;
  out.cols = ow;
  out.images.assign(static_cast<size_t>(in.size * ch * oh * ow), 0.0f);
  for (int64_t i = 0; i < in.size; ++i) {
    std::vector<float> img = image_of(in, i), next(static_cast<size_t>(ch * oh * ow));
    if (oh != h || ow != w) {
      resize_bilinear(img.data(), ch, h, w, next.data(), oh, ow);
      img = next;
    }
    const Augmentation a = draw_augmentation(opt.seed, in.epoch, in.indices[static_cast<size_t>(i)], opt.crop_padding);
    if (opt.crop_padding > 0) {
      pad_crop(img.data(), ch, oh, ow, opt.crop_padding, a.top, a.left, next.data());
      img = next;
    }
    if (opt.horizontal_flip && a.flip) flip_horizontal(img.data(), ch, oh, ow);
    if (!opt.mean.empty()) normalize(img.data(), ch, oh, ow, opt.mean.data(), opt.std.data());
    std::copy(img.begin(), img.end(), out.images.begin() + i * ch * oh * ow);
  }
  return out;
}

// Every example of one epoch, by its index in the set.
std::map<int64_t, std::vector<float>> epoch_images(DataLoader& loader, uint64_t epoch) {
  std::map<int64_t, std::vector<float>> out;
  loader.start_epoch(epoch);
  Batch b;
  while (loader.next(b))
    for (int64_t i = 0; i < b.size; ++i) out[b.indices[static_cast<size_t>(i)]] = image_of(b, i);
  return out;
}

}  // namespace

TEST_CASE("resize_bilinear matches torch interpolate (bilinear, align_corners=False)", "[data][transforms]") {
  const json& cases = golden().at("cases");
  // Guards against a truncated or regenerated-empty golden file passing
  // vacuously: up and down, 1 and 3 channels must all be there.
  std::set<std::string> kinds;
  for (const json& c : cases) {
    const int64_t ch = c.at("channels"), in_h = c.at("in_h"), out_h = c.at("out_h");
    kinds.insert((out_h > in_h ? "up" : out_h < in_h ? "down" : "same") + std::to_string(ch));
  }
  REQUIRE(kinds.count("up1"));
  REQUIRE(kinds.count("up3"));
  REQUIRE(kinds.count("down1"));
  REQUIRE(kinds.count("down3"));

  for (const json& c : cases) {
    const std::string name = c.at("name");
    DYNAMIC_SECTION(name) {
      const int64_t ch = c.at("channels"), h = c.at("in_h"), w = c.at("in_w");
      const int64_t oh = c.at("out_h"), ow = c.at("out_w");
      const auto input = c.at("input").get<std::vector<float>>();
      const auto want = c.at("output").get<std::vector<double>>();
      REQUIRE(input.size() == static_cast<size_t>(ch * h * w));
      REQUIRE(want.size() == static_cast<size_t>(ch * oh * ow));

      std::vector<float> got(want.size(), -99.0f);
      resize_bilinear(input.data(), ch, h, w, got.data(), oh, ow);
      // Errors relative to max(1, |want|), in units of float epsilon near 1.
      // The same weights as torch leave at most 1 ulp (torch's own summation
      // order varies with its code path); weights rounded differently give
      // up to ~8, so 2 separates the two.
      double worst = 0;
      size_t worst_at = 0;
      for (size_t k = 0; k < got.size(); ++k) {
        const double err = std::fabs(got[k] - want[k]) / std::max(1.0, std::fabs(want[k]));
        if (!(err <= worst)) worst = err, worst_at = k;
      }
      INFO("largest error " << worst << " at flat index " << worst_at << ": got " << got[worst_at] << ", want "
                            << want[worst_at]);
      REQUIRE(worst <= 2.0 * std::numeric_limits<float>::epsilon());

      // The precomputed form reuses its buffers: a second image through the
      // same object gives the same answer as a fresh one.
      BilinearResize r(h, w, oh, ow);
      std::vector<float> other(input.size());
      for (size_t k = 0; k < input.size(); ++k) other[k] = 1.0f - input[k];
      std::vector<float> a(got.size()), b(got.size());
      r.apply(other.data(), ch, a.data());
      r.apply(input.data(), ch, b.data());
      REQUIRE(same_bits(b, got));
    }
  }
}

TEST_CASE("resizing to the same size is exact, and a constant image stays constant", "[data][transforms]") {
  SECTION("identity, 1 and 3 channels") {
    for (int64_t ch : {1, 3}) {
      std::vector<float> src(static_cast<size_t>(ch * 7 * 5));
      for (size_t k = 0; k < src.size(); ++k) src[k] = std::sin(static_cast<float>(k) * 1.7f) * 1e3f + 1e-7f;
      std::vector<float> dst(src.size(), 0.0f);
      resize_bilinear(src.data(), ch, 7, 5, dst.data(), 7, 5);
      REQUIRE(same_bits(dst, src));
    }
  }
  SECTION("a transform resizing to the batch's own size leaves it unchanged") {
    Batch b = make_batch(3, 2, 7, 7, [](int64_t i, int64_t k) { return std::cos(static_cast<float>(i * 100 + k)); });
    const Batch before = b;
    TransformOptions o;
    o.resize = 7;
    make_transform(o)(b);
    REQUIRE(b.rows == 7);
    REQUIRE(b.cols == 7);
    REQUIRE(same_bits(b.images, before.images));
  }
  SECTION("constant in, the same constant out, up and down") {
    const float v = 0.3137255f;
    std::vector<float> src(28 * 28, v);
    for (int64_t out : {96, 33, 14, 20, 1}) {
      std::vector<float> dst(static_cast<size_t>(out * out), 0.0f);
      resize_bilinear(src.data(), 1, 28, 28, dst.data(), out, out);
      for (float x : dst) REQUIRE(std::fabs(x - v) <= 1e-7f);
    }
  }
  SECTION("sizes must be >= 1") {
    float x = 0;
    REQUIRE_THROWS_AS(resize_bilinear(&x, 1, 1, 1, &x, 0, 1), std::invalid_argument);
    REQUIRE_THROWS_AS(BilinearResize(1, -1, 1, 1), std::invalid_argument);
    REQUIRE_THROWS_AS(resize_bilinear(&x, 0, 1, 1, &x, 1, 1), std::invalid_argument);
  }
}

TEST_CASE("flip_horizontal mirrors every row of every channel", "[data][transforms]") {
  // 2 channels of 2 x 3.
  std::vector<float> img = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const std::vector<float> orig = img;
  flip_horizontal(img.data(), 2, 2, 3);
  REQUIRE(img == std::vector<float>{3, 2, 1, 6, 5, 4, 9, 8, 7, 12, 11, 10});
  flip_horizontal(img.data(), 2, 2, 3);
  REQUIRE(img == orig);

  SECTION("odd and even widths, twice is the identity") {
    for (int64_t w : {1, 4, 5, 96}) {
      std::vector<float> x(static_cast<size_t>(3 * w));
      for (size_t k = 0; k < x.size(); ++k) x[k] = static_cast<float>(k);
      std::vector<float> y = x;
      flip_horizontal(y.data(), 1, 3, w);
      for (int64_t r = 0; r < 3; ++r)
        for (int64_t c = 0; c < w; ++c) REQUIRE(y[r * w + c] == x[r * w + (w - 1 - c)]);
      flip_horizontal(y.data(), 1, 3, w);
      REQUIRE(y == x);
    }
  }
}

TEST_CASE("pad_crop is a shifted copy with zeros where the padding shows", "[data][transforms]") {
  SECTION("a hand-worked 3 x 3 example") {
    const std::vector<float> src = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    std::vector<float> dst(9, -1.0f);
    // Padding 1, window at (top 0, left 2): shifted down one row and left one column.
    pad_crop(src.data(), 1, 3, 3, 1, 0, 2, dst.data());
    REQUIRE(dst == std::vector<float>{0, 0, 0, 2, 3, 0, 5, 6, 0});
    // The centred window is the image itself.
    pad_crop(src.data(), 1, 3, 3, 1, 1, 1, dst.data());
    REQUIRE(dst == src);
  }
  SECTION("every offset, 2 channels, padding wider than the image") {
    const int64_t ch = 2, h = 3, w = 4, pad = 5;
    std::vector<float> src(static_cast<size_t>(ch * h * w));
    for (size_t k = 0; k < src.size(); ++k) src[k] = static_cast<float>(k + 1);
    std::vector<float> dst(src.size());
    for (int64_t top = 0; top <= 2 * pad; ++top)
      for (int64_t left = 0; left <= 2 * pad; ++left) {
        std::fill(dst.begin(), dst.end(), -1.0f);
        pad_crop(src.data(), ch, h, w, pad, top, left, dst.data());
        for (int64_t c = 0; c < ch; ++c)
          for (int64_t y = 0; y < h; ++y)
            for (int64_t x = 0; x < w; ++x) {
              const int64_t sy = y + top - pad, sx = x + left - pad;
              const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
              const float want = inside ? src[(c * h + sy) * w + sx] : 0.0f;
              INFO("top " << top << " left " << left << " at " << c << "," << y << "," << x);
              REQUIRE(dst[(c * h + y) * w + x] == want);
            }
      }
  }
  SECTION("offsets outside [0, 2 * padding] are refused") {
    float x[4] = {};
    float y[4];
    REQUIRE_THROWS_WITH(pad_crop(x, 1, 2, 2, 1, 3, 0, y), Contains("2 * padding"));
    REQUIRE_THROWS_AS(pad_crop(x, 1, 2, 2, 1, 0, -1, y), std::invalid_argument);
    REQUIRE_THROWS_AS(pad_crop(x, 1, 2, 2, -1, 0, 0, y), std::invalid_argument);
  }
}

TEST_CASE("the random crop covers every offset and flips about half the images", "[data][transforms]") {
  // Images of distinct positive values 1..36, so each output reveals its shift.
  const int64_t n = 400, side = 6, pad = 2;
  Batch b = make_batch(n, 1, side, side, [](int64_t, int64_t k) { return static_cast<float>(k + 1); }, 3, 1000);
  TransformOptions opt;
  opt.crop_padding = pad;
  opt.horizontal_flip = true;
  opt.seed = 42;
  make_transform(opt)(b);
  REQUIRE(b.rows == side);
  REQUIRE(b.cols == side);

  std::set<std::pair<int64_t, int64_t>> offsets;
  std::set<int64_t> tops;
  int64_t flips = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Augmentation a = draw_augmentation(42, 3, 1000 + i, pad);
    REQUIRE((a.top >= 0 && a.top <= 2 * pad && a.left >= 0 && a.left <= 2 * pad));
    offsets.insert({a.top, a.left});
    tops.insert(a.top);
    flips += a.flip;
    // The transform applied exactly this draw: crop, then flip.
    const std::vector<float> got = image_of(b, i);
    for (int64_t y = 0; y < side; ++y)
      for (int64_t x = 0; x < side; ++x) {
        const int64_t cx = a.flip ? side - 1 - x : x;  // column of the crop before the flip
        const int64_t sy = y + a.top - pad, sx = cx + a.left - pad;
        const bool inside = sy >= 0 && sy < side && sx >= 0 && sx < side;
        INFO("example " << i << " at " << y << "," << x);
        REQUIRE(got[y * side + x] == (inside ? static_cast<float>(sy * side + sx + 1) : 0.0f));
      }
  }
  REQUIRE(offsets.size() == static_cast<size_t>((2 * pad + 1) * (2 * pad + 1)));
  REQUIRE(tops.size() == static_cast<size_t>(2 * pad + 1));
  // Binomial(400, 0.5): mean 200, standard deviation 10.
  REQUIRE(flips > 150);
  REQUIRE(flips < 250);

  SECTION("wider padding: each offset in [0, 16] occurs, none outside") {
    std::map<int64_t, int64_t> seen;
    for (int64_t i = 0; i < 2000; ++i) {
      const Augmentation a = draw_augmentation(7, 0, i, 8);
      seen[a.top]++;
      seen[a.left]++;
    }
    REQUIRE(seen.size() == 17u);
    REQUIRE(seen.begin()->first == 0);
    REQUIRE(seen.rbegin()->first == 16);
    for (auto [offset, times] : seen) REQUIRE(times > 100);  // expected 4000 / 17 ~ 235
  }
  SECTION("without padding the offsets are 0 and flips still vary") {
    std::set<bool> f;
    for (int64_t i = 0; i < 50; ++i) {
      const Augmentation a = draw_augmentation(7, 0, i, 0);
      REQUIRE(a.top == 0);
      REQUIRE(a.left == 0);
      f.insert(a.flip);
    }
    REQUIRE(f.size() == 2u);
  }
}

TEST_CASE("transform randomness depends only on (seed, epoch, example index)", "[data][transforms]") {
  const auto set = std::make_shared<const ImageSet>(make_set(37, 12, 12));
  TransformOptions opt;
  opt.resize = 16;
  opt.crop_padding = 3;
  opt.horizontal_flip = true;
  opt.seed = 5;

  // Different batch sizes, shuffling on and off, different shuffle seeds.
  DataLoader a(set, 5, true, false, 11, make_transform(opt));
  DataLoader b(set, 8, false, false, 99, make_transform(opt));
  DataLoader c(set, 37, true, false, 3, make_transform(opt));
  const auto ea = epoch_images(a, 0), eb = epoch_images(b, 0), ec = epoch_images(c, 0);
  REQUIRE(ea.size() == 37u);
  REQUIRE(eb.size() == 37u);
  REQUIRE(ec.size() == 37u);
  for (const auto& [index, img] : ea) {
    INFO("example " << index);
    REQUIRE(img.size() == 16u * 16u);
    REQUIRE(same_bits(img, eb.at(index)));
    REQUIRE(same_bits(img, ec.at(index)));
  }

  SECTION("a hand-made batch in another order agrees with the loader") {
    // Indices 36, 35, ..., 0 in one batch, epoch 0.
    Batch h = make_batch(37, 1, 12, 12, [&](int64_t i, int64_t k) {
      return static_cast<float>(set->pixels[static_cast<size_t>((36 - i) * 144 + k)]) / 255.0f;
    });
    for (int64_t i = 0; i < 37; ++i) h.indices[static_cast<size_t>(i)] = 36 - i;
    make_transform(opt)(h);
    for (int64_t i = 0; i < 37; ++i) REQUIRE(same_bits(image_of(h, i), ea.at(36 - i)));
  }
  SECTION("the next epoch changes the images, and replaying an epoch repeats it") {
    const auto e1 = epoch_images(a, 1);
    int64_t changed = 0;
    for (const auto& [index, img] : e1) changed += !same_bits(img, ea.at(index));
    // Crop (49 offsets) and flip all equal by chance: probability 1/98 each.
    REQUIRE(changed >= 30);
    const auto again = epoch_images(b, 1);
    for (const auto& [index, img] : e1) REQUIRE(same_bits(img, again.at(index)));
  }
  SECTION("another seed changes the images") {
    TransformOptions other = opt;
    other.seed = 6;
    DataLoader d(set, 5, true, false, 11, make_transform(other));
    const auto ed = epoch_images(d, 0);
    int64_t changed = 0;
    for (const auto& [index, img] : ed) changed += !same_bits(img, ea.at(index));
    REQUIRE(changed >= 30);
  }
}

TEST_CASE("the transform is resize, then pad + crop, then flip, then normalise", "[data][transforms]") {
  const int64_t n = 16, ch = 3, h = 10, w = 7, out = 13, pad = 2;
  auto value = [](int64_t i, int64_t k) { return static_cast<float>((i * 31 + k * 17) % 97) / 96.0f; };
  Batch b = make_batch(n, ch, h, w, value, 2, 50);
  const Batch before = b;
  TransformOptions opt;
  opt.resize = out;
  opt.crop_padding = pad;
  opt.horizontal_flip = true;
  opt.mean = {0.5f, 0.25f, 0.125f};
  opt.std = {0.25f, 0.5f, 2.0f};
  opt.seed = 9;
  BatchTransform t = make_transform(opt);
  t(b);

  REQUIRE(b.size == n);
  REQUIRE(b.channels == ch);
  REQUIRE(b.rows == out);
  REQUIRE(b.cols == out);
  REQUIRE(b.images.size() == static_cast<size_t>(n * ch * out * out));
  REQUIRE(b.labels == before.labels);
  REQUIRE(b.indices == before.indices);
  REQUIRE(b.epoch == before.epoch);

  std::set<bool> flips;
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<float> src = image_of(before, i);
    std::vector<float> resized(static_cast<size_t>(ch * out * out)), want(resized.size());
    resize_bilinear(src.data(), ch, h, w, resized.data(), out, out);
    const Augmentation a = draw_augmentation(9, 2, 50 + i, pad);
    flips.insert(a.flip);
    pad_crop(resized.data(), ch, out, out, pad, a.top, a.left, want.data());
    if (a.flip) flip_horizontal(want.data(), ch, out, out);
    normalize(want.data(), ch, out, out, opt.mean.data(), opt.std.data());
    INFO("example " << i);
    REQUIRE(same_bits(image_of(b, i), want));
  }
  REQUIRE(flips.size() == 2u);  // both paths were exercised

  SECTION("every combination of the steps, with and without a size change") {
    // The transform fuses steps and takes different paths (in place, out of
    // place, through a scratch image); each must equal the plain composition.
    for (int mask = 0; mask < 32; ++mask) {
      TransformOptions o;
      o.resize = (mask & 1) ? out : 0;
      o.crop_padding = (mask & 2) ? pad : 0;
      o.horizontal_flip = (mask & 4) != 0;
      if (mask & 8) o.mean = opt.mean, o.std = opt.std;
      if (mask & 16) o.resize = h;  // resize to the height only: the width still changes
      o.seed = 9;
      Batch got = make_batch(n, ch, h, w, value, 2, 50);
      const Batch want = composed(got, o);
      make_transform(o)(got);
      INFO("option mask " << mask);
      REQUIRE(got.rows == want.rows);
      REQUIRE(got.cols == want.cols);
      REQUIRE(same_bits(got.images, want.images));
    }
  }
  SECTION("the same transform object on the next batch (buffers reused) is still right") {
    Batch b2 = make_batch(n, ch, h, w, value, 2, 50);
    t(b2);
    REQUIRE(same_bits(b2.images, b.images));
  }
  SECTION("a new input size rebuilds the resize tables") {
    Batch small = make_batch(2, ch, 5, 4, value, 2, 50);
    const Batch small_before = small;
    opt.crop_padding = 0;
    opt.horizontal_flip = false;
    opt.mean.clear();
    opt.std.clear();
    BatchTransform plain = make_transform(opt);
    Batch big = make_batch(2, ch, h, w, value);
    plain(big);
    plain(small);
    std::vector<float> want(static_cast<size_t>(ch * out * out));
    resize_bilinear(small_before.images.data(), ch, 5, 4, want.data(), out, out);
    REQUIRE(same_bits(image_of(small, 0), want));
  }
  SECTION("an empty batch takes the new shape") {
    Batch e = make_batch(0, ch, h, w, value);
    t(e);
    REQUIRE(e.rows == out);
    REQUIRE(e.cols == out);
    REQUIRE(e.images.empty());
  }
}

TEST_CASE("normalisation subtracts the mean and divides by the std per channel", "[data][transforms]") {
  // 3 channels of 1 x 2; values chosen so that the results are exact in float.
  Batch b = make_batch(1, 3, 1, 2, [](int64_t, int64_t k) {
    const float v[] = {0.0f, 0.75f, 1.0f, 0.5f, 0.25f, 4.25f};
    return v[k];
  });
  TransformOptions opt;
  opt.mean = {0.5f, 0.25f, 0.25f};
  opt.std = {0.25f, 0.5f, 2.0f};
  make_transform(opt)(b);
  REQUIRE(b.rows == 1);
  REQUIRE(b.cols == 2);
  REQUIRE(b.images == std::vector<float>{-2.0f, 1.0f, 1.5f, 0.5f, 0.0f, 2.0f});

  SECTION("Fashion-MNIST statistics on a pixel, to float precision") {
    float x = 200.0f / 255.0f;
    const float mean = 0.2860406f, std = 0.3530242f;
    normalize(&x, 1, 1, 1, &mean, &std);
    REQUIRE(x == Approx((200.0 / 255.0 - 0.2860406) / 0.3530242).epsilon(1e-6));
  }
  SECTION("padding is zero before normalising, so it comes out as -mean / std") {
    Batch p = make_batch(64, 1, 4, 4, [](int64_t, int64_t) { return 1.0f; });
    TransformOptions o;
    o.crop_padding = 2;
    o.mean = {0.5f};
    o.std = {0.25f};
    make_transform(o)(p);
    std::set<float> values(p.images.begin(), p.images.end());
    REQUIRE(values == std::set<float>{-2.0f, 2.0f});
  }
}

TEST_CASE("channel_stats gives the per-channel mean and std of pixel / 255", "[data][transforms]") {
  SECTION("a tiny hand-made set") {
    ImageSet s;
    s.count = 2;
    s.rows = 1;
    s.cols = 2;
    s.pixels = {0, 255, 255, 255};
    s.labels = {0, 1};
    const ChannelStats st = channel_stats(s);
    REQUIRE(st.mean.size() == 1u);
    REQUIRE(st.std.size() == 1u);
    // Values 0, 1, 1, 1: mean 3/4, population variance 3/16.
    REQUIRE(st.mean[0] == Approx(0.75).epsilon(1e-7));
    REQUIRE(st.std[0] == Approx(std::sqrt(3.0) / 4.0).epsilon(1e-7));
  }
  SECTION("a constant set has std exactly 0") {
    ImageSet s;
    s.count = 3;
    s.rows = s.cols = 5;
    s.pixels.assign(75, 51);
    s.labels = {0, 0, 0};
    const ChannelStats st = channel_stats(s);
    REQUIRE(st.mean[0] == Approx(0.2).epsilon(1e-7));
    REQUIRE(st.std[0] == 0.0f);
  }
  SECTION("more pixels than one summation chunk") {
    ImageSet s = make_set(100, 28, 28);  // 78400 pixels
    double sum = 0, sum_sq = 0;
    for (uint8_t p : s.pixels) sum += p / 255.0, sum_sq += (p / 255.0) * (p / 255.0);
    const double n = static_cast<double>(s.pixels.size()), mean = sum / n;
    const ChannelStats st = channel_stats(s);
    REQUIRE(st.mean[0] == Approx(mean).epsilon(1e-6));
    REQUIRE(st.std[0] == Approx(std::sqrt(sum_sq / n - mean * mean)).epsilon(1e-6));
  }
  SECTION("empty or inconsistent sets are refused") {
    ImageSet empty;
    REQUIRE_THROWS_WITH(channel_stats(empty), Contains("empty"));
    ImageSet bad = make_set(2, 3, 3);
    bad.pixels.pop_back();
    REQUIRE_THROWS_WITH(channel_stats(bad), Contains("17 pixels"));
  }
}

TEST_CASE("channel_stats of the Fashion-MNIST training split", "[data][transforms][fashion]") {
  if (!anvil::testing::have_fashion_mnist()) {
    WARN("skipped: " << anvil::testing::kFashionDir << " not found");
    return;
  }
  const ChannelStats st = channel_stats(load_mnist_split(anvil::testing::kFashionDir, true));
  // Computed independently with numpy in float64 over all 47,040,000 pixels.
  REQUIRE(st.mean[0] == Approx(0.286040597).epsilon(1e-6));
  REQUIRE(st.std[0] == Approx(0.353024245).epsilon(1e-6));
}

TEST_CASE("make_transform rejects bad options, naming the field", "[data][transforms]") {
  auto fails = [](auto edit, const std::string& words) {
    TransformOptions o;
    edit(o);
    REQUIRE_THROWS_AS(make_transform(o), std::invalid_argument);
    REQUIRE_THROWS_WITH(make_transform(o), Contains(words));
  };
  fails([](TransformOptions& o) { o.resize = -1; }, "TransformOptions.resize");
  fails([](TransformOptions& o) { o.crop_padding = -2; }, "TransformOptions.crop_padding");
  fails([](TransformOptions& o) { o.mean = {0.5f}; }, "same size");
  fails([](TransformOptions& o) { o.mean = {0.5f, 0.5f}, o.std = {1.0f, 0.0f}; }, "TransformOptions.std[1]");
  fails([](TransformOptions& o) { o.mean = {0.5f}, o.std = {-1.0f}; }, "TransformOptions.std[0]");
  fails([](TransformOptions& o) { o.mean = {0.5f}, o.std = {std::nanf("")}; }, "TransformOptions.std[0]");
  fails([](TransformOptions& o) { o.mean = {std::numeric_limits<float>::infinity()}, o.std = {1.0f}; },
        "TransformOptions.mean[0]");
  TransformOptions ok;
  ok.resize = 1;
  ok.mean = {0.0f};
  ok.std = {1e-3f};
  REQUIRE_NOTHROW(make_transform(ok));

  SECTION("mean/std that do not match the batch's channels fail at run time") {
    TransformOptions o;
    o.mean = {0.1f, 0.2f, 0.3f};
    o.std = {1.0f, 1.0f, 1.0f};
    BatchTransform t = make_transform(o);
    Batch b = make_batch(2, 1, 4, 4, [](int64_t, int64_t) { return 0.5f; });
    REQUIRE_THROWS_WITH(t(b), Contains("mean/std have 3 entries but the batch has 1 channel"));
    // Inside a DataLoader, next() rethrows it.
    ImageSet set = make_set(4, 4, 4);
    DataLoader loader(set, 2, false, false, 0, make_transform(o));
    loader.start_epoch();
    Batch out;
    REQUIRE_THROWS_WITH(loader.next(out), Contains("mean/std"));
  }
  SECTION("an inconsistent batch is refused") {
    BatchTransform t = make_transform(TransformOptions{});
    Batch b = make_batch(2, 1, 4, 4, [](int64_t, int64_t) { return 0.5f; });
    b.images.pop_back();
    REQUIRE_THROWS_WITH(t(b), Contains("31 pixel values, expected 32"));
    TransformOptions crop;
    crop.crop_padding = 1;
    Batch c = make_batch(2, 1, 4, 4, [](int64_t, int64_t) { return 0.5f; });
    c.indices.pop_back();
    REQUIRE_THROWS_WITH(make_transform(crop)(c), Contains("example indices"));
  }
}

TEST_CASE("a DataLoader with the transform yields batches of the new shape", "[data][transforms]") {
  const ImageSet set = make_set(10, 28, 28);
  TransformOptions opt;
  opt.resize = 96;
  opt.mean = {0.25f};
  opt.std = {0.5f};
  DataLoader plain(set, 4, true, false, 3);
  DataLoader resized(set, 4, true, false, 3, make_transform(opt));
  opt.crop_padding = 4;
  opt.horizontal_flip = true;
  DataLoader augmented(set, 4, true, false, 3, make_transform(opt));
  plain.start_epoch();
  resized.start_epoch();
  augmented.start_epoch();
  Batch p, r, a;
  std::vector<int64_t> sizes;
  while (plain.next(p)) {
    REQUIRE(resized.next(r));
    REQUIRE(augmented.next(a));
    sizes.push_back(p.size);
    for (const Batch* b : {&r, &a}) {
      REQUIRE(b->size == p.size);
      REQUIRE(b->channels == 1);
      REQUIRE(b->rows == 96);
      REQUIRE(b->cols == 96);
      REQUIRE(b->images.size() == static_cast<size_t>(p.size * 96 * 96));
      REQUIRE(b->labels == p.labels);
      REQUIRE(b->indices == p.indices);
      REQUIRE(b->index == p.index);
    }
    // Without crop and flip: the resized, normalised loader image.
    for (int64_t i = 0; i < p.size; ++i) {
      std::vector<float> want(96 * 96);
      resize_bilinear(p.images.data() + i * 28 * 28, 1, 28, 28, want.data(), 96, 96);
      const float mean = 0.25f, std = 0.5f;
      normalize(want.data(), 1, 96, 96, &mean, &std);
      REQUIRE(same_bits(image_of(r, i), want));
    }
  }
  REQUIRE_FALSE(resized.next(r));
  REQUIRE_FALSE(augmented.next(a));
  REQUIRE(sizes == std::vector<int64_t>{4, 4, 2});
}
