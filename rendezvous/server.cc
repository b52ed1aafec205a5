#include "rendezvous/server.h"

#include "common/log.h"
#include "rendezvous/session.h"

namespace elasticrun::rendezvous {

namespace asio = boost::asio;

Server::Server(asio::io_context& io, const auth::Secret& secret, const asio::ip::tcp::endpoint& bind,
               Callbacks cb, ServerLimits limits)
    : io_(io), secret_(secret), acceptor_(io), cb_(std::move(cb)), limits_(limits) {
  acceptor_.open(bind.protocol());
  acceptor_.set_option(asio::ip::tcp::acceptor::reuse_address(true));
  acceptor_.bind(bind);
  acceptor_.listen(asio::socket_base::max_listen_connections);
  accept();
}

Server::~Server() { stop(); }

std::uint16_t Server::port() const { return acceptor_.local_endpoint().port(); }

void Server::accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, asio::ip::tcp::socket sock) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      if (sessions_.size() >= limits_.max_connections) {
        ER_LOG(rendezvous, warn, "refusing a connection: {} already open", sessions_.size());
      } else {
        auto s = std::make_shared<Session>(*this, std::move(sock));
        sessions_.insert(s);
        s->start(limits_.handshake_timeout);
      }
    } else {
      ER_LOG(rendezvous, warn, "accept: {}", ec.message());
    }
    accept();
  });
}

void Server::stop() {
  boost::system::error_code ec;
  acceptor_.close(ec);
  auto all = sessions_;
  for (const auto& s : all) s->close("");
  sessions_.clear();
  kv_waiters_.clear();
  barriers_.clear();
}

void Server::start_epoch(Assignment a, msg::NotifyKind kind, const std::string& reason) {
  assignment_ = std::move(a);
  kv_.clear();
  for (auto& [key, w] : kv_waiters_)
    if (auto s = w.session.lock()) s->send(msg::Error{w.req, "epoch ended"});
  kv_waiters_.clear();
  for (auto& [name, b] : barriers_)
    for (auto& w : b.waiters)
      if (auto s = w.session.lock()) s->send(msg::Error{w.req, "epoch ended"});
  barriers_.clear();
  for (const auto& s : sessions_)
    if (s->place() && s->epoch() < assignment_.epoch)
      s->send(msg::Notify{kind, assignment_.epoch, reason});
  ER_LOG(rendezvous, info, "epoch {} started with {} workers", assignment_.epoch, assignment_.size());
}

void Server::notify_all(msg::NotifyKind kind, const std::string& reason) {
  for (const auto& s : sessions_)
    if (s->place()) s->send(msg::Notify{kind, assignment_.epoch, reason});
}

void Server::on_join(const std::shared_ptr<Session>& s, const msg::Join& j) {
  const WorkerPlace* p = assignment_.find(j.host, static_cast<int>(j.slot));
  if (!p) {
    s->send(msg::Error{0, "no slot " + std::to_string(j.slot) + " on host '" + j.host +
                              "' in epoch " + std::to_string(assignment_.epoch)});
    s->close("rejected join: host '" + j.host.substr(0, 64) + "' slot " + std::to_string(j.slot) +
             " is not in epoch " + std::to_string(assignment_.epoch));
    return;
  }
  s->joined(*p, assignment_.epoch);
  s->send(msg::JoinOk{assignment_.epoch, p->rank, assignment_.size(), p->local_rank, p->local_size,
                      p->cross_rank, p->cross_size});
  ER_LOG(rendezvous, debug, "rank {} joined epoch {} from '{}' slot {}", p->rank, assignment_.epoch,
         p->host, p->slot);
  if (cb_.on_worker_joined) cb_.on_worker_joined(*p, assignment_.epoch);
}

void Server::on_kv_set(const std::shared_ptr<Session>& s, msg::KvSet m) {
  if (m.value.size() > limits_.max_value || (kv_.size() >= limits_.max_keys && !kv_.count(m.key))) {
    s->send(msg::Error{m.req, "key-value limit reached"});
    return;
  }
  auto [lo, hi] = kv_waiters_.equal_range(m.key);
  for (auto it = lo; it != hi; ++it) {
    it->second.timer->cancel();
    if (auto w = it->second.session.lock()) w->send(msg::KvValue{it->second.req, m.value});
  }
  kv_waiters_.erase(lo, hi);
  kv_[m.key] = std::move(m.value);
  s->send(msg::Ok{m.req});
}

void Server::on_kv_get(const std::shared_ptr<Session>& s, const msg::KvGet& m) {
  if (auto it = kv_.find(m.key); it != kv_.end()) {
    s->send(msg::KvValue{m.req, it->second});
    return;
  }
  auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(m.timeout_ms));
  auto it = kv_waiters_.emplace(m.key, Waiter{s, m.req, timer});
  timer->async_wait([this, key = m.key, req = m.req, weak = std::weak_ptr<Session>(s),
                     raw = timer.get()](boost::system::error_code ec) {
    if (ec) return;
    auto [lo, hi] = kv_waiters_.equal_range(key);
    for (auto i = lo; i != hi; ++i)
      if (i->second.timer.get() == raw) {
        kv_waiters_.erase(i);
        break;
      }
    if (auto w = weak.lock()) w->send(msg::Error{req, "timed out waiting for key '" + key + "'"});
  });
  (void)it;
}

void Server::on_barrier(const std::shared_ptr<Session>& s, const msg::Barrier& m) {
  if (s->epoch() != assignment_.epoch) {
    s->send(msg::Error{m.req, "barrier from an ended epoch"});
    return;
  }
  BarrierState& b = barriers_[m.name];
  b.arrived.insert(s->place()->rank);
  b.waiters.push_back(Waiter{s, m.req, nullptr});
  if (static_cast<int>(b.arrived.size()) < assignment_.size()) return;
  for (auto& w : b.waiters)
    if (auto ws = w.session.lock()) ws->send(msg::Ok{w.req});
  barriers_.erase(m.name);
}

void Server::on_closed(const std::shared_ptr<Session>& s, bool clean) {
  sessions_.erase(s);
  if (!clean && s->place() && cb_.on_worker_lost) cb_.on_worker_lost(*s->place(), s->epoch());
}

}  // namespace elasticrun::rendezvous
