#include "daemon/job_records.h"

#include "common/log.h"
#include "common/shm_dirs.h"

#include <fmt/format.h>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace elasticrun::daemon {

namespace fs = std::filesystem;

namespace {

struct ProcStat {
  char state = 0;
  std::uint64_t start_time = 0;
};

ProcStat read_stat(int pid) {
  if (pid <= 0) return {};
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  // "pid (comm) state ppid ..." where comm may hold spaces and parentheses: the
  // fields after the last ')' are fixed. starttime is field 22 overall, the 20th
  // after the ')'; state is the first.
  auto close = stat.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream fields(stat.substr(close + 1));
  ProcStat out;
  std::string field;
  for (int i = 0; i < 20 && fields >> field; ++i)
    if (i == 0) out.state = field.empty() ? 0 : field[0];
  if (!fields) return {};
  try {
    out.start_time = std::stoull(field);
  } catch (const std::exception&) {
    return {};
  }
  return out;
}

}  // namespace

std::uint64_t process_start_time(int pid) { return read_stat(pid).start_time; }

JobRecord::JobRecord(std::string state_dir)
    : path_(fmt::format("{}/job.{}", state_dir, ::getpid())), start_time_(process_start_time(::getpid())) {
  write();
}

JobRecord::~JobRecord() {
  std::error_code ec;
  fs::remove(path_, ec);
}

void JobRecord::add(int pid) {
  workers_[pid] = process_start_time(pid);
  write();
}

void JobRecord::remove(int pid) {
  if (workers_.erase(pid)) write();
}

void JobRecord::write() const {
  std::string text = fmt::format("job {} {}\n", ::getpid(), start_time_);
  for (auto [pid, start] : workers_) text += fmt::format("{} {}\n", pid, start);
  std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out) {
      ER_LOG(daemon, warn, "cannot write job record {}", tmp);
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, path_, ec);
  if (ec) ER_LOG(daemon, warn, "cannot write job record {}: {}", path_, ec.message());
}

namespace {

// A zombie counts as gone: its parent died too and nobody may ever reap it.
bool alive(int pid, std::uint64_t start) {
  auto st = read_stat(pid);
  return start != 0 && st.start_time == start && st.state != 'Z' && st.state != 'X';
}

// Kills what is left of one recorded worker. True when something was there.
bool kill_worker_group(int pid, std::uint64_t start) {
  auto now = read_stat(pid);
  // The pid now names another process: the group id can only be in use by that
  // process's own group (Linux keeps a pid allocated while a group uses it), so leave it.
  if (now.start_time != 0 && now.start_time != start) return false;
  bool leader = now.start_time != 0 && now.state != 'Z';
  if (leader) ::kill(pid, SIGKILL);
  return ::kill(-pid, SIGKILL) == 0 || leader;
}

}  // namespace

ReclaimReport reclaim_jobs(const std::string& state_dir) {
  ReclaimReport report;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(state_dir, ec)) {
    std::string name = entry.path().filename();
    if (name.rfind("job.", 0) != 0) continue;
    if (name.size() > 4 && name.substr(name.size() - 4) == ".tmp") {
      // A live job may be writing it this moment (reclaim also runs while jobs run):
      // only a dead job's half-written record goes.
      int writer = std::atoi(name.c_str() + 4);
      if (writer <= 1 || process_start_time(writer) == 0) fs::remove(entry.path(), ec);
      continue;
    }
    std::ifstream in(entry.path());
    std::string tag;
    int job = 0;
    std::uint64_t job_start = 0;
    if (!(in >> tag >> job >> job_start) || tag != "job") {
      ER_LOG(daemon, warn, "ignoring unreadable job record {}", entry.path().string());
      continue;
    }
    if (alive(job, job_start)) continue;  // still running; it cleans up after itself
    int pid = 0;
    std::uint64_t start = 0;
    int killed = 0;
    while (in >> pid >> start)
      if (pid > 1 && kill_worker_group(pid, start)) ++killed;
    if (killed > 0)
      ER_LOG(daemon, warn, "job process {} died before its workers; killed {} leftover worker group(s)", job, killed);
    shm_dirs::remove_all_of(job);
    fs::remove(entry.path(), ec);
    ++report.jobs;
    report.groups += killed;
  }
  return report;
}

}  // namespace elasticrun::daemon
