// The experiment directory: everything a sweep must find again after it was killed.
//
//   EXP/sweep.json            the sweep's definition: space, seed, scheduler and its
//                             parameters, metric, mode, trial size, command
//   EXP/scheduler.json        the scheduler's state after its latest decision
//   EXP/trials/<id>/params.json   the trial's configuration (changes under pbt)
//   EXP/trials/<id>/status.json   state, last step and metric, best metric, exit
//   EXP/trials/<id>/results.jsonl one line per report: step, metrics, time, workers
//   EXP/trials/<id>/checkpoint/   ELASTICRUN_TRIAL_DIR: the program's own checkpoints
//   EXP/trials/<id>/events.jsonl  the trial job's --events
//   EXP/trials/<id>/output.log    the trial job's output
//
// Files that are rewritten are replaced whole (written aside, renamed), so a kill at any
// moment leaves the old version or the new one; the definition and the parameters are
// also flushed to the disk first. While the sweep runs, status, results and scheduler
// state are written behind its back (write_behind.h): its loop never waits for the disk.
#pragma once

#include "cmd/sweep/write_behind.h"
#include "common/result.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace elasticrun::sweep {

struct TrialRecord {
  std::string id;  // "0007": its index in the sampled order
  nlohmann::json config;
  // pending, running, stopped (by the scheduler), finished (exit 0 on its own), failed
  std::string state = "pending";
  double last_step = -1;
  std::optional<double> last_metric, best_metric;
  int exit_code = 0;
  std::string why;   // why it failed or was stopped
  int restarts = 0;  // pbt exploits and resumes
  nlohmann::json to_json() const;
  static TrialRecord from_json(const nlohmann::json& j);
  bool done() const { return state == "stopped" || state == "finished" || state == "failed"; }
};

class Experiment {
 public:
  // A new experiment in `dir` (created if need be); fails if it already holds one.
  static Result<Experiment> create(const std::string& dir, const nlohmann::json& spec);
  // The experiment in `dir`, with its trials as last saved.
  static Result<Experiment> open(const std::string& dir);

  const nlohmann::json& spec() const { return spec_; }
  std::vector<TrialRecord>& trials() { return trials_; }
  std::optional<nlohmann::json> scheduler_state() const;

  std::filesystem::path trial_dir(const std::string& id) const { return root_ / "trials" / id; }
  std::filesystem::path checkpoint_dir(const std::string& id) const { return trial_dir(id) / "checkpoint"; }
  // Creates the trial's directory and records it (written before it returns).
  Result<void> add_trial(const TrialRecord& t);
  // Written behind (errors are logged), except that a trial's end (done()) is written
  // before save_trial returns:
  void save_trial(const TrialRecord& t);
  void save_params(const TrialRecord& t);  // flushed to the disk too (pbt changes them)
  void append_result(const std::string& id, const nlohmann::json& line);
  void save_scheduler(const nlohmann::json& state);
  // Every report of the trial so far.
  std::vector<nlohmann::json> results(const std::string& id) const;

 private:
  explicit Experiment(std::filesystem::path root)
      : root_(std::move(root)), writer_(std::make_unique<WriteBehind>()) {}
  std::filesystem::path root_;
  std::unique_ptr<WriteBehind> writer_;
  nlohmann::json spec_;
  std::vector<TrialRecord> trials_;
};

// Replaces `path` with `text`: written to a temporary name, then renamed, so a reader
// (or a sweep resumed after a kill) sees the old text or the new. With `sync`, flushed
// to the disk before the rename (for what must survive the machine going down); files
// rewritten at every report are not: a report waits for its answer, and the answer goes
// out before they are written.
Result<void> write_file_atomically(const std::filesystem::path& path, const std::string& text, bool sync = false);

}  // namespace elasticrun::sweep
