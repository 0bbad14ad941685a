// The launch audit (ANVIL_SIM_LAUNCH_AUDIT=FILE; docs/kernels.md, "Launch
// audit"): how well each kernel of a run would fill an H100's 132 SMs. The
// scheduler times every block of every launch (sim/scheduler.cpp); here each
// launch is named after its kernel's symbol, its blocks are dealt to the
// SMs' block slots, and per kernel the launches, their blocks, their share of
// the run's block time and the predicted utilisation are kept, to be written
// as one JSON object per kernel per line when the audit finishes (at exit
// for the environment variable).
//
// The prediction for one launch. Each SM holds R blocks at once: R follows
// from the kernel's registers and static shared memory as ptxas reported
// them for sm_90 (docs/kernel-resources.json, made by tools/predict/kernel-table.sh)
// and the launch's threads and dynamic shared memory, with the H100's limits;
// a kernel not in that file is assumed to fit one block per SM. The blocks
// are dealt in launch order to the 132 * R slots, each to the slot that frees
// first, as the GPU's block scheduler gives an SM a new block when one of its
// blocks ends; a block holds its slot for its measured simulated time (a fair
// proxy for its work: the simulator runs every thread of it; record_launch
// first takes the host's jitter out of the times). The ideal is
// the launch's total block time spread evenly over every slot; the
// prediction is that ideal over the time the busiest slot takes. One block
// scores 1 / (132 R); many blocks of equal work score close to 1. A kernel's
// figure averages its launches' weighted by their time.
//
// Beside it, wave_fill: the same deal with every block's work taken as equal,
// blocks / (waves * 132 R), weighted the same way. It needs no timing, so it
// does not move from run to run: where the two differ, either the blocks'
// work differs (edge tiles, uneven splits) or the host took time from some
// blocks (a launch of 1040 equal blocks in 1056 slots fills 0.985 of its wave,
// and has been timed at 0.66 to 0.985 on this 2-core virtual machine).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/symbol_name.h"
#include "sim/sim_internal.h"

#if !defined(ANVIL_SIM_KERNEL_RESOURCES)
#define ANVIL_SIM_KERNEL_RESOURCES "docs/kernel-resources.json"
#endif

