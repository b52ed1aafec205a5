#include "daemon/worker_table.h"

#include <sys/wait.h>

#include <csignal>

namespace elasticrun::daemon {

namespace asio = boost::asio;

// A group can outlive its leader, so this still reaches what a worker left after it
// was reaped.
void WorkerTable::Worker::signal_group(int s) const {
  if (child) child->signal_group(s);
  else ::kill(-pid, s);
}

void WorkerTable::add(std::uint32_t slot, int pid, UniqueFd out, UniqueFd err, std::unique_ptr<ChildProcess> child) {
  auto w = std::make_unique<Worker>();
  w->slot = slot;
  w->pid = pid;
  w->child = std::move(child);
  w->out = std::make_unique<asio::posix::stream_descriptor>(io_, out.release());
  w->err = std::make_unique<asio::posix::stream_descriptor>(io_, err.release());
  Id id = next_id_++;
  workers_[id] = std::move(w);
  live_[pid] = id;
  read(id, 1);
  read(id, 2);
}

void WorkerTable::exited(int pid, int status) {
  auto l = live_.find(pid);
  if (l == live_.end()) return;
  Id id = l->second;
  live_.erase(l);  // the pid is free: a new worker may get it
  Worker& w = *workers_.at(id);
  w.exited = true;
  if (WIFSIGNALED(status)) w.sig = WTERMSIG(status);
  else w.code = WEXITSTATUS(status);
  maybe_finish(id);
}

void WorkerTable::signal(std::uint32_t slot, int sig) {
  for (auto& [id, w] : workers_)
    if (w->slot == slot && !w->exited) w->signal_group(sig);
}

void WorkerTable::signal_all(int sig) {
  for (auto& [id, w] : workers_)
    if (!w->exited) w->signal_group(sig);
  for (auto& [id, l] : leftovers_) ::kill(-l.pgid, sig);
}

std::vector<int> WorkerTable::running_pids() const {
  std::vector<int> out;
  for (const auto& [pid, id] : live_) out.push_back(pid);
  return out;
}

void WorkerTable::read(Id id, int stream) {
  Worker& w = *workers_.at(id);
  auto& pipe = stream == 1 ? *w.out : *w.err;
  auto& buf = stream == 1 ? w.obuf : w.ebuf;
  pipe.async_read_some(asio::buffer(buf), [this, id, stream](boost::system::error_code ec, std::size_t n) {
    auto it = workers_.find(id);
    if (it == workers_.end()) return;
    Worker& wk = *it->second;
    if (n > 0 && ev_.on_output) ev_.on_output(wk.slot, stream, {(stream == 1 ? wk.obuf : wk.ebuf).data(), n});
    if (ec) {
      --wk.open_pipes;
      maybe_finish(id);
      return;
    }
    if (ev_.hold_output && ev_.hold_output()) {
      wk.held[stream - 1] = true;
      return;
    }
    read(id, stream);
  });
}

void WorkerTable::resume_output() {
  for (auto& [id, w] : workers_)
    for (int stream : {1, 2})
      if (w->held[stream - 1]) {
        w->held[stream - 1] = false;
        read(id, stream);
      }
}

// Reports the exit once both pipes reached EOF, or shortly after the exit if a
// grandchild keeps them open.
void WorkerTable::maybe_finish(Id id) {
  auto it = workers_.find(id);
  if (it == workers_.end() || !it->second->exited) return;
  Worker& w = *it->second;
  if (w.open_pipes > 0 && !w.drain_timer) {
    w.drain_timer = std::make_unique<asio::steady_timer>(io_);
    wait_for_drain(id);
    return;
  }
  if (w.open_pipes > 0) return;
  auto done = std::move(it->second);
  workers_.erase(it);
  boost::system::error_code ec;
  if (done->drain_timer) done->drain_timer->cancel();
  done->out->close(ec);
  done->err->close(ec);
  stop_leftovers(id, done->pid);  // before the report, so that lingering() counts them
  if (ev_.on_exit) ev_.on_exit(done->slot, done->pid, done->code, done->sig);
  // Destroying the pipes' pending handlers must wait until they ran; post the release.
  asio::post(io_, [d = std::shared_ptr<Worker>(std::move(done))] {});
}

// 500 ms after the worker's exit, whatever still holds its pipes, which belongs to the
// dead worker, is killed. What it wrote is still read to the end, unless reading is held
// then: the pipes are given up at the first check that finds them not held (a holder in
// another group would keep them open for ever).
void WorkerTable::wait_for_drain(Id id) {
  Worker& w = *workers_.at(id);
  w.drain_timer->expires_after(std::chrono::milliseconds(500));
  w.drain_timer->async_wait([this, id](boost::system::error_code ec) {
    if (ec) return;
    auto i = workers_.find(id);
    if (i == workers_.end()) return;
    // Once: nothing in the group survives it, and a later signal to -pid could reach a
    // stranger's group once this one has emptied (see stop_leftovers). Not at all when a
    // new worker of ours has the pid: the group emptied, and -pid is the new one's.
    if (!i->second->drain_killed && !live_.count(i->second->pid)) i->second->signal_group(SIGKILL);
    i->second->drain_killed = true;
    if (i->second->held[0] || i->second->held[1]) return wait_for_drain(id);
    i->second->open_pipes = 0;
    maybe_finish(id);
  });
}

// The worker is reaped, so its pid is free again; but while its group has a member, no
// new process gets that pid, so -pid still names only what the worker left. (A group
// that empties during the grace, and a stranger that then gets the pid and makes a
// group of its own within it, is the one case this could reach; pids are handed out in
// turn, up to pid_max, so that takes a host forking pid_max times in 2 s.) A new worker
// of ours with the pid means the group emptied: nothing is left to stop.
void WorkerTable::stop_leftovers(Id id, int pgid) {
  if (live_.count(pgid)) return;
  if (::kill(-pgid, 0) != 0) return;  // nothing left (the usual case), or nothing we may signal
  ::kill(-pgid, SIGTERM);
  Leftover& l = leftovers_[id];
  l.pgid = pgid;
  l.kill_at = std::chrono::steady_clock::now() + kLeftoverGrace;
  l.timer = std::make_unique<asio::steady_timer>(io_);
  poll_leftovers_later(id);  // never on_settled from here: the exit is not reported yet
}

void WorkerTable::poll_leftovers_later(Id id) {
  auto& timer = *leftovers_.at(id).timer;
  timer.expires_after(std::chrono::milliseconds(20));
  timer.async_wait([this, id](boost::system::error_code ec) {
    if (!ec) poll_leftovers(id);
  });
}

void WorkerTable::poll_leftovers(Id id) {
  auto it = leftovers_.find(id);
  if (it == leftovers_.end()) return;
  int pgid = it->second.pgid;
  // A worker of ours with that pid means the group emptied first: it is not ours to kill.
  bool gone = live_.count(pgid) || ::kill(-pgid, 0) != 0;
  if (!gone && std::chrono::steady_clock::now() >= it->second.kill_at) {
    ::kill(-pgid, SIGKILL);
    gone = true;
  }
  if (gone) {
    asio::post(io_, [t = std::shared_ptr<asio::steady_timer>(std::move(it->second.timer))] {});
    leftovers_.erase(it);
    if (ev_.on_settled) ev_.on_settled();
    return;
  }
  poll_leftovers_later(id);
}

}  // namespace elasticrun::daemon
