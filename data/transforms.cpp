#include "data/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace anvil::data {

namespace {

// ---- Randomness: splitmix64 (Steele, Lea, Flood 2014), fully specified by
// integer arithmetic, so every platform draws the same values.

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
// Mixed into the user's seed so that these draws do not share a state with
// other splitmix64 streams derived from the same seed (the DataLoader derives
// its shuffle seed with splitmix64 too).
constexpr uint64_t kAugmentDomain = 0x6175676d656e7431ull;  // "augment1"

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, n) from one 64-bit draw by multiply-shift (Lemire): one draw
// per choice keeps the draw sequence fixed; the bias, at most n / 2^64, is
// far below anything a training run could notice.
uint64_t below(uint64_t r, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(r) * n) >> 64);
}

std::string field(const char* name, size_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; }

void validate_options(const TransformOptions& o) {
  if (o.resize < 0)
    throw std::invalid_argument("TransformOptions.resize must be >= 0 (0 keeps the size), got " +
                                std::to_string(o.resize));
  if (o.crop_padding < 0)
    throw std::invalid_argument("TransformOptions.crop_padding must be >= 0, got " +
                                std::to_string(o.crop_padding));
  if (o.mean.size() != o.std.size())
    throw std::invalid_argument("TransformOptions.mean and TransformOptions.std must have the same size, got " +
                                std::to_string(o.mean.size()) + " and " + std::to_string(o.std.size()));
  for (size_t i = 0; i < o.mean.size(); ++i) {
    if (!std::isfinite(o.mean[i]))
      throw std::invalid_argument("TransformOptions." + field("mean", i) + " must be finite, got " +
                                  std::to_string(o.mean[i]));
    // Written so that NaN fails too.
    if (!(o.std[i] > 0.0f) || !std::isfinite(o.std[i]))
      throw std::invalid_argument("TransformOptions." + field("std", i) + " must be finite and > 0, got " +
                                  std::to_string(o.std[i]));
  }
}

void check_image_args(const char* fn, int64_t channels, int64_t h, int64_t w) {
  if (channels < 1 || h < 1 || w < 1)
    throw std::invalid_argument(std::string(fn) + ": channels, height and width must be >= 1, got " +
                                std::to_string(channels) + " x " + std::to_string(h) + " x " + std::to_string(w));
}

// normalize(flip(pad_crop(src))) for one image in a single pass from src to
// dst (not overlapping), with the arithmetic of those three functions, so the
// result is bit-identical to calling them in turn; it just reads and writes
// each pixel once instead of three times. padding = top = left = 0 means no
// crop, shift 0 and scale 1 no normalisation ((x - 0) * 1 == x exactly).
void crop_flip_normalize(const float* src, int64_t channels, int64_t h, int64_t w, int64_t padding, int64_t top,
                         int64_t left, bool flip, const float* shift, const float* scale, float* dst) {
  // As in pad_crop: output (y, x) of the crop reads source (y + dy, x + dx);
  // crop rows [y0, y1) and columns [x0, x1) come from the source.
  const int64_t dy = top - padding, dx = left - padding;
  const int64_t y0 = std::max<int64_t>(0, -dy), y1 = std::min(h, h - dy);
  const int64_t x0 = std::max<int64_t>(0, -dx), x1 = std::min(w, w - dx);
  // After the flip, output column x shows crop column w - 1 - x: the source
  // columns land on [w - x1, w - x0).
  const int64_t lo = flip ? w - x1 : x0, hi = flip ? w - x0 : x1;
  for (int64_t c = 0; c < channels; ++c) {
    const float m = shift[c], k = scale[c];
    const float pad_value = (0.0f - m) * k;
    for (int64_t y = 0; y < h; ++y) {
      float* __restrict out = dst + (c * h + y) * w;
      if (y < y0 || y >= y1 || lo >= hi) {
        std::fill(out, out + w, pad_value);
        continue;
      }
      const float* __restrict row = src + (c * h + y + dy) * w;
      std::fill(out, out + lo, pad_value);
      if (flip) {
        // out[x] = crop[w - 1 - x] = row[w - 1 - x + dx]
        const float* __restrict back = row + (w - 1 + dx);
        for (int64_t x = lo; x < hi; ++x) out[x] = (back[-x] - m) * k;
      } else {
        const float* __restrict from = row + dx;
        for (int64_t x = lo; x < hi; ++x) out[x] = (from[x] - m) * k;
      }
      std::fill(out + hi, out + w, pad_value);
    }
  }
}

