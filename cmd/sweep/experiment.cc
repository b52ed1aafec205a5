#include "cmd/sweep/experiment.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace elasticrun::sweep {

namespace fs = std::filesystem;

Result<void> write_file_atomically(const fs::path& path, const std::string& text, bool sync) {
  fs::path tmp = path;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail(fmt::format("cannot write {}: {}", tmp.string(), std::strerror(errno)));
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return fail(fmt::format("cannot write {}: {}", tmp.string(), std::strerror(e)));
    }
    done += static_cast<std::size_t>(n);
  }
  if (sync) ::fsync(fd);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return fail(fmt::format("cannot rename {} to {}: {}", tmp.string(), path.string(), std::strerror(errno)));
  return {};
}

namespace {

Result<nlohmann::json> read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return fail(fmt::format("cannot read {}", p.string()));
  std::stringstream s;
  s << in.rdbuf();
  try {
    return nlohmann::json::parse(s.str());
  } catch (const nlohmann::json::exception& e) {
    return fail(fmt::format("{}: not valid JSON ({})", p.string(), e.what()));
  }
}

}  // namespace

nlohmann::json TrialRecord::to_json() const {
  nlohmann::json j = {{"id", id}, {"config", config}, {"state", state}, {"last_step", last_step},
                      {"exit_code", exit_code}, {"why", why}, {"restarts", restarts}};
  j["last_metric"] = last_metric ? nlohmann::json(*last_metric) : nlohmann::json();
  j["best_metric"] = best_metric ? nlohmann::json(*best_metric) : nlohmann::json();
  return j;
}

TrialRecord TrialRecord::from_json(const nlohmann::json& j) {
  TrialRecord t;
  t.id = j.at("id").get<std::string>();
  t.config = j.at("config");
  t.state = j.value("state", "pending");
  t.last_step = j.value("last_step", -1.0);
  if (j.contains("last_metric") && j["last_metric"].is_number()) t.last_metric = j["last_metric"].get<double>();
  if (j.contains("best_metric") && j["best_metric"].is_number()) t.best_metric = j["best_metric"].get<double>();
  t.exit_code = j.value("exit_code", 0);
  t.why = j.value("why", "");
  t.restarts = j.value("restarts", 0);
  return t;
}

Result<Experiment> Experiment::create(const std::string& dir, const nlohmann::json& spec) {
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "trials", ec);
  if (ec) return fail(fmt::format("cannot create --dir {}: {}", dir, ec.message()));
  if (fs::exists(fs::path(dir) / "sweep.json"))
    return fail(fmt::format("{} already holds a sweep: give --resume to continue it, or another --dir", dir));
  Experiment x(dir);
  x.spec_ = spec;
  if (auto ok = write_file_atomically(x.root_ / "sweep.json", spec.dump(2) + "\n", true); !ok) return Failure{ok.error()};
  return x;
}

Result<Experiment> Experiment::open(const std::string& dir) {
  Experiment x(dir);
  if (!fs::exists(x.root_ / "sweep.json")) return fail(fmt::format("--resume: {} holds no sweep (no sweep.json)", dir));
  auto spec = read_json(x.root_ / "sweep.json");
  if (!spec) return Failure{spec.error()};
  x.spec_ = std::move(*spec);
  std::error_code ec;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(x.root_ / "trials", ec))
    if (e.is_directory()) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (const auto& d : dirs) {
    auto st = read_json(d / "status.json");
    if (!st) return Failure{st.error()};
    try {
      x.trials_.push_back(TrialRecord::from_json(*st));
    } catch (const nlohmann::json::exception& e) {
      return fail(fmt::format("{}: {}", (d / "status.json").string(), e.what()));
    }
  }
  return x;
}

std::optional<nlohmann::json> Experiment::scheduler_state() const {
  auto j = read_json(root_ / "scheduler.json");
  if (!j) return std::nullopt;
  return *j;
}

Result<void> Experiment::add_trial(const TrialRecord& t) {
  std::error_code ec;
  fs::create_directories(checkpoint_dir(t.id), ec);
  if (ec) return fail(fmt::format("cannot create {}: {}", checkpoint_dir(t.id).string(), ec.message()));
  if (auto ok = write_file_atomically(trial_dir(t.id) / "params.json", t.config.dump(2) + "\n", true); !ok) return ok;
  return write_file_atomically(trial_dir(t.id) / "status.json", t.to_json().dump() + "\n");
}

void Experiment::save_trial(const TrialRecord& t) {
  writer_->replace(trial_dir(t.id) / "status.json", t.to_json().dump() + "\n");
  // A trial's end is on the disk before the sweep goes on: a sweep killed right after
  // must not run a finished trial again when it is resumed.
  if (t.done()) writer_->flush();
}

void Experiment::save_params(const TrialRecord& t) {
  writer_->replace(trial_dir(t.id) / "params.json", t.config.dump(2) + "\n", true);
}

void Experiment::append_result(const std::string& id, const nlohmann::json& line) {
  writer_->append(trial_dir(id) / "results.jsonl", line.dump() + "\n");
}

void Experiment::save_scheduler(const nlohmann::json& state) {
  writer_->replace(root_ / "scheduler.json", state.dump() + "\n");
}

std::vector<nlohmann::json> Experiment::results(const std::string& id) const {
  writer_->flush();
  std::vector<nlohmann::json> out;
  std::ifstream in(trial_dir(id) / "results.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception&) {
      // a line torn by a kill: the report is made again after the resume
    }
  }
  return out;
}

}  // namespace elasticrun::sweep
