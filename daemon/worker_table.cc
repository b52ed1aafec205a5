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
  Worker* raw = w.get();
  workers_[pid] = std::move(w);
  read(*raw, 1);
  read(*raw, 2);
}

void WorkerTable::exited(int pid, int status) {
  auto it = workers_.find(pid);
  if (it == workers_.end() || it->second->exited) return;
  Worker& w = *it->second;
  w.exited = true;
  if (WIFSIGNALED(status)) w.sig = WTERMSIG(status);
  else w.code = WEXITSTATUS(status);
  maybe_finish(pid);
}

void WorkerTable::signal(std::uint32_t slot, int sig) {
  for (auto& [pid, w] : workers_)
    if (w->slot == slot && !w->exited) w->signal_group(sig);
}

void WorkerTable::signal_all(int sig) {
  for (auto& [pid, w] : workers_)
    if (!w->exited) w->signal_group(sig);
}

std::vector<int> WorkerTable::running_pids() const {
  std::vector<int> out;
  for (const auto& [pid, w] : workers_)
    if (!w->exited) out.push_back(pid);
  return out;
}

void WorkerTable::read(Worker& w, int stream) {
  auto& pipe = stream == 1 ? *w.out : *w.err;
  auto& buf = stream == 1 ? w.obuf : w.ebuf;
  int pid = w.pid;
  pipe.async_read_some(asio::buffer(buf), [this, pid, stream](boost::system::error_code ec, std::size_t n) {
    auto it = workers_.find(pid);
    if (it == workers_.end()) return;
    Worker& wk = *it->second;
    if (n > 0 && ev_.on_output) ev_.on_output(wk.slot, stream, {(stream == 1 ? wk.obuf : wk.ebuf).data(), n});
    if (ec) {
      --wk.open_pipes;
      maybe_finish(pid);
      return;
    }
    read(wk, stream);
  });
}

// Reports the exit once both pipes reached EOF, or shortly after the exit if a
// grandchild keeps them open.
void WorkerTable::maybe_finish(int pid) {
  auto it = workers_.find(pid);
  if (it == workers_.end() || !it->second->exited) return;
  Worker& w = *it->second;
  if (w.open_pipes > 0 && !w.drain_timer) {
    w.drain_timer = std::make_unique<asio::steady_timer>(io_, std::chrono::milliseconds(500));
    w.drain_timer->async_wait([this, pid](boost::system::error_code ec) {
      if (ec) return;
      auto i = workers_.find(pid);
      if (i == workers_.end()) return;
      i->second->signal_group(SIGKILL);  // whatever still holds the pipes belongs to the dead worker
      i->second->open_pipes = 0;
      maybe_finish(pid);
    });
    return;
  }
  if (w.open_pipes > 0) return;
  auto done = std::move(it->second);
  workers_.erase(it);
  boost::system::error_code ec;
  if (done->drain_timer) done->drain_timer->cancel();
  done->out->close(ec);
  done->err->close(ec);
  if (ev_.on_exit) ev_.on_exit(done->slot, pid, done->code, done->sig);
  // Destroying the pipes' pending handlers must wait until they ran; post the release.
  asio::post(io_, [d = std::shared_ptr<Worker>(std::move(done))] {});
}

}  // namespace elasticrun::daemon