// The state behind make_transform's BatchTransform. Held by value in the
// std::function, so a copy of the function owns separate buffers.
class Transform {
 public:
  explicit Transform(TransformOptions o) : opt_(std::move(o)) {}

  void operator()(Batch& b) {
    const int64_t n = b.size, ch = b.channels, in_h = b.rows, in_w = b.cols;
    check_batch(b);
    const int64_t out_h = opt_.resize > 0 ? opt_.resize : in_h;
    const int64_t out_w = opt_.resize > 0 ? opt_.resize : in_w;
    const bool resizing = out_h != in_h || out_w != in_w;
    const bool cropping = opt_.crop_padding > 0;
    const bool normalising = !opt_.mean.empty();
    // Crop, flip and normalise run as one pass (crop_flip_normalize) when the
    // pixels move anyway; otherwise flip and normalise work in place.
    const bool later_steps = cropping || opt_.horizontal_flip || normalising;
    const int64_t in_numel = ch * in_h * in_w, out_numel = ch * out_h * out_w;
    if (!resizing && !later_steps) return;

    if (resizing && !(resizer_ && resizer_->in_h() == in_h && resizer_->in_w() == in_w &&
                      resizer_->out_h() == out_h && resizer_->out_w() == out_w))
      resizer_.emplace(in_h, in_w, out_h, out_w);
    shift_.assign(static_cast<size_t>(ch), 0.0f);
    scale_.assign(static_cast<size_t>(ch), 1.0f);
    if (normalising)
      for (int64_t c = 0; c < ch; ++c) shift_[c] = opt_.mean[c], scale_[c] = 1.0f / opt_.std[c];

    // Resize and crop change the size or move pixels: the batch's pixels move
    // to input_ and the results go back into b.images. Swapping rather than
    // copying costs nothing; the DataLoader cycles a few Batch buffers
    // through here, and once each has grown to the output size (a handful of
    // batches) nothing is allocated.
    const bool out_of_place = resizing || cropping;
    if (out_of_place) {
      input_.swap(b.images);
      b.images.resize(static_cast<size_t>(n * out_numel));
    }
    // One image between the resize and the fused pass; small enough to stay
    // in cache.
    if (resizing && later_steps) image_.resize(static_cast<size_t>(out_numel));
    b.rows = out_h;
    b.cols = out_w;

    for (int64_t i = 0; i < n; ++i) {
      float* dst = b.images.data() + i * out_numel;
      const float* src = out_of_place ? input_.data() + i * in_numel : dst;
      if (!later_steps) {
        resizer_->apply(src, ch, dst);
        continue;
      }
      Augmentation a;  // no crop, no flip
      if (cropping || opt_.horizontal_flip)
        a = draw_augmentation(opt_.seed, b.epoch, b.indices[static_cast<size_t>(i)], opt_.crop_padding);
      if (!out_of_place) {  // flip and/or normalise, in place
        if (opt_.horizontal_flip && a.flip) flip_horizontal(dst, ch, out_h, out_w);
        if (normalising) normalize(dst, ch, out_h, out_w, opt_.mean.data(), opt_.std.data());
        continue;
      }
      if (resizing) {
        resizer_->apply(src, ch, image_.data());
        src = image_.data();
      }
      crop_flip_normalize(src, ch, out_h, out_w, opt_.crop_padding, a.top, a.left, opt_.horizontal_flip && a.flip,
                          shift_.data(), scale_.data(), dst);
    }
  }

 private:
  void check_batch(const Batch& b) const {
    const std::string where = "data transform: batch ";
    if (b.size < 0 || b.channels < 1 || b.rows < 0 || b.cols < 0 || (b.size > 0 && (b.rows == 0 || b.cols == 0)))
      throw std::invalid_argument(where + "has an invalid shape " + std::to_string(b.size) + " x " +
                                  std::to_string(b.channels) + " x " + std::to_string(b.rows) + " x " +
                                  std::to_string(b.cols));
    const auto numel = static_cast<size_t>(b.size * b.channels * b.rows * b.cols);
    if (b.images.size() != numel)
      throw std::invalid_argument(where + "holds " + std::to_string(b.images.size()) + " pixel values, expected " +
                                  std::to_string(numel) + " for its shape");
    if ((opt_.crop_padding > 0 || opt_.horizontal_flip) && b.indices.size() != static_cast<size_t>(b.size))
      throw std::invalid_argument(where + "has " + std::to_string(b.indices.size()) +
                                  " example indices for " + std::to_string(b.size) +
                                  " examples (random crops and flips are drawn per example index)");
    if (!opt_.mean.empty() && opt_.mean.size() != static_cast<size_t>(b.channels))
      throw std::invalid_argument("data transform: TransformOptions.mean/std have " +
                                  std::to_string(opt_.mean.size()) + " entries but the batch has " +
                                  std::to_string(b.channels) + " channel(s)");
  }

