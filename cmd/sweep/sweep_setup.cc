// The sweep driver's setup: the experiment created or resumed, the trials' ranking, the
// pool following its hosts.
#include "cmd/sweep/driver.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

namespace elasticrun::sweep {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw SpaceError(fmt::format("cannot read the space file {}", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

// Reads or creates the experiment, its trials and the scheduler.
Result<void> Sweep::prepare() {
  nlohmann::json spec;
  if (o_.resume) {
    auto x = Experiment::open(o_.dir);
    if (!x) return Failure{x.error()};
    exp_.emplace(std::move(*x));
    spec = exp_->spec();
  } else {
    std::string text;
    try {
      text = read_text(o_.space_file);
      space_ = parse_space(text);
    } catch (const SpaceError& e) {
      return fail(fmt::format("{}: {}", o_.space_file, e.what()));
    }
    spec = {{"space", nlohmann::json::parse(text)}, {"seed", o_.seed}, {"scheduler", o_.scheduler},
            {"scheduler_params", o_.scheduler_params}, {"metric", o_.metric}, {"mode", o_.maximize ? "max" : "min"},
            {"num_samples", o_.num_samples}, {"trial_np", {o_.trial_min_np, o_.trial_max_np}},
            {"command", o_.command}};
    // Checked before anything is written: a bad scheduler parameter leaves no experiment.
    try {
      make_scheduler(o_.scheduler, o_.scheduler_params, space_, o_.maximize ? Mode::max : Mode::min, o_.seed);
    } catch (const std::exception& e) {
      return fail(fmt::format("--scheduler {}: {}", o_.scheduler, e.what()));
    }
    auto x = Experiment::create(o_.dir, spec);
    if (!x) return Failure{x.error()};
    exp_.emplace(std::move(*x));
  }
  try {
    space_ = parse_space(spec.at("space").dump());
    metric_ = spec.at("metric").get<std::string>();
    maximize_ = spec.at("mode").get<std::string>() == "max";
    min_np_ = spec.at("trial_np")[0].get<int>();
    max_np_ = spec.at("trial_np")[1].get<int>();
    command_ = spec.at("command").get<std::vector<std::string>>();
    scheduler_ = make_scheduler(spec.at("scheduler").get<std::string>(), spec.at("scheduler_params"), space_,
                                maximize_ ? Mode::max : Mode::min, spec.at("seed").get<std::uint64_t>());
  } catch (const std::exception& e) {
    return fail(fmt::format("{}/sweep.json: {}", o_.dir, e.what()));
  }
  if (o_.resume) {
    for (auto& r : exp_->trials()) {
      Trial t;
      t.rec = r;
      // A trial that was running when the sweep was killed continues from its checkpoint.
      if (t.rec.state == "running") t.rec.state = "pending", ++t.rec.restarts;
      trials_.push_back(std::move(t));
    }
    if (auto st = exp_->scheduler_state()) {
      try {
        scheduler_->restore(*st);
      } catch (const std::exception& e) {
        return fail(fmt::format("{}/scheduler.json: {}", o_.dir, e.what()));
      }
    } else {
      for (auto& t : trials_) scheduler_->on_trial_added(t.rec.id, t.rec.config);
    }
  } else {
    auto configs = sample(space_, o_.num_samples, o_.seed);
    int width = std::max<int>(4, static_cast<int>(std::to_string(configs.size()).size()));
    for (std::size_t i = 0; i < configs.size(); ++i) {
      Trial t;
      t.rec.id = fmt::format("{:0{}}", i, width);
      t.rec.config = configs[i];
      if (auto ok = exp_->add_trial(t.rec); !ok) return ok;
      scheduler_->on_trial_added(t.rec.id, t.rec.config);
      trials_.push_back(std::move(t));
    }
    exp_->save_scheduler(scheduler_->state());
  }
  return {};
}

// Trials by their best metric so far, best first; trials without one last.
std::vector<std::string> Sweep::ranking() const {
  std::vector<const Trial*> v;
  for (const auto& t : trials_) v.push_back(&t);
  std::stable_sort(v.begin(), v.end(), [&](const Trial* a, const Trial* b) {
    if (a->rec.best_metric.has_value() != b->rec.best_metric.has_value()) return a->rec.best_metric.has_value();
    return a->rec.best_metric && better(*a->rec.best_metric, *b->rec.best_metric);
  });
  std::vector<std::string> out;
  for (const auto* t : v) out.push_back(t->rec.id);
  return out;
}

// The pool follows the host list; a trial that loses slots shrinks (its elastic job
// follows its new discovery output), one below its MIN waits in its job for slots.
void Sweep::set_pool(const std::vector<discovery::Host>& hosts) {
  std::set<std::string> listed;
  for (const auto& h : hosts) {
    listed.insert(h.name);
    pool_->set_host(h.name, h.slots);
  }
  for (const auto& h : pool_->hosts())
    if (!listed.count(h)) pool_->remove_host(h);
}

}  // namespace elasticrun::sweep
