// The simulator's launch audit in tests (sim/launch_audit.cpp): recording
// one part of a test, and reading the file back.
#pragma once
#if defined(ANVIL_CUDA_SIM)
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/cuda/runtime.h"

namespace launch_audit_test {

// The audit's file as rows by kernel name; every line must be a JSON object
// with every field the audit promises.
inline std::map<std::string, nlohmann::json> read_audit(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::map<std::string, nlohmann::json> rows;
  double shares = 0;
  for (std::string line; std::getline(in, line);) {
    INFO(path << ": " << line);
    nlohmann::json row;
    REQUIRE_NOTHROW(row = nlohmann::json::parse(line));
    REQUIRE(row.is_object());
    for (const char* field :
         {"kernel", "launches", "blocks_min", "blocks_max", "threads_per_block", "blocks_per_sm",
          "residency_source", "work_share", "predicted_sm_utilisation", "wave_fill",
          "sample_blocks"})
      REQUIRE(row.contains(field));
    CHECK(row["blocks_min"].get<uint64_t>() <= row["blocks_max"].get<uint64_t>());
    const double u = row["predicted_sm_utilisation"].get<double>();
    CHECK(u >= 0.0);
    CHECK(u <= 1.0 + 1e-9);
    shares += row["work_share"].get<double>();
    rows[row["kernel"].get<std::string>()] = row;
  }
  REQUIRE(!rows.empty());
  CHECK(shares == Approx(1.0).epsilon(1e-6));
  return rows;
}

// Finishes the audit even when a REQUIRE leaves the test early, so that no
// later test records into it.
struct AuditScope {
  explicit AuditScope(const std::string& path) { anvil::sim::start_launch_audit(path); }
  ~AuditScope() {
    try {
      anvil::sim::finish_launch_audit();
    } catch (...) {
    }
  }
};

}  // namespace launch_audit_test

#endif
