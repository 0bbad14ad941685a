#include "nn/train.h"

#include <chrono>

#include "core/autograd.h"
#include "core/ops.h"

namespace anvil::train {
namespace {

using Clock = std::chrono::steady_clock;

// Compares on the host with the batch's own labels: no copy back from the device.
int64_t count_correct(const Tensor& logits, const std::vector<int64_t>& labels) {
  Tensor pred = argmax_rows(logits);
  const int64_t* p = pred.data<int64_t>();
  int64_t correct = 0;
  for (size_t i = 0; i < labels.size(); ++i) correct += p[i] == labels[i];
  return correct;
}

}  // namespace

std::pair<Tensor, Tensor> batch_tensors(const data::Batch& b, Device device) {
  Tensor x = Tensor::from_host(b.images.data(), {b.size, b.channels, b.rows, b.cols},
                               DType::Float32, device);
  Tensor y = Tensor::from_host(b.labels.data(), {b.size}, DType::Int64, device);
  return {x, y};
}

EpochStats train_epoch(nn::Module& model, optim::SGD& optimizer, data::DataLoader& loader,
                       Device device, const Progress& progress) {
  model.train();
  loader.start_epoch();
  EpochStats stats;
  double loss_sum = 0;
  int64_t correct = 0, done = 0;
  auto start = Clock::now();
  data::Batch batch;
  while (loader.next(batch)) {
    auto [x, y] = batch_tensors(batch, device);
    Tensor logits = model(x);
    Tensor loss = cross_entropy(logits, y);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    loss_sum += loss.item() * double(batch.size);
    correct += count_correct(logits, batch.labels);
    stats.examples += batch.size;
    ++done;
    if (progress) {
      stats.loss = loss_sum / double(stats.examples);
      stats.accuracy = double(correct) / double(stats.examples);
      stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      progress(done, loader.num_batches(), stats);
    }
  }
  stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (stats.examples) {
    stats.loss = loss_sum / double(stats.examples);
    stats.accuracy = double(correct) / double(stats.examples);
  }
  return stats;
}

EpochStats evaluate(nn::Module& model, data::DataLoader& loader, Device device) {
  bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  loader.start_epoch();
  EpochStats stats;
  double loss_sum = 0;
  int64_t correct = 0;
  auto start = Clock::now();
  data::Batch batch;
  while (loader.next(batch)) {
    auto [x, y] = batch_tensors(batch, device);
    Tensor logits = model(x);
    loss_sum += cross_entropy(logits, y, Reduction::Sum).item();
    correct += count_correct(logits, batch.labels);
    stats.examples += batch.size;
  }
  stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (stats.examples) {
    stats.loss = loss_sum / double(stats.examples);
    stats.accuracy = double(correct) / double(stats.examples);
  }
  model.train(was_training);
  return stats;
}

}  // namespace anvil::train
