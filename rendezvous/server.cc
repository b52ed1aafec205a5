#include "rendezvous/server.h"

#include "common/log.h"
#include "rendezvous/metrics.h"
#include "rendezvous/session.h"

#include <fmt/format.h>

#include <algorithm>

namespace elasticrun::rendezvous {

namespace asio = boost::asio;

Server::Server(asio::io_context& io, const auth::Secret& secret, const asio::ip::tcp::endpoint& bind,
               Callbacks cb, ServerLimits limits)
    : io_(io), secret_(secret), acceptor_(io),
      accept_(acceptor_, log::Component::rendezvous, [this](asio::ip::tcp::socket sock) { on_socket(std::move(sock)); }),
      cb_(std::move(cb)), limits_(limits), liveness_timer_(io) {
  acceptor_.open(bind.protocol());
  acceptor_.set_option(asio::ip::tcp::acceptor::reuse_address(true));
  acceptor_.bind(bind);
  acceptor_.listen(asio::socket_base::max_listen_connections);
  accept_.start();
  if (limits_.worker_timeout.count() > 0) {
    liveness_.emplace(limits_.worker_timeout);
    watch_liveness();
  }
}

Server::~Server() {
  *alive_ = false;
  stop();
}

std::uint16_t Server::port() const { return acceptor_.local_endpoint().port(); }

void Server::on_socket(asio::ip::tcp::socket sock) {
  if (sessions_.size() >= limits_.max_connections) {
    ER_LOG(rendezvous, warn, "refusing a connection: {} already open", sessions_.size());
    return;
  }
  auto s = std::make_shared<Session>(static_cast<SessionHost&>(*this), std::move(sock), secret_, limits_.keep_alive,
                                     limits_.max_send_queue);
  sessions_.insert(s);
  if (handshaking_ < limits_.max_handshakes) {
    ++handshaking_;
    return s->start(limits_.handshake_timeout);
  }
  // Accepted (the listen queue keeps draining: a connection left there past its SYN-ACK
  // retries stalls for a minute), but its handshake waits its turn.
  if (admission_.empty())
    ER_LOG(rendezvous, warn, "{} connections are in their handshake (the limit): the next ones wait their turn",
           handshaking_);
  admission_.push_back(s);
}

void Server::on_handshake_over(Session&) {
  --handshaking_;
  while (handshaking_ < limits_.max_handshakes && !admission_.empty()) {
    auto next = admission_.front().lock();
    admission_.pop_front();
    if (!next || !sessions_.count(next)) continue;
    ++handshaking_;
    next->start(limits_.handshake_timeout);
  }
}

bool Server::may_wait(const std::shared_ptr<Session>& s, std::uint64_t req, const char* what) {
  if (s->waiting() < limits_.max_waiting) return true;
  const WorkerPlace& p = *s->place();
  ER_LOG(rendezvous, warn, "rejected a {} of rank {} on '{}': {} of its requests are waiting already (the limit)", what,
         p.rank, p.host, s->waiting());
  s->send(msg::Error{req, fmt::format("too many requests waiting ({}, the limit)", s->waiting())});
  return false;
}

void Server::stop() {
  boost::system::error_code ec;
  accept_.stop();
  acceptor_.close(ec);
  cb_ = {};  // connections we close ourselves are not workers lost
  liveness_timer_.cancel();
  auto all = sessions_;
  for (const auto& s : all) s->close("");
  sessions_.clear();
  admission_.clear();
  epochs_.clear();
  rejoins_.clear();
  members_.clear();
}

void Server::start_epoch(Assignment a, msg::NotifyKind kind, const std::string& reason) {
  assignment_ = std::move(a);
  std::uint64_t e = assignment_.epoch;
  if (kind != msg::NotifyKind::hosts_updated)
    while (!epochs_.empty() && epochs_.begin()->first < e) end_epoch(epochs_.begin()->first);
  epochs_[e].size = assignment_.size();
  fan_out(msg::Notify{kind, e, reason}, e);
  auto pending = std::move(rejoins_);
  rejoins_.clear();
  for (auto& p : pending) {
    auto s = p.session.lock();
    if (!s) continue;
    if (p.min_epoch <= e) answer_rejoin(s, p.req);
    else rejoins_.push_back(p);
  }
  collect_epochs();
  ER_LOG(rendezvous, info, "epoch {} started with {} workers", e, assignment_.size());
}

// A notice to every joined worker in an epoch before `before` (checked when it goes).
void Server::fan_out(const msg::Notify& n, std::uint64_t before) {
  std::vector<Outgoing> out;
  out.reserve(sessions_.size());
  Frame f = msg::to_frame(n);
  for (const auto& s : sessions_)
    if (s->place() && s->epoch() < before) out.push_back({s, f, before});
  send_paced(std::move(out));
}

// Frames to many workers at once (notices, a barrier's release) leave kFanOut at a time,
// kFanOutPause apart: thousands of small packets sent in one burst, and the burst of
// replies they cause, overflow the receiving queues (a NIC's ring, or on one machine the
// loopback device's backlog), and TCP's retransmissions of what was dropped cost seconds
// (on this machine a 16,384-worker recovery lost connections to TCP_USER_TIMEOUT).
void Server::send_paced(std::vector<Outgoing> out) {
  auto todo = std::make_shared<std::vector<Outgoing>>(std::move(out));
  auto timer = std::make_shared<asio::steady_timer>(io_);
  auto slice = std::make_shared<std::function<void(std::size_t)>>();
  *slice = [this, todo, timer, alive = alive_, weak = std::weak_ptr(slice)](std::size_t from) {
    if (!*alive) return;
    std::size_t to = std::min(todo->size(), from + kFanOut);
    for (std::size_t i = from; i < to; ++i) {
      auto& o = (*todo)[i];
      if (auto s = o.session.lock(); s && (o.before == kAnyEpoch || (s->place() && s->epoch() < o.before)))
        s->send_frame(o.frame);
    }
    if (to == todo->size()) return;
    auto next = weak.lock();
    timer->expires_after(kFanOutPause);
    timer->async_wait([next, to](boost::system::error_code ec) {
      if (!ec) (*next)(to);
    });
  };
  (*slice)(0);
}

void Server::end_epoch(std::uint64_t epoch) {
  auto it = epochs_.find(epoch);
  if (it == epochs_.end()) return;
  EpochState& st = it->second;
  for (auto& [key, w] : st.kv_waiters) {
    w.timer->cancel();
    if (auto s = w.session.lock()) s->send(msg::Error{w.req, "epoch ended"});
  }
  for (auto& [name, b] : st.barriers)
    for (auto& w : b.waiters) {
      w.timer->cancel();
      if (auto s = w.session.lock()) s->send(msg::Error{w.req, "epoch ended"});
    }
  keys_ -= st.kv.size();
  epochs_.erase(it);
}

// Drops the state of epochs that no connected worker is in any more.
void Server::collect_epochs() {
  while (!epochs_.empty() && epochs_.begin()->first < assignment_.epoch) {
    auto members = members_.find(epochs_.begin()->first);
    if (members != members_.end() && members->second > 0) break;
    end_epoch(epochs_.begin()->first);
  }
}

// Moves a session into `epoch`, keeping the per-epoch member counts that
// collect_epochs() reads (so that it never scans every session).
void Server::place(const std::shared_ptr<Session>& s, const WorkerPlace& p, std::uint64_t epoch) {
  if (s->place() && --members_[s->epoch()] == 0) members_.erase(s->epoch());
  s->joined(p, epoch);
  ++members_[epoch];
}

void Server::notify_all(msg::NotifyKind kind, const std::string& reason) {
  fan_out(msg::Notify{kind, assignment_.epoch, reason}, kAnyEpoch);
}

void Server::request_checkpoint(const std::string& reason) {
  checkpoint_reason_ = reason.empty() ? "checkpoint requested" : reason;
  notify_all(msg::NotifyKind::checkpoint, checkpoint_reason_);
}

void Server::abort_epoch(const std::string& reason) {
  std::uint64_t next = assignment_.epoch + 1;
  fan_out(msg::Notify{msg::NotifyKind::abort, next, reason}, next);
  while (!epochs_.empty() && epochs_.begin()->first < next) end_epoch(epochs_.begin()->first);
}

void Server::on_join(const std::shared_ptr<Session>& s, const msg::Join& j) {
  const WorkerPlace* p = assignment_.find(j.host, static_cast<int>(j.slot));
  std::string where = "host '" + j.host.substr(0, 64) + "' slot " + std::to_string(j.slot);
  if (!p) {
    s->send(msg::Error{0, "no slot " + std::to_string(j.slot) + " on host '" + j.host + "' in epoch " +
                              std::to_string(assignment_.epoch)});
    s->close("rejected join: " + where + " is not in epoch " + std::to_string(assignment_.epoch));
    return;
  }
  // A worker of a place that was removed and listed again: its successor holds the place.
  if (p->started_epoch != 0 && p->started_epoch != j.epoch) {
    std::string why = fmt::format("{} belongs to the worker started in epoch {}, not to one started in epoch {}",
                                  where, p->started_epoch, j.epoch);
    s->send(msg::Error{0, why});
    s->close("rejected join: " + why);
    return;
  }
  WorkerPlace mine = *p;
  mine.started_epoch = j.epoch;
  place(s, mine, assignment_.epoch);
  if (liveness_) liveness_->watch(s.get(), LivenessClock::now());
  s->send(join_ok(0, *p));
  if (!checkpoint_reason_.empty()) s->send(msg::Notify{msg::NotifyKind::checkpoint, assignment_.epoch, checkpoint_reason_});
  ER_LOG(rendezvous, debug, "rank {} joined epoch {} from '{}' slot {}", p->rank, assignment_.epoch, p->host,
         p->slot);
  if (cb_.on_worker_joined) cb_.on_worker_joined(mine, assignment_.epoch);
}

void Server::on_rejoin(const std::shared_ptr<Session>& s, const msg::Rejoin& r) {
  if (r.min_epoch <= assignment_.epoch) return answer_rejoin(s, r.req);
  if (!may_wait(s, r.req, "re-join")) return;
  rejoins_.push_back(PendingRejoin{s, r.req, r.min_epoch, s->hold_wait()});
  if (cb_.on_epoch_abandoned && s->place()) cb_.on_epoch_abandoned(*s->place(), assignment_.epoch);
}

void Server::answer_rejoin(const std::shared_ptr<Session>& s, std::uint64_t req) {
  const WorkerPlace* p = assignment_.find(s->place()->host, s->place()->slot);
  std::uint64_t started = s->place()->started_epoch;
  // Removed, or removed and listed again: then the place has a new worker, not this one.
  if (!p || (p->started_epoch != 0 && p->started_epoch != started)) {
    s->send(msg::Error{req, "removed: host '" + s->place()->host + "' slot " + std::to_string(s->place()->slot) +
                                " is not this worker's in epoch " + std::to_string(assignment_.epoch)});
    return;
  }
  WorkerPlace mine = *p;
  mine.started_epoch = started;
  place(s, mine, assignment_.epoch);
  s->send(join_ok(req, *p));
  ER_LOG(rendezvous, debug, "rank {} re-joined in epoch {} ('{}' slot {})", p->rank, assignment_.epoch, p->host,
         p->slot);
  if (cb_.on_worker_joined) cb_.on_worker_joined(mine, assignment_.epoch);
  collect_epochs();
}

msg::JoinOk Server::join_ok(std::uint64_t req, const WorkerPlace& p) {
  auto beat = liveness_ ? heartbeat_interval(liveness_->timeout()) : std::chrono::milliseconds(0);
  std::uint32_t seq = ++epochs_[assignment_.epoch].joins[{p.host, p.slot}];
  return msg::JoinOk{req,          assignment_.epoch, p.rank,       assignment_.size(),
                     p.local_rank, p.local_size,      p.cross_rank, p.cross_size,
                     static_cast<std::uint32_t>(beat.count()), seq};
}

Server::EpochState* Server::epoch_of(const std::shared_ptr<Session>& s, std::uint64_t req) {
  auto it = epochs_.find(s->epoch());
  if (it != epochs_.end()) return &it->second;
  s->send(msg::Error{req, "epoch " + std::to_string(s->epoch()) + " ended"});
  return nullptr;
}

void Server::on_kv_set(const std::shared_ptr<Session>& s, msg::KvSet m) {
  EpochState* st = epoch_of(s, m.req);
  if (!st) return;
  bool fresh = !st->kv.count(m.key);
  if (m.value.size() > limits_.max_value || (fresh && keys_ >= limits_.max_keys)) {
    s->send(msg::Error{m.req, "key-value limit reached"});
    return;
  }
  auto [lo, hi] = st->kv_waiters.equal_range(m.key);
  for (auto it = lo; it != hi; ++it) {
    it->second.timer->cancel();
    if (auto w = it->second.session.lock()) w->send(msg::KvValue{it->second.req, m.value});
  }
  st->kv_waiters.erase(lo, hi);
  keys_ += fresh;
  st->kv[m.key] = std::move(m.value);
  s->send(msg::Ok{m.req});
}

void Server::on_kv_get(const std::shared_ptr<Session>& s, const msg::KvGet& m) {
  EpochState* st = epoch_of(s, m.req);
  if (!st) return;
  if (auto it = st->kv.find(m.key); it != st->kv.end()) {
    s->send(msg::KvValue{m.req, it->second});
    return;
  }
  if (!may_wait(s, m.req, "key-value get")) return;
  auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(m.timeout_ms));
  st->kv_waiters.emplace(m.key, Waiter{s, m.req, timer, s->hold_wait()});
  timer->async_wait([this, epoch = s->epoch(), key = m.key, req = m.req, weak = std::weak_ptr<Session>(s),
                     raw = timer.get()](boost::system::error_code ec) {
    if (ec) return;
    if (auto e = epochs_.find(epoch); e != epochs_.end()) {
      auto [lo, hi] = e->second.kv_waiters.equal_range(key);
      for (auto i = lo; i != hi; ++i)
        if (i->second.timer.get() == raw) {
          e->second.kv_waiters.erase(i);
          break;
        }
    }
    if (auto w = weak.lock()) w->send(msg::Error{req, "timed out waiting for key '" + key + "'"});
  });
}

