#include "control/abort_signal.h"

#include <elasticrun/types.hpp>

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace elasticrun::collective {

AbortSignal::AbortSignal() {
  fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd_ < 0) throw Error(std::string("eventfd: ") + std::strerror(errno));
}

AbortSignal::~AbortSignal() { ::close(fd_); }

void AbortSignal::raise(Kind kind, std::string reason) {
  {
    std::lock_guard lock(mu_);
    if (raised()) return;
    reason_ = std::move(reason);
    kind_.store(kind, std::memory_order_release);
  }
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(fd_, &one, sizeof one);
}

std::string AbortSignal::reason() const {
  std::lock_guard lock(mu_);
  return reason_;
}

void AbortSignal::throw_error() const {
  std::string why = reason();
  switch (kind()) {
    case Kind::hosts_updated: throw HostsUpdated(why.empty() ? "hosts updated" : why);
    case Kind::shutdown: throw Error(why.empty() ? "shut down" : why);
    default: throw WorkersFailed(why.empty() ? "workers failed" : why);
  }
}

void AbortSignal::reset() {
  std::lock_guard lock(mu_);
  std::uint64_t v;
  while (::read(fd_, &v, sizeof v) > 0) {
  }
  reason_.clear();
  kind_.store(Kind::none, std::memory_order_release);
}

}  // namespace elasticrun::collective
