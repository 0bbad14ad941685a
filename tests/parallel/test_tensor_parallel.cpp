// Tensor parallel (parallel/tensor_parallel.h) against one device. LeNet
// with its linear layers 7 and 9 split over the ranks (column-parallel, then
// row-parallel): the first forward's logits lie within the bound that the
// new order of the sums allows, derived below; after 3 steps of SGD (1 on
// the simulator) the weights (the shards gathered into one model) and the
// epoch's figures lie within the data-parallel tests' tolerance, and the
// layers every rank runs whole (the convolutions) are bit for bit the same
// on every rank. The split convolutions (column, row, column with its
// channels gathered), each against the whole Conv2d on the same input:
// output, input, weight and bias gradients within the bounds of their sums'
// order. A narrow ResNet-18 with every residual block split: a few steps
// end where one device does. Over MPI on the processes mpiexec starts (the
// tag [mpi_model_parallel]: 2 and 4 ranks) and over NCCL on 2 simulated GPUs.
#include <catch2/catch.hpp>

#include <cmath>

#include "core/precision.h"
#include "core/random.h"

#include "core/autocast.h"
#include "core/autograd.h"
#include "parallel/tensor_parallel.h"
#include "tests/parallel/data_parallel_scenarios.h"
#include "tests/parallel/ranks.h"
#include "tests/parallel/split_scenarios.h"

using namespace parallel_test;
namespace par = anvil::parallel;