// A barrier completes when every rank of the epoch waits at it. A rank that waited past
// its timeout is answered an error and leaves the barrier: it no longer counts as
// arrived, so a later arrival cannot complete the barrier with it.
void Server::on_barrier(const std::shared_ptr<Session>& s, const msg::Barrier& m) {
  EpochState* st = epoch_of(s, m.req);
  if (!st || !may_wait(s, m.req, "barrier")) return;
  BarrierState& b = st->barriers[m.name];
  auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(m.timeout_ms));
  b.waiters.push_back(Waiter{s, m.req, timer, s->hold_wait(), s->place()->rank});
  ++b.arrived[s->place()->rank];
  if (static_cast<int>(b.arrived.size()) < st->size) {
    timer->async_wait([this, epoch = s->epoch(), name = m.name,
                       weak = std::weak_ptr<asio::steady_timer>(timer)](boost::system::error_code ec) {
      if (auto t = weak.lock(); t && !ec) barrier_timed_out(epoch, name, t.get());
    });
    return;
  }
  auto done = std::move(b.waiters);
  st->barriers.erase(m.name);
  std::vector<Outgoing> out;
  out.reserve(done.size());
  for (auto& w : done) {
    w.timer->cancel();
    out.push_back({w.session, msg::to_frame(msg::Ok{w.req}), kAnyEpoch});
  }
  send_paced(std::move(out));
}

