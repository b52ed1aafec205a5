// Trial schedulers of `elasticrun sweep`: given each trial's reported (step, metric), decide
// whether it continues, stops, or (PBT) restarts from a better trial's checkpoint.
//
// Pure logic: no I/O, no clock; steps are whatever the trial reports (epochs, iterations).
// The driver tells the scheduler of each trial (on_trial_added), each report (on_result: its
// decision goes back to the trial), and each trial's end (on_trial_finished: finished, stopped,
// failed). state() is a JSON object that restore() takes back after the driver was killed
// (--resume), after which every decision is the same as it would have been.
//
// Metrics: `mode` says whether lower (min) or higher (max) is better. A non-finite metric (NaN,
// inf: a diverged trial) counts as the worst possible: ASHA leaves it out of its cut-offs (as
// numpy's nanpercentile, which Ray Tune uses) and stops it at a rung with a cut-off; it ranks
// last. In state() it is written as null.
//
//   FIFO  every trial continues until it ends by itself.
//   ASHA  asynchronous successive halving, after Ray Tune's AsyncHyperBandScheduler (one
//         bracket): see Asha below.
//   PBT   population-based training: see Pbt below.
#pragma once

#include "cmd/sweep/space.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace elasticrun::sweep {

// Bad scheduler parameters or a state that does not fit; the message says which and why.
class SchedulerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Mode { min, max };
Mode parse_mode(const std::string& s);  // "min" | "max", else SchedulerError
const char* mode_name(Mode m);

struct Decision {
  enum class Action { continue_, stop, exploit };
  Action action = Action::continue_;
  // exploit: restart this trial from source_trial's latest checkpoint with new_config (the
  // scheduler already counts new_config as the trial's configuration).
  std::string source_trial;
  nlohmann::json new_config;
  std::string reason;  // stop and exploit: why, for the log ("rung 3: 0.8 worse than cut-off 0.5")
  // stop: the trial used its whole budget (asha's max_t); it is finished, not cut short.
  bool completed = false;

  static Decision go_on() { return {}; }
  static Decision stop(std::string why) { return {Action::stop, {}, {}, std::move(why)}; }
};

class Scheduler {
 public:
  explicit Scheduler(Mode mode) : mode_(mode) {}
  virtual ~Scheduler() = default;
  virtual const char* name() const = 0;  // "fifo", "asha", "pbt"
  Mode mode() const { return mode_; }

  // A new trial (or, for a known one, its configuration replaced; its results are kept).
  void on_trial_added(const std::string& trial, const nlohmann::json& config);
  // A report of a known, unfinished trial; a report after on_trial_finished is ignored
  // (continue). An unknown trial is the caller's bug: std::logic_error.
  Decision on_result(const std::string& trial, double step, double metric);
  // The trial ended (by itself, stopped, or failed); it no longer ranks and its slots go back.
  void on_trial_finished(const std::string& trial);

  // Unfinished trials, best first: by latest metric, then those without a result; ties in the
  // order added. The driver passes it to the pool as priorities.
  std::vector<std::string> ranking() const;
  // A trial's configuration (PBT changes it on exploit); nullptr for an unknown trial.
  const nlohmann::json* config(const std::string& trial) const;

  // {"scheduler": name, "mode": "min"|"max", "trials": [...], name: {what the kind keeps}}.
  nlohmann::json state() const;
  // Replaces everything with `state`; SchedulerError if it is not a state of this scheduler kind
  // and mode, or is malformed.
  void restore(const nlohmann::json& state);

 protected:
  struct Trial {
    nlohmann::json config;
    std::size_t order = 0;  // when it was added
    std::optional<double> step, metric;  // the latest result
    bool finished = false;
  };
  // Higher is better whatever the mode; non-finite: -inf.
  double score(double metric) const;
  const std::map<std::string, Trial>& trials() const { return trials_; }
  Trial& trial(const std::string& id) { return trials_.at(id); }

  // After the trial's latest result was recorded.
  virtual Decision decide(const std::string& trial, double step, double metric) = 0;
  virtual void finished(const std::string& /*trial*/) {}
  virtual nlohmann::json own_state() const { return nlohmann::json::object(); }
  virtual void restore_own(const nlohmann::json& /*state*/) {}

 private:
  Mode mode_;
  std::map<std::string, Trial> trials_;
};

class Fifo : public Scheduler {
 public:
  using Scheduler::Scheduler;
  const char* name() const override { return "fifo"; }

 private:
  Decision decide(const std::string&, double, double) override { return Decision::go_on(); }
};

