#include "control/rendezvous_client.h"

#include "common/handshake.h"
#include "common/socket_options.h"

#include <elasticrun/types.hpp>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

namespace elasticrun::collective {
namespace {

std::uint32_t ms_until(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<std::uint32_t>(std::clamp<long long>(ms, 0, 0x7fffffff));
}

// A connect that failed, with the last error (errno) of its tries.
class ConnectFailed : public Error {
 public:
  ConnectFailed(const std::string& what, int code) : Error(what), code(code) {}
  int code;
};

// Non-blocking connect bounded by the deadline; returns a connected blocking socket.
int connect_to(const std::string& addr, Clock::time_point deadline, std::chrono::milliseconds keep_alive) {
  auto colon = addr.rfind(':');
  if (colon == std::string::npos) throw Error("bad rendezvous address '" + addr + "' (want host:port)");
  std::string host = addr.substr(0, colon), port = addr.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0)
    throw Error("cannot resolve rendezvous address '" + addr + "': " + gai_strerror(rc));
  std::string last = "no address";
  int last_code = 0;
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      if (::poll(&p, 1, static_cast<int>(ms_until(deadline))) == 1 &&
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
        rc = 0;
      else
        errno = err ? err : ETIMEDOUT;
    }
    if (rc == 0) {
      ::freeaddrinfo(res);
      int flags = 0, one = 1;
      ::ioctl(fd, FIONBIO, &flags);
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      net::keep_alive(fd, keep_alive);  // a driver behind a cut link is noticed, not waited for
      return fd;
    }
    last_code = errno;
    last = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  throw ConnectFailed("cannot connect to the rendezvous server at " + addr + ": " + last, last_code);
}

template <class M>
M expect(Result<Frame> f, const char* what) {
  if (!f) throw ProtocolError(std::string("rendezvous ") + what + ": " + f.error());
  if (f->type == msg::kError) {
    wire::Decoder d(f->payload);
    throw Error(std::string("rendezvous server refused ") + what + ": " + msg::Error::decode(d).message);
  }
  try {
    return msg::parse<M>(*f);
  } catch (const wire::DecodeError& e) {
    throw ProtocolError(std::string("rendezvous ") + what + ": " + e.what());
  }
}

}  // namespace

RendezvousClient::RendezvousClient(const std::string& addr, const auth::Secret& secret, const std::string& host,
                                   int slot, std::uint64_t epoch, Clock::time_point deadline,
                                   std::chrono::milliseconds keep_alive)
    : abort_(std::make_shared<AbortSignal>()) {
  open(addr, deadline, keep_alive);
  try {
    handshake(secret, deadline);
    if (auto ok = channel_.write(msg::to_frame(msg::Join{host, static_cast<std::uint32_t>(slot),
                                                         static_cast<std::uint32_t>(::getpid()), epoch}),
                                 deadline);
        !ok)
      throw Error("rendezvous join: " + ok.error());
    joined_ = expect<msg::JoinOk>(channel_.read(deadline), "join");
    joined_epoch_ = joined_.epoch;
  } catch (...) {
    ::close(fd_);
    throw;
  }
  reader_ = std::thread([this] { reader(); });
  if (joined_.heartbeat_ms > 0)
    beater_ = std::thread([this, every = std::chrono::milliseconds(joined_.heartbeat_ms)] { beat(every); });
}

