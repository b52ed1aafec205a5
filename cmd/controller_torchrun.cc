// The epoch controller's side of programs written for torchrun: the epoch's port
// (MASTER_PORT) and a failed worker's error file.
#include "cmd/controller.h"

#include "cmd/error_report.h"
#include "cmd/exit_codes.h"
#include "common/log.h"

#include <algorithm>
#include <fmt/format.h>

#include <csignal>

namespace elasticrun::cmd {

// The epoch's workers wait for its port when any is to start: the new ones, and those
// kept from an epoch whose port never came (rank 0's host failed first).
void EpochController::reserve_port(const rendezvous::Plan& plan) {
  bool held = std::any_of(workers_.begin(), workers_.end(), [](const auto& w) { return w.second.held; });
  if ((plan.spawn.empty() && !held) || assignment_.size() == 0) return;
  command::ReservePort r{assignment_.workers.front().host, assignment_.epoch, {}};
  for (const auto& w : plan.spawn)
    if (std::find(r.hosts.begin(), r.hosts.end(), w.host) == r.hosts.end()) r.hosts.push_back(w.host);
  out_.push_back(std::move(r));
}

void EpochController::port_reserved(const std::string& host, std::uint64_t epoch, int port, const std::string& error) {
  if (finished() || epoch != assignment_.epoch || port_epoch_ == epoch || assignment_.size() == 0 ||
      assignment_.workers.front().host != host)
    return;  // an answer for an epoch gone by
  port_epoch_ = epoch;
  master_port_ = port;
  if (port == 0)
    say(fmt::format("host '{}' could not reserve a port for epoch {} ({}); its workers get no MASTER_PORT", host,
                    epoch, error));
  emit("port_reserved", {{"epoch", epoch}, {"host", host}, {"port", port}});
  for (const auto& r : assignment_.workers) {
    auto it = workers_.find({r.host, r.slot});
    if (it != workers_.end() && it->second.held) launch(it->first, it->second);
  }
}

// A failed worker's error file (TORCHELASTIC_ERROR_FILE): the root cause, as torchrun
// prints it, and a worker_error event.
void EpochController::report_error(const std::string& host, const Worker& w, const msg::Exited& e) {
  if (e.error_file_size == 0) return;
  WorkerError err = parse_error_file(e.error_file, e.error_file_size, msg::kMaxErrorFile);
  FailedWorker f{host, w.rank, w.local_rank, static_cast<int>(e.pid), e.code, e.signal};
  say(root_cause(f, err));
  nlohmann::json fields = {{"host", host}, {"slot", e.slot}, {"rank", w.rank}, {"local_rank", w.local_rank},
                           {"pid", e.pid}, {"code", e.code}, {"signal", e.signal}};
  if (!err.problem.empty()) {
    fields["problem"] = err.problem;
  } else {
    fields["message"] = err.message;
    fields["traceback"] = err.traceback;
    if (err.timestamp) fields["timestamp"] = *err.timestamp;
  }
  emit("worker_error", std::move(fields));
}

}  // namespace elasticrun::cmd
