// Tests of evaluation per class: train::evaluate_classes counts a confusion
// matrix exactly, and anvil-train --eval-only reports the weights of a
// --save file or a --checkpoint with the figures the training run printed,
// per class and as JSON, refusing flags that would have nothing to do.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "data/dataloader.h"
#include "nn/module.h"
#include "nn/train.h"
#include "tests/cli_test_util.h"
#include "tests/golden_util.h"
#include "tests/test_util.h"

using namespace anvil;
using namespace anvil::testing;
using namespace anvil::testing::cli;
using Catch::Contains;

namespace {

// Predicts from the single pixel of a 1x1 image: class (pixel value) % 10,
// with a confident one-hot logit row, so every prediction is known.
class PixelModel : public nn::Module {
 public:
  explicit PixelModel(int64_t classes) : classes_(classes) {}
  Tensor forward(const Tensor& x) override {
    const std::vector<float> pixels = x.to_vector();
    std::vector<float> logits(pixels.size() * size_t(classes_), 0.0f);
    for (size_t i = 0; i < pixels.size(); ++i) {
      const int64_t value = std::lround(pixels[i] * 255.0f);
      logits[i * size_t(classes_) + size_t(value % 10)] = 10.0f;
    }
    return Tensor::from_vector(logits, {int64_t(pixels.size()), classes_});
  }
  std::string describe() const override { return "PixelModel"; }

 private:
  int64_t classes_;
};

// 1x1 images whose pixels and labels are given.
data::ImageSet pixel_set(const std::vector<uint8_t>& pixels, const std::vector<int64_t>& labels) {
  data::ImageSet set;
  set.count = int64_t(pixels.size());
  set.rows = set.cols = 1;
  set.pixels = pixels;
  set.labels = labels;
  return set;
}

}  // namespace

TEST_CASE("evaluate_classes counts the confusion matrix exactly", "[train][eval]") {
  // (label, predicted): 0->0, 0->3, 1->1, 1->1, 2->0, 3->3, 3->3, 3->9, 9->9; class 4..8 absent.
  const std::vector<int64_t> labels = {0, 0, 1, 1, 2, 3, 3, 3, 9};
  const std::vector<uint8_t> pixels = {10, 13, 21, 1, 30, 3, 43, 9, 99};
  const data::ImageSet set = pixel_set(pixels, labels);
  data::DataLoader loader(set, 4, false, false, 0);  // 3 batches, the last of 1
  PixelModel model(10);
  const train::ClassEvaluation e = train::evaluate_classes(model, loader, Device::cpu(), 10);
  REQUIRE(e.classes == 10);
  REQUIRE(e.confusion.size() == 100);
  std::vector<int64_t> expected(100, 0);
  for (auto [t, p] : {std::pair{0, 0}, {0, 3}, {1, 1}, {1, 1}, {2, 0}, {3, 3}, {3, 3}, {3, 9}, {9, 9}})
    ++expected[size_t(t * 10 + p)];
  CHECK(e.confusion == expected);
  CHECK(e.count(0, 3) == 1);
  CHECK(e.examples_of(3) == 3);
  CHECK(e.accuracy_of(0) == 0.5);
  CHECK(e.accuracy_of(2) == 0.0);
  CHECK(e.accuracy_of(3) == Approx(2.0 / 3.0));
  CHECK(e.accuracy_of(5) == 0.0);  // no examples
  CHECK(e.stats.examples == 9);
  CHECK(e.stats.accuracy == Approx(6.0 / 9.0));  // the diagonal: 1 + 2 + 2 + 1

  SECTION("a model with another number of outputs is refused") {
    PixelModel twelve(12);
    CHECK_THROWS_WITH(train::evaluate_classes(twelve, loader, Device::cpu(), 10),
                      Contains("[4, 12]") && Contains("not [N, 10]"));
    CHECK_THROWS_WITH(train::evaluate_classes(model, loader, Device::cpu(), 0),
                      Contains("classes must be >= 1"));
  }
}

