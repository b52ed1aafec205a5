// The scheduler base (trial bookkeeping, ranking, state), FIFO, ASHA and the factory.
// PBT is in scheduler_pbt.cc.
#include "cmd/sweep/scheduler.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdio>
#include <limits>

namespace elasticrun::sweep {
namespace {

using nlohmann::json;

std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

// A metric in state(): JSON has no NaN or inf, so those are null.
json metric_json(double m) { return std::isfinite(m) ? json(m) : json(nullptr); }
double metric_of(const json& j) { return j.is_null() ? std::numeric_limits<double>::quiet_NaN() : j.get<double>(); }

// The parameters of a scheduler, checked key by key against what it takes.
class ParamReader {
 public:
  ParamReader(const char* scheduler, const json& params, std::vector<std::string> known)
      : scheduler_(scheduler), params_(params.is_null() ? json::object() : params) {
    if (!params_.is_object())
      throw SchedulerError(scheduler_ + ": parameters need a JSON object, got " + params_.dump());
    for (const auto& [key, value] : params_.items())
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        std::string list;
        for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
        throw SchedulerError(scheduler_ + ": unknown parameter \"" + key + "\"" +
                             (known.empty() ? " (it takes none)" : " (expected " + list + ")"));
      }
  }
  // The number `key`, or `fallback` when absent (nullopt: required).
  double number(const std::string& key, std::optional<double> fallback) const {
    if (!params_.contains(key)) {
      if (!fallback) throw SchedulerError(scheduler_ + ": " + key + " is required");
      return *fallback;
    }
    const json& v = params_[key];
    if (!v.is_number() || !std::isfinite(v.get<double>()))
      throw SchedulerError(scheduler_ + ": " + key + " needs a number, got " + v.dump());
    return v.get<double>();
  }
  void check(bool ok, const std::string& problem) const {
    if (!ok) throw SchedulerError(scheduler_ + ": " + problem);
  }

 private:
  std::string scheduler_;
  json params_;
};

}  // namespace

Mode parse_mode(const std::string& s) {
  if (s == "min") return Mode::min;
  if (s == "max") return Mode::max;
  throw SchedulerError("mode needs min or max, got \"" + s + "\"");
}

const char* mode_name(Mode m) { return m == Mode::min ? "min" : "max"; }

// ---- the base: what every scheduler keeps per trial ----

double Scheduler::score(double metric) const {
  if (!std::isfinite(metric)) return -std::numeric_limits<double>::infinity();
  return mode_ == Mode::max ? metric : -metric;
}

void Scheduler::on_trial_added(const std::string& trial, const nlohmann::json& config) {
  auto [it, added] = trials_.try_emplace(trial);
  if (added) it->second.order = trials_.size() - 1;
  it->second.config = config;
}

Decision Scheduler::on_result(const std::string& trial, double step, double metric) {
  auto it = trials_.find(trial);
  if (it == trials_.end()) throw std::logic_error("scheduler: a result of unknown trial '" + trial + "'");
  if (it->second.finished) return Decision::go_on();
  it->second.step = step;
  it->second.metric = std::isfinite(metric) ? metric : std::numeric_limits<double>::quiet_NaN();
  return decide(trial, step, *it->second.metric);
}

void Scheduler::on_trial_finished(const std::string& trial) {
  auto it = trials_.find(trial);
  if (it == trials_.end() || it->second.finished) return;
  finished(trial);
  it->second.finished = true;
}

std::vector<std::string> Scheduler::ranking() const {
  std::vector<const std::pair<const std::string, Trial>*> live;
  for (const auto& kv : trials_)
    if (!kv.second.finished) live.push_back(&kv);
  std::sort(live.begin(), live.end(), [&](auto* a, auto* b) {
    const Trial &x = a->second, &y = b->second;
    if (x.metric.has_value() != y.metric.has_value()) return x.metric.has_value();
    if (x.metric && score(*x.metric) != score(*y.metric)) return score(*x.metric) > score(*y.metric);
    return x.order < y.order;
  });
  std::vector<std::string> out;
  for (auto* kv : live) out.push_back(kv->first);
  return out;
}

const nlohmann::json* Scheduler::config(const std::string& trial) const {
  auto it = trials_.find(trial);
  return it == trials_.end() ? nullptr : &it->second.config;
}