  TransformOptions opt_;
  std::optional<BilinearResize> resizer_;  // for the last size pair seen
  std::vector<float> input_;               // the batch's pixels before an out-of-place step
  std::vector<float> image_;               // one image: the input of crop_flip_normalize
  std::vector<float> shift_, scale_;       // per channel: mean and 1 / std, or 0 and 1
};

}  // namespace

BatchTransform make_transform(const TransformOptions& options) {
  validate_options(options);
  return Transform(options);
}

// ---- channel_stats

ChannelStats channel_stats(const ImageSet& set) {
  if (set.count < 1 || set.rows < 1 || set.cols < 1)
    throw std::invalid_argument("channel_stats: the ImageSet is empty or has an invalid shape (" +
                                std::to_string(set.count) + " x " + std::to_string(set.rows) + " x " +
                                std::to_string(set.cols) + ")");
  const auto numel = static_cast<uint64_t>(set.count * set.rows * set.cols);
  if (set.pixels.size() != numel)
    throw std::invalid_argument("channel_stats: the ImageSet has " + std::to_string(set.pixels.size()) +
                                " pixels, expected count x rows x cols = " + std::to_string(numel));
  // Integer sums are exact, so the variance below is computed without
  // cancellation. Each chunk sums into 32 bits, which the compiler
  // vectorises, and is small enough not to overflow (32768 * 255^2 < 2^32).
  constexpr size_t kChunk = 32768;
  uint64_t sum = 0, sum_sq = 0;
  const uint8_t* p = set.pixels.data();
  for (size_t begin = 0; begin < numel; begin += kChunk) {
    const size_t end = std::min<size_t>(numel, begin + kChunk);
    uint32_t s = 0, q = 0;
    for (size_t k = begin; k < end; ++k) {
      const uint32_t v = p[k];
      s += v;
      q += v * v;
    }
    sum += s;
    sum_sq += q;
  }
  // var(pixel) * n^2 = n * sum_sq - sum^2, exactly, in 128 bits.
  const auto n = static_cast<unsigned __int128>(numel);
  const unsigned __int128 var_n2 = n * sum_sq - static_cast<unsigned __int128>(sum) * sum;
  const double nd = static_cast<double>(numel);
  const double mean = static_cast<double>(sum) / nd / 255.0;
  const double var = static_cast<double>(var_n2) / (nd * nd) / (255.0 * 255.0);
  return ChannelStats{{static_cast<float>(mean)}, {static_cast<float>(std::sqrt(var))}};
}

// ---- Bilinear resize

// PyTorch's rule (upsample_bilinear2d, align_corners=False): source
// coordinate s = (in / out) * (k + 0.5) - 0.5, clamped at 0; i0 = floor(s)
// (at most in - 1), i1 = i0 + 1 except at the last source index; w1 = s - i0,
// w0 = 1 - w1; equal sizes copy. The rounding follows torch's CPU kernel (as
// measured against torch 1.13's output, bit for bit on every golden axis):
// the ratio in/out is a float, s and s - i0 are evaluated in double, and w1
// is then rounded to float, w0 = 1 - w1 computed in float. Evaluating s in
// float instead moves weights by up to 2 float ulps and the resized pixels by
// up to 8 ulps (~1e-6).
BilinearResize::Axis BilinearResize::make_axis(int64_t in, int64_t out) {
  Axis a;
  a.i0.resize(static_cast<size_t>(out));
  a.i1.resize(static_cast<size_t>(out));
  a.w0.resize(static_cast<size_t>(out));
  a.w1.resize(static_cast<size_t>(out));
  const auto scale = static_cast<double>(static_cast<float>(in) / static_cast<float>(out));
  for (int64_t k = 0; k < out; ++k) {
    int64_t i0 = k;
    float w1 = 0.0f;
    if (in != out) {
      const double s = std::max(scale * (static_cast<double>(k) + 0.5) - 0.5, 0.0);
      i0 = std::min(static_cast<int64_t>(s), in - 1);  // s >= 0: truncation is floor
      w1 = static_cast<float>(std::clamp(s - static_cast<double>(i0), 0.0, 1.0));
    }
    a.i0[k] = static_cast<int32_t>(i0);
    a.i1[k] = static_cast<int32_t>(i0 < in - 1 ? i0 + 1 : i0);
    a.w0[k] = 1.0f - w1;
    a.w1[k] = w1;
  }
  return a;
}

