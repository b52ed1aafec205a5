// rendezvous_scale: how long one rendezvous round takes for N workers, in one process.
//
//   rendezvous_scale [--sizes 256,1024,4096] [--rounds 5]
//
// A real rendezvous::Server runs on its own io_context thread (as in the driver). The
// "workers" are N non-blocking sockets driven by one epoll loop on the main thread, so the
// figure is the server's cost plus a cheap client, not N processes fighting for 2 cores.
// Each client does exactly what RendezvousClient does at init: connect, answer the
// HMAC challenge (and check the server's proof), join (host "h", slot i), one kv set
// (its address), one barrier. A round ends when the last client's barrier is released.
// Every round uses a fresh server, so rounds are independent; the median is reported.
#include "common/auth.h"
#include "common/frame.h"
#include "common/messages.h"
#include "rendezvous/server.h"

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
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace er = elasticrun;
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

enum class Phase { hello, auth_ok, join_ok, set_ok, barrier_ok, done };

struct Client {
  int fd = -1;
  int slot = 0;
  Phase phase = Phase::hello;
  er::FrameParser parser;
  er::auth::Nonce server_nonce{}, client_nonce{};
  er::wire::Bytes out;  // bytes not yet written (a send can be partial under load)
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "rendezvous_scale: %s\n", what.c_str());
  std::exit(1);
}

void flush(Client& c) {
  while (!c.out.empty()) {
    ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EAGAIN) return;  // EPOLLOUT would be needed; never seen with small frames
    if (n < 0) die(std::string("send: ") + std::strerror(errno));
    c.out.erase(c.out.begin(), c.out.begin() + n);
  }
}

template <class M>
void send(Client& c, const M& m) {
  auto bytes = er::encode_frame(er::msg::to_frame(m));
  c.out.insert(c.out.end(), bytes.begin(), bytes.end());
  flush(c);
}

// Advances one client by one received frame; returns true when its barrier completed.
bool on_frame(Client& c, const er::auth::Secret& secret, const er::Frame& f) {
  if (f.type == er::msg::kError) die("server error: " + er::msg::parse<er::msg::Error>(f).message);
  switch (c.phase) {
    case Phase::hello: {
      auto h = er::msg::parse<er::msg::Hello>(f);
      if (h.nonce.size() != c.server_nonce.size()) die("bad nonce");
      std::copy(h.nonce.begin(), h.nonce.end(), c.server_nonce.begin());
      c.client_nonce = er::auth::random_nonce();
      auto proof = er::auth::client_proof(secret, "worker", c.server_nonce, c.client_nonce);
      send(c, er::msg::Auth{"worker", er::wire::Bytes(c.client_nonce.begin(), c.client_nonce.end()),
                            er::wire::Bytes(proof.begin(), proof.end())});
      c.phase = Phase::auth_ok;
      return false;
    }
    case Phase::auth_ok: {
      auto ok = er::msg::parse<er::msg::AuthOk>(f);
      // Check the server's proof too: a real worker pays for it.
      if (!er::auth::digest_equal(er::auth::server_proof(secret, "worker", c.server_nonce, c.client_nonce), ok.proof))
        die("server proof mismatch");
      send(c, er::msg::Join{"h", static_cast<std::uint32_t>(c.slot), static_cast<std::uint32_t>(::getpid()), 1});
      c.phase = Phase::join_ok;
      return false;
    }
    case Phase::join_ok: {
      auto j = er::msg::parse<er::msg::JoinOk>(f);
      if (j.rank != c.slot) die("unexpected rank");
      // A worker publishes its transport address (UCX worker addresses are ~100-300 B).
      send(c, er::msg::KvSet{1, "addr/" + std::to_string(j.rank), er::wire::Bytes(200, 0x5a)});
      c.phase = Phase::set_ok;
      return false;
    }
    case Phase::set_ok:
      er::msg::parse<er::msg::Ok>(f);
      send(c, er::msg::Barrier{2, "init", 60000});
      c.phase = Phase::barrier_ok;
      return false;
    case Phase::barrier_ok:
      if (er::msg::parse<er::msg::Ok>(f).req != 2) die("unexpected reply");
      c.phase = Phase::done;
      return true;
    case Phase::done: return false;
  }
  return false;
}

