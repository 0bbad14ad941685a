#include "apps/evaluation.h"

#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "apps/train_setup.h"
#include "nn/safetensors.h"

namespace anvil::app {
namespace {

// --eval-only --resume FILE: the model's tensors of a training checkpoint.
// The settings that decide what evaluation computes (the model, and the
// inputs it sees) must be the checkpoint's, as for a resumed run.
void load_checkpoint_weights(const Options& o, nn::Module& model) {
  const train::RunState state = train::read_run_state(o.resume);
  const nlohmann::ordered_json saved =
      state.info.value("settings", nlohmann::ordered_json::object());
  const nlohmann::ordered_json settings = app::training_settings(o);
  std::vector<std::string> keys = {"model", "resize", "normalize"};
  if (o.normalize) keys.push_back("limit-train");  // the normalisation's statistics
  for (const std::string& key : keys)
    if (saved.is_object() && saved.contains(key) && saved[key] != settings[key])
      throw nn::CheckpointError(fmt::format(
          "{}: was trained with --{} {}, this run has --{} {}; evaluate with the flags it was "
          "trained with",
          o.resume, key, saved[key].dump(), key, settings[key].dump()));
  nn::NamedTensors weights;
  for (auto& [key, t] : nn::load_safetensors(o.resume))
    if (key.starts_with("model.")) weights.emplace_back(key.substr(6), t);
  nn::load_state_dict(model, weights, o.resume);
}

}  // namespace

std::string class_name(int64_t label) {
  if (label >= 0 && label < int64_t(kFashionClasses.size())) return kFashionClasses[size_t(label)];
  return fmt::format("class {}", label);
}

std::string evaluation_text(const train::ClassEvaluation& e) {
  const int64_t correct = int64_t(e.stats.accuracy * double(e.stats.examples) + 0.5);
  std::string out = fmt::format("test loss {:.4f}, test acc {:.4f} ({} of {} images)\n\n",
                                e.stats.loss, e.stats.accuracy, correct, e.stats.examples);
  out += "per class:\n";
  out += fmt::format("  {:>5}  {:<12} {:>7} {:>8} {:>9}\n", "label", "class", "images", "correct",
                     "accuracy");
  for (int64_t c = 0; c < e.classes; ++c)
    out += fmt::format("  {:>5}  {:<12} {:>7} {:>8} {:>9.4f}\n", c, class_name(c), e.examples_of(c),
                       e.count(c, c), e.accuracy_of(c));
  out += "\nconfusion matrix (rows: true class, columns: predicted class):\n";
  out += fmt::format("  {:<14}", "");
  for (int64_t p = 0; p < e.classes; ++p) out += fmt::format(" {:>5}", p);
  out += '\n';
  for (int64_t t = 0; t < e.classes; ++t) {
    out += fmt::format("  {:>2} {:<11}", t, class_name(t));
    for (int64_t p = 0; p < e.classes; ++p) out += fmt::format(" {:>5}", e.count(t, p));
    out += '\n';
  }
  return out;
}

nlohmann::ordered_json evaluation_json(const train::ClassEvaluation& e) {
  nlohmann::ordered_json j;
  j["test_loss"] = e.stats.loss;
  j["test_acc"] = e.stats.accuracy;
  j["examples"] = e.stats.examples;
  nlohmann::ordered_json names = nlohmann::ordered_json::array();
  nlohmann::ordered_json per_class = nlohmann::ordered_json::array();
  nlohmann::ordered_json confusion = nlohmann::ordered_json::array();
  for (int64_t t = 0; t < e.classes; ++t) {
    names.push_back(class_name(t));
    per_class.push_back({{"label", t},
                         {"class", class_name(t)},
                         {"examples", e.examples_of(t)},
                         {"correct", e.count(t, t)},
                         {"accuracy", e.accuracy_of(t)}});
    nlohmann::ordered_json row = nlohmann::ordered_json::array();
    for (int64_t p = 0; p < e.classes; ++p) row.push_back(e.count(t, p));
    confusion.push_back(row);
  }
  j["classes"] = names;
  j["per_class"] = per_class;
  j["confusion"] = confusion;
  return j;
}

int evaluate_only(const Options& o, nn::Module& model, Device device) {
  const std::string weights = o.resume.empty() ? o.init_from : o.resume;
  const std::string note = o.resume.empty() ? load_init_from(o, model) : "";
  if (!o.resume.empty()) load_checkpoint_weights(o, model);
  model.to(device);
  auto test_set = std::make_shared<const data::ImageSet>(
      data::load_mnist_split(o.data_dir, false, o.limit_test));
  // The training set only for its statistics, when the inputs are normalised.
  data::ImageSet train_set;
  if (o.normalize) train_set = data::load_mnist_split(o.data_dir, true, o.limit_train);
  Transforms transforms = make_transforms(o, train_set);
  data::DataLoader test_loader(test_set, o.batch_size, false, false, o.seed, transforms.test);
  std::cout << fmt::format("evaluating {} ({} parameters) from {} on {}: {} test images, batch {}, "
                           "transforms {}\n",
                           o.model, model.num_parameters(), weights, device.str(), test_set->count,
                           o.batch_size, transforms.summary)
            << note << std::flush;
  const train::ClassEvaluation result =
      train::evaluate_classes(model, test_loader, device, int64_t(app::kFashionClasses.size()),
                              o.amp_bf16());
  std::cout << app::evaluation_text(result) << std::flush;
  if (!o.metrics.empty()) {
    nlohmann::ordered_json j = {{"mode", "eval"},     {"weights", weights}, {"model", o.model},
                                {"recipe", o.recipe}, {"device", device.str()}};
    j.update(app::evaluation_json(result));
    std::ofstream out(o.metrics, std::ios::trunc);
    out << j.dump() << '\n';
    out.close();
    if (!out) throw UsageError(fmt::format("--metrics {}: cannot write", o.metrics));
  }
  return 0;
}

}  // namespace anvil::app
