#include "nn/init.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "core/backend.h"

namespace anvil::nn::init {
namespace {

// Fill on the host in float32, then copy into the tensor wherever it lives;
// a bfloat16 tensor gets the draws rounded to nearest even.
template <typename F> void fill_host(const char* op, Tensor& t, F&& draw) {
  if (t.dtype() != DType::Float32 && t.dtype() != DType::BFloat16)
    throw std::invalid_argument(fmt::format(
        "{}: the tensor has dtype {} (shape {}); random init needs float32 or bfloat16", op,
        dtype_name(t.dtype()), shape_str(t.shape())));
  Tensor host = Tensor::empty(t.shape(), DType::Float32, Device::cpu());
  float* p = host.data<float>();
  for (int64_t i = 0; i < host.numel(); ++i) p[i] = draw();
  t.detach().copy_(host.to(t.dtype()));
}

}  // namespace

void normal_(Tensor& t, double mean, double std, Generator* gen) {
  Generator& g = gen ? *gen : default_generator();
  fill_host("normal_", t, [&] { return float(mean + std * g.normal()); });
}

void uniform_(Tensor& t, double low, double high, Generator* gen) {
  Generator& g = gen ? *gen : default_generator();
  fill_host("uniform_", t, [&] { return float(low + (high - low) * g.uniform()); });
}

void zeros_(Tensor& t) { backend_for(t.device()).fill(t, 0.0); }
void ones_(Tensor& t) { backend_for(t.device()).fill(t, 1.0); }

int64_t fan_in(const Tensor& w) {
  if (w.dim() < 2) throw std::invalid_argument("fan_in: weight needs at least 2 dimensions");
  int64_t receptive = 1;
  for (int64_t d = 2; d < w.dim(); ++d) receptive *= w.size(d);
  return w.size(1) * receptive;
}

void kaiming_normal_(Tensor& t, bool fan_out_mode, Generator* gen) {
  int64_t fan = fan_in(t);
  if (fan_out_mode) fan = fan / t.size(1) * t.size(0);
  normal_(t, 0.0, std::sqrt(2.0 / double(fan)), gen);
}

}  // namespace anvil::nn::init
