// What the sweep driver shows: lines as trials start and end, the live table on a
// terminal, the summary at the end.
#include "cmd/sweep/driver.h"

#include <fmt/format.h>

#include <cstdio>

namespace elasticrun::sweep {

std::string compact(const nlohmann::json& config) {
  std::string out;
  for (const auto& [k, v] : config.items()) {
    if (!out.empty()) out += " ";
    std::string val = v.is_number_float() ? fmt::format("{:.4g}", v.get<double>()) : v.dump();
    out += k + "=" + val;
  }
  return out;
}

// Plain lines when the output is not a terminal; on one, the table is redrawn below them.
void Sweep::say(const std::string& line) {
  if (tty_ && table_lines_ > 0) fmt::print("\x1b[{}A\x1b[J", table_lines_), table_lines_ = 0;
  fmt::print("{}\n", line);
  std::fflush(stdout);
  if (tty_) render();
}

void Sweep::render() {
  if (!tty_) return;
  std::string out;
  if (table_lines_ > 0) out += fmt::format("\x1b[{}A\x1b[J", table_lines_);
  std::optional<double> best;
  for (const auto& t : trials_)
    if (t.rec.best_metric && (!best || better(*t.rec.best_metric, *best))) best = t.rec.best_metric;
  int lines = 0;
  out += fmt::format("{:<6} {:<9} {:>7} {:>8} {:>12} {:>12}  {}\n", "trial", "state", "workers", "step", metric_,
                     "best", "parameters");
  ++lines;
  for (const auto& t : trials_) {
    if (t.rec.done() && lines > 20) continue;
    out += fmt::format("{:<6} {:<9} {:>7} {:>8} {:>12} {:>12}  {}\n", t.rec.id, t.rec.state,
                       t.job ? std::to_string(t.workers) : "", t.rec.last_step >= 0 ? fmt::format("{:g}", t.rec.last_step) : "",
                       t.rec.last_metric ? fmt::format("{:.6g}", *t.rec.last_metric) : "",
                       t.rec.best_metric ? fmt::format("{:.6g}", *t.rec.best_metric) : "", compact(t.rec.config));
    ++lines;
  }
  out += fmt::format("best {} so far: {}\n", metric_, best ? fmt::format("{:.6g}", *best) : "-");
  ++lines;
  fmt::print("{}", out);
  std::fflush(stdout);
  table_lines_ = lines;
}

void Sweep::summary() {
  const Trial* best = nullptr;
  int counts[4] = {0, 0, 0, 0};
  for (const auto& t : trials_) {
    counts[0] += t.rec.state == "finished";
    counts[1] += t.rec.state == "stopped";
    counts[2] += t.rec.state == "failed";
    counts[3] += !t.rec.done();
    if (t.rec.best_metric && (!best || better(*t.rec.best_metric, *best->rec.best_metric))) best = &t;
  }
  account_usage();
  double util = usage_.utilisation_while_waiting();
  fmt::print("sweep: {} trials: {} finished, {} stopped early, {} failed{}; pool utilisation {:.0f}%\n", trials_.size(),
             counts[0], counts[1], counts[2], counts[3] ? fmt::format(", {} unfinished", counts[3]) : "", util * 100);
  if (best)
    fmt::print("best trial {}: {} = {:.6g} at step {:g}; parameters {}\n", best->rec.id, metric_,
               *best->rec.best_metric, best->rec.last_step, best->rec.config.dump());
  events_.emit("sweep_finished",
               {{"trials", trials_.size()}, {"finished", counts[0]}, {"stopped", counts[1]}, {"failed", counts[2]},
                {"unfinished", counts[3]}, {"utilisation", util},
                {"best", best ? nlohmann::json{{"trial", best->rec.id}, {"metric", *best->rec.best_metric},
                                               {"config", best->rec.config}}
                              : nlohmann::json()}});
}

}  // namespace elasticrun::sweep
