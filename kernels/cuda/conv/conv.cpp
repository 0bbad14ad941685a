// The convolution entry points: shape checks, empty outputs and the bias
// gradient, then the rung's launcher (conv.h lists the rungs; each file says
// how its threads map to the three GEMMs).
#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/cuda/conv/conv.h"
#include "kernels/cuda/conv/rung_table.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_backend.h"
#include "core/precision.h"

namespace anvil::cuda {
namespace {

constexpr const conv_rungs::Rung* kRungs[kConvRungs] = {
    &conv_rungs::kDirect, &conv_rungs::kIm2col, &conv_rungs::kImplicitGemm,
    &conv_rungs::kImplicitWarpTile, &conv_rungs::kSplitK, &conv_rungs::kTf32Mma,
    &conv_rungs::kBf16Mma, &conv_rungs::kBf16Multistage, &conv_rungs::kTf32Multistage};

[[noreturn]] void bad_shape(const char* fn, const std::string& what) {
  throw std::invalid_argument(std::string("cuda::") + fn + ": " + what);
}

// Checks the shape and the rung's number; returns the rung.
const conv_rungs::Rung& checked(const char* fn, int number, const Conv2dShape& s) {
  if (number < 1 || number > kConvRungs)
    bad_shape(fn, "no rung " + std::to_string(number) + " (there are 1 to " +
                      std::to_string(kConvRungs) + ")");
  struct Field {
    const char* name;
    int64_t value, lo;
  };
  const Field fields[] = {
      {"N", s.N, 0},         {"C", s.C, 0},         {"H", s.H, 0},
      {"W", s.W, 0},         {"K", s.K, 0},         {"R", s.R, 1},
      {"S", s.S, 1},         {"stride_h", s.stride_h, 1}, {"stride_w", s.stride_w, 1},
      {"pad_h", s.pad_h, 0}, {"pad_w", s.pad_w, 0}, {"P", s.P, 0},
      {"Q", s.Q, 0}};
  for (const Field& f : fields)
    if (f.value < f.lo || f.value > INT32_MAX)
      bad_shape(fn, std::string(f.name) + " = " + std::to_string(f.value) + " is out of range [" +
                        std::to_string(f.lo) + ", 2^31)");
  if (s.P != Conv2dShape::out_size(s.H, s.R, s.stride_h, s.pad_h))
    bad_shape(fn, "P = " + std::to_string(s.P) + " does not match H, R, stride_h, pad_h");
  if (s.Q != Conv2dShape::out_size(s.W, s.S, s.stride_w, s.pad_w))
    bad_shape(fn, "Q = " + std::to_string(s.Q) + " does not match W, S, stride_w, pad_w");
  const std::pair<const char*, double> gemm_dims[] = {
      {"N*P*Q", double(s.N) * s.P * s.Q},
      {"N*H*W", double(s.N) * s.H * s.W},
      {"C*R*S", double(s.C) * s.R * s.S},
      {"K*R*S", double(s.K) * s.R * s.S}};
  for (const auto& [name, v] : gemm_dims)
    if (v > double(INT32_MAX)) bad_shape(fn, std::string(name) + " is 2^31 or more");
  return conv_rungs::rung(number);
}

float* checked_workspace(const char* fn, int number, const conv_rungs::Rung& rung,
                         const Conv2dShape& s, float* workspace) {
  if (rung.workspace(s) > 0 && workspace == nullptr)
    bad_shape(fn, "rung " + std::to_string(number) + " needs a workspace (null given)");
  return workspace;
}

}  // namespace

const conv_rungs::Rung& conv_rungs::rung(int number) {
  if (number < 1 || number > kConvRungs)
    throw std::invalid_argument("cuda::conv: no rung " + std::to_string(number) +
                                " (there are 1 to " + std::to_string(kConvRungs) + ")");
  return *kRungs[number - 1];
}

size_t conv2d_workspace_floats(int number, const Conv2dShape& s) {
  const conv_rungs::Rung& rung = checked("conv2d_workspace_floats", number, s);
  // Backward-weight's dbias (channel_sum's partials) runs first on the same
  // stream, so it can reuse the space the direction's own work needs after it.
  return std::max(rung.workspace(s),
                  channel_sum_workspace_floats(kBestChannelSum, s.N, s.K, s.P * s.Q));
}

namespace {

// The rung's launcher for operands of T (and an output of TY): every rung
// has the float32 one; the bfloat16 ones only the rungs that read bfloat16
// (else the error names fn).
template <class T, class TY, class F32, class Bf16, class Bf16Out>
auto launcher(const char* fn, int number, const conv_rungs::Rung& rung, F32 f32, Bf16 bf16,
              Bf16Out bf16_out) {
  const auto pick = [&](auto f) {
    if (f == nullptr)
      bad_shape(fn, "rung " + std::to_string(number) + " (" + rung.name +
                        ") reads float32 operands only; bfloat16 ones need rung " +
                        std::to_string(kBf16Conv) + " (" + conv_rungs::rung(kBf16Conv).name +
                        ")");
    return f;
  };
  if constexpr (std::is_same_v<T, float>)
    return f32;
  else if constexpr (std::is_same_v<TY, float>)
    return pick(bf16);
  else
    return pick(bf16_out);
}

template <class T, class TY>
void forward(int number, const Conv2dShape& s, const T* x, const T* w, const float* bias, TY* y,
             float* workspace, cudaStream_t stream) {
  const char* fn = "conv2d_forward";
  const conv_rungs::Rung& rung = checked(fn, number, s);
  const auto run = launcher<T, TY>(fn, number, rung, rung.forward, rung.forward_bf16,
                                   rung.forward_bf16_out);
  float* ws = checked_workspace(fn, number, rung, s, workspace);
  if (s.N * s.K * s.P * s.Q == 0) return;  // y is empty
  run(s, x, w, bias, y, ws, stream);
}

template <class T, class TY>
void backward_data(int number, const Conv2dShape& s, const T* dy, const T* w, TY* dx,
                   float* workspace, cudaStream_t stream) {
  const char* fn = "conv2d_backward_data";
  const conv_rungs::Rung& rung = checked(fn, number, s);
  const auto run = launcher<T, TY>(fn, number, rung, rung.backward_data,
                                   rung.backward_data_bf16, rung.backward_data_bf16_out);
  float* ws = checked_workspace(fn, number, rung, s, workspace);
  const int64_t dx_size = s.N * s.C * s.H * s.W;
  if (dx_size == 0) return;
  if (s.K * s.P * s.Q == 0) {  // nothing flows back
    fill(dx_size, TY(0.0f), dx, stream);
    return;
  }
  run(s, dy, w, dx, ws, stream);
}

// dbias: float32 dy only (null for bfloat16).
template <class T>
void backward_weight(int number, const Conv2dShape& s, const T* x, const T* dy, float* dw,
                     float* dbias, float* workspace, cudaStream_t stream) {
  const char* fn = "conv2d_backward_weight";
  const conv_rungs::Rung& rung = checked(fn, number, s);
  const auto run = launcher<T, float>(fn, number, rung, rung.backward_weight,
                                      rung.backward_weight_bf16, nullptr);
  float* ws = checked_workspace(fn, number, rung, s, workspace);
  const int64_t PQ = s.P * s.Q, dw_size = s.K * s.C * s.R * s.S;
  if constexpr (std::is_same_v<T, float>) {
    if (dbias) {
      if (channel_sum_workspace_floats(kBestChannelSum, s.N, s.K, PQ) > 0 && workspace == nullptr)
        bad_shape(fn, "dbias needs a workspace (null given)");
      channel_sum(kBestChannelSum, s.N, s.K, PQ, dy, dbias, workspace, stream);
    }
  }
  if (dw_size == 0) return;
  if (s.N * PQ == 0) {  // an empty sum
    fill(dw_size, 0.0f, dw, stream);
    return;
  }
  run(s, x, dy, dw, ws, stream);
}

}  // namespace

void conv2d_forward(int number, const Conv2dShape& s, const float* x, const float* w,
                    const float* bias, float* y, float* workspace, cudaStream_t stream) {
  forward(number, s, x, w, bias, y, workspace, stream);
}
void conv2d_forward(int number, const Conv2dShape& s, const bfloat16* x, const bfloat16* w,
                    const float* bias, float* y, float* workspace, cudaStream_t stream) {
  forward(number, s, x, w, bias, y, workspace, stream);
}

void conv2d_forward(int number, const Conv2dShape& s, const bfloat16* x, const bfloat16* w,
                    const float* bias, bfloat16* y, float* workspace, cudaStream_t stream) {
  forward(number, s, x, w, bias, y, workspace, stream);
}

void conv2d_backward_data(int number, const Conv2dShape& s, const float* dy, const float* w,
                          float* dx, float* workspace, cudaStream_t stream) {
  backward_data(number, s, dy, w, dx, workspace, stream);
}
void conv2d_backward_data(int number, const Conv2dShape& s, const bfloat16* dy,
                          const bfloat16* w, float* dx, float* workspace, cudaStream_t stream) {
  backward_data(number, s, dy, w, dx, workspace, stream);
}

void conv2d_backward_data(int number, const Conv2dShape& s, const bfloat16* dy,
                          const bfloat16* w, bfloat16* dx, float* workspace, cudaStream_t stream) {
  backward_data(number, s, dy, w, dx, workspace, stream);
}

void conv2d_backward_weight(int number, const Conv2dShape& s, const float* x, const float* dy,
                            float* dw, float* dbias, float* workspace, cudaStream_t stream) {
  backward_weight(number, s, x, dy, dw, dbias, workspace, stream);
}
void conv2d_backward_weight(int number, const Conv2dShape& s, const bfloat16* x,
                            const bfloat16* dy, float* dw, float* workspace,
                            cudaStream_t stream) {
  backward_weight(number, s, x, dy, dw, nullptr, workspace, stream);
}

namespace {
// The rung an environment variable names: `fallback` when unset or empty,
// `other` when it says so; std::invalid_argument naming it otherwise.
int rung_from_env(const char* name, const char* math, int fallback, int other) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  const std::string text(v);
  if (text == std::to_string(fallback) || text == std::to_string(other)) return std::stoi(text);
  throw std::invalid_argument(std::string(name) + "=" + text + ": the " + math +
                              " convolution rungs are " + std::to_string(fallback) + " and " +
                              std::to_string(other));
}
}  // namespace