namespace {

double gamma(double m) {
  const double u = std::ldexp(1.0, -24);
  return m * u / (1 - m * u);
}

// The first `n` images of `set` as a batch on `device`.
Tensor first_images(const data::ImageSet& set, int64_t n, anvil::Device device) {
  std::vector<float> v;
  for (int64_t i = 0; i < n * 784; ++i) v.push_back(float(set.pixels[size_t(i)]) / 255.0f);
  return Tensor::from_vector(v, {n, 1, 28, 28}, device);
}

std::vector<double> doubles(const Tensor& t) {
  std::vector<double> out;
  for (float f : t.detach().to(anvil::Device::cpu()).to(DType::Float32).to_vector())
    out.push_back(f);
  return out;
}

std::vector<double> doubles(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// FP32 products and sums in the convolutions for a scope (process-wide: the
// NCCL tests set it before their threads start): the CPU's Winograd and the
// GPU's TF32 compute other sums than the products the bounds below count.
struct IeeeConvolutions {
  anvil::Fp32Precision before = anvil::fp32_precision(anvil::OpFamily::kConv);
  IeeeConvolutions() { anvil::set_fp32_precision(anvil::OpFamily::kConv, anvil::Fp32Precision::kIeee); }
  ~IeeeConvolutions() { anvil::set_fp32_precision(anvil::OpFamily::kConv, before); }
};

// `images` in batches of 8: 3 steps over MPI, 1 on the simulator's GPUs.
Outcomes tensor_parallel_scenario(Communicator& comm, int64_t images) {
  namespace nn = anvil::nn;
  const anvil::Device device = comm.device();
  const int n = comm.size();
  const data::ImageSet set = synthetic_images(images, 5);
  const anvil::optim::SGDOptions sgd{.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4,
                                     .nesterov = true};
  auto reference = std::dynamic_pointer_cast<nn::Sequential>(make_model("lenet", 1));
  auto whole = std::dynamic_pointer_cast<nn::Sequential>(make_model("lenet", 1));
  reference->to(device);
  whole->to(device);
  auto split = par::split_tensor_parallel(comm, *whole, par::tensor_parallel_plan("lenet"));
  Outcomes out;
  const std::string tag =
      fmt::format("LeNet's linear layers over {} ranks, {} steps", n, images / 8);

  // The first forward. Both compute the convolutions alike (the same input h
  // of layer 7), then z = b9 + W9 relu(b7 + W7 h). One device sums each
  // output of layer 9 over 128 terms and the bias; the split layers over
  // 128/n terms, then the ring adds the n partial sums and the bias follows:
  // by the usual bound on a sum of m terms, each within gamma(m) of the
  // exact sum of the terms' magnitudes (S2: sum_k |a_k W9_jk| + |b9_j|). Each
  // layer-7 output a_k is a sum of 801 terms either way, computed by
  // different GEMMs, so the two a_k differ by at most 2 gamma(801) S1_k
  // (S1_k: sum_i |h_i W7_ki| + |b7_k|), carried to z_j through |W9_jk|.
  {
    anvil::NoGradGuard no_grad;
    const Tensor x = first_images(set, 8, device);
    Tensor h = x;
    for (size_t i = 0; i < 7; ++i) h = (*reference)[i](h);
    const auto& l7 = dynamic_cast<const nn::Linear&>((*reference)[7]);
    const auto& l9 = dynamic_cast<const nn::Linear&>((*reference)[9]);
    const std::vector<double> hv = doubles(h), w7 = doubles(l7.weight), b7 = doubles(l7.bias),
                              w9 = doubles(l9.weight), b9 = doubles(l9.bias);
    std::vector<double> bound;
    for (int64_t e = 0; e < 8; ++e) {
      std::vector<double> a(128), s1(128);
      for (int64_t k = 0; k < 128; ++k) {
        double sum = b7[size_t(k)];
        s1[size_t(k)] = std::fabs(b7[size_t(k)]);
        for (int64_t i = 0; i < 800; ++i) {
          const double t = hv[size_t(e * 800 + i)] * w7[size_t(k * 800 + i)];
          sum += t;
          s1[size_t(k)] += std::fabs(t);
        }
        a[size_t(k)] = std::max(sum, 0.0);
      }
      for (int64_t j = 0; j < 10; ++j) {
        double s2 = std::fabs(b9[size_t(j)]), carried = 0;
        for (int64_t k = 0; k < 128; ++k) {
          s2 += std::fabs(a[size_t(k)] * w9[size_t(j * 128 + k)]);
          carried += std::fabs(w9[size_t(j * 128 + k)]) * s1[size_t(k)];
        }
        bound.push_back((gamma(129) + gamma(128.0 / n + n)) * s2 + 2 * gamma(801) * carried);
      }
    }
    out.push_back({"first forward's logits within the bound, " + tag, doubles((*split)(x)),
                   doubles((*reference)(x)), 0, bound});
  }
  // Steps of SGD, then the split layers gathered into one model.
  anvil::optim::SGD ref_opt(reference->parameters(), sgd), opt(split->parameters(), sgd);
  data::DataLoader ref_loader(set, 8, true, false, 3), loader(set, 8, true, false, 3);
  const train::EpochStats want = train::train_epoch(*reference, ref_opt, ref_loader, device);
  const train::EpochStats got = train::train_epoch(*split, opt, loader, device);
  out.push_back({"the epoch's loss, accuracy and examples, " + tag,
                 {got.loss, got.accuracy, double(got.examples)},
                 {want.loss, want.accuracy, double(want.examples)}, 1e-4});
  par::gather_tensor_parallel(comm, *split, *whole);
  out.push_back({"weights after the steps, " + tag, flat_parameters(comm, *whole),
                 flat_parameters(comm, *reference), 2e-4});
  // The replicated layers: rank 0's bytes on every rank.
  const Tensor conv = (*whole)[3].parameters()[0];
  Tensor root = conv.detach().clone();
  comm.broadcast(root, 0);
  out.push_back({"the convolution's weights, bit for bit rank 0's, " + tag, bytes_of(comm, conv),
                 bytes_of(comm, root), 0});
  return out;
}

// The magnitudes of a convolution's sums, in double, for the bounds: for
// each output, the sum of |x w| over its products and |bias|; for each input
// element, of |dy w| over the products its gradient adds; for each weight,
// of |dy x|; for each bias, of |dy|. x [B, C, H, W], w [K, C, R, R].
struct ConvMagnitudes {
  std::vector<float> y, dx, dw, db;
};

ConvMagnitudes conv_magnitudes(const Tensor& x_t, const Tensor& w_t, const Tensor& b_t,
                               const Tensor& dy_t, int64_t stride, int64_t pad) {
  const std::vector<double> x = doubles(x_t), w = doubles(w_t), b = doubles(b_t),
                            dy = doubles(dy_t);
  const int64_t B = x_t.size(0), C = x_t.size(1), H = x_t.size(2), W = x_t.size(3);
  const int64_t K = w_t.size(0), R = w_t.size(2), P = dy_t.size(2), Q = dy_t.size(3);
  std::vector<double> y(dy.size()), dx(x.size()), dw(w.size()), db(static_cast<size_t>(K));
  for (int64_t i = 0; i < B * K * P * Q; ++i) {
    const int64_t q = i % Q, p = i / Q % P, k = i / (P * Q) % K, n = i / (K * P * Q);
    y[size_t(i)] += std::fabs(b[size_t(k)]);
    db[size_t(k)] += std::fabs(dy[size_t(i)]);
    for (int64_t c = 0; c < C; ++c)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t t = 0; t < R; ++t) {
          const int64_t h = p * stride - pad + r, v = q * stride - pad + t;
          if (h < 0 || h >= H || v < 0 || v >= W) continue;
          const size_t xi = size_t(((n * C + c) * H + h) * W + v), wi = size_t(((k * C + c) * R + r) * R + t);
          y[size_t(i)] += std::fabs(x[xi] * w[wi]);
          dx[xi] += std::fabs(dy[size_t(i)] * w[wi]);
          dw[wi] += std::fabs(dy[size_t(i)] * x[xi]);
        }
  }
  auto floats = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  return {floats(y), floats(dx), floats(dw), floats(db)};
}

// Each kind of split convolution against the whole Conv2d on the same input
// and output gradient (the same random numbers on every rank), on ragged
// sizes. With gamma(m) for m roundings and S the magnitudes above: an output
// of the whole layer sums K = C R R products and the bias, so the same sum
// by another kernel in another order lies within 2 gamma(K + 1) S of it; a
// row-parallel output sums K/N products on each rank, the ring adds the N
// partial sums and the bias follows: within (gamma(K + 1) + gamma(K/N + N))
// S. An input gradient sums at most K' = K_out R R products: through a
// column-parallel layer each rank sums its K'/N and f's all-reduce adds the
// N parts, (gamma(K') + gamma(K'/N + N)) S; through a row-parallel one (its
// input channels, every output) 2 gamma(K') S. Weight and bias gradients
// sum B P Q terms either way: 2 gamma(B P Q) S. (Sums of products: no
// Winograd or TF32, IeeeConvolutions; channels below 16 keep the CPU's
// Winograd out anyway.)
Outcomes split_conv_scenario(Communicator& comm) {
  using Kind = par::SplitLayer::Kind;
  struct Case {
    Kind kind;
    const char* name;
    int64_t in, out, kernel, stride, pad, size;
  };
  const Case cases[] = {
      {Kind::kColumn, "column-parallel Conv2d(8, 8, 3, padding 1)", 8, 8, 3, 1, 1, 6},
      {Kind::kRow, "row-parallel Conv2d(8, 8, 3, stride 2, padding 1)", 8, 8, 3, 2, 1, 7},
      {Kind::kColumnGathered, "column-parallel Conv2d(4, 8, 1, stride 2), gathered", 4, 8, 1, 2,
       0, 7}};
  const anvil::Device device = comm.device();
  const int n = comm.size(), rank = comm.rank();
  // This rank's part (along dim d) of a whole tensor, or of its magnitudes.
  auto part = [&](const Tensor& t, int64_t d) {
    return doubles(par::slice_along(t, d, rank * t.size(d) / n, t.size(d) / n));
  };
  auto part_of = [&](const std::vector<float>& v, const Shape& shape, int64_t d) {
    return part(Tensor::from_vector(v, shape), d);
  };
  auto times = [](std::vector<double> v, double f) {
    for (double& e : v) e *= f;
    return v;
  };
  Outcomes out;
  uint64_t seed = 11;
  for (const Case& c : cases) {
    anvil::Generator gen(seed++);
    anvil::nn::Conv2d full(c.in, c.out, c.kernel, c.stride, c.pad, true, &gen);
    full.to(device);
    const Tensor x = Tensor::randn({3, c.in, c.size, c.size}, &gen).to(device);
    Tensor whole_x = x.clone();
    whole_x.set_requires_grad(true);
    const Tensor y = full(whole_x);
    const Tensor dy = Tensor::randn(y.shape(), &gen).to(device);
    y.backward(dy);
    par::SplitLayer split(comm, full, c.kind);
    const bool row = c.kind == Kind::kRow, column = c.kind == Kind::kColumn;
    Tensor split_x = row ? par::slice_along(x, 1, rank * c.in / n, c.in / n) : x.clone();
    split_x.set_requires_grad(true);
    const Tensor split_y = split(split_x);
    split_y.backward(column ? par::slice_along(dy, 1, rank * c.out / n, c.out / n) : dy);

    const ConvMagnitudes m = conv_magnitudes(x, full.weight, full.bias, dy, c.stride, c.pad);
    const double K = double(c.in * c.kernel * c.kernel), K_out = double(c.out * c.kernel * c.kernel);
    const double terms = double(y.numel() / c.out);  // B P Q
    const std::string tag = fmt::format("{} over {} ranks", c.name, n);
    const double forward = row ? gamma(K + 1) + gamma(K / n + n) : 2 * gamma(K + 1);
    out.push_back({"output within the bound, " + tag, doubles(split_y),
                   column ? part(y, 1) : doubles(y), 0,
                   times(column ? part_of(m.y, y.shape(), 1) : doubles(m.y), forward)});
    const double input = row ? 2 * gamma(K_out) : gamma(K_out) + gamma(K_out / n + n);
    out.push_back({"input gradient within the bound, " + tag, doubles(split_x.grad()),
                   row ? part(whole_x.grad(), 1) : doubles(whole_x.grad()), 0,
                   times(row ? part_of(m.dx, x.shape(), 1) : doubles(m.dx), input)});
    const int64_t w_dim = row ? 1 : 0;
    out.push_back({"weight gradient within the bound, " + tag, doubles(split.weight.grad()),
                   part(full.weight.grad(), w_dim), 0,
                   times(part_of(m.dw, full.weight.shape(), w_dim), 2 * gamma(terms))});
    out.push_back({"bias gradient within the bound, " + tag, doubles(split.bias.grad()),
                   row ? doubles(full.bias.grad()) : part(full.bias.grad(), 0), 0,
                   times(row ? doubles(m.db) : part_of(m.db, full.bias.shape(), 0),
                         2 * gamma(terms))});
    // Under bfloat16 autocast both read the same bfloat16 operands (the parts
    // of the same weights) and sum in float32; the whole layer rounds its sum
    // once to bfloat16 (u_b = 2^-8), so a column-parallel output lies within
    // 2 (u_b + gamma(K + 1)) S of it; a row-parallel one rounds each rank's
    // partial sum, each of the ring's N - 1 additions and the bias's:
    // ((N + 2) u_b + gamma(K + 1) + gamma(K/N + N)) S. S grows by the
    // operands' rounding to bfloat16, (1 + u_b)^2 at most: 1 + 2^-7 covers it
    // and the second-order terms.
    {
      anvil::NoGradGuard no_grad;
      const anvil::AutocastGuard autocast(device.type);
      const double ub = std::ldexp(1.0, -8), grow = 1 + std::ldexp(1.0, -7);
      const Tensor bf_y = full(x);
      const Tensor bf_split = split(row ? par::slice_along(x, 1, rank * c.in / n, c.in / n) : x);
      const double bf = row ? (n + 2) * ub + gamma(K + 1) + gamma(K / n + n) : 2 * (ub + gamma(K + 1));
      out.push_back({"bfloat16 output's dtype, the whole layer's, " + tag,
                     {double(bf_split.dtype())}, {double(bf_y.dtype())}, 0});
      out.push_back({"bfloat16 output within the bound, " + tag, doubles(bf_split),
                     column ? part(bf_y, 1) : doubles(bf_y), 0,
                     times(column ? part_of(m.y, y.shape(), 1) : doubles(m.y), bf * grow)});
    }
  }
  return out;
}

// The values of every tensor of a state dict, in its order (the counters too).
std::vector<double> state_values(Communicator& comm, const anvil::nn::Module& m) {
  std::vector<double> out;
  for (auto& [key, t] : m.state_dict())
    for (double v : host(comm, t)) out.push_back(v);
  return out;
}

// Every BatchNorm's scale, shift and running statistics drawn from `seed`, as
// a trained model's would be (at their defaults every channel is alike, and
// a BatchNorm split at the wrong channels would go unseen).
void vary_batch_norms(anvil::nn::Module& model, uint64_t seed) {
  anvil::NoGradGuard no_grad;
  anvil::Generator gen(seed);
  auto draw = [&gen](Tensor& t, double mean, double spread) {
    std::vector<float> v = Tensor::rand(t.shape(), &gen).to_vector();
    for (float& e : v) e = float(mean + spread * (2 * e - 1));
    t.detach().copy_(Tensor::from_vector(v, t.shape()).to(t.device()));
  };
  for (anvil::nn::Module* m : model.modules())
    if (auto* bn = dynamic_cast<anvil::nn::BatchNorm2d*>(m)) {
      draw(bn->weight, 1, 0.3);
      draw(bn->bias, 0, 0.3);
      draw(bn->running_mean, 0, 0.3);
      draw(bn->running_var, 1, 0.5);
    }
}

// A narrow ResNet-18 (stage widths 4, 8, 8, 8) with every residual block
// split over the ranks, against the whole model on one device: `images` in
// batches of 8 (3 steps over MPI, 1 on the simulator's GPUs). Within the
// data-parallel tests' tolerances, not a derived bound: BatchNorm divides
// each difference by its batch's standard deviation, which no bound here
// follows (each split convolution's own sums are bounded above).
Outcomes resnet_tensor_parallel_scenario(Communicator& comm, int64_t images) {
  namespace nn = anvil::nn;
  const anvil::Device device = comm.device();
  const data::ImageSet set = synthetic_images(images, 9);
  const anvil::optim::SGDOptions sgd{.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4,
                                     .nesterov = true};
  auto reference = std::dynamic_pointer_cast<nn::Sequential>(make_model("resnet18-narrow", 1));
  auto whole = std::dynamic_pointer_cast<nn::Sequential>(make_model("resnet18-narrow", 1));
  reference->to(device);
  whole->to(device);
  vary_batch_norms(*reference, 4);
  vary_batch_norms(*whole, 4);
  auto split = par::split_tensor_parallel(comm, *whole, par::tensor_parallel_plan("resnet18"));
  const std::string tag =
      fmt::format("a narrow ResNet-18 over {} ranks, {} steps", comm.size(), images / 8);
  anvil::optim::SGD ref_opt(reference->parameters(), sgd), opt(split->parameters(), sgd);
  Outcomes out;
  {  // The first forward in eval mode (the running statistics), no step yet.
    anvil::NoGradGuard no_grad;
    reference->eval();
    split->eval();
    anvil::Generator gen(21);  // the same images on every rank
    const Tensor x = Tensor::randn({3, 1, 28, 28}, &gen).to(device);
    out.push_back({"the first forward's logits, eval mode, " + tag, doubles((*split)(x)),
                   doubles((*reference)(x)), 5e-5});
    reference->train();
    split->train();
  }
  data::DataLoader ref_loader(set, 8, true, false, 3), loader(set, 8, true, false, 3);
  const train::EpochStats want = train::train_epoch(*reference, ref_opt, ref_loader, device);
  const train::EpochStats got = train::train_epoch(*split, opt, loader, device);
  out.push_back({"the epoch's loss, accuracy and examples, " + tag,
                 {got.loss, got.accuracy, double(got.examples)},
                 {want.loss, want.accuracy, double(want.examples)}, 1e-4});
  data::DataLoader ref_test(set, 8, false, false, 3), test(set, 8, false, false, 3);
  const train::EpochStats want_eval = train::evaluate(*reference, ref_test, device);
  const train::EpochStats got_eval = train::evaluate(*split, test, device);
  out.push_back({"the evaluation's loss and accuracy, " + tag, {got_eval.loss, got_eval.accuracy},
                 {want_eval.loss, want_eval.accuracy}, 1e-4});
  par::gather_tensor_parallel(comm, *split, *whole);
  out.push_back({"every weight and buffer of the whole model after the steps, " + tag,
                 state_values(comm, *whole), state_values(comm, *reference), 2e-4});
  // The momentum into the whole model's order, and back into this rank's
  // parts bit for bit.
  const std::vector<Tensor> momentum =
      par::gather_momentum(comm, *split, opt.momentum_buffers(), *whole);
  std::vector<double> got_m, want_m, back_m, own_m;
  for (size_t i = 0; i < momentum.size(); ++i) {
    for (double v : host(comm, momentum[i])) got_m.push_back(v);
    for (double v : host(comm, ref_opt.momentum_buffers()[i])) want_m.push_back(v);
  }
  const std::vector<Tensor> back = par::shard_momentum(*split, *whole, momentum, comm.rank());
  for (size_t i = 0; i < back.size(); ++i) {
    for (double v : bytes_of(comm, back[i])) back_m.push_back(v);
    for (double v : bytes_of(comm, opt.momentum_buffers()[i])) own_m.push_back(v);
  }
  out.push_back({"the momentum gathered into the whole model, " + tag, got_m, want_m, 2e-4});
  out.push_back({"the gathered momentum sharded back, bit for bit, " + tag, back_m, own_m, 0});
  // The layers every rank runs whole (the stem, fc): rank 0's bytes everywhere.
  for (auto& [key, t] : whole->state_dict()) {
    if (key != "0.weight" && key != "fc.1.weight") continue;
    Tensor root = t.detach().clone();
    comm.broadcast(root, 0);
    out.push_back({key + ", run whole, bit for bit rank 0's, " + tag, bytes_of(comm, t),
                   bytes_of(comm, root), 0});
  }
  return out;
}

}  // namespace

