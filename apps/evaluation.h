// anvil-train --eval-only: the test figures of a weights file, per class and
// as a confusion matrix, as text for the terminal and as JSON for --metrics.
#pragma once
#include <array>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/train_recipes.h"
#include "core/device.h"
#include "nn/module.h"
#include "nn/train.h"

namespace anvil::app {

// Fashion-MNIST's classes, by label.
inline constexpr std::array<const char*, 10> kFashionClasses = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

// The class's name, or its number when there is no name for it.
std::string class_name(int64_t label);

// Test loss and accuracy, a table of each class's accuracy, then the
// confusion matrix (rows: true class, columns: predicted class).
std::string evaluation_text(const train::ClassEvaluation& e);

// The same figures as one JSON object: test_loss, test_acc, examples,
// classes (names), per_class [{label, class, examples, correct, accuracy}]
// and confusion (rows: true class).
nlohmann::ordered_json evaluation_json(const train::ClassEvaluation& e);

// anvil-train --eval-only: the test figures of the weights in `model` (or,
// with --resume, of the checkpoint's, whose model and input settings must be
// this run's), per class and as a confusion matrix; --metrics gets them as
// one JSON object. Returns the exit status (0).
int evaluate_only(const Options& o, nn::Module& model, Device device);

}  // namespace anvil::app
