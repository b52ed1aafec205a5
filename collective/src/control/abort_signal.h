// The control plane's "stop waiting" flag for one epoch.
//
// The rendezvous client's reader thread raises it when the server pushes abort or
// hosts-updated; every wait in the library checks it (and can poll() its fd next to
// a transport's event fd), so a collective blocked on a dead peer returns within
// milliseconds of the notice instead of at its deadline.
#pragma once

#include <atomic>
#include <mutex>
#include <string>

namespace elasticrun::collective {

class AbortSignal {
 public:
  enum class Kind { none, workers_failed, hosts_updated, shutdown };

  AbortSignal();
  ~AbortSignal();
  AbortSignal(const AbortSignal&) = delete;
  AbortSignal& operator=(const AbortSignal&) = delete;

  // First raise wins; later ones are ignored until reset().
  void raise(Kind kind, std::string reason);
  bool raised() const { return kind_.load(std::memory_order_acquire) != Kind::none; }
  Kind kind() const { return kind_.load(std::memory_order_acquire); }
  std::string reason() const;
  // Readable (POLLIN) while raised.
  int fd() const { return fd_; }
  // Throws the typed error that matches kind(): WorkersFailed or HostsUpdated.
  [[noreturn]] void throw_error() const;
  // Throws if raised; otherwise returns.
  void check() const {
    if (raised()) throw_error();
  }
  void reset();

 private:
  std::atomic<Kind> kind_{Kind::none};
  mutable std::mutex mu_;
  std::string reason_;
  int fd_ = -1;
};

}  // namespace elasticrun::collective