// LeNet and a narrow ResNet-18 split over the ranks under bfloat16 autocast,
// one step of 8 images, against the whole model on one device under
// autocast. The split layers' bfloat16 outputs differ from one device's by a
// few roundings of u_b = 2^-8 (bounded above): the step's loss (its forward)
// is held within 2 u_b, relative; LeNet's weights after the step within u_b.
// Not the narrow ResNet's: there autocast itself moves one device's update
// by half its size against float32 (BatchNorm over 8 images of 4 channels,
// every activation gradient rounded), and the split model's update differs
// from one device's by as much.
Outcomes amp_scenario(Communicator& comm) {
  namespace nn = anvil::nn;
  const anvil::Device device = comm.device();
  const data::ImageSet set = synthetic_images(8, 13);
  const anvil::optim::SGDOptions sgd{.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4,
                                     .nesterov = true};
  const double ub = std::ldexp(1.0, -8);
  Outcomes out;
  for (const std::string name : {"lenet", "resnet18-narrow"}) {
    auto reference = std::dynamic_pointer_cast<nn::Sequential>(make_model(name, 1));
    auto whole = std::dynamic_pointer_cast<nn::Sequential>(make_model(name, 1));
    reference->to(device);
    whole->to(device);
    auto split = par::split_tensor_parallel(
        comm, *whole, par::tensor_parallel_plan(name == "lenet" ? "lenet" : "resnet18"));
    anvil::optim::SGD ref_opt(reference->parameters(), sgd), opt(split->parameters(), sgd);
    data::DataLoader ref_loader(set, 8, true, false, 3), loader(set, 8, true, false, 3);
    train::EpochOptions o;
    o.amp = true;
    const train::EpochStats want = train::train_epoch(*reference, ref_opt, ref_loader, device, o);
    const train::EpochStats got = train::train_epoch(*split, opt, loader, device, o);
    const std::string tag =
        fmt::format("{} over {} ranks, bfloat16 autocast, one step", name, comm.size());
    out.push_back({"the step's loss, " + tag, {got.loss}, {want.loss}, 2 * ub});
    if (name != "lenet") continue;
    par::gather_tensor_parallel(comm, *split, *whole);
    out.push_back({"every weight after the step, " + tag, state_values(comm, *whole),
                   state_values(comm, *reference), ub});
  }
  return out;
}