nlohmann::json Scheduler::state() const {
  std::vector<const std::pair<const std::string, Trial>*> in_order;
  for (const auto& kv : trials_) in_order.push_back(&kv);
  std::sort(in_order.begin(), in_order.end(), [](auto* a, auto* b) { return a->second.order < b->second.order; });
  json trials = json::array();
  for (auto* kv : in_order) {
    const Trial& t = kv->second;
    json j = {{"id", kv->first}, {"config", t.config}, {"finished", t.finished}};
    if (t.step) j["step"] = *t.step, j["metric"] = metric_json(*t.metric);
    trials.push_back(std::move(j));
  }
  return {{"scheduler", name()}, {"mode", mode_name(mode_)}, {"trials", trials}, {name(), own_state()}};
}

void Scheduler::restore(const nlohmann::json& state) {
  try {
    if (state.at("scheduler") != name())
      throw SchedulerError(std::string("scheduler state is for ") + state.at("scheduler").dump() + ", not \"" +
                           name() + "\"");
    if (state.at("mode") != mode_name(mode_))
      throw SchedulerError(std::string("scheduler state is for mode ") + state.at("mode").dump() + ", not \"" +
                           mode_name(mode_) + "\"");
    std::map<std::string, Trial> trials;
    for (const auto& j : state.at("trials")) {
      Trial t;
      t.order = trials.size();
      t.config = j.at("config");
      t.finished = j.at("finished").get<bool>();
      if (j.contains("step")) t.step = j.at("step").get<double>(), t.metric = metric_of(j.at("metric"));
      trials[j.at("id").get<std::string>()] = std::move(t);
    }
    restore_own(state.at(name()));
    trials_ = std::move(trials);
  } catch (const json::exception& e) {
    throw SchedulerError(std::string("scheduler state is malformed: ") + e.what());
  }
}

// ---- ASHA ----

double percentile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const double h = (values.size() - 1) * q;
  const auto lo = static_cast<std::size_t>(std::floor(h));
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  const double t = h - lo, a = values[lo], d = values[hi] - a;
  // numpy's _lerp: from the nearer end, so that t = 1 gives exactly b.
  return t < 0.5 ? a + d * t : values[hi] - d * (1 - t);
}

Asha::Asha(Mode mode, AshaParams params) : Scheduler(mode), p_(params) {
  for (double m = p_.grace_period; m < p_.max_t; m *= p_.reduction_factor) rungs_.push_back({m, {}});
}

std::vector<double> Asha::milestones() const {
  std::vector<double> out;
  for (const auto& r : rungs_) out.push_back(r.milestone);
  return out;
}

// The strict rule, with the trial's own value already recorded at the rung.
Decision Asha::strict_decision(const Rung& rung, double metric) const {
  const std::string where = "rung " + num(rung.milestone) + ": ";
  if (!std::isfinite(metric)) return Decision::stop(where + "not a finite value");
  std::vector<double> scores;
  for (const auto& [id, m] : rung.recorded)
    if (std::isfinite(m)) scores.push_back(score(m));
  std::sort(scores.begin(), scores.end(), std::greater<>());
  const auto keep = static_cast<std::size_t>(std::floor(static_cast<double>(scores.size()) / p_.reduction_factor));
  const double bar = scores[keep == 0 ? 0 : keep - 1];
  if (score(metric) >= bar) return Decision::go_on();
  return Decision::stop(where + num(metric) + " not among the best " + std::to_string(std::max<std::size_t>(keep, 1)) +
                        " of " + std::to_string(scores.size()));
}

std::optional<double> Asha::score_cutoff(const Rung& rung) const {
  std::vector<double> scores;
  for (const auto& [id, metric] : rung.recorded)
    if (std::isfinite(metric)) scores.push_back(score(metric));
  if (scores.empty()) return std::nullopt;
  return percentile(std::move(scores), (1 - 1 / p_.reduction_factor) * 100 / 100);
}

std::optional<double> Asha::cutoff(std::size_t rung) const {
  auto c = score_cutoff(rungs_.at(rung));
  if (c && mode() == Mode::min) *c = -*c;
  return c;
}

Decision Asha::decide(const std::string& trial, double step, double metric) {
  if (step >= p_.max_t) {
    Decision d = Decision::stop("reached max_t " + num(p_.max_t));
    d.completed = true;
    return d;
  }
  return record(trial, step, metric);
}