// ASHA with one bracket (Ray's default and its common use; more brackets would spread trials over
// later first rungs). Rungs sit at grace_period * reduction_factor^k for k = 0, 1, ... while
// below max_t. A result with step >= max_t stops the trial (it is done). Otherwise, the highest
// rung the step has reached where the trial has no value yet gets its metric, and the trial
// stops when that metric is worse than the rung's cut-off, computed BEFORE adding it: the
// (1 - 1/reduction_factor) quantile, linearly interpolated (numpy's percentile), of the values
// already recorded there. This is what Ray's _Bracket.on_result does: the trial's own value is
// not part of the cut-off; a rung with no value yet has no cut-off (the first trial always goes
// on, whatever reduction_factor); a value equal to the cut-off continues (Ray's strict
// `cur_rew < cutoff`). A step that jumps over rungs records only at the highest one. When a trial
// ends, its latest result is recorded the same way (Ray's on_trial_complete), so that a trial
// stopped at max_t still counts at the rungs it skipped.
struct AshaParams {
  double grace_period = 1, reduction_factor = 4, max_t = 100;  // Ray's defaults
  // The rule at a rung. Ray's (default): stop when worse than the (1 - 1/rf) percentile of
  // the values recorded there before; the first trial at a rung always goes on. Strict
  // (Optuna's SuccessiveHalvingPruner, the ASHA paper's promotion): go on only when among
  // the best floor(n/rf) of the n values recorded there, its own included, and while n < rf
  // only as the best so far. Strict runs fewer steps of mediocre trials.
  bool strict = false;
};

class Asha : public Scheduler {
 public:
  Asha(Mode mode, AshaParams params);
  const char* name() const override { return "asha"; }
  std::vector<double> milestones() const;  // ascending
  // The cut-off of a rung (per mode: lower is better in min mode), nullopt while it has none.
  std::optional<double> cutoff(std::size_t rung) const;

 private:
  struct Rung {
    double milestone;
    std::map<std::string, double> recorded;  // trial -> metric (NaN for non-finite)
  };
  Decision decide(const std::string& trial, double step, double metric) override;
  void finished(const std::string& trial) override;
  nlohmann::json own_state() const override;
  void restore_own(const nlohmann::json& state) override;
  Decision record(const std::string& trial, double step, double metric);
  std::optional<double> score_cutoff(const Rung& rung) const;
  Decision strict_decision(const Rung& rung, double metric) const;

  AshaParams p_;
  std::vector<Rung> rungs_;  // ascending milestones
};

// numpy.percentile(values, 100 * q) with its default (linear) method; values non-empty, q in [0, 1].
double percentile(std::vector<double> values, double q);

// PBT, after Ray Tune's PopulationBasedTraining. A trial whose result has step >=
// last_perturbation + perturbation_interval (last_perturbation starts at 0) is at a perturbation
// point: last_perturbation becomes that step, and unfinished trials with a result are ranked by
// their latest metric (ties in the order added). With n of them (n >= 2), the bottom and top
// quantiles hold k = ceil(n * quantile_fraction) trials each, at most floor(n / 2). A trial in the
// bottom quantile gets `exploit`: copy a top-quantile trial chosen at random, with that trial's
// configuration explored (space.h: each parameter resampled with resample_probability, else
// perturbed by 0.8/1.2 or a neighbouring value); the trial takes that configuration and the
// source's last_perturbation, as Ray does. Any other trial continues. The seeded Rng makes the
// choices reproducible and is part of state().
struct PbtParams {
  double perturbation_interval = 0;  // required, > 0
  double quantile_fraction = 0.25, resample_probability = 0.25;
};

class Pbt : public Scheduler {
 public:
  Pbt(Mode mode, PbtParams params, Space space, std::uint64_t seed);
  const char* name() const override { return "pbt"; }
  double last_perturbation(const std::string& trial) const;

 private:
  Decision decide(const std::string& trial, double step, double metric) override;
  nlohmann::json own_state() const override;
  void restore_own(const nlohmann::json& state) override;

  PbtParams p_;
  Space space_;
  Rng rng_;
  std::map<std::string, double> last_perturbation_;
};

// A scheduler by name ("fifo", "asha", "pbt") with its parameters as a JSON object (null: all
// defaults). SchedulerError for an unknown name, an unknown or ill-typed parameter, or a value
// out of range, e.g. `asha: reduction_factor needs > 1, got 1`.
std::unique_ptr<Scheduler> make_scheduler(const std::string& name, const nlohmann::json& params, const Space& space,
                                          Mode mode, std::uint64_t seed);

}  // namespace elasticrun::sweep
