#include "apps/train_profile.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>

#include <fmt/format.h>

namespace anvil::app {

ProfileTable profile_table(const profile::Thread& t, int64_t warmup) {
  ProfileTable table;
  table.rank = t.rank;
  table.device = t.device;
  double step_us = 0;
  for (const profile::Step& s : t.steps) {
    if (s.index < warmup) {
      ++table.skipped;
      continue;
    }
    ++table.steps;
    step_us += s.end_us - s.start_us;
  }
  if (table.steps == 0)
    throw std::runtime_error(fmt::format(
        "--profile: rank {} ran {} training step(s), none after the {} warm-up step(s) it "
        "leaves out: train longer (more --limit-train, or --epochs)",
        t.rank, t.steps.size(), warmup));
  std::vector<double> us(profile::kFamilies, 0.0);
  std::vector<int64_t> calls(profile::kFamilies, 0);
  for (const profile::Record& r : t.records) {
    if (r.step < warmup) continue;
    us[size_t(r.family)] += r.end_us - r.start_us;
    ++calls[size_t(r.family)];
  }
  const double n = double(table.steps);
  table.step_ms = step_us / 1000.0 / n;
  double named_ms = 0;
  for (int f = 0; f < profile::kFamilies; ++f) {
    ProfileRow row{profile::Family(f), double(calls[size_t(f)]) / n, us[size_t(f)] / 1000.0 / n};
    if (row.family == profile::Family::Other) continue;
    named_ms += row.ms_per_step;
    table.rows.push_back(row);
  }
  // "other": the step less the named rows, so that the rows add up to it.
  table.rows.push_back({profile::Family::Other,
                        double(calls[size_t(profile::Family::Other)]) / n,
                        table.step_ms - named_ms});
  for (ProfileRow& row : table.rows)
    row.percent = table.step_ms > 0 ? 100.0 * row.ms_per_step / table.step_ms : 0.0;
  return table;
}

std::string format_profile_table(const ProfileTable& table, const std::string& time_label) {
  std::string out = fmt::format(
      "Profile: rank {} on {}, {} steady step(s) after {} warm-up step(s) left out; {}\n",
      table.rank, table.device, table.steps, table.skipped, time_label);
  out += fmt::format("  {:<22} {:>12} {:>12} {:>8}\n", "family", "calls/step", "ms/step",
                     "% step");
  for (const ProfileRow& r : table.rows)
    out += fmt::format("  {:<22} {:>12.1f} {:>12.3f} {:>7.1f}%\n", profile::family_name(r.family),
                       r.calls_per_step, r.ms_per_step, r.percent);
  out += fmt::format("  {:<22} {:>12} {:>12.3f} {:>7.1f}%\n", "step (measured)", "",
                     table.step_ms, 100.0);
  return out;
}

nlohmann::json chrome_trace(const std::vector<profile::Thread>& threads, int64_t warmup) {
  nlohmann::json events = nlohmann::json::array();
  auto meta = [&](const char* what, int pid, int tid, const std::string& name) {
    events.push_back({{"ph", "M"}, {"name", what}, {"pid", pid}, {"tid", tid},
                      {"args", {{"name", name}}}});
  };
  auto slice = [&](const std::string& name, const char* cat, int pid, int tid, double start_us,
                   double end_us, nlohmann::json args) {
    events.push_back({{"ph", "X"}, {"name", name}, {"cat", cat}, {"pid", pid}, {"tid", tid},
                      {"ts", start_us}, {"dur", end_us - start_us}, {"args", std::move(args)}});
  };
  for (const profile::Thread& t : threads) {
    meta("process_name", t.rank, 0, fmt::format("rank {} ({})", t.rank, t.device));
    for (size_t s = 0; s < t.streams.size(); ++s)
      meta("thread_name", t.rank, int(s), t.device == "cpu" || s == 0
                                              ? t.streams[s]
                                              : fmt::format("{} {}", t.device, t.streams[s]));
    for (const profile::Step& s : t.steps)
      if (s.index >= warmup)
        slice(fmt::format("step {}", s.index), "step", t.rank, 0, s.start_us, s.end_us,
              {{"step", s.index}});
    for (const profile::Record& r : t.records)
      if (r.step >= warmup)
        slice(profile::name_of(r.name), profile::family_name(r.family), t.rank, r.stream,
              r.start_us, r.end_us,
              {{"family", profile::family_name(r.family)}, {"step", r.step}});
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

void report_profile(bool print, const std::string& trace_path, bool simulated) {
  const std::vector<profile::Thread> threads = profile::collected();
  if (threads.empty()) return;
  if (print && threads.front().rank == 0) {
    const ProfileTable table = profile_table(threads.front());
    const bool cpu = table.device == "cpu";
    std::cout << format_profile_table(
        table, cpu ? "CPU wall clock per op"
               : simulated
                   ? "kernels timed by CUDA events on the simulator: the simulator's wall "
                     "clock, not a GPU's, and not a prediction"
                   : "kernels timed by CUDA events; host waits (data, all-reduce) by the wall "
                     "clock");
  }
  if (!trace_path.empty() && threads.front().rank == 0) {
    std::ofstream out(trace_path, std::ios::trunc);
    out << chrome_trace(threads).dump() << '\n';
    if (!out)
      throw std::runtime_error(fmt::format("--profile-trace {}: cannot write: {}", trace_path,
                                           std::strerror(errno)));
  }
}

}  // namespace anvil::app
