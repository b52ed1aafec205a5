// Job's side of the epoch controller: events go in one at a time, and its commands are
// carried out in the order it queued them.
#include "cmd/job.h"

#include "common/env.h"
#include "common/log.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

namespace elasticrun::cmd {

// Delivers `event` now, unless commands are being carried out: then it waits until they
// are (a command that fails at once, such as a daemon that cannot start, reports it as an
// event of its own, after the commands queued before it).
void Job::feed(Event event) {
  deferred_.push_back(std::move(event));
  if (carrying_out_) return;
  carrying_out_ = true;
  while (!deferred_.empty()) {
    Event next = std::move(deferred_.front());
    deferred_.pop_front();
    next(controller_, std::chrono::steady_clock::now());
    while (auto c = controller_.take()) carry_out(*c);
  }
  carrying_out_ = false;
  arm_controller_timer();
}

// Something outside the controller ends the job (a signal, a launch or output failure).
void Job::end_job(int code, std::string message) {
  feed([code, message = std::move(message)](EpochController& c, TimePoint) { c.finish(code, message); });
}

void Job::arm_controller_timer() {
  auto now = std::chrono::steady_clock::now();
  auto due = controller_.next_deadline(now);
  if (!due) {
    controller_timer_.cancel();
    return;
  }
  controller_timer_.expires_at(*due);
  controller_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec) feed([](EpochController& c, TimePoint now) { c.tick(now); });
  });
}

void Job::carry_out(const Command& c) {
  std::visit(
      [this](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, command::Spawn>) {
          spawn(x);
        } else if constexpr (std::is_same_v<T, command::ReservePort>) {
          reserve_port(x);
        } else if constexpr (std::is_same_v<T, command::Signal>) {
          signal_worker(x.place, x.signal);
        } else if constexpr (std::is_same_v<T, command::StartEpoch>) {
          server_->start_epoch(x.assignment, x.kind, x.reason);
        } else if constexpr (std::is_same_v<T, command::AbortEpoch>) {
          server_->abort_epoch(x.reason);
        } else if constexpr (std::is_same_v<T, command::CloseOutput>) {
          output_.finish(x.place);
        } else if constexpr (std::is_same_v<T, command::Say>) {
          fmt::print(stderr, "elasticrun: {}\n", x.text);
        } else if constexpr (std::is_same_v<T, command::Emit>) {
          events_.emit(x.event, x.fields);
        } else {
          static_assert(std::is_same_v<T, command::Finish>);
          stop_everything(x.message);
        }
      },
      c);
}

// Starts the place's worker through its host's daemon (started first if need be; one
// that cannot start is reported as an event of its own). Its environment: torchrun's
// variables, then the forwarded ones and -x (which win), then ours.
void Job::spawn(const command::Spawn& s) {
  // Rank 0 on this machine under a local name ("localhost", a loopback address): that
  // name means the worker's own machine there, so a remote worker gets our address
  // towards its host instead, the one its daemon reaches us at. Both names are looked
  // up first (rank 0's host was, for its port).
  with_host(s.place.first, [this, s](const discovery::HostPlace& place) {
    with_host(s.torch.master_addr, [this, s, place](const discovery::HostPlace& master) {
      if (DaemonLink* d = ensure_daemon(s.place.first, place))
        launch(*d, s, !place.local && master.local ? place.toward : s.torch.master_addr);
    });
  });
}

void Job::launch(DaemonLink& d, const command::Spawn& s, const std::string& master_addr) {
  TorchWorker torch = s.torch;
  torch.master_addr = master_addr;
  auto env = torch_env(torch, run_id_);
  env.insert(env.end(), opts_.env.begin(), opts_.env.end());
  auto rejoin = opts_.elastic_timeout + opts_.rendezvous_timeout;
  env.push_back(fmt::format("{}={:.3f}", env::kRejoinTimeout, rejoin.count() / 1000.0));
  env.push_back(fmt::format("{}={:.3f}", env::kHostTimeout, opts_.host_timeout.count() / 1000.0));
  note_omp_default(s.torch.local_world_size);
  d.send(msg::Spawn{static_cast<std::uint32_t>(s.place.second), s.started_epoch, s.rank, s.size, opts_.command, env,
                     s.torch.local_world_size});
}

// Once per job, as torchrun does: where OMP_NUM_THREADS is not set, a host's workers
// share its cores (the daemon sets it); said when that is fewer threads than OpenMP's
// own default, one per core.
void Job::note_omp_default(int local_workers) {
  if (omp_noted_ || local_workers <= 1) return;
  omp_noted_ = true;
  std::string name = std::string(env::kOmpNumThreads) + "=";
  bool given = std::getenv(env::kOmpNumThreads) ||
               std::any_of(opts_.env.begin(), opts_.env.end(), [&](const std::string& kv) { return kv.starts_with(name); });
  if (!given)
    fmt::print(stderr, "elasticrun: OMP_NUM_THREADS is not set: each worker gets its host's cores divided by its "
                       "workers on that host (at least 1); set it with -x OMP_NUM_THREADS=N\n");
}

// Rank 0's daemon reserves the epoch's port; the daemons of the other hosts that get
// workers start meanwhile, rather than after the answer.
void Job::reserve_port(const command::ReservePort& r) {
  with_host(r.host, [this, r](const discovery::HostPlace& place) {
    if (DaemonLink* d = ensure_daemon(r.host, place)) d->send(msg::ReservePort{r.epoch, r.host_store});
  });
  for (const auto& h : r.hosts)
    if (h != r.host)  // one that cannot start is an event of its own
      with_host(h, [this, h](const discovery::HostPlace& place) { ensure_daemon(h, place); });
}

// After the host's pending spawns, if its name is still being looked up.
void Job::signal_worker(const Place& p, int sig) {
  with_host(p.first, [this, p, sig](const discovery::HostPlace&) {
    auto it = daemons_.find(p.first);
    if (it != daemons_.end() && !it->second->closed())
      it->second->send(msg::Kill{static_cast<std::uint32_t>(p.second), sig});
  });
}

}  // namespace elasticrun::cmd