BilinearResize::BilinearResize(int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w)
    : in_h_(in_h), in_w_(in_w), out_h_(out_h), out_w_(out_w) {
  // The tables hold 32-bit indices; 2^24 keeps every size far from that and
  // exactly representable as a float coordinate.
  constexpr int64_t kMaxSide = int64_t{1} << 24;
  for (int64_t v : {in_h, in_w, out_h, out_w})
    if (v < 1 || v > kMaxSide)
      throw std::invalid_argument("BilinearResize: sizes must be in [1, 2^24], got " + std::to_string(in_h) + "x" +
                                  std::to_string(in_w) + " -> " + std::to_string(out_h) + "x" +
                                  std::to_string(out_w));
  rows_ = make_axis(in_h, out_h);
  cols_ = make_axis(in_w, out_w);
  transposed_.resize(static_cast<size_t>(in_w * in_h));
  columns_.resize(static_cast<size_t>(out_w * in_h));
  horizontal_.resize(static_cast<size_t>(in_h * out_w));
}

// a * wa + b * wb. With hardware FMA it is fused as fma(a, wa, b * wb): the
// rounding torch's CPU kernel gets from its compiler (its generic path,
// used for more than one channel, then matches bit for bit), and ours no
// longer depends on whether our compiler chooses to contract. Without FMA
// the plain expression differs from that by at most an ulp.
inline float blend(float a, float wa, float b, float wb) {
#ifdef FP_FAST_FMAF
  return std::fma(a, wa, b * wb);
#else
  return a * wa + b * wb;
#endif
}

// Separable, in torch's order of operations: each output is
//   blend(blend(a, w0_col, b, w1_col), w0_row, blend(c, w0_col, d, w1_col), w1_row)
// (for one channel torch takes its channels-last path, which sums the four
// terms in another order: at most 1 ulp apart).
//
// The horizontal pass interpolates every source row along x. Done row by row
// it is a gather (row[i0[x]], row[i1[x]]) that does not vectorise and took
// most of the time; on the transposed plane it becomes, for each output
// column, a blend of two contiguous source columns, which does. So: transpose
// the plane (in_h x in_w -> in_w x in_h), blend columns into columns_
// (out_w x in_h), transpose that into horizontal_ (in_h x out_w). The
// vertical pass then blends two rows of horizontal_ per output row, also
// contiguous. For 28 -> 96 that is 784 + 2688 moves and 2688 + 9216 blends
// per channel, all but the moves in vector instructions; the results are
// bit-identical to the row-by-row gather.
void BilinearResize::apply(const float* src, int64_t channels, float* dst) {
  const int64_t ih = in_h_, iw = in_w_, oh = out_h_, ow = out_w_;
  float* __restrict tr = transposed_.data();
  float* __restrict cols = columns_.data();
  float* __restrict hz = horizontal_.data();
  for (int64_t c = 0; c < channels; ++c) {
    const float* __restrict s = src + c * ih * iw;
    float* __restrict d = dst + c * oh * ow;
    for (int64_t y = 0; y < ih; ++y)
      for (int64_t x = 0; x < iw; ++x) tr[x * ih + y] = s[y * iw + x];
    for (int64_t x = 0; x < ow; ++x) {
      const float* __restrict a = tr + cols_.i0[x] * ih;
      const float* __restrict b = tr + cols_.i1[x] * ih;
      const float wa = cols_.w0[x], wb = cols_.w1[x];
      float* __restrict out = cols + x * ih;
      for (int64_t y = 0; y < ih; ++y) out[y] = blend(a[y], wa, b[y], wb);
    }
    for (int64_t y = 0; y < ih; ++y)
      for (int64_t x = 0; x < ow; ++x) hz[y * ow + x] = cols[x * ih + y];
    for (int64_t y = 0; y < oh; ++y) {
      const float* __restrict a = hz + rows_.i0[y] * ow;
      const float* __restrict b = hz + rows_.i1[y] * ow;
      const float wa = rows_.w0[y], wb = rows_.w1[y];
      float* __restrict out = d + y * ow;
      for (int64_t x = 0; x < ow; ++x) out[x] = blend(a[x], wa, b[x], wb);
    }
  }
}