// Every scenario above: `steps` batches of 8 images.
Outcomes all_scenarios(Communicator& comm, int64_t steps) {
  Outcomes out = tensor_parallel_scenario(comm, 8 * steps);
  for (Outcome& o : split_conv_scenario(comm)) out.push_back(std::move(o));
  for (Outcome& o : resnet_tensor_parallel_scenario(comm, 8 * steps)) out.push_back(std::move(o));
  for (Outcome& o : amp_scenario(comm)) out.push_back(std::move(o));
  return out;
}

TEST_CASE("mpi: tensor-parallel LeNet, split convolutions and a narrow ResNet-18 end where one "
          "device does",
          "[mpi_model_parallel]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  par::CommOptions o;
  o.timeout = std::chrono::seconds(60);
  auto world = par::mpi_world(o);
  if (world->size() < 2) return skip("needs 2 or more MPI ranks");
  const IeeeConvolutions ieee;
  require_outcomes(all_scenarios(*world, 3), world->rank());
}

TEST_CASE("nccl: tensor-parallel LeNet, split convolutions and a narrow ResNet-18 on 2 GPUs end "
          "where one device does",
          "[nccl][tensor_parallel][tsan]") {
  if (gpus(2) == 0) return;
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  skip("a LeNet or ResNet step on the simulator takes minutes under the sanitizers");
#else
  const IeeeConvolutions ieee;  // before the threads: the setting is the process's
  const par::NcclId id = par::nccl_unique_id();
  const auto per_rank = each_rank(2, [&](int r) {
    auto comm = par::nccl_communicator(id, r, 2, anvil::Device::cuda(r), options(120));
    return all_scenarios(*comm, 1);
  });
  for (int r = 0; r < 2; ++r) require_outcomes(per_rank[size_t(r)], r);
#endif
}

