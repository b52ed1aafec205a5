// rendezvous_scale's simulated workers (bench/rendezvous_scale.cc): the child process
// that drives thousands of worker connections on one epoll loop, doing at init what
// RendezvousClient does, and the helpers both processes share.
#include "rendezvous_workers.h"

#include "common/auth.h"
#include "common/frame.h"
#include "common/messages.h"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace rendezvous_bench {

namespace er = elasticrun;
using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "rendezvous_scale: %s\n", what.c_str());
  std::exit(1);
}

void raise_fd_limit(long want) {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  if (static_cast<long>(rl.rlim_cur) >= want) return;
  rl.rlim_cur = std::min<rlim_t>(static_cast<rlim_t>(want), rl.rlim_max);
  ::setrlimit(RLIMIT_NOFILE, &rl);
  if (static_cast<long>(rl.rlim_cur) < want)
    die("the open-file limit (" + std::to_string(rl.rlim_max) + ") is below the " + std::to_string(want) +
        " descriptors needed; use a smaller --per-process or size");
}

std::string host_name(int h) {
  std::string name = std::to_string(h);
  name.insert(name.begin(), 'h');
  return name;
}

// Worker g's place: g = 0 is alone on host "v" (the one the recovery loses); the others
// fill hosts "h0", "h1", ... of `slots` slots each.
std::pair<std::string, int> place_of(int g, int slots) {
  if (g == 0) return {"v", 0};
  return {host_name((g - 1) / slots), (g - 1) % slots};
}

std::vector<er::rendezvous::HostSlots> hosts_of(int n, int slots, bool with_v) {
  std::vector<er::rendezvous::HostSlots> hosts;
  if (with_v) hosts.push_back({"v", 1});
  for (int left = n - 1, h = 0; left > 0; left -= slots, ++h) hosts.push_back({host_name(h), std::min(left, slots)});
  return hosts;
}

namespace {

enum class Phase { hello, auth_ok, join_ok, set_ok, barrier_ok, idle, rejoin_ok, done };

struct Client {
  int fd = -1;
  std::string host;
  int slot = 0;
  Phase phase = Phase::hello;
  er::FrameParser parser;
  er::auth::Nonce server_nonce{}, client_nonce{};
  er::wire::Bytes out;  // bytes not yet written (a send can be partial under load)
  bool want_out = false;
  bool rejoined = false;  // in the recovery's epoch
  int backoff_ms = 0;     // of its last reconnection
};

struct Clients {
  int ep = -1;
  std::vector<Client> c;
  er::auth::Secret secret{};
  int barriers_done = 0, recovered = 0;
  int reconnects = 0;
};

void watch(Clients& cs, std::uint32_t i, bool out) {
  epoll_event ev{};
  ev.events = EPOLLIN | (out ? EPOLLOUT : 0u);
  ev.data.u32 = i;
  ::epoll_ctl(cs.ep, EPOLL_CTL_MOD, cs.c[i].fd, &ev);
}

void flush(Clients& cs, std::uint32_t i) {
  Client& c = cs.c[i];
  std::size_t sent = 0;
  while (sent < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EAGAIN) break;
    if (n < 0) die(std::string("send: ") + std::strerror(errno));
    sent += static_cast<std::size_t>(n);
  }
  c.out.erase(c.out.begin(), c.out.begin() + static_cast<long>(sent));
  bool want = !c.out.empty();
  if (want != c.want_out) watch(cs, i, c.want_out = want);
}

template <class M>
void send(Clients& cs, std::uint32_t i, const M& m) {
  auto bytes = er::encode_frame(er::msg::to_frame(m));
  cs.c[i].out.insert(cs.c[i].out.end(), bytes.begin(), bytes.end());
  flush(cs, i);
}