void Server::barrier_timed_out(std::uint64_t epoch, const std::string& name, asio::steady_timer* timer) {
  auto e = epochs_.find(epoch);
  if (e == epochs_.end()) return;
  auto b = e->second.barriers.find(name);
  if (b == e->second.barriers.end()) return;
  auto& ws = b->second.waiters;
  auto it = std::find_if(ws.begin(), ws.end(), [&](const Waiter& w) { return w.timer.get() == timer; });
  if (it == ws.end()) return;
  Waiter w = std::move(*it);
  ws.erase(it);
  if (--b->second.arrived[w.rank] == 0) b->second.arrived.erase(w.rank);
  if (ws.empty()) e->second.barriers.erase(b);
  if (auto s = w.session.lock()) s->send(msg::Error{w.req, "timed out at barrier '" + name + "'"});
}

// Only rank 0 of the current epoch reports: one voice per job, and a report of an
// epoch that is over (a worker behind a reset) would describe a state that is gone.
// A refusal is an Error for that request; the connection stays (it is a worker of ours).
void Server::on_report(const std::shared_ptr<Session>& s, msg::Report m) {
  const WorkerPlace& p = *s->place();
  auto refuse = [&](const std::string& why) {
    ER_LOG(rendezvous, warn, "rejected a report of step {} from rank {} on '{}' (epoch {}): {}", m.step, p.rank,
           p.host, s->epoch(), why);
    s->send(msg::Error{m.req, "report refused: " + why});
  };
  if (s->epoch() != assignment_.epoch || !epochs_.count(s->epoch()))
    return refuse(fmt::format("epoch {} is not the current one ({})", s->epoch(), assignment_.epoch));
  if (p.rank != 0) return refuse(fmt::format("only rank 0 reports, this is rank {}", p.rank));
  auto metrics = parse_metrics(m.metrics, limits_.max_report);
  if (!metrics) return refuse(metrics.error());
  ER_LOG(rendezvous, debug, "report of step {} from rank 0 in epoch {}", m.step, s->epoch());
  auto answered = std::make_shared<bool>(false);
  ReportAnswer answer = [weak = std::weak_ptr<Session>(s), req = m.req, answered](msg::Decision d) {
    if (std::exchange(*answered, true)) return;
    if (auto session = weak.lock()) session->send(msg::ReportReply{req, d});
  };
  if (!cb_.on_report) return answer(msg::Decision::keep_going);
  cb_.on_report(p, s->epoch(), m.step, *metrics, std::move(answer));
}