int bf16_conv_rung() {
  static const int rung = rung_from_env("ANVIL_CONV_BF16_RUNG", "BF16", kBf16Conv, 7);
  return rung;
}
int tf32_conv_rung() {
  static const int rung = rung_from_env("ANVIL_CONV_TF32_RUNG", "TF32", kTf32Conv, 6);
  return rung;
}

// ---- CudaBackend (cuda_backend.h) ----

namespace {
// The rung by core/precision.h's arithmetic (the tensor cores where
// convolutions compute in TF32, PyTorch's default, or BF16, autocast; else
// FP32) and the measured table's choice for the shape (rung_table.h).
int backend_rung(ConvDirection direction, const Conv2dShape& s) {
  switch (fp32_math(OpFamily::kConv, DeviceType::CUDA)) {
    case Fp32Math::kTf32: return shipped_conv_rung(gemm_rungs::Math::kTf32, direction, s);
    case Fp32Math::kBf16: return shipped_conv_rung(gemm_rungs::Math::kBf16, direction, s);
    default: return shipped_conv_rung(gemm_rungs::Math::kFp32, direction, s);
  }
}
int bf16_rung(ConvDirection direction, const Conv2dShape& s) {
  return shipped_conv_rung(gemm_rungs::Math::kBf16, direction, s);
}
}  // namespace

