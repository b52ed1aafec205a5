// What a job under `elasticrund --listen` leaves on disk, so that a daemon restarted
// after a crash can kill the workers the crash left behind (Mesos's agent recovery,
// in its simplest form: reclaim by killing).
//
//   <state dir>/job.<pid>    line 1: "job <pid> <start time>"
//                            then one "<worker pid> <start time>" per live worker
//
// Each worker leads its own process group; PR_SET_PDEATHSIG kills the worker itself
// when its job process dies, but not what the worker started (a data-loader child, a
// shell's background job). Those stay in the worker's process group, which the
// restarted daemon kills. Start times (clock ticks since boot, /proc/PID/stat) tell a
// recorded process from a later one that reused its pid.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace elasticrun::daemon {

// Start time of `pid` in clock ticks since boot; 0 when there is no such process.
std::uint64_t process_start_time(int pid);

// The record of the current process's job. Rewritten (atomically) on every change;
// removed when the job ends normally.
class JobRecord {
 public:
  explicit JobRecord(std::string state_dir);
  ~JobRecord();
  JobRecord(const JobRecord&) = delete;
  JobRecord& operator=(const JobRecord&) = delete;
  void add(int pid);
  void remove(int pid);

 private:
  void write() const;
  std::string path_;
  std::uint64_t start_time_ = 0;
  std::map<int, std::uint64_t> workers_;
};

struct ReclaimReport {
  int jobs = 0;    // records of dead jobs handled
  int groups = 0;  // worker process groups that still had processes and were killed
};

// Kills the worker process groups of every recorded job whose process is gone, then
// removes those records and the jobs' shared-memory directories.
ReclaimReport reclaim_jobs(const std::string& state_dir);

}  // namespace elasticrun::daemon
