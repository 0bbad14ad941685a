// SyncBatchNorm, composed from the backend's kernels and the communicator's
// all-reduce, so it is written once for every device. Its per-channel maps
// are the BatchNorm eval kernel, which computes (x - m) / sqrt(v + e) * g + b
// per channel: with v = 1 and e = 0 it is any affine map x * g + b, and on a
// [1, C] tensor of ones it gives g / sqrt(v + e).
#include "parallel/sync_batch_norm.h"

#include <fmt/format.h>

#include <stdexcept>

#include "core/autograd.h"
#include "core/backend.h"
#include "parallel/fingerprint.h"

namespace anvil::parallel {
namespace {

struct Shape4 {
  int64_t N, C, HW;
};

Shape4 shape_of(const Tensor& x) {
  if (x.dim() != 2 && x.dim() != 4)
    throw std::invalid_argument(fmt::format(
        "sync_batch_norm: input must be [N, C] or [N, C, H, W], got {}", shape_str(x.shape())));
  const int64_t N = x.size(0), C = x.size(1);
  return {N, C, N * C == 0 ? 0 : x.numel() / (N * C)};
}

Tensor vec(int64_t C, double value, Device d) { return Tensor::full({C}, value, DType::Float32, d); }

// x * scale[c] + shift[c] per channel.
Tensor per_channel(Backend& b, const Tensor& x, const Tensor& scale, const Tensor& shift) {
  const int64_t C = x.size(1);
  Tensor y = Tensor::empty(x.shape(), DType::Float32, x.device());
  b.batch_norm_forward_eval(x, scale, shift, vec(C, 0, x.device()), vec(C, 1, x.device()), 0.0f, y,
                            false);
  return y;
}

// The fingerprint of the call's all-reduce `which` (0-3: the sums, the
// squared deviations, the sums of dy and of dy * xhat); 0 stays unsaid.
uint64_t marked(uint64_t fingerprint, int64_t which) {
  return fingerprint == 0 ? 0 : fingerprint_of(fingerprint, which);
}

// Per-channel sums over N and HW, all-reduced over the ranks.
Tensor global_channel_sum(Communicator& comm, Backend& b, const Tensor& x, const Shape4& s,
                          uint64_t fingerprint) {
  Tensor sum = Tensor::empty({s.C}, DType::Float32, x.device());
  b.channel_sum(s.N, s.C, s.HW, x, sum);
  comm.allreduce(sum, ReduceOp::kSum, Algorithm::kRing, fingerprint);
  return sum;
}

}  // namespace

Tensor sync_batch_norm(Communicator& comm, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                       const Tensor& running_mean, const Tensor& running_var, double momentum,
                       double eps, int64_t count, uint64_t fingerprint) {
  // Autocast's bfloat16 activations: the statistics and the normalisation in
  // float32 (as BatchNorm computes them), the output bfloat16 again; both
  // casts differentiable.
  if (x.dtype() == DType::BFloat16)
    return sync_batch_norm(comm, x.to(DType::Float32), gamma, beta, running_mean, running_var,
                           momentum, eps, count, fingerprint)
        .to(DType::BFloat16);
  const Shape4 s = shape_of(x);
  if (count < 2)
    throw std::invalid_argument(fmt::format(
        "sync_batch_norm: expected more than 1 value per channel over all ranks, got {}", count));
  check_same_device("sync_batch_norm", {&x, &gamma, &beta, &running_mean, &running_var});
  const Device d = x.device();
  Backend& b = backend_for(d);
  Tensor mean, var;
  {
    NoGradGuard no_grad;
    const Tensor xd = x.detach();
    mean = global_channel_sum(comm, b, xd, s, marked(fingerprint, 0));
    b.scale(float(1.0 / double(count)), mean, mean);
    Tensor neg_mean = Tensor::empty({s.C}, DType::Float32, d);
    b.scale(-1.0f, mean, neg_mean);
    Tensor centered = per_channel(b, xd, vec(s.C, 1, d), neg_mean);
    Tensor squared = Tensor::empty(x.shape(), DType::Float32, d);
    b.mul(centered, centered, squared);
    var = global_channel_sum(comm, b, squared, s, marked(fingerprint, 1));
    b.scale(float(1.0 / double(count)), var, var);
    // The running statistics: unbiased variance, as BatchNorm keeps it.
    const float m = float(momentum);
    b.scale(1.0f - m, running_mean, running_mean);
    b.axpy(m, mean, running_mean);
    b.scale(1.0f - m, running_var, running_var);
    b.axpy(float(momentum * double(count) / double(count - 1)), var, running_var);
  }
  Tensor y = Tensor::empty(x.shape(), DType::Float32, d);
  b.batch_norm_forward_eval(x, gamma, beta, mean, var, float(eps), y, false);
  if (any_requires_grad({&x, &gamma, &beta})) {
    const Tensor sx = x.detach(), sg = gamma.detach();
    Communicator* c = &comm;
    record(y, "SyncBatchNormBackward", {&x, &gamma, &beta}, [=](const Tensor& g) {
      Backend& be = backend_for(g.device());
      const Device dev = g.device();
      const Tensor ones = vec(s.C, 1, dev), zeros = vec(s.C, 0, dev);
      Tensor xhat = Tensor::empty(sx.shape(), DType::Float32, dev);
      be.batch_norm_forward_eval(sx, ones, zeros, mean, var, float(eps), xhat, false);
      Tensor prod = Tensor::empty(sx.shape(), DType::Float32, dev);
      be.mul(g, xhat, prod);
      Tensor dbeta = Tensor::empty({s.C}, DType::Float32, dev);
      Tensor dgamma = Tensor::empty({s.C}, DType::Float32, dev);
      be.channel_sum(s.N, s.C, s.HW, g, dbeta);
      be.channel_sum(s.N, s.C, s.HW, prod, dgamma);
      // dx = gamma / std * (dy - sum(dy) / M - xhat * sum(dy * xhat) / M), the
      // sums over every rank's values (M = count).
      Tensor sum_dy = dbeta.clone(), sum_dy_xhat = dgamma.clone();
      c->allreduce(sum_dy, ReduceOp::kSum, Algorithm::kRing, marked(fingerprint, 2));
      c->allreduce(sum_dy_xhat, ReduceOp::kSum, Algorithm::kRing, marked(fingerprint, 3));
      be.scale(float(-1.0 / double(count)), sum_dy, sum_dy);
      be.scale(float(-1.0 / double(count)), sum_dy_xhat, sum_dy_xhat);
      Tensor centered = per_channel(be, g, ones, sum_dy);
      Tensor correction = per_channel(be, xhat, sum_dy_xhat, zeros);
      be.add(centered, correction, centered);
      Tensor coef = Tensor::empty({1, s.C}, DType::Float32, dev);  // gamma / sqrt(var + eps)
      be.batch_norm_forward_eval(Tensor::ones({1, s.C}, DType::Float32, dev), sg, zeros, zeros,
                                 var, float(eps), coef, false);
      Tensor dx = per_channel(be, centered, coef.reshape({s.C}), zeros);
      return std::vector<Tensor>{dx, dgamma, dbeta};
    });
  }
  return y;
}

}  // namespace anvil::parallel