void Server::on_checkpoint_note(const std::shared_ptr<Session>& s, const msg::CheckpointNote& m) {
  const WorkerPlace& p = *s->place();
  ER_LOG(rendezvous, debug, "checkpoint note {} of commit {} from rank {} on '{}'", static_cast<int>(m.event),
         m.commit, p.rank, p.host);
  if (!cb_.on_checkpoint) return;
  msg::CheckpointNote n = m;
  if (n.path.size() > kMaxNoteText) n.path.resize(kMaxNoteText);
  if (n.detail.size() > kMaxNoteText) n.detail.resize(kMaxNoteText);
  cb_.on_checkpoint(p, s->epoch(), n);
}

void Server::on_synced(const std::shared_ptr<Session>& s, const msg::Synced& m) {
  const WorkerPlace& p = *s->place();
  ER_LOG(rendezvous, debug, "rank {} on '{}' synced its state in epoch {} (commit {})", p.rank, p.host, s->epoch(),
         m.commits);
  if (cb_.on_synced) cb_.on_synced(p, s->epoch(), m.commits);
}

void Server::on_heard(Session& s) {
  if (liveness_) liveness_->heard(&s, LivenessClock::now());
}

// A worker that left may take its time to exit (its program goes on without us): it is
// no longer watched.
void Server::on_leave(Session& s) {
  if (liveness_) liveness_->forget(&s);
}

