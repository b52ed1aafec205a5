// The epoch controller's test fixture: a controller fed by hand with a fake clock, and
// what it said (tests/cmd/controller_test.cc, controller_finishing_test.cc).
#pragma once

#include "cmd/controller.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace elasticrun::cmd {

using namespace std::chrono_literals;
using discovery::Host;

inline TimePoint t0() { return TimePoint{} + 1000s; }

// A controller and everything it has said so far.
struct Driver {
  explicit Driver(ControllerConfig cfg) : c(std::move(cfg)) {}

  // Takes the commands queued since the last call. Rank 0's daemon answers a port
  // reservation at once (port_of), unless `answer_ports` is off; the spawns that waited
  // for it follow in the same list.
  std::vector<Command> drain() {
    std::vector<Command> out;
    while (auto x = c.take()) {
      if (auto* r = std::get_if<command::ReservePort>(&*x); r && answer_ports)
        c.port_reserved(r->host, r->epoch, port_of(r->epoch), "", r->host_store && hosts_stores);
      out.push_back(std::move(*x));
    }
    return out;
  }
  // Whether rank 0's daemon hosts torch's store when asked to (it can: its fork server runs).
  bool hosts_stores = false;
  static int port_of(std::uint64_t epoch) { return 29500 + static_cast<int>(epoch); }
  // Answers the current epoch's port reservation (nothing if answered already).
  void answer_port() {
    const auto& a = c.assignment();
    if (a.size() > 0) c.port_reserved(a.workers.front().host, a.epoch, port_of(a.epoch), "");
  }
  template <class T>
  static std::vector<T> only(const std::vector<Command>& cmds) {
    std::vector<T> out;
    for (const auto& x : cmds)
      if (auto* p = std::get_if<T>(&x)) out.push_back(*p);
    return out;
  }
  static std::vector<std::string> events(const std::vector<Command>& cmds) {
    std::vector<std::string> out;
    for (const auto& e : only<command::Emit>(cmds)) out.push_back(e.event);
    return out;
  }
  // The first event of that name among the commands, if any.
  static const command::Emit* event(const std::vector<Command>& cmds, const std::string& name) {
    for (const auto& c : cmds)
      if (auto* e = std::get_if<command::Emit>(&c); e && e->event == name) return e;
    return nullptr;
  }
  static std::string said(const std::vector<Command>& cmds) {
    std::string out;
    for (const auto& s : only<command::Say>(cmds)) out += s.text + "\n";
    return out;
  }

  // Every worker of the current epoch started and joined.
  void start_and_join_all() {
    if (answer_ports) answer_port();
    const auto& a = c.assignment();
    for (const auto& w : a.workers) {
      c.worker_started(w.host, static_cast<std::uint32_t>(w.slot), pid_of(w));
      c.worker_joined(w, a.epoch);
    }
  }
  // Every worker of the current epoch started; none joins (a program that does not use
  // libelasticrun, such as a torchrun script).
  void start_all() {
    if (answer_ports) answer_port();
    for (const auto& w : c.assignment().workers) c.worker_started(w.host, static_cast<std::uint32_t>(w.slot), pid_of(w));
  }
  // A pid that names host, slot and the epoch the worker started in: 'b', slot 1,
  // epoch 1 is 98111.
  int pid_of(const rendezvous::WorkerPlace& w) const {
    return 100 + w.slot + 10 * static_cast<int>(w.started_epoch) + static_cast<int>(w.host[0]) * 1000;
  }
  rendezvous::WorkerPlace place(const std::string& host, int slot) const {
    const auto* w = c.assignment().find(host, slot);
    EXPECT_NE(w, nullptr) << host << ":" << slot;
    return w ? *w : rendezvous::WorkerPlace{};
  }
  msg::Exited exit_of(const std::string& host, int slot, int code, int sig = 0) const {
    auto w = place(host, slot);
    return msg::Exited{static_cast<std::uint32_t>(slot), static_cast<std::uint32_t>(pid_of(w)), code, sig};
  }

  EpochController c;
  bool answer_ports = true;
};

inline ControllerConfig fixed(int np) {
  ControllerConfig cfg;
  cfg.np = np;
  cfg.start_timeout = 60s;
  return cfg;
}

// Restart mode (--max-restarts), in a fixed job.
inline ControllerConfig restarting(int np, int max_restarts) {
  ControllerConfig cfg = fixed(np);
  cfg.max_restarts = max_restarts;
  return cfg;
}

inline ControllerConfig elastic(int min_np, int max_np = 0) {
  ControllerConfig cfg;
  cfg.elastic = true;
  cfg.np = min_np;
  cfg.min_np = min_np;
  cfg.max_np = max_np;
  cfg.start_timeout = 60s;
  cfg.rendezvous_timeout = 30s;
  cfg.elastic_timeout = 100s;
  return cfg;
}

}  // namespace elasticrun::cmd