namespace anvil::sim {
namespace {

// ---- one H100 SM (compute capability 9.0), as tools/predict/kernel_table.py ----
constexpr unsigned kSms = 132;
constexpr unsigned kSmThreads = 2048;
constexpr unsigned kSmBlocks = 32;
constexpr unsigned kSmRegisters = 65536;
constexpr unsigned kRegisterUnit = 256;          // per warp
constexpr size_t kSmSharedBytes = 228 * 1024;    // the largest carveout
constexpr size_t kSharedReservedPerBlock = 1024;  // by the system
constexpr size_t kSharedUnit = 128;

// The relative jitter of one block's measured time on a busy host (see
// record_launch).
constexpr double kJitter = 0.25;
// Blocks in the median that replaces each block's time (see record_launch).
constexpr size_t kWindow = 9;

struct Resources {
  unsigned registers = 0;
  size_t static_shared = 0;
};

struct Residency {
  unsigned blocks = 1;
  const char* limit = "assumed";
};

// Blocks one SM holds at once, and the resource that limits them.
Residency resident_blocks(unsigned threads, const Resources& r, size_t dynamic_shared) {
  const unsigned warps = (threads + 31) / 32;
  const unsigned regs_per_warp =
      (std::max(r.registers, 1u) * 32 + kRegisterUnit - 1) / kRegisterUnit * kRegisterUnit;
  const size_t shared = r.static_shared + dynamic_shared + kSharedReservedPerBlock;
  const size_t shared_per_block = (shared + kSharedUnit - 1) / kSharedUnit * kSharedUnit;
  const std::pair<unsigned, const char*> limits[] = {
      {kSmThreads / threads, "threads"},
      {kSmRegisters / regs_per_warp / warps, "registers"},
      {static_cast<unsigned>(kSmSharedBytes / shared_per_block), "shared memory"},
      {kSmBlocks, "blocks"},
  };
  Residency best{~0u, ""};
  for (auto [n, what] : limits)
    if (n < best.blocks) best = {n, what};
  best.blocks = std::max(best.blocks, 1u);  // a launch that ran fits at least one
  return best;
}

// The share of its waves' slots a launch of `blocks` fills, every block
// counted equal (the wave_fill field).
double wave_fill(uint64_t blocks, uint64_t slots) {
  const uint64_t waves = (blocks + slots - 1) / slots;
  return waves > 0 ? double(blocks) / double(waves * slots) : 0.0;
}

// The launch's predicted utilisation: the ideal over the busiest slot's time.
double predicted_utilisation(const std::vector<double>& seconds, uint64_t slots) {
  double total = 0, busiest = 0;
  for (double t : seconds) total += t;
  if (seconds.size() <= slots) {
    for (double t : seconds) busiest = std::max(busiest, t);
  } else {
    std::priority_queue<double, std::vector<double>, std::greater<>> free_at(
        seconds.begin(), seconds.begin() + static_cast<std::ptrdiff_t>(slots));
    for (size_t b = slots; b < seconds.size(); ++b) {
      const double t = free_at.top();
      free_at.pop();
      free_at.push(t + seconds[b]);
    }
    while (free_at.size() > 1) free_at.pop();
    busiest = free_at.top();
  }
  if (busiest <= 0) return wave_fill(seconds.size(), slots);  // no measurable time
  return total / double(slots) / busiest;
}

// The blocks' times as the prediction takes them (in launch order, the blocks
// that ran).
std::vector<double> without_host_noise(const std::vector<double>& ran) {
  // Each block's time becomes the lower quartile of the times of the 9
  // blocks around it. The host only ever adds to a block's time (page faults, caches
  // cold after the simulator's thread was descheduled, another process's
  // memory traffic), often for a few blocks in a row, and one such block in
  // the last wave would set the busiest slot's time; a real difference of
  // work (edge tiles, an uneven split) spans runs of neighbouring blocks and
  // stays, and a lone light block does not lower its neighbours'.
  std::vector<double> smooth(ran.size());
  for (size_t i = 0; i < ran.size(); ++i) {
    // The window keeps its width at the ends: the first blocks of a launch
    // (cold caches, first touches of new memory) are the slowest.
    const size_t n = std::min(ran.size(), kWindow);
    const size_t lo = std::min(i - std::min(i, kWindow / 2), ran.size() - n);
    double window[kWindow];
    std::copy(ran.begin() + std::ptrdiff_t(lo), ran.begin() + std::ptrdiff_t(lo + n), window);
    std::nth_element(window, window + (n - 1) / 4, window + n);
    smooth[i] = window[(n - 1) / 4];
  }
  // Blocks within a quarter of the launch's median are taken to do the
  // median's work: the host's jitter on one block's time is of that order,
  // and over a launch's 132 x R slots the busiest would pick up its largest
  // excursions (equal elementwise blocks scored 0.7 instead of 0.97). Work
  // that really differs more (a partial edge tile, an uneven split) stays.
  if (!smooth.empty()) {
    std::vector<double> sorted = smooth;
    std::nth_element(sorted.begin(), sorted.begin() + std::ptrdiff_t(sorted.size() / 2), sorted.end());
    const double median = sorted[sorted.size() / 2];
    for (double& t : smooth)
      if (std::abs(t - median) <= kJitter * median) t = median;
  }
  return smooth;
}

// ---- naming a kernel by its symbol (core/symbol_name.h) ----

// "conv_kernels::forward_warp_tiled<warp_tile::Shape<8, 2, ...> >" for a
// kernel's mangled symbol.
std::string readable_name(const std::string& mangled) {
  return short_kernel_name(demangle(mangled.c_str()));
}

// ---- what the audit keeps ----

struct KernelStats {
  std::string name, mangled;
  std::optional<Resources> resources;  // from docs/kernel-resources.json
  uint64_t launches = 0, sampled_launches = 0;
  uint64_t graph_runs = 0;  // of the launches, those that ran as a graph launch's nodes
  uint64_t sample_blocks = 0;  // the most blocks a sampled launch ran (0: none sampled)
  uint64_t blocks_min = std::numeric_limits<uint64_t>::max(), blocks_max = 0;
  unsigned threads_min = ~0u, threads_max = 0;
  unsigned resident_min = ~0u, resident_max = 0;
  std::string limit;
  size_t dynamic_shared_max = 0;
  double seconds = 0;
  double utilisation_seconds = 0;  // sum of each launch's utilisation x its seconds
  double fill_seconds = 0;         // sum of each launch's wave fill x its seconds
};

struct Audit {
  std::mutex mutex;
  std::atomic<bool> recording{false};
  std::string path;
  std::string resources_path;
  std::string resources_note;  // why no resources were read, if so
  std::map<std::string, Resources> resources;  // by mangled name
  std::map<const void*, KernelStats*> by_address;
  std::map<std::string, KernelStats> by_name;
  // cudaGraphLaunch: the host's launches of graphs, the kernel nodes they ran
  // and those kernels' simulated seconds (also in the kernels' rows).
  uint64_t graph_launches = 0, graph_nodes = 0;
  double graph_seconds = 0;
};

// The graph launch this thread is running the nodes of, if any.
thread_local bool t_in_graph = false;

Audit& audit() {
  static auto* a = new Audit();  // leaked: launches may come from static destructors
  return *a;
}

// Creates (truncates) the file now, so that a path that cannot be written
// fails before the run rather than after it.
void check_writable(const std::string& path, const char* what) {
  std::ofstream probe(path, std::ios::trunc);
  if (!probe)
    throw std::runtime_error(std::string(what) + " '" + path +
                             "': cannot open for writing: " + std::strerror(errno));
}

void load_resources(Audit& a) {
  a.resources.clear();
  a.resources_note.clear();
  const char* env = std::getenv("ANVIL_SIM_KERNEL_RESOURCES");
  a.resources_path = env && *env ? env : ANVIL_SIM_KERNEL_RESOURCES;
  std::ifstream in(a.resources_path);
  if (!in) {
    a.resources_note = a.resources_path + " not found";
    return;
  }
  try {
    const auto doc = nlohmann::json::parse(in);
    for (const auto& [mangled, k] : doc.at("kernels").items())
      a.resources[mangled] = {k.at("registers").get<unsigned>(),
                              k.at("static_shared_bytes").get<size_t>()};
  } catch (const std::exception& e) {
    throw std::runtime_error("launch audit: " + a.resources_path + " is malformed: " + e.what());
  }
}

void start(Audit& a, const std::string& path, const char* what) {
  if (a.recording.load()) throw std::runtime_error(std::string(what) + ": an audit already records to '" + a.path + "'");
  check_writable(path, what);
  load_resources(a);
  a.path = path;
  a.by_address.clear();
  a.by_name.clear();
  a.graph_launches = a.graph_nodes = 0;
  a.graph_seconds = 0;
  a.recording.store(true);
}

// A kernel's line of the audit's file; total: every kernel's seconds.
nlohmann::ordered_json line_of(const KernelStats& k, const Audit& a, double total) {
  nlohmann::ordered_json line;
  line["kernel"] = k.name;
  line["launches"] = k.launches;
  line["blocks_min"] = k.blocks_min;
  line["blocks_max"] = k.blocks_max;
  line["threads_per_block"] = k.threads_max;
  line["threads_per_block_min"] = k.threads_min;
  line["blocks_per_sm"] = k.resident_min;
  line["blocks_per_sm_max"] = k.resident_max;
  line["residency_limit"] = k.limit;
  line["residency_source"] =
      k.resources ? "ptxas sm_90 (" + a.resources_path + ")"
                  : "assumed 1 block per SM: " +
                        (a.resources_note.empty() ? "not in " + a.resources_path : a.resources_note);
  line["registers"] = k.resources ? nlohmann::ordered_json(k.resources->registers) : nullptr;
  line["static_shared_bytes"] =
      k.resources ? nlohmann::ordered_json(k.resources->static_shared) : nullptr;
  line["dynamic_shared_bytes"] = k.dynamic_shared_max;
  line["simulated_seconds"] = k.seconds;
  line["work_share"] = total > 0 ? k.seconds / total : 0.0;
  line["predicted_sm_utilisation"] = k.seconds > 0 ? k.utilisation_seconds / k.seconds : 0.0;
  line["wave_fill"] = k.seconds > 0 ? k.fill_seconds / k.seconds : 0.0;
  line["sampled_launches"] = k.sampled_launches;
  line["sample_blocks"] = k.sample_blocks;
  line["mangled"] = k.mangled;
  line["graph_runs"] = k.graph_runs;
  return line;
}

void write(Audit& a) {
  std::vector<const KernelStats*> rows;
  double total = 0;
  for (const auto& [name, k] : a.by_name) {
    rows.push_back(&k);
    total += k.seconds;
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](auto* x, auto* y) { return x->seconds > y->seconds; });
  std::ofstream out(a.path, std::ios::trunc);
  for (const KernelStats* k : rows) out << line_of(*k, a, total).dump() << '\n';
  if (a.graph_launches > 0) {
    // One launch for the host each. Their kernels' work is in the lines
    // above (graph_runs): this line's seconds are those kernels', its share
    // of the work 0.
    KernelStats graphs;
    graphs.name = "cudaGraphLaunch";
    graphs.launches = a.graph_launches;
    graphs.blocks_min = graphs.blocks_max = graphs.threads_min = graphs.threads_max = 0;
    graphs.resident_min = graphs.resident_max = 0;
    graphs.limit = "-";
    nlohmann::ordered_json line = line_of(graphs, a, 0);
    line["simulated_seconds"] = a.graph_seconds;
    line["residency_source"] = "graph launches: their kernels are the lines with graph_runs";
    line["graph_nodes"] = a.graph_nodes;
    out << line.dump() << '\n';
  }
  out.close();
  if (!out)
    throw std::runtime_error("launch audit: cannot write '" + a.path + "': " + std::strerror(errno));
}

void finish_at_exit() {
  try {
    finish_launch_audit();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anvil sim: %s\n", e.what());
  }
}

std::atomic<uint64_t>& sample_setting() {
  static std::atomic<uint64_t> count = [] {
    const char* env = std::getenv("ANVIL_SIM_SAMPLE_BLOCKS");
    if (!env || !*env) return uint64_t{0};
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(env, &end, 10);
    if (errno || *end || n < 0)
      throw std::runtime_error(std::string("ANVIL_SIM_SAMPLE_BLOCKS='") + env +
                               "': not a block count (0 runs every block)");
    return static_cast<uint64_t>(n);
  }();
  return count;
}

}  // namespace

