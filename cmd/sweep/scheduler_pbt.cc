// Population-based training (scheduler.h, Pbt).
#include "cmd/sweep/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace elasticrun::sweep {

Pbt::Pbt(Mode mode, PbtParams params, Space space, std::uint64_t seed)
    : Scheduler(mode), p_(params), space_(std::move(space)), rng_(seed) {}

double Pbt::last_perturbation(const std::string& trial) const {
  auto it = last_perturbation_.find(trial);
  return it == last_perturbation_.end() ? 0 : it->second;
}

Decision Pbt::decide(const std::string& trial, double step, double metric) {
  if (step - last_perturbation(trial) < p_.perturbation_interval) return Decision::go_on();
  last_perturbation_[trial] = step;

  // The population: unfinished trials with a result, worst first, ties in the order added.
  std::vector<std::pair<std::string, const Trial*>> pop;
  for (const auto& [id, t] : trials())
    if (!t.finished && t.metric) pop.emplace_back(id, &t);
  std::stable_sort(pop.begin(), pop.end(), [](const auto& a, const auto& b) { return a.second->order < b.second->order; });
  std::stable_sort(pop.begin(), pop.end(),
                   [&](const auto& a, const auto& b) { return score(*a.second->metric) < score(*b.second->metric); });
  const std::size_t n = pop.size();
  if (n < 2) return Decision::go_on();
  const auto k = std::min(static_cast<std::size_t>(std::ceil(n * p_.quantile_fraction)), n / 2);
  const bool bottom = std::any_of(pop.begin(), pop.begin() + k, [&](const auto& e) { return e.first == trial; });
  if (!bottom) return Decision::go_on();

  // Exploit a random top-quantile trial, then explore its configuration.
  const auto& [source, src] = pop[n - k + rng_.below(k)];
  Decision d;
  d.action = Decision::Action::exploit;
  d.source_trial = source;
  d.new_config = explore(space_, src->config, p_.resample_probability, rng_);
  char why[160];
  std::snprintf(why, sizeof why, "bottom %zu of %zu at step %g (%g): copies %s (%g)", k, n, step, metric,
                source.c_str(), *src->metric);
  d.reason = why;
  last_perturbation_[trial] = last_perturbation(source);
  Scheduler::trial(trial).config = d.new_config;
  return d;
}

nlohmann::json Pbt::own_state() const {
  return {{"rng", rng_.state()}, {"last_perturbation", last_perturbation_}};
}

void Pbt::restore_own(const nlohmann::json& state) {
  Rng rng = Rng::restore(state.at("rng"));
  last_perturbation_ = state.at("last_perturbation").get<std::map<std::string, double>>();
  rng_ = rng;
}

}  // namespace elasticrun::sweep