TEST_CASE("tensor parallel: a pair that is not two Linear layers is refused", "[comm]") {
  auto one = par::one_rank_group(anvil::Device::cpu());
  auto lenet = anvil::models::lenet();
  CHECK_THROWS_WITH(par::split_tensor_parallel(*one, *lenet, {.linear_pairs = {{3, 9}}}),
                    Catch::Matchers::Contains("layers 3 and 9 are not a Linear and the Linear"));
  CHECK_THROWS_WITH(par::split_tensor_parallel(*one, *lenet, {.linear_pairs = {{9, 7}}}),
                    Catch::Matchers::Contains("layers 9 and 7"));
  // Over a group of one the split model is the model.
  auto split = par::split_tensor_parallel(*one, *lenet, par::tensor_parallel_plan("lenet"));
  const Tensor x = Tensor::ones({2, 1, 28, 28});
  CHECK(doubles((*split)(x)) == doubles((*lenet)(x)));
  CHECK(split->state_dict().size() == lenet->state_dict().size());
}

TEST_CASE("tensor parallel: ResNet-18's plan splits its blocks, and a plan that does not fit is refused",
          "[comm]") {
  auto one = par::one_rank_group(anvil::Device::cpu());
  anvil::models::ResNetConfig narrow;
  narrow.widths = {4, 8, 8, 8};
  auto resnet = anvil::models::resnet18(narrow);
  auto split = par::split_tensor_parallel(*one, *resnet, par::tensor_parallel_plan("resnet18"));
  // Every key of the model, and over a group of one the same outputs.
  CHECK(split->state_dict().size() == resnet->state_dict().size());
  const std::map<std::string, int64_t> dims = par::split_tensors(*split);
  CHECK(dims.at("resnet_block2.0.conv1.weight") == 0);
  CHECK(dims.at("resnet_block2.0.conv2.weight") == 1);
  CHECK(dims.at("resnet_block2.0.conv3.bias") == 0);
  CHECK(dims.at("resnet_block4.1.bn1.running_var") == 0);
  CHECK(!dims.contains("resnet_block2.0.conv2.bias"));  // the row-parallel bias is whole
  CHECK(!dims.contains("resnet_block2.0.bn2.weight"));
  CHECK(!dims.contains("0.weight"));
  resnet->eval();
  split->eval();
  const Tensor x = Tensor::ones({2, 1, 28, 28});
  CHECK(doubles((*split)(x)) == doubles((*resnet)(x)));
  CHECK_THROWS_WITH(par::split_tensor_parallel(*one, *resnet, {.residual_blocks = {"resnet_block5.0"}}),
                    Catch::Matchers::Contains("the model has no layer resnet_block5.0"));
  CHECK_THROWS_WITH(par::split_tensor_parallel(*one, *resnet, {.residual_blocks = {"0"}}),
                    Catch::Matchers::Contains("layer 0 is a Conv2d"));
  CHECK_THROWS_WITH(par::tensor_parallel_plan("mlp"),
                    Catch::Matchers::Contains("model 'mlp' has no plan"));
}

TEST_CASE("tensor parallel: slices along a dimension and their gather over a group of one",
          "[comm]") {
  auto one = par::one_rank_group(anvil::Device::cpu());
  std::vector<float> v(2 * 3 * 4);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  const Tensor t = Tensor::from_vector(v, {2, 3, 4});
  // Elements [1, 3) of dim 1: rows 4..11 of each 12.
  CHECK(par::slice_along(t, 1, 1, 2).to_vector() ==
        std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23});
  CHECK(par::slice_along(t, 2, 3, 1).to_vector() == std::vector<float>{3, 7, 11, 15, 19, 23});
  CHECK(par::slice_along(t, 0, 1, 1).shape() == anvil::Shape{1, 3, 4});
  CHECK(par::gather_along(*one, t, 1).to_vector() == v);
  CHECK_THROWS_WITH(par::slice_along(t, 1, 2, 2), Catch::Matchers::Contains("[2, 4) of dim 1"));
  CHECK_THROWS_WITH(par::slice_along(t, 3, 0, 1), Catch::Matchers::Contains("dim 3"));
}
