// bench_cuda_kernels' memory-bound families: per-channel sums, the sum
// reduction, softmax cross-entropy and BatchNorm's training passes, each rung
// checked against the CPU, then timed (no vendor baseline).
#include "bench/cuda_kernels/bench.h"

#if defined(ANVIL_CUDA_BACKEND)
namespace bench_cuda {

// Per-channel sums of dy[outer, C, inner] (bias gradients): every rung
// checked against the CPU, then timed. Bytes: dy read once.
void Bench::channel_sum(const char* name, int64_t outer, int64_t C, int64_t inner) {
  std::mt19937_64 rng(opt.seed + uint64_t(outer * 31 + C * 7 + inner));
  const std::vector<float> dy = random_vector(static_cast<size_t>(outer * C * inner), rng);
  std::vector<float> ref(static_cast<size_t>(C));
  cpu::channel_sum(outer, C, inner, dy.data(), ref.data());
  DeviceBuffer d_dy(dy.size()), d_db(ref.size());
  d_dy.upload(dy);
  const std::string shape = fmt::format("{} {}x{}x{}", name, outer, C, inner);
  for (int v : rungs_of(opt, cu::kChannelSumRungs)) {
    const std::string impl = fmt::format("v{} {}", v, cu::channel_sum_rungs::kRungs[v - 1].name);
    DeviceBuffer ws(cu::channel_sum_workspace_floats(v, outer, C, inner));
    auto call = [&] {
      cu::channel_sum(v, outer, C, inner, d_dy.get(), d_db.get(), ws.get(), stream);
    };
    d_db.poison(stream);
    call();
    if (!verify("csum", shape, impl, d_db.download(), ref, outer * inner)) continue;
    row("csum", shape, impl, timer->median_ms(call), 0.0, kNoVendor);
  }
}

// The sum of a vector: every rung checked against a double-precision sum,
// then timed. Bytes: x read once.
void Bench::sum(const char* name, int64_t n) {
  std::mt19937_64 rng(opt.seed + uint64_t(n));
  const std::vector<float> x = random_vector(static_cast<size_t>(n), rng);
  double total = 0.0;
  for (float v : x) total += v;
  const std::vector<float> ref = {static_cast<float>(total)};
  DeviceBuffer d_x(x.size()), d_out(1);
  d_x.upload(x);
  const std::string shape = fmt::format("{} {}", name, n);
  for (int v : rungs_of(opt, cu::kSumRungs)) {
    const std::string impl = fmt::format("v{} {}", v, cu::sum_rungs::kRungs[v - 1].name);
    DeviceBuffer ws(cu::sum_workspace_floats(v, n));
    auto call = [&] { cu::sum(v, n, d_x.get(), d_out.get(), ws.get(), stream); };
    d_out.poison(stream);
    call();
    if (verify("sum", shape, impl, d_out.download(), ref, n))
      row("sum", shape, impl, timer->median_ms(call), 0.0, kNoVendor);
  }
}

// Softmax cross-entropy forward (loss and probs, label smoothing 0.1): every
// rung checked against the CPU, then timed. Memory-bound: GFLOP/s is 0.
void Bench::softmax(const char* name, int64_t N, int64_t C) {
  std::mt19937_64 rng(opt.seed + uint64_t(N * 31 + C));
  const std::vector<float> logits = random_vector(static_cast<size_t>(N * C), rng);
  std::vector<int64_t> labels(static_cast<size_t>(N));
  for (auto& l : labels) l = int64_t(rng() % uint64_t(C));
  const float smoothing = 0.1f;
  std::vector<float> loss(labels.size()), probs(logits.size());
  cpu::softmax_cross_entropy_forward(N, C, logits.data(), labels.data(), smoothing, loss.data(),
                                     probs.data());
  DeviceBuffer d_logits(logits.size()), d_loss(loss.size()), d_probs(probs.size());
  d_logits.upload(logits);
  int64_t* d_labels = nullptr;
  cu::check(cudaMalloc(reinterpret_cast<void**>(&d_labels), labels.size() * sizeof(int64_t)),
            "cudaMalloc(labels)");
  cu::check(cudaMemcpy(d_labels, labels.data(), labels.size() * sizeof(int64_t),
                       cudaMemcpyHostToDevice),
            "cudaMemcpy(labels)");
  const std::string shape = fmt::format("{} {}x{}", name, N, C);
  for (int v : rungs_of(opt, cu::kSoftmaxRungs)) {
    const std::string impl = fmt::format("v{} {}", v, cu::softmax_rungs::kRungs[v - 1].name);
    auto call = [&] {
      cu::softmax_cross_entropy_forward(v, N, C, d_logits.get(), d_labels, smoothing,
                                        d_loss.get(), d_probs.get(), stream);
    };
    d_loss.poison(stream);
    d_probs.poison(stream);
    call();
    if (verify("smax", shape, impl, d_loss.download(), loss, C) &&
        verify("smax", shape, impl + " probs", d_probs.download(), probs, C))
      row("smax", shape, impl, timer->median_ms(call), 0.0, kNoVendor);
  }
  cu::check(cudaFree(d_labels), "cudaFree(labels)");
}

// BatchNorm training forward (y, mean, invstd) and backward (dx, dgamma,
// dbeta): every rung checked against the CPU, then timed.
void Bench::batch_norm(const char* name, int64_t N, int64_t C, int64_t HW) {
  std::mt19937_64 rng(opt.seed + uint64_t(N * 31 + C * 7 + HW));
  const size_t n = static_cast<size_t>(N * C * HW), nc = static_cast<size_t>(C);
  const std::vector<float> x = random_vector(n, rng), dy = random_vector(n, rng);
  const std::vector<float> gamma = random_vector(nc, rng), beta = random_vector(nc, rng);
  std::vector<float> y(n), mean(nc), invstd(nc), dx(n), dgamma(nc), dbeta(nc);
  const float eps = 1e-5f, momentum = 0.1f;
  cpu::batch_norm_forward_train(N, C, HW, x.data(), gamma.data(), beta.data(), eps, momentum,
                                nullptr, nullptr, mean.data(), invstd.data(), y.data());
  cpu::batch_norm_backward_train(N, C, HW, x.data(), gamma.data(), mean.data(), invstd.data(),
                                 dy.data(), dx.data(), dgamma.data(), dbeta.data());
  DeviceBuffer d_x(n), d_dy(n), d_gamma(nc), d_beta(nc), d_y(n), d_mean(nc), d_invstd(nc),
      d_dx(n), d_dgamma(nc), d_dbeta(nc);
  d_x.upload(x);
  d_dy.upload(dy);
  d_gamma.upload(gamma);
  d_beta.upload(beta);
  const std::string shape = fmt::format("{} {}x{}x{}", name, N, C, HW);
  const int64_t M = N * HW;
  for (int v : rungs_of(opt, cu::kBatchNormRungs)) {
    const std::string impl = fmt::format("v{} {}", v, cu::batch_norm_rungs::kRungs[v - 1]->name);
    DeviceBuffer ws(cu::batch_norm_workspace_floats(v, N, C, HW));
    auto forward = [&] {
      cu::batch_norm_forward_train(v, N, C, HW, d_x.get(), d_gamma.get(), d_beta.get(), eps,
                                   momentum, nullptr, nullptr, d_mean.get(), d_invstd.get(),
                                   d_y.get(), ws.get(), stream);
    };
    d_y.poison(stream);
    forward();
    if (verify("bnF", shape, impl, d_y.download(), y, M) &&
        verify("bnF", shape, impl + " mean", d_mean.download(), mean, M) &&
        verify("bnF", shape, impl + " invstd", d_invstd.download(), invstd, M))
      row("bnF", shape, impl, timer->median_ms(forward), 0.0, kNoVendor);
    // The backward from the CPU's saved statistics, as the CPU's backward.
    d_mean.upload(mean);
    d_invstd.upload(invstd);
    auto backward = [&] {
      cu::batch_norm_backward_train(v, N, C, HW, d_x.get(), d_gamma.get(), d_mean.get(),
                                    d_invstd.get(), d_dy.get(), d_dx.get(), d_dgamma.get(),
                                    d_dbeta.get(), ws.get(), stream);
    };
    d_dx.poison(stream);
    backward();
    if (verify("bnB", shape, impl, d_dx.download(), dx, M) &&
        verify("bnB", shape, impl + " dgamma", d_dgamma.download(), dgamma, M) &&
        verify("bnB", shape, impl + " dbeta", d_dbeta.download(), dbeta, M))
      row("bnB", shape, impl, timer->median_ms(backward), 0.0, kNoVendor);
  }
}

}  // namespace bench_cuda
#endif  // ANVIL_CUDA_BACKEND