void start_launch_audit(const std::string& path) {
  Audit& a = audit();
  std::lock_guard lock(a.mutex);
  start(a, path, "launch audit");
}

void finish_launch_audit() {
  Audit& a = audit();
  std::lock_guard lock(a.mutex);
  if (!a.recording.load()) return;
  a.recording.store(false);
  write(a);
}

void set_sample_blocks(uint64_t count) { sample_setting().store(count); }
uint64_t sample_blocks() { return sample_setting().load(); }

bool detail::launch_audit_recording() {
  Audit& a = audit();
  // The environment is read at the first launch; a file that cannot be
  // written fails that launch (and every later one) with the reason.
  static const bool from_env = [&a] {
    const char* env = std::getenv("ANVIL_SIM_LAUNCH_AUDIT");
    if (!env || !*env) return false;
    std::lock_guard lock(a.mutex);
    start(a, env, "ANVIL_SIM_LAUNCH_AUDIT");
    std::atexit(finish_at_exit);
    return true;
  }();
  (void)from_env;
  return a.recording.load(std::memory_order_relaxed);
}

uint64_t detail::sample_blocks_for_launch() {
  const uint64_t n = sample_blocks();
  static std::atomic<bool> told{false};
  if (n > 0 && !told.exchange(true))
    std::fprintf(stderr,
                 "anvil sim: ANVIL_SIM_SAMPLE_BLOCKS=%llu: each launch runs at most %llu of its "
                 "blocks and skips the rest; this run's numeric results are invalid (it is for "
                 "the launch audit's timings)\n",
                 static_cast<unsigned long long>(n), static_cast<unsigned long long>(n));
  return n;
}