// Advances one worker by one frame from the server.
void on_frame(Clients& cs, std::uint32_t i, const er::Frame& f) {
  Client& c = cs.c[i];
  if (f.type == er::msg::kError) die("server error: " + er::msg::parse<er::msg::Error>(f).message);
  switch (c.phase) {
    case Phase::hello: {
      auto h = er::msg::parse<er::msg::Hello>(f);
      if (h.nonce.size() != c.server_nonce.size()) die("bad nonce");
      std::copy(h.nonce.begin(), h.nonce.end(), c.server_nonce.begin());
      c.client_nonce = er::auth::random_nonce();
      auto proof = er::auth::client_proof(cs.secret, "worker", c.server_nonce, c.client_nonce);
      c.phase = Phase::auth_ok;
      return send(cs, i, er::msg::Auth{"worker", er::wire::Bytes(c.client_nonce.begin(), c.client_nonce.end()),
                                       er::wire::Bytes(proof.begin(), proof.end())});
    }
    case Phase::auth_ok: {
      auto ok = er::msg::parse<er::msg::AuthOk>(f);
      // Check the server's proof too: a real worker pays for it.
      if (!er::auth::digest_equal(er::auth::server_proof(cs.secret, "worker", c.server_nonce, c.client_nonce),
                                  ok.proof))
        die("server proof mismatch");
      c.phase = Phase::join_ok;
      return send(cs, i, er::msg::Join{c.host, static_cast<std::uint32_t>(c.slot), static_cast<std::uint32_t>(::getpid()), 1});
    }
    case Phase::join_ok:
    case Phase::rejoin_ok: {
      auto j = er::msg::parse<er::msg::JoinOk>(f);
      // A worker publishes its transport address (UCX worker addresses are ~100-300 B).
      c.phase = Phase::set_ok;
      return send(cs, i, er::msg::KvSet{10, "addr/" + std::to_string(j.rank), er::wire::Bytes(200, 0x5a)});
    }
    case Phase::set_ok:
      er::msg::parse<er::msg::Ok>(f);
      c.phase = Phase::barrier_ok;
      return send(cs, i, er::msg::Barrier{11, "init", 60000});
    case Phase::barrier_ok:
      if (er::msg::parse<er::msg::Ok>(f).req != 11) die("unexpected reply");
      c.phase = c.rejoined ? Phase::done : Phase::idle;
      ++(c.rejoined ? cs.recovered : cs.barriers_done);
      return;
    case Phase::idle: {
      // The notice of the next epoch: re-join it, as the library does at its next call.
      auto n = er::msg::parse<er::msg::Notify>(f);
      c.phase = Phase::rejoin_ok;
      c.rejoined = true;
      return send(cs, i, er::msg::Rejoin{12, n.epoch});
    }
    case Phase::done: return;
  }
}

// The loopback address host "hK" connects from: 127.1.0.1 onwards ("v": 127.2.0.1).
std::uint32_t source_address(const std::string& host) {
  if (host == "v") return (127u << 24) | (2u << 16) | 1u;
  std::uint32_t k = static_cast<std::uint32_t>(std::stoul(host.substr(1)));
  return (127u << 24) | (1u << 16) | (k / 254) << 8 | (k % 254 + 1);
}