void Server::watch_liveness() {
  liveness_timer_.expires_after(liveness_->tick());
  liveness_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec || !acceptor_.is_open()) return;
    // Held first: a callback may stop the server, which lets go of every session.
    std::vector<std::pair<std::shared_ptr<Session>, std::chrono::milliseconds>> silent;
    for (const auto& [raw, how_long] : liveness_->check(LivenessClock::now()))
      silent.emplace_back(raw->shared_from_this(), how_long);
    for (const auto& [s, how_long] : silent) {
      if (!sessions_.count(s)) continue;
      WorkerPlace p = *s->place();
      std::uint64_t epoch = s->epoch();
      s->close(fmt::format("sent nothing for {:.1f} s, not even a heartbeat (worker timeout {:.1f} s)",
                           how_long.count() / 1000.0, liveness_->timeout().count() / 1000.0),
               /*report_lost=*/false);
      if (cb_.on_worker_silent) cb_.on_worker_silent(p, epoch, how_long);
    }
    if (acceptor_.is_open()) watch_liveness();
  });
}

void Server::on_closed(const std::shared_ptr<Session>& s, bool clean) {
  if (liveness_) liveness_->forget(s.get());
  sessions_.erase(s);
  if (s->place() && --members_[s->epoch()] == 0) members_.erase(s->epoch());
  if (!clean && s->place() && cb_.on_worker_lost) cb_.on_worker_lost(*s->place(), s->epoch());
  collect_epochs();
}

}  // namespace elasticrun::rendezvous