void resize_bilinear(const float* src, int64_t channels, int64_t h, int64_t w, float* dst, int64_t out_h,
                     int64_t out_w) {
  check_image_args("resize_bilinear", channels, h, w);
  BilinearResize(h, w, out_h, out_w).apply(src, channels, dst);
}

// ---- Crop, flip, normalise

void pad_crop(const float* src, int64_t channels, int64_t h, int64_t w, int64_t padding, int64_t top, int64_t left,
              float* dst) {
  check_image_args("pad_crop", channels, h, w);
  if (padding < 0 || top < 0 || top > 2 * padding || left < 0 || left > 2 * padding)
    throw std::invalid_argument("pad_crop: need 0 <= top, left <= 2 * padding, got padding " +
                                std::to_string(padding) + ", top " + std::to_string(top) + ", left " +
                                std::to_string(left));
  // Output (y, x) reads source (y + dy, x + dx). Source rows [0, h) land on
  // output rows [y0, y1), and likewise for columns; the rest is padding.
  const int64_t dy = top - padding, dx = left - padding;
  const int64_t y0 = std::max<int64_t>(0, -dy), y1 = std::min(h, h - dy);
  const int64_t x0 = std::max<int64_t>(0, -dx), x1 = std::min(w, w - dx);
  for (int64_t c = 0; c < channels; ++c) {
    const float* s = src + c * h * w;
    float* d = dst + c * h * w;
    for (int64_t y = 0; y < h; ++y) {
      float* out = d + y * w;
      if (y < y0 || y >= y1 || x0 >= x1) {
        std::fill(out, out + w, 0.0f);
        continue;
      }
      std::fill(out, out + x0, 0.0f);
      std::memcpy(out + x0, s + (y + dy) * w + (x0 + dx), static_cast<size_t>(x1 - x0) * sizeof(float));
      std::fill(out + x1, out + w, 0.0f);
    }
  }
}

void flip_horizontal(float* image, int64_t channels, int64_t h, int64_t w) {
  for (int64_t r = 0; r < channels * h; ++r) std::reverse(image + r * w, image + (r + 1) * w);
}

void normalize(float* image, int64_t channels, int64_t h, int64_t w, const float* mean, const float* std) {
  const int64_t plane = h * w;
  for (int64_t c = 0; c < channels; ++c) {
    const float m = mean[c], inv = 1.0f / std[c];
    float* __restrict p = image + c * plane;
    for (int64_t k = 0; k < plane; ++k) p[k] = (p[k] - m) * inv;
  }
}

// ---- Random choices

Augmentation draw_augmentation(uint64_t seed, uint64_t epoch, int64_t example_index, int64_t crop_padding) {
  // Key the stream by the three inputs, each through a full mixing round so
  // that neighbouring epochs or indices give unrelated streams.
  uint64_t key = mix64(seed ^ kAugmentDomain);
  key = mix64(key ^ mix64(epoch + kGolden));
  key = mix64(key ^ mix64(static_cast<uint64_t>(example_index) + 2 * kGolden));
  // The first three outputs of splitmix64 started at `key`, always in this
  // order (top, left, flip) whatever the options, so turning one choice on
  // or off does not change the others.
  const uint64_t r_top = mix64(key + kGolden), r_left = mix64(key + 2 * kGolden), r_flip = mix64(key + 3 * kGolden);
  const uint64_t span = crop_padding > 0 ? static_cast<uint64_t>(2 * crop_padding + 1) : 1;
  Augmentation a;
  a.top = static_cast<int64_t>(below(r_top, span));
  a.left = static_cast<int64_t>(below(r_left, span));
  a.flip = (r_flip >> 63) != 0;
  return a;
}

}  // namespace anvil::data