// bfloat16 operands go to a BF16 rung (bf16_rung), which
// reads them as they are, whatever the precision setting (bf16_operands,
// cuda_backend.h), and stores y and dx as float32 or bfloat16, the bias
// added before the rounding.
void CudaBackend::conv2d_forward(const Conv2dShape& s, const Tensor& x, const Tensor& w,
                                 const Tensor& bias, const Tensor& y) {
  activate();
  if (bf16_operands("conv2d_forward", x, w, y)) {
    const Tensor x16 = bf16_operand(x), w16 = bf16_operand(w);
    const int rung = bf16_rung(ConvDirection::kForward, s);
    Tensor ws = workspace(conv2d_workspace_floats(rung, s));
    if (y.dtype() == DType::BFloat16)
      cuda::conv2d_forward(rung, s, bf16s(x16), bf16s(w16), floats(bias), y.data<bfloat16>(),
                           floats(ws), stream_);
    else
      cuda::conv2d_forward(rung, s, bf16s(x16), bf16s(w16), floats(bias), floats(y), floats(ws),
                           stream_);
    return;
  }
  const int rung = backend_rung(ConvDirection::kForward, s);
  Tensor ws = workspace(conv2d_workspace_floats(rung, s));
  cuda::conv2d_forward(rung, s, floats(x), floats(w), floats(bias), floats(y), floats(ws),
                       stream_);
}
void CudaBackend::conv2d_backward_data(const Conv2dShape& s, const Tensor& dy, const Tensor& w,
                                       const Tensor& dx) {
  activate();
  if (bf16_operands("conv2d_backward_data", dy, w, dx)) {
    const Tensor dy16 = bf16_operand(dy), w16 = bf16_operand(w);
    const int rung = bf16_rung(ConvDirection::kBackwardData, s);
    Tensor ws = workspace(conv2d_workspace_floats(rung, s));
    if (dx.dtype() == DType::BFloat16)
      cuda::conv2d_backward_data(rung, s, bf16s(dy16), bf16s(w16), dx.data<bfloat16>(),
                                 floats(ws), stream_);
    else
      cuda::conv2d_backward_data(rung, s, bf16s(dy16), bf16s(w16), floats(dx), floats(ws),
                                 stream_);
    return;
  }
  const int rung = backend_rung(ConvDirection::kBackwardData, s);
  Tensor ws = workspace(conv2d_workspace_floats(rung, s));
  cuda::conv2d_backward_data(rung, s, floats(dy), floats(w), floats(dx), floats(ws), stream_);
}
// With bfloat16 dy the bias gradient is channel_sum's bfloat16 overload,
// which sums dy as stored (FP32 sums); dw is float32 either way.
void CudaBackend::conv2d_backward_weight(const Conv2dShape& s, const Tensor& x,
                                         const Tensor& dy, const Tensor& dw,
                                         const Tensor& dbias) {
  activate();
  if (dw.dtype() != DType::Float32)
    throw std::invalid_argument("cuda backend conv2d_backward_weight: dw must be float32, got " +
                                std::string(dtype_name(dw.dtype())));
  if (bf16_operands("conv2d_backward_weight", x, dy, dw)) {
    const Tensor x16 = bf16_operand(x), dy16 = bf16_operand(dy);
    const int rung = bf16_rung(ConvDirection::kBackwardWeight, s);
    Tensor ws = workspace(conv2d_workspace_floats(rung, s));
    if (dbias.defined())
      cuda::channel_sum(kBestChannelSum, s.N, s.K, s.P * s.Q, bf16s(dy16), floats(dbias),
                        floats(ws), stream_);
    cuda::conv2d_backward_weight(rung, s, bf16s(x16), bf16s(dy16), floats(dw), floats(ws),
                                 stream_);
    return;
  }
  const int rung = backend_rung(ConvDirection::kBackwardWeight, s);
  Tensor ws = workspace(conv2d_workspace_floats(rung, s));
  cuda::conv2d_backward_weight(rung, s, floats(x), floats(dy), floats(dw), floats(dbias),
                               floats(ws), stream_);
}

}  // namespace anvil::cuda