// One round with a fresh server; returns seconds from the first connect() to the last
// barrier release, and the time by which all N had joined (to split the round).
std::pair<double, double> round_once(int n, const er::auth::Secret& secret) {
  asio::io_context io;
  er::rendezvous::Server server(io, secret, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  server.start_epoch(er::rendezvous::assign({{"h", n}}, 0, 1), er::msg::NotifyKind::abort, "");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server.port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto guard = asio::make_work_guard(io);
  std::thread io_thread([&] { io.run(); });

  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  std::vector<Client> clients(n);
  int done = 0, joined = 0;
  double t_joined = 0;
  auto t0 = Clock::now();
  // All N connect at once, like a job's workers after a launch: the listen backlog
  // (SOMAXCONN) and the server's accept rate are part of what is measured.
  for (int i = 0; i < n; ++i) {
    Client& c = clients[i];
    c.slot = i;
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) die(std::string("socket: ") + std::strerror(errno));
    int one = 1;
    ::setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(c.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 && errno != EINPROGRESS)
      die(std::string("connect: ") + std::strerror(errno));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<std::uint32_t>(i);
    ::epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &ev);
  }
  std::vector<epoll_event> evs(1024);
  std::uint8_t buf[16384];
  auto deadline = t0 + std::chrono::seconds(60);
  while (done < n) {
    if (Clock::now() > deadline) die("round timed out: " + std::to_string(done) + " of " + std::to_string(n) + " done");
    int k = ::epoll_wait(ep, evs.data(), static_cast<int>(evs.size()), 1000);
    for (int e = 0; e < k; ++e) {
      Client& c = clients[evs[e].data.u32];
      ssize_t r = ::recv(c.fd, buf, sizeof buf, 0);
      if (r < 0 && errno == EAGAIN) continue;
      if (r <= 0) die("connection " + std::to_string(c.slot) + " closed: " + (r < 0 ? std::strerror(errno) : "eof"));
      if (auto ok = c.parser.feed({buf, static_cast<std::size_t>(r)}); !ok) die(ok.error());
      while (c.parser.has_frame()) {
        Phase before = c.phase;
        if (on_frame(c, secret, c.parser.pop())) ++done;
        if (before == Phase::join_ok && ++joined == n)
          t_joined = std::chrono::duration<double>(Clock::now() - t0).count();
      }
    }
  }
  double total = std::chrono::duration<double>(Clock::now() - t0).count();
  std::promise<void> stopped;
  asio::post(io, [&] {
    server.stop();
    stopped.set_value();
  });
  stopped.get_future().wait();
  guard.reset();
  io.stop();
  io_thread.join();
  for (auto& c : clients) ::close(c.fd);
  ::close(ep);
  return {total, t_joined};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes{256, 1024, 4096};
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::stoi(argv[++i]);
    } else if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::string s = argv[++i];
      for (std::size_t p = 0; p < s.size();) {
        auto q = s.find(',', p);
        sizes.push_back(std::stoi(s.substr(p, q - p)));
        p = q == std::string::npos ? s.size() : q + 1;
      }
    } else {
      std::fprintf(stderr, "usage: rendezvous_scale [--sizes 256,1024,4096] [--rounds 5]\n");
      return 64;
    }
  }
  // Two descriptors per worker (client end and server end) in this one process.
  int most = *std::max_element(sizes.begin(), sizes.end());
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  rlim_t want = static_cast<rlim_t>(2 * most + 256);
  if (rl.rlim_cur < want) {
    rl.rlim_cur = std::min(want, rl.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < want) die("RLIMIT_NOFILE hard limit too low for " + std::to_string(most) + " workers");
  }
  auto secret = er::auth::random_secret();
  std::printf("%8s %12s %12s %12s %14s %8s\n", "N", "round_ms", "min_ms", "max_ms", "per_worker_us", "join_ms");
  for (int n : sizes) {
    if (n > er::discovery::kMaxSlotsPerHost) die("N above kMaxSlotsPerHost");
    std::vector<double> t, j;
    for (int r = 0; r < rounds; ++r) {
      auto [total, joined] = round_once(n, secret);
      t.push_back(total);
      j.push_back(joined);
    }
    auto med = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    double m = med(t);
    std::printf("%8d %12.1f %12.1f %12.1f %14.1f %8.1f\n", n, m * 1e3, *std::min_element(t.begin(), t.end()) * 1e3,
                *std::max_element(t.begin(), t.end()) * 1e3, m * 1e6 / n, med(j) * 1e3);
    std::fflush(stdout);
  }
  return 0;
}