// Ray's _Bracket.on_result: the highest rung reached where the trial has no value yet.
Decision Asha::record(const std::string& trial, double step, double metric) {
  for (std::size_t i = rungs_.size(); i-- > 0;) {
    Rung& rung = rungs_[i];
    if (step < rung.milestone || rung.recorded.count(trial)) continue;
    const auto cut = score_cutoff(rung);
    rung.recorded[trial] = metric;
    if (p_.strict) return strict_decision(rung, metric);
    if (cut && score(metric) < *cut) {
      const double shown = mode() == Mode::min ? -*cut : *cut;
      return Decision::stop("rung " + num(rung.milestone) + ": " + num(metric) + " worse than cut-off " + num(shown));
    }
    break;
  }
  return Decision::go_on();
}

void Asha::finished(const std::string& trial) {
  const Trial& t = Scheduler::trial(trial);
  if (t.step) record(trial, *t.step, *t.metric);
}

nlohmann::json Asha::own_state() const {
  json rungs = json::array();
  for (const auto& r : rungs_) {
    json recorded = json::object();
    for (const auto& [id, m] : r.recorded) recorded[id] = metric_json(m);
    rungs.push_back({{"milestone", r.milestone}, {"recorded", recorded}});
  }
  return {{"rungs", rungs}};
}

void Asha::restore_own(const nlohmann::json& state) {
  const json& rungs = state.at("rungs");
  if (rungs.size() != rungs_.size())
    throw SchedulerError("scheduler state has " + std::to_string(rungs.size()) + " rungs, these parameters make " +
                         std::to_string(rungs_.size()));
  std::vector<Rung> out = rungs_;
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].recorded.clear();
    for (const auto& [id, m] : rungs[i].at("recorded").items()) out[i].recorded[id] = metric_of(m);
  }
  rungs_ = std::move(out);
}

// ---- the factory ----

std::unique_ptr<Scheduler> make_scheduler(const std::string& name, const nlohmann::json& params, const Space& space,
                                          Mode mode, std::uint64_t seed) {
  if (name == "fifo") {
    ParamReader r("fifo", params, {});
    return std::make_unique<Fifo>(mode);
  }
  if (name == "asha") {
    ParamReader r("asha", params, {"grace_period", "reduction_factor", "max_t", "brackets", "strict"});
    AshaParams p;
    p.grace_period = r.number("grace_period", p.grace_period);
    p.reduction_factor = r.number("reduction_factor", p.reduction_factor);
    p.max_t = r.number("max_t", p.max_t);
    const double brackets = r.number("brackets", 1);
    const double strict = r.number("strict", 0);
    r.check(strict == 0 || strict == 1, "strict needs 0 or 1, got " + num(strict));
    p.strict = strict == 1;
    r.check(p.grace_period > 0, "grace_period needs > 0, got " + num(p.grace_period));
    r.check(p.reduction_factor > 1, "reduction_factor needs > 1, got " + num(p.reduction_factor));
    r.check(p.max_t >= p.grace_period,
            "max_t needs >= grace_period, got max_t=" + num(p.max_t) + ", grace_period=" + num(p.grace_period));
    r.check(brackets == 1, "brackets: only 1 is supported, got " + num(brackets));
    return std::make_unique<Asha>(mode, p);
  }
  if (name == "pbt") {
    ParamReader r("pbt", params, {"perturbation_interval", "quantile_fraction", "resample_probability"});
    PbtParams p;
    p.perturbation_interval = r.number("perturbation_interval", std::nullopt);
    p.quantile_fraction = r.number("quantile_fraction", p.quantile_fraction);
    p.resample_probability = r.number("resample_probability", p.resample_probability);
    r.check(p.perturbation_interval > 0, "perturbation_interval needs > 0, got " + num(p.perturbation_interval));
    r.check(p.quantile_fraction > 0 && p.quantile_fraction <= 0.5,
            "quantile_fraction needs 0 < q <= 0.5, got " + num(p.quantile_fraction));
    r.check(p.resample_probability >= 0 && p.resample_probability <= 1,
            "resample_probability needs 0 <= p <= 1, got " + num(p.resample_probability));
    return std::make_unique<Pbt>(mode, p, space, seed);
  }
  throw SchedulerError("unknown scheduler \"" + name + "\" (expected fifo, asha, pbt)");
}

}  // namespace elasticrun::sweep
