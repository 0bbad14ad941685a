// Learning-rate schedules: every shape, with and without warmup, against the
// rates torch's schedulers give (tests/golden/schedule_golden.json, made by
// tests/golden/make_schedule_golden.py), exact closed-form values at the
// corners, and one clear error per bad setting, naming its flag.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "nn/schedule.h"
#include "tests/golden_util.h"

using namespace anvil::optim;
using Catch::Contains;

namespace {

ScheduleOptions options_from(const nlohmann::json& c) {
  ScheduleOptions o;
  o.shape = parse_schedule_shape(c.at("shape").get<std::string>());
  o.lr = c.at("lr");
  o.epochs = c.at("epochs");
  o.step_epochs = c.value("step_epochs", int64_t{1});
  o.gamma = c.value("gamma", 0.1);
  o.min_lr = c.value("min_lr", 0.0);
  o.warmup_epochs = c.value("warmup_epochs", int64_t{0});
  o.warmup_start_factor = c.value("warmup_start_factor", 0.1);
  return o;
}

// A schedule's options: `shape` from lr over `epochs`, then `change` applied.
template <class Change>
ScheduleOptions make(ScheduleShape shape, double lr, int64_t epochs, Change change) {
  ScheduleOptions o;
  o.shape = shape;
  o.lr = lr;
  o.epochs = epochs;
  change(o);
  return o;
}
ScheduleOptions make(ScheduleShape shape, double lr, int64_t epochs) {
  return make(shape, lr, epochs, [](ScheduleOptions&) {});
}

// The message of the std::invalid_argument that constructing throws.
std::string error_of(const ScheduleOptions& o) {
  try {
    LRSchedule s(o);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  FAIL("no error for a bad schedule");
  return "";
}

}  // namespace

TEST_CASE("LR schedules give torch's rates, step by step", "[schedule]") {
  const nlohmann::json& golden = anvil::testing::golden_file("schedule_golden.json");
  REQUIRE(golden["cases"].size() >= 8);
  for (auto& c : golden["cases"]) {
    const std::string name = c["name"];
    INFO("case " << name);
    LRSchedule schedule(options_from(c));
    const int64_t epochs = c["epochs"], batches = c["batches"];
    auto& lrs = c["lrs"];
    REQUIRE(int64_t(lrs.size()) == epochs * batches);
    for (int64_t e = 0; e < epochs; ++e)
      for (int64_t b = 0; b < batches; ++b) {
        INFO("epoch " << e << ", batch " << b);
        double want = lrs[size_t(e * batches + b)];
        // torch's cosine is recursive, so its rounding drifts a little from
        // the closed form this computes.
        CHECK(schedule.lr(e, b, batches) == Approx(want).epsilon(1e-9).margin(1e-15));
      }
  }
}

TEST_CASE("LR schedules: closed-form values at the corners", "[schedule]") {
  SECTION("constant: the rate, always") {
    LRSchedule s(make(ScheduleShape::Constant, 0.2, 3));
    CHECK(s.lr(0, 0, 10) == 0.2);
    CHECK(s.lr(2, 9, 10) == 0.2);
    CHECK(s.lr(7, 3, 10) == 0.2);  // past the end too
  }
  SECTION("step: gamma^k after k * step_epochs epochs, the same for a whole epoch") {
    LRSchedule s(make(ScheduleShape::Step, 1.0, 9, [](auto& o) {
      o.step_epochs = 3;
      o.gamma = 0.5;
    }));
    CHECK(s.lr(0, 0, 4) == 1.0);
    CHECK(s.lr(2, 3, 4) == 1.0);
    CHECK(s.lr(3, 0, 4) == 0.5);
    CHECK(s.lr(5, 3, 4) == 0.5);
    CHECK(s.lr(6, 0, 4) == 0.25);
    CHECK(s.lr(8, 3, 4) == 0.25);
  }
  SECTION("cosine: lr at the start, the midpoint halfway, min_lr at the end") {
    LRSchedule s(make(ScheduleShape::Cosine, 0.1, 4, [](auto& o) { o.min_lr = 0.02; }));
    CHECK(s.lr(0, 0, 5) == 0.1);
    CHECK(s.lr(2, 0, 5) == Approx(0.06).epsilon(1e-15));  // t = T/2
    CHECK(s.lr(3, 4, 5) > 0.02);                          // the last step is before T
    CHECK(s.lr(3, 4, 5) == Approx(0.02 + 0.08 * (1 + std::cos(M_PI * 19 / 20)) / 2));
    CHECK(s.lr(9, 0, 5) == Approx(0.02).epsilon(1e-15));  // stays at the minimum
  }
  SECTION("warmup: from lr * start_factor, linearly per iteration, then the shape from its start") {
    LRSchedule s(make(ScheduleShape::Cosine, 0.1, 5, [](auto& o) {
      o.min_lr = 0;
      o.warmup_epochs = 1;
      o.warmup_start_factor = 0.1;
    }));
    CHECK(s.lr(0, 0, 10) == Approx(0.01).epsilon(1e-15));
    CHECK(s.lr(0, 5, 10) == Approx(0.055).epsilon(1e-15));
    CHECK(s.lr(0, 9, 10) == Approx(0.091).epsilon(1e-15));
    CHECK(s.lr(1, 0, 10) == 0.1);  // the cosine starts at its peak
    CHECK(s.lr(3, 0, 10) == Approx(0.05).epsilon(1e-15));  // halfway through its 40 steps
    LRSchedule step(make(ScheduleShape::Step, 1.0, 6, [](auto& o) {
      o.step_epochs = 2;
      o.gamma = 0.1;
      o.warmup_epochs = 2;
      o.warmup_start_factor = 0.5;
    }));
    CHECK(step.lr(1, 2, 4) == Approx(0.5 + 0.5 * 6 / 8).epsilon(1e-15));
    CHECK(step.lr(2, 0, 4) == 1.0);  // the step's epochs count from the warmup's end
    CHECK(step.lr(3, 3, 4) == 1.0);
    CHECK(step.lr(4, 0, 4) == Approx(0.1).epsilon(1e-15));
  }
  SECTION("a warmup as long as the run never reaches the shape") {
    LRSchedule s(make(ScheduleShape::Cosine, 0.3, 2, [](auto& o) {
      o.warmup_epochs = 2;
      o.warmup_start_factor = 0.5;
    }));
    CHECK(s.lr(1, 9, 10) == Approx(0.3 * (0.5 + 0.5 * 19 / 20)).epsilon(1e-15));
    CHECK(s.lr(2, 0, 10) == 0.3);
  }
}

TEST_CASE("LR schedules: shape names", "[schedule]") {
  CHECK(parse_schedule_shape("constant") == ScheduleShape::Constant);
  CHECK(parse_schedule_shape("step") == ScheduleShape::Step);
  CHECK(parse_schedule_shape("cosine") == ScheduleShape::Cosine);
  for (auto shape : {ScheduleShape::Constant, ScheduleShape::Step, ScheduleShape::Cosine})
    CHECK(parse_schedule_shape(schedule_shape_name(shape)) == shape);
  for (const char* bad : {"linear", "Cosine", ""}) {
    INFO("'" << bad << "'");
    try {
      parse_schedule_shape(bad);
      FAIL("accepted");
    } catch (const std::invalid_argument& e) {
      CHECK_THAT(e.what(), Contains("--lr-schedule") && Contains(std::string("'") + bad + "'") &&
                               Contains("constant, step, cosine"));
    }
  }
}

TEST_CASE("LR schedules: each bad setting names its flag", "[schedule]") {
  const ScheduleOptions step = make(ScheduleShape::Step, 0.1, 10);
  const ScheduleOptions cosine = make(ScheduleShape::Cosine, 0.1, 10);
  auto with = [](ScheduleOptions o, auto change) {
    change(o);
    return o;
  };
  CHECK_THAT(error_of(with(step, [](auto& o) { o.lr = -1; })), Contains("--lr:"));
  CHECK_THAT(error_of(with(step, [](auto& o) { o.lr = NAN; })), Contains("--lr:"));
  CHECK_THAT(error_of(with(step, [](auto& o) { o.epochs = -2; })), Contains("--epochs:"));
  CHECK_THAT(error_of(with(step, [](auto& o) { o.step_epochs = 0; })),
             Contains("--lr-step-epochs:") && Contains("got 0"));
  CHECK_THAT(error_of(with(step, [](auto& o) { o.gamma = 0; })), Contains("--lr-gamma:"));
  CHECK_THAT(error_of(with(step, [](auto& o) { o.gamma = 1.5; })),
             Contains("--lr-gamma:") && Contains("1.5"));
  CHECK_THAT(error_of(with(step, [](auto& o) { o.gamma = INFINITY; })), Contains("--lr-gamma:"));
  CHECK_THAT(error_of(with(cosine, [](auto& o) { o.min_lr = 0.2; })),
             Contains("--lr-min:") && Contains("0.2"));
  CHECK_THAT(error_of(with(cosine, [](auto& o) { o.min_lr = -0.01; })), Contains("--lr-min:"));
  CHECK_THAT(error_of(with(cosine, [](auto& o) { o.warmup_epochs = -1; })),
             Contains("--warmup-epochs:"));
  CHECK_THAT(error_of(with(cosine, [](auto& o) { o.warmup_epochs = 11; })),
             Contains("--warmup-epochs:") && Contains("--epochs 10"));
  CHECK_THAT(error_of(with(cosine, [](auto& o) {
               o.warmup_epochs = 1;
               o.warmup_start_factor = 0;
             })),
             Contains("--warmup-start-factor:"));
  // Settings a shape does not use are not checked: a preset's step length
  // does not trouble a cosine run.
  CHECK_NOTHROW(LRSchedule(with(cosine, [](auto& o) { o.step_epochs = 0; })));
  CHECK_NOTHROW(LRSchedule(with(step, [](auto& o) { o.min_lr = 5; })));
  // A position outside the run's grid is a programming error.
  LRSchedule s(step);
  CHECK_THROWS_AS(s.lr(0, 5, 5), std::invalid_argument);
  CHECK_THROWS_AS(s.lr(-1, 0, 5), std::invalid_argument);
  CHECK_THROWS_AS(s.lr(0, 0, 0), std::invalid_argument);
}