void detail::record_launch(const KernelLaunch& launch, std::vector<double>& seconds) {
  double launch_seconds = 0;  // what the blocks that ran took, as measured
  std::vector<double> ran;
  for (double t : seconds)
    if (t >= 0) ran.push_back(t);
  for (double t : ran) launch_seconds += t;
  std::vector<double> smooth = without_host_noise(ran);
  // A block the sample skipped is taken to last the mean of those that ran.
  const bool sampled = ran.size() < seconds.size();
  double mean = 0;
  for (double t : smooth) mean += t;
  mean = smooth.empty() ? 0.0 : mean / double(smooth.size());
  if (sampled) launch_seconds += mean * double(seconds.size() - ran.size());
  for (size_t b = 0, i = 0; b < seconds.size(); ++b) seconds[b] = seconds[b] >= 0 ? smooth[i++] : mean;

  Audit& a = audit();
  std::lock_guard lock(a.mutex);
  if (!a.recording.load()) return;  // finished while this launch ran
  const void* address = launch.call->kernel_address();
  KernelStats*& k = a.by_address[address];
  if (k == nullptr) {
    const std::string mangled = address ? mangled_name_at(address) : std::string();
    // Without a symbol (a stripped binary), the launch site names the kernel.
    const std::string name = mangled.empty() ? detail::launch_site(launch.where) : readable_name(mangled);
    k = &a.by_name[name];
    k->name = name;
    k->mangled = mangled;
    if (auto r = a.resources.find(mangled); r != a.resources.end()) k->resources = r->second;
  }
  const unsigned threads = launch.block.x * launch.block.y * launch.block.z;
  const Residency r = k->resources ? resident_blocks(threads, *k->resources, launch.shared_bytes)
                                   : Residency{};
  const uint64_t slots = uint64_t{kSms} * r.blocks;
  const double utilisation = predicted_utilisation(seconds, slots);
  const double fill = wave_fill(seconds.size(), slots);
  k->launches += 1;
  if (t_in_graph) {
    k->graph_runs += 1;
    a.graph_seconds += launch_seconds;
  }
  k->sampled_launches += sampled;
  if (sampled) k->sample_blocks = std::max<uint64_t>(k->sample_blocks, ran.size());
  k->blocks_min = std::min<uint64_t>(k->blocks_min, seconds.size());
  k->blocks_max = std::max<uint64_t>(k->blocks_max, seconds.size());
  k->threads_min = std::min(k->threads_min, threads);
  k->threads_max = std::max(k->threads_max, threads);
  if (r.blocks < k->resident_min) k->limit = r.limit;
  k->resident_min = std::min(k->resident_min, r.blocks);
  k->resident_max = std::max(k->resident_max, r.blocks);
  k->dynamic_shared_max = std::max(k->dynamic_shared_max, launch.shared_bytes);
  k->seconds += launch_seconds;
  k->utilisation_seconds += utilisation * launch_seconds;
  k->fill_seconds += fill * launch_seconds;
}

detail::GraphLaunchScope::GraphLaunchScope(size_t kernel_nodes) {
  t_in_graph = true;
  if (!launch_audit_recording()) return;
  Audit& a = audit();
  std::lock_guard lock(a.mutex);
  if (!a.recording.load()) return;
  a.graph_launches += 1;
  a.graph_nodes += kernel_nodes;
}

detail::GraphLaunchScope::~GraphLaunchScope() { t_in_graph = false; }

}  // namespace anvil::sim
