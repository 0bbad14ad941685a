// Image transforms for training: resize, pad + random crop, horizontal flip,
// normalisation, as a DataLoader BatchTransform.
//
//   TransformOptions opt;
//   opt.resize = 96;                       // Fashion-MNIST 28x28 -> 96x96 for ResNet
//   opt.crop_padding = 4;                  // pad 4, random 96x96 crop
//   opt.horizontal_flip = true;
//   ChannelStats s = channel_stats(*train_set);
//   opt.mean = s.mean; opt.std = s.std;
//   opt.seed = 1;
//   DataLoader loader(train_set, 256, true, false, 1, make_transform(opt));
//
// Order, as torchvision's Compose([Resize, RandomCrop(padding), RandomHorizontalFlip,
// ToTensor, Normalize]): resize, pad + random crop, flip, normalise. The padding
// is zeros before normalisation, so padded pixels come out as -mean / std.
//
// Reproducibility: each example's crop offsets and flip come from an RNG
// seeded from (options.seed, batch.epoch, the example's index in the ImageSet
// = batch.indices[i]) alone, so they do not depend on batch size, batch
// composition, shuffling or thread timing, and are the same on every platform
// (splitmix64 with integer arithmetic; no std::*_distribution).
//
// Resizing is PyTorch's F.interpolate(mode="bilinear", align_corners=False,
// antialias=False) on the float image (pixel / 255), to 1 float ulp. The seed
// recipes use torchvision's Resize on PIL uint8 images instead, which rounds
// the result to uint8 and antialiases when shrinking. Measured on 200
// Fashion-MNIST images: enlarging 28 -> 96 the two differ by at most 1 grey
// level (mean 0.17 of a level); shrinking 28 -> 14 by up to 69 levels.
#pragma once

#include <cstdint>
#include <vector>

#include "data/dataloader.h"
#include "data/idx.h"

namespace anvil::data {

struct TransformOptions {
  int64_t resize = 0;            // 0 keeps the size; else bilinear resize to resize x resize
  int64_t crop_padding = 0;      // >0: zero-pad by this many pixels, then a random crop of the (resized) size
  bool horizontal_flip = false;  // flip each image with probability 0.5
  std::vector<float> mean, std;  // empty: no normalisation; else (x - mean[c]) / std[c] per channel
  uint64_t seed = 0;             // randomness derives from (seed, batch.epoch, example index)
};

// A BatchTransform applying, in this order: resize, pad + random crop, flip,
// normalise. After a resize the batch's rows/cols are the new size and its
// images hold the resized pixels; labels, indices, epoch and index are
// untouched. The returned function keeps scratch buffers (so that a batch
// allocates nothing once they have grown): one thread at a time may call it,
// as the DataLoader does; a copy has buffers of its own.
// Throws std::invalid_argument naming the field for bad options (negative
// resize or crop_padding, a std entry that is not > 0, non-finite values,
// mean and std of different sizes). The transform itself throws
// std::invalid_argument when mean/std do not have one entry per channel of
// the batch, or the batch is inconsistent.
BatchTransform make_transform(const TransformOptions& options);

// Per-channel mean and (population) standard deviation of pixel / 255 over
// every pixel of every image of a set. ImageSet is grey-scale: one channel.
// Exact integer sums, so the result does not depend on summation order.
// Throws std::invalid_argument for an empty or inconsistent set.
struct ChannelStats {
  std::vector<float> mean, std;
};
ChannelStats channel_stats(const ImageSet& set);

// ---- The building blocks, on one CHW float image (for tests and benchmarks).

// Bilinear resize with precomputed source indices and weights for one size
// pair (computed once, used for every image). apply() uses internal scratch
// buffers: one thread at a time per object.
class BilinearResize {
 public:
  // Throws std::invalid_argument unless every size is >= 1.
  BilinearResize(int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w);

  // src: channels x in_h x in_w; dst: channels x out_h x out_w, not
  // overlapping src.
  void apply(const float* src, int64_t channels, float* dst);

  int64_t in_h() const { return in_h_; }
  int64_t in_w() const { return in_w_; }
  int64_t out_h() const { return out_h_; }
  int64_t out_w() const { return out_w_; }

 private:
  // For each output index along one axis: the two source indices and their
  // weights (i1 == i0 at the far edge, where w1 == 0).
  struct Axis {
    std::vector<int32_t> i0, i1;
    std::vector<float> w0, w1;
  };
  static Axis make_axis(int64_t in, int64_t out);

  int64_t in_h_, in_w_, out_h_, out_w_;
  Axis rows_, cols_;
  // Scratch for one channel (see apply()): the source plane transposed
  // (in_w x in_h), the horizontal pass column by column (out_w x in_h), and
  // the same as rows (in_h x out_w).
  std::vector<float> transposed_, columns_, horizontal_;
};

// One-off form of BilinearResize (builds the tables on every call).
void resize_bilinear(const float* src, int64_t channels, int64_t h, int64_t w, float* dst, int64_t out_h,
                     int64_t out_w);

// The h x w window at (top, left) of the image zero-padded by `padding` on
// every side: dst[c][y][x] = src[c][y + top - padding][x + left - padding],
// or 0 where that lies in the padding. top and left must be in
// [0, 2 * padding] (std::invalid_argument otherwise). dst must not overlap src.
void pad_crop(const float* src, int64_t channels, int64_t h, int64_t w, int64_t padding, int64_t top,
              int64_t left, float* dst);

// Mirrors every row in place: x -> w - 1 - x.
void flip_horizontal(float* image, int64_t channels, int64_t h, int64_t w);

// In place: x = (x - mean[c]) * (1 / std[c]). Multiplying by the reciprocal
// differs from torchvision's division by at most an ulp or so.
void normalize(float* image, int64_t channels, int64_t h, int64_t w, const float* mean, const float* std);

// The random choices for one example: the crop window's offsets into the
// padded image (each in [0, 2 * crop_padding]) and whether to flip. A pure
// function of its arguments; make_transform uses it with
// example_index = batch.indices[i].
struct Augmentation {
  int64_t top = 0, left = 0;
  bool flip = false;
};
Augmentation draw_augmentation(uint64_t seed, uint64_t epoch, int64_t example_index, int64_t crop_padding);

}  // namespace anvil::data