// Connects, and speaks first (a heartbeat), though the server's hello opens the
// handshake. When thousands of workers connect at once, the server's listen queue
// overflows and its kernel drops the last ACK of some TCP handshakes (with SYN cookies
// it keeps nothing of them either): a client that only waited for the hello could wait
// for nothing, its side established and the server's not. Data of ours is retransmitted
// until the server takes the connection, or is answered with a reset (bench/
// rendezvous_scale saw one at 16,384 workers): then nothing happened on the server's
// side, and we connect again after a jittered back-off (20 ms doubling to 1 s), until
// the deadline. Leaves the server's hello in hello_.
void RendezvousClient::open(const std::string& addr, Clock::time_point deadline, std::chrono::milliseconds keep_alive) {
  auto backoff = std::chrono::milliseconds(20);
  std::minstd_rand jitter(static_cast<std::uint32_t>(::getpid()) ^
                          static_cast<std::uint32_t>(Clock::now().time_since_epoch().count()));
  for (int tries = 1;; ++tries) {
    Result<Frame> f = Failure{std::string()};
    try {
      fd_ = connect_to(addr, deadline, keep_alive);
      channel_ = FdChannel(fd_, fd_);
      auto greeted = channel_.write(msg::to_frame(msg::Heartbeat{}), deadline);
      f = greeted ? channel_.read(deadline) : Result<Frame>(Failure{greeted.error()});
    } catch (const ConnectFailed& e) {
      // The reset can come before the connect's completion is seen: the same case.
      if (e.code != ECONNRESET) throw;
      f = Failure{std::string(e.what())};
    }
    if (f) {
      hello_ = std::move(*f);
      return;
    }
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    auto pause = std::chrono::duration_cast<std::chrono::milliseconds>(backoff * (0.5 + (jitter() % 1000) / 1000.0));
    if (f.error().starts_with("timed out") || Clock::now() + pause >= deadline)
      throw Error(fmt::format("rendezvous server at {}: no hello after {} connection{}: {}", addr, tries,
                              tries == 1 ? "" : "s", f.error()));
    std::this_thread::sleep_for(pause);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

void RendezvousClient::handshake(const auth::Secret& secret, Clock::time_point deadline) {
  auto hello = expect<msg::Hello>(Result<Frame>(std::move(hello_)), "handshake");
  handshake::Client hs(secret, "worker");
  msg::Auth answer;
  try {
    answer = hs.answer(hello);
  } catch (const wire::DecodeError&) {
    throw ProtocolError("rendezvous handshake: bad nonce");
  }
  auto ok = channel_.write(msg::to_frame(answer), deadline);
  if (!ok) throw Error("rendezvous handshake: " + ok.error());
  auto reply = channel_.read(deadline);
  if (!reply) throw ProtocolError("rendezvous server rejected authentication (" + reply.error() + ")");
  if (!hs.verify(expect<msg::AuthOk>(std::move(reply), "handshake")))
    throw ProtocolError("rendezvous server failed to prove the job secret");
}

RendezvousClient::~RendezvousClient() {
  {
    std::lock_guard lock(beat_mu_);
    beat_stop_ = true;
  }
  beat_cv_.notify_all();
  ::shutdown(fd_, SHUT_RDWR);  // also ends a write the heartbeat thread is blocked in
  if (beater_.joinable()) beater_.join();
  if (reader_.joinable()) reader_.join();
  ::close(fd_);
}

// On a fixed schedule, so that a late wake-up does not push every later beat back. A
// write that fails means the connection is gone, which the reader reports.
void RendezvousClient::beat(std::chrono::milliseconds every) {
  auto next = Clock::now() + every;
  std::unique_lock lock(beat_mu_);
  while (!beat_cv_.wait_until(lock, next, [this] { return beat_stop_; })) {
    lock.unlock();
    {
      std::lock_guard w(write_mu_);
      if (!channel_.write(msg::to_frame(msg::Heartbeat{}), Clock::now() + every)) return;
    }
    next = std::max(next + every, Clock::now());
    lock.lock();
  }
}

void RendezvousClient::reader() {
  const auto forever = Clock::now() + std::chrono::hours(24 * 365);
  while (true) {
    auto f = channel_.read(forever);
    if (!f) return fail_all("lost the connection to the rendezvous server: " + f.error());
    try {
      if (f->type == msg::kNotify) {
        on_notify(msg::parse<msg::Notify>(*f));
        continue;
      }
      wire::Decoder d(f->payload);
      std::uint64_t req = d.u64();  // every reply starts with its request id
      std::lock_guard lock(mu_);
      if (auto it = replies_.find(req); it != replies_.end()) it->second.frame = std::move(*f);
      cv_.notify_all();
    } catch (const wire::DecodeError& e) {
      return fail_all(std::string("malformed frame from the rendezvous server: ") + e.what());
    }
  }
}

// A notice about an epoch we already joined (or an older one) is stale and ignored.
// Hosts-updated only flags the news: the current epoch's collectives keep working until
// the worker re-joins at its next commit. Abort and shutdown interrupt every wait. A
// checkpoint request concerns no epoch: it is counted whatever its number.
void RendezvousClient::on_notify(const msg::Notify& n) {
  if (n.kind == msg::NotifyKind::checkpoint) {
    checkpoint_requests_.fetch_add(1);
    return;
  }
  std::uint64_t prev = announced_epoch_.load();
  while (n.epoch > prev && !announced_epoch_.compare_exchange_weak(prev, n.epoch)) {
  }
  if (n.kind != msg::NotifyKind::shutdown && n.epoch <= joined_epoch_.load()) return;
  if (n.kind == msg::NotifyKind::hosts_updated) {
    updated_epoch_.store(std::max(updated_epoch_.load(), n.epoch));
    return;
  }
  std::uint64_t seen = aborted_epoch_.load();
  while (n.epoch > seen && !aborted_epoch_.compare_exchange_weak(seen, n.epoch)) {
  }
  auto kind = n.kind == msg::NotifyKind::shutdown ? AbortSignal::Kind::shutdown : AbortSignal::Kind::workers_failed;
  abort_->raise(kind, n.reason.empty() ? "epoch " + std::to_string(n.epoch) + " started" : n.reason);
  std::lock_guard lock(mu_);
  cv_.notify_all();
}

msg::JoinOk RendezvousClient::rejoin(std::uint64_t min_epoch, Clock::time_point deadline) {
  std::uint64_t req;
  {
    std::lock_guard lock(mu_);
    req = next_req_++;
  }
  // Not abortable: the abort that brought us here is what we are answering.
  auto f = call(req, msg::to_frame(msg::Rejoin{req, min_epoch}), deadline, "rejoin", /*abortable=*/false);
  if (f.type == msg::kError) {
    wire::Decoder d(f.payload);
    d.u64();
    throw Error("rendezvous rejoin: " + d.str());
  }
  auto j = expect<msg::JoinOk>(std::move(f), "rejoin");
  // Reset before publishing the new epoch so that a notice for a newer epoch, arriving
  // from now on, is not lost.
  abort_->reset();
  joined_ = j;
  joined_epoch_ = j.epoch;
  if (aborted_epoch_.load() > j.epoch) abort_->raise(AbortSignal::Kind::workers_failed, "a newer epoch started");
  return j;
}

void RendezvousClient::fail_all(const std::string& why) {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    closed_why_ = why;
    cv_.notify_all();
  }
  abort_->raise(AbortSignal::Kind::workers_failed, why);
}

Frame RendezvousClient::call(std::uint64_t req, const Frame& f, Clock::time_point deadline, const char* what,
                             bool abortable) {
  std::unique_lock lock(mu_);
  if (closed_) throw WorkersFailed(closed_why_);
  replies_[req];
  lock.unlock();
  {
    std::lock_guard w(write_mu_);
    if (auto ok = channel_.write(f, deadline); !ok) {
      lock.lock();
      replies_.erase(req);
      throw WorkersFailed(std::string("rendezvous ") + what + ": " + ok.error());
    }
  }
  lock.lock();
  auto& r = replies_[req];
  bool done = cv_.wait_until(lock, deadline, [&] {
    return r.frame.has_value() || closed_ || (abortable && abort_->raised());
  });
  std::optional<Frame> reply = std::move(r.frame);
  replies_.erase(req);
  if (reply) return std::move(*reply);
  if (closed_) throw WorkersFailed(closed_why_);
  if (abortable && abort_->raised()) abort_->throw_error();
  (void)done;
  throw TimeoutError(std::string("rendezvous ") + what + " timed out");
}

void RendezvousClient::set(const std::string& key, const Bytes& value) {
  std::uint64_t req;
  {
    std::lock_guard lock(mu_);
    req = next_req_++;
  }
  auto deadline = Clock::now() + std::chrono::seconds(60);
  auto f = call(req, msg::to_frame(msg::KvSet{req, key, value}), deadline, "set");
  if (f.type == msg::kError) {
    wire::Decoder d(f.payload);
    auto e = msg::Error::decode(d);
    if (e.message.find("epoch") != std::string::npos) throw WorkersFailed("rendezvous set '" + key + "': " + e.message);
    throw Error("rendezvous set '" + key + "': " + e.message);
  }
  expect<msg::Ok>(std::move(f), "set");
}

Bytes RendezvousClient::get(const std::string& key, Clock::time_point deadline) {
  std::uint64_t req;
  {
    std::lock_guard lock(mu_);
    req = next_req_++;
  }
  // The server answers an error at its deadline; ours is a little later as a backstop.
  auto f = call(req, msg::to_frame(msg::KvGet{req, key, ms_until(deadline)}), deadline + std::chrono::seconds(2),
                "get");
  if (f.type == msg::kError) {
    wire::Decoder d(f.payload);
    auto e = msg::Error::decode(d);
    if (e.message.rfind("timed out", 0) == 0) throw TimeoutError("rendezvous get: " + e.message);
    throw WorkersFailed("rendezvous get '" + key + "': " + e.message);
  }
  return expect<msg::KvValue>(std::move(f), "get").value;
}

void RendezvousClient::barrier(const std::string& name, Clock::time_point deadline) {
  std::uint64_t req;
  {
    std::lock_guard lock(mu_);
    req = next_req_++;
  }
  // As for get: the server answers an error at its deadline (and forgets our arrival).
  auto f = call(req, msg::to_frame(msg::Barrier{req, name, ms_until(deadline)}), deadline + std::chrono::seconds(2),
                "barrier");
  if (f.type == msg::kError) {
    wire::Decoder d(f.payload);
    auto e = msg::Error::decode(d);
    if (e.message.rfind("timed out", 0) == 0) throw TimeoutError("rendezvous barrier: " + e.message);
    throw WorkersFailed("rendezvous barrier: " + e.message);
  }
  expect<msg::Ok>(std::move(f), "barrier");
}

msg::Decision RendezvousClient::report(std::int64_t step, const std::string& metrics, Clock::time_point deadline) {
  std::uint64_t req;
  {
    std::lock_guard lock(mu_);
    req = next_req_++;
  }
  auto f = call(req, msg::to_frame(msg::Report{req, step, metrics}), deadline, "report");
  if (f.type == msg::kError) {
    wire::Decoder d(f.payload);
    std::string why = "rendezvous report of step " + std::to_string(step) + ": " + msg::Error::decode(d).message;
    // The refusal and a notice that explains it can arrive together: the notice says
    // what the caller should do.
    if (abort_->raised()) abort_->throw_error();
    if (announced_epoch_.load() > joined_epoch_.load()) throw HostsUpdated(why);
    throw Error(why);
  }
  return expect<msg::ReportReply>(std::move(f), "report").decision;
}

bool RendezvousClient::note(const msg::CheckpointNote& n) {
  std::lock_guard w(write_mu_);
  return channel_.write(msg::to_frame(n), Clock::now() + std::chrono::seconds(2)).ok();
}

bool RendezvousClient::synced(std::uint64_t commits) {
  std::lock_guard w(write_mu_);
  return channel_.write(msg::to_frame(msg::Synced{commits}), Clock::now() + std::chrono::seconds(2)).ok();
}

void RendezvousClient::leave() {
  std::lock_guard w(write_mu_);
  (void)channel_.write(msg::to_frame(msg::Leave{}), Clock::now() + std::chrono::seconds(2));
}

}  // namespace elasticrun::collective