TEST_CASE("anvil-train --eval-only reports the weights a run saved, per class and as JSON",
          "[cli][eval]") {
  TempDir dir;
  std::string data_dir = kFashionDir;
  if (!have_fashion_mnist()) {
    WARN("Fashion-MNIST not found in " << kFashionDir << "; using synthetic data");
    write_synthetic_split(dir.path / "data", 256, 200);
    data_dir = (dir.path / "data").string();
  }
  const std::string common = "--device cpu --recipe best --limit-train 512 --limit-test 300 "
                             "--batch-size 64 --data-dir " + quote(data_dir);
  const std::string weights = dir.file("w.safetensors"), ckpt = dir.file("run.ckpt");
  const std::string train_metrics = dir.file("train.jsonl");
  CliResult trained = run_cli(common + " --epochs 1 --save " + quote(weights) + " --checkpoint " +
                              quote(ckpt) + " --metrics " + quote(train_metrics));
  INFO("training output:\n" << trained.output);
  REQUIRE(trained.code == 0);
  const auto last_epoch = nlohmann::json::parse(lines_of(read_file(train_metrics)).back());
  const double train_test_acc = last_epoch["test_acc"].get<double>();

  for (const std::string& source : {"--init-from " + quote(weights), "--resume " + quote(ckpt)}) {
    const std::string metrics = dir.file("eval.json");
    CliResult r = run_cli(common + " --eval-only " + source + " --metrics " + quote(metrics));
    INFO("anvil-train --eval-only " << source << "\n" << r.output);
    REQUIRE(r.code == 0);
    check_no_crash(r);
    CHECK_THAT(r.output, !Contains("epoch "));  // nothing trained
    // The training run's final evaluation, to the printed digit.
    CHECK_THAT(r.output, Contains(fmt::format("test acc {:.4f} (", train_test_acc)));
    CHECK_THAT(r.output, Contains("  0 T-shirt/top"));
    CHECK_THAT(r.output, Contains("confusion matrix (rows: true class, columns: predicted class)"));

    const auto lines = lines_of(read_file(metrics));
    REQUIRE(lines.size() == 1);
    const auto j = nlohmann::json::parse(lines[0]);
    CHECK(j["mode"] == "eval");
    CHECK(j["test_acc"].get<double>() == Approx(train_test_acc).margin(1e-12));
    CHECK(j["test_loss"].get<double>() == Approx(last_epoch["test_loss"].get<double>()).epsilon(1e-6));
    CHECK(j["examples"] == 300);
    REQUIRE(j["confusion"].size() == 10);
    REQUIRE(j["per_class"].size() == 10);
    int64_t total = 0, diagonal = 0;
    for (int t = 0; t < 10; ++t) {
      const auto& row = j["confusion"][t];
      REQUIRE(row.size() == 10);
      const int64_t row_sum = std::accumulate(row.begin(), row.end(), int64_t{0},
                                              [](int64_t a, const auto& v) { return a + v.template get<int64_t>(); });
      const auto& c = j["per_class"][t];
      CHECK(c["label"] == t);
      CHECK(c["examples"] == row_sum);
      CHECK(c["correct"] == row[t]);
      if (row_sum > 0) CHECK(c["accuracy"].get<double>() == Approx(double(row[t].get<int64_t>()) / double(row_sum)));
      // The printed table's row for the class.
      CHECK_THAT(r.output, Contains(fmt::format("{:>7} {:>8} {:>9.4f}", row_sum, row[t].get<int64_t>(),
                                                c["accuracy"].get<double>())));
      total += row_sum;
      diagonal += row[t].get<int64_t>();
    }
    CHECK(total == 300);
    CHECK(double(diagonal) / 300.0 == Approx(train_test_acc).margin(1e-12));
    CHECK(j["classes"][6] == "Shirt");
  }

  SECTION("flags with nothing to do, and missing weights, are refused") {
    const std::string nodata = " --device cpu --data-dir /nonexistent";
    expect_failure("--eval-only" + nodata, {"--eval-only", "--init-from", "--resume"});
    expect_failure("--eval-only --init-from " + quote(weights) + " --save " + quote(dir.file("x")) + nodata,
                   {"--save has no effect with --eval-only"});
    expect_failure("--eval-only --resume " + quote(ckpt) + " --checkpoint " + quote(dir.file("y")) + nodata,
                   {"--checkpoint has no effect with --eval-only"});
    // The metrics would overwrite the weights being evaluated.
    const std::string before = read_file(ckpt);
    expect_failure("--eval-only --resume " + quote(ckpt) + " --metrics " + quote(ckpt) + nodata,
                   {"--metrics " + ckpt + ": is the --resume file"});
    expect_failure("--eval-only --init-from " + quote(weights) + " --metrics " + quote(weights) + nodata,
                   {"--metrics " + weights + ": is the --init-from file"});
    CHECK(read_file(ckpt) == before);
  }
  SECTION("a checkpoint of another model or other inputs is refused, naming the flag") {
    expect_failure(common + " --eval-only --resume " + quote(ckpt) + " --no-normalize",
                   {ckpt, "was trained with --normalize true, this run has --normalize false"});
    expect_failure(common + " --eval-only --resume " + quote(ckpt) + " --model resnet18",
                   {ckpt, "--model \"lenet\""});
  }
}

// A LeNet state dict in bfloat16 written by safetensors.torch.save_file
// (tests/golden/make_lenet_bf16_golden.py): --init-from widens it into the
// float32 weights and says so, and the weights then evaluate as PyTorch
// evaluates them on the same images (loss to float32 rounding, accuracy
// exactly: PyTorch's smallest top-2 logit margin is in the golden file).
TEST_CASE("anvil-train --init-from widens a bfloat16 file of PyTorch's and evaluates as PyTorch",
          "[cli][eval][bf16]") {
  const nlohmann::json& golden = golden_file("lenet_bf16_golden.json");
  REQUIRE(golden["smallest_top2_margin"].get<double>() > 1e-3);
  TempDir dir("bf16init");
  write_banded_split(dir.path / "data", 64, golden["test_images"].get<uint32_t>());
  const std::string weights = ANVIL_TEST_DATA_DIR "/golden/lenet_bf16.safetensors";
  const std::string common = "--device cpu --model lenet --batch-size 32 --no-normalize "
                             "--data-dir " + quote((dir.path / "data").string()) +
                             " --init-from " + quote(weights);
  const std::string widened = "--init-from " + weights +
                              ": 8 of its 8 tensors are bfloat16, widened exactly into the "
                              "float32 weights";
  const std::string metrics = dir.file("eval.json");
  CliResult r = run_cli(common + " --eval-only --metrics " + quote(metrics));
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Contains(widened));
  const auto j = nlohmann::json::parse(lines_of(read_file(metrics)).at(0));
  CHECK(j["examples"] == golden["test_images"]);
  CHECK(j["test_acc"].get<double>() == golden["test_acc"].get<double>());
  CHECK(j["test_loss"].get<double>() ==
        Approx(golden["test_loss"].get<double>()).epsilon(1e-5));
  // Training from it says so in the run's header.
  CliResult t = run_cli(common + " --epochs 1 --limit-train 32 --lr 0");
  INFO(t.output);
  REQUIRE(t.code == 0);
  CHECK_THAT(t.output, Contains(widened));
  CHECK_THAT(t.output, Contains(fmt::format("test acc {:.4f}", golden["test_acc"].get<double>())));
}
