#include "apps/train_recipes.h"

// The presets are apps/recipes.json, compiled in as kRecipesJson (CMakeLists.txt);
// why each value is what it is: apps/recipes.md.
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include <fmt/format.h>

namespace anvil::app {

extern const char* const kRecipesJson;

namespace {

constexpr const char* kTableFile = "apps/recipes.json";

// The table, parsed once. A table that is not what the code expects is a
// defect of the build, reported naming the file.
const nlohmann::ordered_json& recipe_table() {
  static const nlohmann::ordered_json table = [] {
    auto j = nlohmann::ordered_json::parse(kRecipesJson, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) throw std::runtime_error(fmt::format("{}: not a JSON object", kTableFile));
    return j;
  }();
  return table;
}

// The recipes' names: the table's keys whose values are objects ("about" is not one).
std::string recipe_names() {
  std::string names;
  for (auto& [name, rows] : recipe_table().items())
    if (rows.is_object()) names += (names.empty() ? "" : ", ") + name;
  return names;
}

template <class T>
bool has_type(const nlohmann::ordered_json& v) {
  if constexpr (std::is_same_v<T, bool>) return v.is_boolean();
  else if constexpr (std::is_same_v<T, std::string>) return v.is_string();
  else if constexpr (std::is_floating_point_v<T>) return v.is_number();
  else return v.is_number_integer();
}

// The row of `recipe` for `model`: every recipe flag, each of its type, no
// other key. A model the table does not list gets LeNet's row.
Options preset(const std::string& recipe, const std::string& model) {
  const nlohmann::ordered_json& table = recipe_table();
  auto rows = table.find(recipe);
  if (rows == table.end() || !rows->is_object())
    throw UsageError(
        fmt::format("--recipe: unknown recipe '{}' (known: {})", recipe, recipe_names()));
  const std::string row_name = rows->contains(model) ? model : "lenet";
  auto row = rows->find(row_name);
  if (row == rows->end() || !row->is_object())
    throw std::runtime_error(fmt::format("{}: '{}' has no row '{}'", kTableFile, recipe, row_name));
  Options r;
  size_t keys = 0;
  for_each_recipe_flag([&](const char* flag, auto field) {
    using T = std::decay_t<decltype(r.*field)>;
    auto value = row->find(flag + 2);
    if (value == row->end() || !has_type<T>(*value))
      throw std::runtime_error(fmt::format("{}: {}/{}: '{}' is missing or not a {}", kTableFile,
                                           recipe, row_name, flag + 2,
                                           std::is_same_v<T, bool>          ? "boolean"
                                           : std::is_same_v<T, std::string> ? "string"
                                           : std::is_floating_point_v<T>    ? "number"
                                                                            : "whole number"));
    r.*field = value->template get<T>();
    ++keys;
  });
  if (row->size() != keys)
    throw std::runtime_error(fmt::format("{}: {}/{} has {} keys; the recipe flags are {}",
                                         kTableFile, recipe, row_name, row->size(), keys));
  return r;
}

}  // namespace

Options apply_recipe(const Options& given) {
  const Options values = preset(given.recipe, given.model);
  Options out = given;
  for_each_recipe_flag([&](const char*, auto field) { out.*field = values.*field; });
  return out;
}

models::Init parse_init(const std::string& name) {
  if (name == "seed") return models::Init::Seed;
  if (name == "kaiming") return models::Init::Kaiming;
  if (name == "default") return models::Init::Default;
  throw UsageError(fmt::format("--init: unknown scheme '{}' (seed, kaiming, default)", name));
}

optim::ScheduleOptions check_settings(const Options& o) {
  // Here rather than from SGD's constructor, so that it fails before the
  // data is read, like every other bad flag.
  if (o.nesterov && o.momentum <= 0)
    throw UsageError(fmt::format("--nesterov needs --momentum > 0 (it is {}); give --no-nesterov "
                                 "or a momentum",
                                 o.momentum));
  for_each_recipe_flag([&](const char* flag, auto field) {
    if constexpr (std::is_floating_point_v<std::decay_t<decltype(o.*field)>>)
      if (!std::isfinite(o.*field))
        throw UsageError(fmt::format("{}: expected a finite number, got {}", flag, o.*field));
  });
  if (o.label_smoothing > 1)
    throw UsageError(fmt::format("--label-smoothing {}: must be in [0, 1]", o.label_smoothing));
  constexpr int64_t kMaxResize = 1024;  // 60,000 such images are 250 GB as floats
  if (o.resize > kMaxResize)
    throw UsageError(fmt::format("--resize {}: at most {}", o.resize, kMaxResize));
  const int64_t side = o.resize ? o.resize : 28;
  if (o.augment && o.crop_padding >= side)
    throw UsageError(fmt::format("--crop-padding {}: less than the image size ({}) is needed; "
                                 "more would crop mostly padding",
                                 o.crop_padding, side));
  if (o.model == "lenet" && o.resize != 0 && o.resize != 28)
    throw UsageError(fmt::format("--resize {}: lenet takes 28x28 images (its Linear(800, 128) "
                                 "fixes the size); use a resnet18 model for other sizes",
                                 o.resize));
  if (o.model == "resnet18-96" && o.resize != 96)
    throw UsageError(fmt::format("--resize {}: resnet18-96 is the ResNet-18 for 96x96 inputs "
                                 "(use --model resnet18 for other sizes)",
                                 o.resize));
  optim::ScheduleOptions s;
  try {
    s.shape = optim::parse_schedule_shape(o.lr_schedule);
    s.lr = o.lr;
    s.epochs = o.epochs;
    s.step_epochs = o.lr_step_epochs;
    s.gamma = o.lr_gamma;
    s.min_lr = o.lr_min;
    s.warmup_epochs = o.warmup_epochs;
    s.warmup_start_factor = o.warmup_start_factor;
    optim::LRSchedule check(s);  // validates, naming the flag
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  return s;
}

nlohmann::ordered_json training_settings(const Options& o) {
  nlohmann::ordered_json j;
  j["model"] = o.model;
  for_each_recipe_flag([&](const char* flag, auto field) { j[flag + 2] = o.*field; });
  j["seed"] = o.seed;
  j["limit-train"] = o.limit_train;
  j["no-shuffle"] = o.no_shuffle;
  return j;
}

nlohmann::ordered_json replica_settings(const Options& o) {
  nlohmann::ordered_json j = training_settings(o);
  for (auto& [flag, value] : o.command_line.items())
    if (!j.contains(flag)) j[flag] = value;
  return j;
}

std::string recipes_help() {
  return "Recipes (--recipe; any flag given explicitly overrides its preset):\n"
         "  seed  the seed documents' settings: batch 256, lr 0.2 (LeNet) / 0.1 (ResNet-18),\n"
         "        plain SGD, constant rate, N(0, 0.01) init, 10 epochs, no augmentation\n"
         "  best  Kaiming init, normalised inputs, SGD + Nesterov momentum 0.9, weight decay\n"
         "        5e-4, batch 128, cosine schedule after 1 warmup epoch; LeNet: lr 0.05,\n"
         "        10 epochs; ResNet-18: lr 0.1, 15 epochs, random crop + flip, label\n"
         "        smoothing 0.1\n"
         "resnet18-96 always resizes to 96x96. See docs/training.md, \"Recipes\".\n";
}

}  // namespace anvil::app
