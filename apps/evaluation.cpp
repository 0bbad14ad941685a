#include "apps/evaluation.h"

#include <fmt/format.h>

namespace anvil::app {

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

}  // namespace anvil::app