// Connects worker i and queues its greeting (RendezvousClient speaks first: a
// heartbeat), written once the connection is up.
void connect_one(Clients& cs, std::uint32_t i, const sockaddr_in& addr) {
  Client& c = cs.c[i];
  c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c.fd < 0) die(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // Each simulated host connects from an address of its own, as hosts do: all 16,384
  // from 127.0.0.1 would make the kernel search its ephemeral ports across every
  // connection to the server on each connect (15% of a 16,384-worker round's CPU).
  sockaddr_in self{};
  self.sin_family = AF_INET;
  self.sin_addr.s_addr = htonl(source_address(c.host));
  ::setsockopt(c.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
  if (::bind(c.fd, reinterpret_cast<const sockaddr*>(&self), sizeof self) != 0)
    die(std::string("bind: ") + std::strerror(errno));
  if (::connect(c.fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 && errno != EINPROGRESS)
    die(std::string("connect: ") + std::strerror(errno));
  auto hb = er::encode_frame(er::msg::to_frame(er::msg::Heartbeat{}));
  c.out.assign(hb.begin(), hb.end());
  c.parser = er::FrameParser();
  c.want_out = true;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT;
  ev.data.u32 = i;
  ::epoll_ctl(cs.ep, EPOLL_CTL_ADD, c.fd, &ev);
}

void say(const char* what) {
  if (::write(1, what, std::strlen(what)) < 0) std::exit(1);
}

}  // namespace

// The child: workers first..first+count-1 of n; commands on stdin ("go", "kill", "exit"),
// progress on stdout ("round", "recovered").
int run_clients(int port, const std::string& secret_hex, int first, int count, int slots) {
  raise_fd_limit(count + 64);
  Clients cs;
  auto s = er::auth::secret_from_hex(secret_hex);
  if (!s) die("bad secret: " + s.error());
  cs.secret = *s;
  cs.ep = ::epoll_create1(EPOLL_CLOEXEC);
  cs.c.resize(count);
  constexpr std::uint32_t kStdin = 0xffffffff;
  epoll_event in{};
  in.events = EPOLLIN;
  in.data.u32 = kStdin;
  ::epoll_ctl(cs.ep, EPOLL_CTL_ADD, 0, &in);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<epoll_event> evs(1024);
  std::uint8_t buf[16384];
  bool said_round = false, said_recovered = false, killed = false;
  int survivors = count;
  std::vector<std::pair<Clock::time_point, std::uint32_t>> retries;  // reconnections due
  std::minstd_rand jitter(static_cast<std::uint32_t>(::getpid()));
  auto idle_since = Clock::now();
  while (true) {
    auto now = Clock::now();
    int wait_ms = 1000;
    for (std::size_t r = 0; r < retries.size();) {
      if (retries[r].first <= now) {
        connect_one(cs, retries[r].second, addr);
        retries[r] = retries.back();
        retries.pop_back();
        continue;
      }
      wait_ms = std::min<int>(wait_ms, static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           retries[r].first - now).count()) + 1);
      ++r;
    }
    int k = ::epoll_wait(cs.ep, evs.data(), static_cast<int>(evs.size()), wait_ms);
    if (k > 0 || !retries.empty()) idle_since = Clock::now();
    if (Clock::now() - idle_since > std::chrono::seconds(60)) die("child: nothing happened for 60 s");
    for (int e = 0; e < k; ++e) {
      std::uint32_t i = evs[e].data.u32;
      if (i == kStdin) {
        char cmd[64] = {};
        ssize_t r = ::read(0, cmd, sizeof cmd - 1);
        if (r <= 0 || std::strncmp(cmd, "exit", 4) == 0) return 0;
        if (std::strncmp(cmd, "go", 2) == 0) {
          // All at once, like a job's workers after a launch: the listen backlog and the
          // server's accept rate are part of what is measured.
          for (int j = 0; j < count; ++j) {
            std::tie(cs.c[j].host, cs.c[j].slot) = place_of(first + j, slots);
            connect_one(cs, static_cast<std::uint32_t>(j), addr);
          }
        } else if (std::strncmp(cmd, "kill", 4) == 0) {
          // Worker `first` (0: host "v") dies: its connection closes, as a killed process's does.
          ::epoll_ctl(cs.ep, EPOLL_CTL_DEL, cs.c[0].fd, nullptr);
          ::close(cs.c[0].fd);
          cs.c[0].fd = -1;
          cs.c[0].phase = Phase::done;
          killed = true;
          --survivors;
        }
        continue;
      }
      Client& c = cs.c[i];
      if (c.fd < 0) continue;
      if (evs[e].events & EPOLLOUT) flush(cs, i);
      if (!(evs[e].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) continue;
      ssize_t r = ::recv(c.fd, buf, sizeof buf, 0);
      if (r < 0 && errno == EAGAIN) continue;
      if (r <= 0 && c.phase == Phase::hello) {
        // Reset (or closed) before the server's hello: its listen queue overflowed. As
        // RendezvousClient does, connect again after a jittered back-off.
        ::epoll_ctl(cs.ep, EPOLL_CTL_DEL, c.fd, nullptr);
        ::close(c.fd);
        c.fd = -1;
        c.backoff_ms = c.backoff_ms == 0 ? 20 : std::min(c.backoff_ms * 2, 1000);
        auto pause = std::chrono::milliseconds(c.backoff_ms / 2 + static_cast<int>(jitter() % c.backoff_ms));
        retries.push_back({Clock::now() + pause, i});
        ++cs.reconnects;
        continue;
      }
      if (r <= 0 && said_recovered) {  // the server stopped after the measurement
        ::epoll_ctl(cs.ep, EPOLL_CTL_DEL, c.fd, nullptr);
        continue;
      }
      if (r <= 0) die("connection of worker " + std::to_string(first + static_cast<int>(i)) +
                      " closed: " + (r < 0 ? std::strerror(errno) : "eof"));
      if (auto ok = c.parser.feed({buf, static_cast<std::size_t>(r)}); !ok) die(ok.error());
      while (c.parser.has_frame()) on_frame(cs, i, c.parser.pop());
    }
    if (!said_round && cs.barriers_done == count) {
      said_round = true;
      say(fmt::format("round {}\n", cs.reconnects).c_str());
    }
    // The victim is worker 0: the child that holds it is done once it is gone and the
    // others re-joined; every other child once all its workers did.
    if ((killed || first != 0) && !said_recovered && cs.recovered == survivors) {
      said_recovered = true;
      say("recovered\n");
    }
  }
}

}  // namespace rendezvous_bench
