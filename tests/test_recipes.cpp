// anvil-train's --recipe presets: every value of every (recipe, model), as
// apps/recipes.json gives them, the errors for a bad recipe name, and the
// values --help quotes.
#include <catch2/catch.hpp>

#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/train_recipes.h"

using anvil::app::Options;
using Catch::Contains;

namespace {

// The recipe settings of `recipe` for `model`, keyed by flag name.
nlohmann::ordered_json preset(const std::string& recipe, const std::string& model) {
  Options o;
  o.recipe = recipe;
  o.model = model;
  const Options r = anvil::app::apply_recipe(o);
  nlohmann::ordered_json j;
  anvil::app::for_each_recipe_flag([&](const char* flag, auto field) { j[flag + 2] = r.*field; });
  return j;
}

nlohmann::ordered_json seed_lenet() {
  return {{"epochs", 10},          {"batch-size", 256},     {"lr", 0.2},
          {"momentum", 0.0},       {"weight-decay", 0.0},   {"nesterov", false},
          {"init", "seed"},        {"lr-schedule", "constant"}, {"lr-step-epochs", 10},
          {"lr-gamma", 0.1},       {"lr-min", 0.0},         {"warmup-epochs", 0},
          {"warmup-start-factor", 0.1}, {"resize", 0},      {"augment", false},
          {"crop-padding", 0},     {"normalize", false},    {"label-smoothing", 0.0}};
}

nlohmann::ordered_json best_lenet() {
  return {{"epochs", 10},          {"batch-size", 128},     {"lr", 0.05},
          {"momentum", 0.9},       {"weight-decay", 5e-4},  {"nesterov", true},
          {"init", "kaiming"},     {"lr-schedule", "cosine"}, {"lr-step-epochs", 10},
          {"lr-gamma", 0.1},       {"lr-min", 0.0},         {"warmup-epochs", 1},
          {"warmup-start-factor", 0.1}, {"resize", 0},      {"augment", false},
          {"crop-padding", 2},     {"normalize", true},     {"label-smoothing", 0.0}};
}

}  // namespace

TEST_CASE("recipes: the seed presets are the seeds' settings", "[recipes]") {
  CHECK(preset("seed", "lenet") == seed_lenet());
  nlohmann::ordered_json resnet = seed_lenet();
  resnet["lr"] = 0.1;
  CHECK(preset("seed", "resnet18") == resnet);
  resnet["resize"] = 96;
  CHECK(preset("seed", "resnet18-96") == resnet);
}

TEST_CASE("recipes: the best presets", "[recipes]") {
  CHECK(preset("best", "lenet") == best_lenet());
  nlohmann::ordered_json resnet = best_lenet();
  resnet["epochs"] = 15;
  resnet["lr"] = 0.1;
  resnet["augment"] = true;
  resnet["label-smoothing"] = 0.1;
  CHECK(preset("best", "resnet18") == resnet);
  resnet["resize"] = 96;
  resnet["crop-padding"] = 7;
  CHECK(preset("best", "resnet18-96") == resnet);
}

TEST_CASE("recipes: an unknown model gets LeNet's values, an unknown recipe an error",
          "[recipes]") {
  // models::create refuses the model later, naming --model.
  CHECK(preset("seed", "vgg") == seed_lenet());
  CHECK(preset("best", "vgg") == best_lenet());
  CHECK_THROWS_WITH(preset("fast", "lenet"),
                    Contains("--recipe: unknown recipe 'fast'") && Contains("seed, best"));
}

TEST_CASE("recipes: flags outside the recipe are kept", "[recipes]") {
  Options o;
  o.recipe = "best";
  o.seed = 7;
  o.limit_train = 100;
  o.metrics = "m.jsonl";
  const Options r = anvil::app::apply_recipe(o);
  CHECK(r.seed == 7);
  CHECK(r.limit_train == 100);
  CHECK(r.metrics == "m.jsonl");
  CHECK(r.recipe == "best");
}

TEST_CASE("recipes: --help's summary of the presets quotes the table's values", "[recipes]") {
  const std::string help = anvil::app::recipes_help();
  const auto lr = [](const std::string& recipe, const std::string& model) {
    return preset(recipe, model)["lr"].dump();
  };
  CHECK_THAT(help, Contains(fmt::format("batch {}, lr {} (LeNet) / {} (ResNet-18)",
                                        preset("seed", "lenet")["batch-size"].dump(),
                                        lr("seed", "lenet"), lr("seed", "resnet18"))));
  CHECK_THAT(help, Contains(fmt::format("{} epochs, no augmentation",
                                        preset("seed", "lenet")["epochs"].dump())));
  CHECK_THAT(help, Contains(fmt::format("batch {}, cosine schedule after {} warmup epoch",
                                        preset("best", "lenet")["batch-size"].dump(),
                                        preset("best", "lenet")["warmup-epochs"].dump())));
  CHECK_THAT(help, Contains(fmt::format("LeNet: lr {},", lr("best", "lenet"))));
  CHECK_THAT(help, Contains(fmt::format("ResNet-18: lr {}, {} epochs", lr("best", "resnet18"),
                                        preset("best", "resnet18")["epochs"].dump())));
  CHECK_THAT(help, Contains(fmt::format("momentum {}", preset("best", "lenet")["momentum"].dump())));
}
