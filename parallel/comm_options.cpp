// The communicator's names (algorithms, collectives), its options from the
// environment (ANVIL_COMM_TIMEOUT, ANVIL_COMM_DEBUG) and the launcher's
// (an MPI job's rank).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "parallel/communicator.h"
#include "parallel/transport.h"

namespace anvil::parallel {

Algorithm parse_algorithm(std::string_view name) {
  if (name == "ring") return Algorithm::kRing;
  if (name == "naive") return Algorithm::kNaive;
  if (name == "native") return Algorithm::kNative;
  throw std::invalid_argument(
      fmt::format("unknown all-reduce algorithm '{}' (choose ring, naive or native)", name));
}

std::string_view algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kRing: return "ring";
    case Algorithm::kNaive: return "naive";
    case Algorithm::kNative: return "native";
  }
  return "?";
}

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::kAllreduce: return "allreduce";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kScatter: return "scatter";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllGather: return "all_gather";
    case Collective::kBarrier: return "barrier";
    case Collective::kSplit: return "split";
    case Collective::kSend: return "send";
    case Collective::kRecv: return "recv";
  }
  return "?";
}

std::chrono::milliseconds default_timeout() {
  const char* env = std::getenv("ANVIL_COMM_TIMEOUT");
  if (env == nullptr || *env == '\0') return std::chrono::minutes(5);
  char* end = nullptr;
  const double seconds = std::strtod(env, &end);
  if (end == env || *end != '\0' || !(seconds > 0) || !std::isfinite(seconds))
    throw std::invalid_argument(fmt::format(
        "ANVIL_COMM_TIMEOUT='{}': expected a positive number of seconds", env));
  return std::chrono::milliseconds(std::max<int64_t>(1, int64_t(seconds * 1000.0)));
}

bool comm_debug() {
  const char* env = std::getenv("ANVIL_COMM_DEBUG");
  if (env == nullptr || *env == '\0' || std::string_view(env) == "OFF") return false;
  if (std::string_view(env) == "INFO") return true;
  throw std::invalid_argument(
      fmt::format("ANVIL_COMM_DEBUG='{}': expected INFO (print every collective) or OFF", env));
}

bool comm_check_default() {
  const char* env = std::getenv("ANVIL_COMM_CHECK");
  if (env == nullptr || *env == '\0' || std::string_view(env) == "ON") return true;
  if (std::string_view(env) == "OFF") return false;
  throw std::invalid_argument(fmt::format(
      "ANVIL_COMM_CHECK='{}': expected ON (compare every rank's call first) or OFF", env));
}

std::string timeout_text(std::chrono::milliseconds t) {
  return fmt::format("{:g} s", double(t.count()) / 1000.0);
}

int mpi_rank_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return -1;
}

}  // namespace anvil::parallel
