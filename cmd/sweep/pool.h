// The sweep's slot pool: which hosts' slots each running trial holds.
//
// Pure bookkeeping, no I/O: the driver sends each trial's share to that trial's job as its
// host feed ("host:slots" lines on its --host-discovery-fd), so a trial grows or shrinks
// elastically.
//
// Rules:
//  - A pending trial starts when min_np slots are free (startable, then start). Pending trials
//    are considered strictly in the order given: one that does not fit stops the scan, so a
//    large trial is not overtaken for ever by smaller ones behind it.
//  - A running trial never loses slots to another trial; it shrinks only when a host leaves
//    the pool or loses slots (set_host, remove_host).
//  - allocate() hands out the free slots, by priority (lower is better; ties in start order):
//    first to trials below their min_np (after a host left) up to min_np, then to every trial
//    up to max_np. The driver starts the startable pending trials BEFORE calling allocate(), so
//    freed slots go to waiting trials first and only the rest grows running ones.
//  - release() returns a trial's slots at once.
//  - A trial that is stopping (hold()) keeps what it has and is given nothing more: new
//    workers would start only to be stopped, and its job must not form a new epoch while
//    its workers stop.
//  - Placement is compact: slots for a trial come first from hosts it already uses (the one with
//    the most free slots first), then from the host with the most free slots; ties go to the
//    host added first. So a trial spans as few hosts as it can and big holes stay big.
//  - No host ever gives more than its slots; no trial ever holds more than its max_np.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace elasticrun::sweep {

// One host's part of a trial's share.
struct Slice {
  std::string host;
  int slots = 0;
  bool operator==(const Slice&) const = default;
};
using Share = std::vector<Slice>;  // hosts in the order the trial got them

// What a trial asks of the pool.
struct TrialNeed {
  std::string id;
  int min_np = 1, max_np = 1;  // 1 <= min_np <= max_np
};

// A trial that lost slots when a host left or shrank: its size now, and whether it is below
// its min_np. The pool keeps it running; the driver either lets it wait (its elastic job waits
// for hosts, and allocate() tops it up to min_np first) or stops it and calls release().
struct Shrunk {
  std::string trial;
  int size = 0;
  bool below_min = false;
  bool operator==(const Shrunk&) const = default;
};

class Pool {
 public:
  // Adds a host, or changes a known host's slot count; 0 removes it. Slots taken away come
  // from the trials on that host, the worst priority first. Returns the trials that shrank.
  std::vector<Shrunk> set_host(const std::string& name, int slots);
  std::vector<Shrunk> remove_host(const std::string& name) { return set_host(name, 0); }
  void add_host(const std::string& name, int slots) { set_host(name, slots); }

  // The pending trials, in the given order, that can start now: each takes min_np free slots;
  // the first that does not fit ends the list. Changes nothing.
  std::vector<std::string> startable(const std::vector<TrialNeed>& pending) const;
  // Starts `t` with min_np slots placed compactly; false, and nothing changes, if fewer are
  // free or `t` is already running.
  bool start(const TrialNeed& t, int priority);
  // Gives the free slots out (rules above); returns the trials whose share changed, in priority order.
  std::vector<std::string> allocate();
  // The trial's slots go back to the pool; an unknown trial is ignored.
  void release(const std::string& trial);
  // The trial is stopping: allocate() gives it no more slots; an unknown trial is ignored.
  void hold(const std::string& trial);

  // Priorities: lower is better. set_ranking gives the i-th trial of `best_first` priority i
  // (the scheduler's ranking()); running trials not in it keep theirs.
  void set_priority(const std::string& trial, int priority);
  void set_ranking(const std::vector<std::string>& best_first);

  bool running(const std::string& trial) const { return trials_.count(trial) != 0; }
  const Share& share(const std::string& trial) const;  // empty for a trial not running
  int size(const std::string& trial) const;            // slots the trial holds
  int free_on(const std::string& host) const;          // 0 for an unknown host
  std::vector<std::string> hosts() const;              // in the order added

  int total_slots() const;
  int busy_slots() const;
  int free_slots() const { return total_slots() - busy_slots(); }
  double utilisation() const;  // busy / total; 0 without slots

 private:
  struct Host {
    std::string name;
    int slots = 0, used = 0;
  };
  struct Running {
    TrialNeed need;
    int priority = 0;
    std::size_t order = 0;  // start order, for ties
    Share share;
    int size = 0;
    bool held = false;
  };
  Host* find_host(const std::string& name);
  // Gives `trial` up to `n` more free slots (placement rule above); returns how many.
  int take(Running& trial, int n);
  void give_back(Running& trial, const std::string& host, int n);
  std::vector<Running*> by_priority(bool best_first);

  std::vector<Host> hosts_;
  std::map<std::string, Running> trials_;
  std::size_t started_ = 0;
};

// Busy and available slot-seconds integrated over time, for the benchmark's utilisation figure
// (busy slot-seconds over available slot-seconds, overall and while trials were waiting). Time
// is passed in (seconds, non-decreasing): each record() closes the interval since the last one,
// which had the state that record gave.
class UsageMeter {
 public:
  void record(double now, int busy, int total, bool trials_waiting);
  double busy_slot_seconds() const { return busy_; }
  double available_slot_seconds() const { return available_; }
  double utilisation() const { return available_ > 0 ? busy_ / available_ : 0; }
  double utilisation_while_waiting() const { return waiting_available_ > 0 ? waiting_busy_ / waiting_available_ : 0; }

 private:
  bool started_ = false;
  double last_ = 0;
  int busy_now_ = 0, total_now_ = 0;
  bool waiting_now_ = false;
  double busy_ = 0, available_ = 0, waiting_busy_ = 0, waiting_available_ = 0;
};

}  // namespace elasticrun::sweep
