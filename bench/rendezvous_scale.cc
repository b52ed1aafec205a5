// rendezvous_scale: a rendezvous round and a recovery for N workers, against the real
// server, with the simulated workers spread over several processes.
//
//   rendezvous_scale [--sizes 1024,4096,16384] [--rounds 3] [--per-process 16384]
//                    [--slots-per-host 8] [--max-handshakes K]
//
// This process runs a real rendezvous::Server on its own io_context thread (as in the
// driver), with the server limits the driver uses. The "workers" are non-blocking
// sockets driven by one epoll loop in each of ceil(N / per-process) child processes
// (this program again, --clients): one process cannot hold both ends of 16,384
// connections under this machine's open-file limit (20,000). Each simulated host
// connects from a loopback address of its own, as hosts do. Each worker does what
// RendezvousClient does at init: connect, greet (a heartbeat: the client speaks first;
// connect again if reset before the hello), answer the HMAC challenge (and check the
// server's proof), join, one key-value set (its 200-byte address), one barrier.
//
// round:    from "go" (every child connects all its workers at once) to the last
//           barrier released. join_ms: by when all had joined.
// recovery: one worker's connection is closed (its own host, "v", as a killed worker's
//           host is failed); the server reports it lost and this process, standing in
//           for the driver's controller, starts the next epoch without that host at
//           once (NotifyKind::abort). Every other worker gets the notice, re-joins,
//           sets its address again and meets at the barrier of the new epoch. From
//           the close to the last barrier released.
// A fresh server and fresh children per repetition; medians reported, with the cost
// per worker.
#include "common/auth.h"
#include "common/frame.h"
#include "common/messages.h"
#include "rendezvous/server.h"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

extern char** environ;

namespace er = elasticrun;
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

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

// ---------------------------------------------------------------- the children: workers

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

// ---------------------------------------------------------------- the parent: the server

struct Child {
  pid_t pid = -1;
  int in = -1, out = -1;  // its stdin (we write), its stdout (we read)
};

Child spawn_child(const std::string& self, int port, const std::string& secret_hex, int first, int count, int slots) {
  int to[2], from[2];
  if (::pipe2(to, O_CLOEXEC) != 0 || ::pipe2(from, O_CLOEXEC) != 0) die("pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from[1], 1);
  std::vector<std::string> args{self, "--clients", std::to_string(port), secret_hex, std::to_string(first),
                                std::to_string(count), std::to_string(slots)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  Child c;
  if (int rc = posix_spawn(&c.pid, self.c_str(), &fa, nullptr, argv.data(), environ); rc != 0)
    die(std::string("spawn: ") + std::strerror(rc));
  posix_spawn_file_actions_destroy(&fa);
  ::close(to[0]);
  ::close(from[1]);
  c.in = to[1];
  c.out = from[0];
  return c;
}

void tell(const Child& c, const char* what) {
  if (::write(c.in, what, std::strlen(what)) < 0) die("a child is gone");
}

// Waits until every child said `word` (optionally followed by a count, summed into
// `*total`); returns when the last one did.
Clock::time_point wait_all(std::vector<Child>& kids, const std::string& word, int seconds, long* total = nullptr) {
  std::vector<bool> said(kids.size(), false);
  std::vector<std::string> buf(kids.size());
  std::size_t left = kids.size();
  auto deadline = Clock::now() + std::chrono::seconds(seconds);
  while (left > 0) {
    std::vector<pollfd> p;
    for (auto& k : kids) p.push_back({k.out, POLLIN, 0});
    int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (ms <= 0 || ::poll(p.data(), p.size(), ms) <= 0) die("timed out waiting for '" + word + "'");
    for (std::size_t i = 0; i < kids.size(); ++i) {
      if (!(p[i].revents & (POLLIN | POLLHUP))) continue;
      char b[256];
      ssize_t r = ::read(kids[i].out, b, sizeof b);
      if (r <= 0) die("a child ended before '" + word + "'");
      buf[i].append(b, static_cast<std::size_t>(r));
      std::size_t nl;
      while ((nl = buf[i].find('\n')) != std::string::npos) {
        std::string line = buf[i].substr(0, nl);
        buf[i].erase(0, nl + 1);
        if ((line == word || line.starts_with(word + " ")) && !said[i]) {
          said[i] = true;
          --left;
          if (total && line.size() > word.size()) *total += std::stol(line.substr(word.size() + 1));
        }
      }
    }
  }
  return Clock::now();
}

struct Times {
  double round, joined, recovery;
  long reconnects = 0;  // connections reset before the server's hello, made again
  long drops = 0;  // packets the kernel dropped meanwhile (softnet backlog full)
};

// Packets dropped by this machine's per-CPU input backlog so far (/proc/net/softnet_stat,
// second column): the loopback device queues every packet there, and a burst larger than
// net.core.netdev_max_backlog (1000 by default) loses the rest to TCP retransmissions.
long softnet_drops() {
  std::FILE* f = std::fopen("/proc/net/softnet_stat", "r");
  if (!f) return 0;
  long total = 0;
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    unsigned long processed = 0, dropped = 0;
    if (std::sscanf(line, "%lx %lx", &processed, &dropped) == 2) total += static_cast<long>(dropped);
  }
  std::fclose(f);
  return total;
}

Times repetition(const std::string& self, int n, int per_process, int slots, std::size_t max_handshakes,
                 const er::auth::Secret& secret) {
  asio::io_context io;
  er::rendezvous::ServerLimits limits;
  if (max_handshakes > 0) limits.max_handshakes = max_handshakes;
  std::unique_ptr<er::rendezvous::Server> server;
  int joined = 0;
  Clock::time_point t_joined{};
  er::rendezvous::Server::Callbacks cb;
  cb.on_worker_joined = [&](const er::rendezvous::WorkerPlace&, std::uint64_t epoch) {
    if (epoch == 1 && ++joined == n) t_joined = Clock::now();
  };
  // The driver's part: the lost worker's host is failed and the next epoch starts without it.
  cb.on_worker_lost = [&](const er::rendezvous::WorkerPlace& p, std::uint64_t) {
    if (p.host != "v") die(fmt::format("lost the worker of host {} slot {} (a child failed?)", p.host, p.slot));
    server->start_epoch(er::rendezvous::assign(hosts_of(n, slots, false), n - 1, 2), er::msg::NotifyKind::abort,
                        "host 'v' failed");
  };
  server = std::make_unique<er::rendezvous::Server>(io, secret, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0),
                                                    cb, limits);
  server->start_epoch(er::rendezvous::assign(hosts_of(n, slots, true), n, 1), er::msg::NotifyKind::abort, "");
  auto guard = asio::make_work_guard(io);
  std::thread io_thread([&] { io.run(); });

  std::string hex = er::auth::to_hex(secret);
  std::vector<Child> kids;
  for (int first = 0; first < n; first += per_process)
    kids.push_back(spawn_child(self, server->port(), hex, first, std::min(per_process, n - first), slots));
  long drops0 = softnet_drops();
  auto t0 = Clock::now();
  for (auto& k : kids) tell(k, "go\n");
  long reconnects = 0;
  auto t_round = wait_all(kids, "round", 120, &reconnects);
  if (std::getenv("RS_DEBUG"))
    std::fprintf(stderr, "round %.3f s, joined %.3f s\n",
                 std::chrono::duration<double>(t_round - t0).count(), std::chrono::duration<double>(t_joined - t0).count());
  auto t_kill = Clock::now();
  tell(kids[0], "kill\n");
  auto t_recovered = wait_all(kids, "recovered", 120);
  long drops = softnet_drops() - drops0;
  std::promise<void> stopped;
  asio::post(io, [&] {
    server->stop();
    stopped.set_value();
  });
  stopped.get_future().wait();
  guard.reset();
  io.stop();
  io_thread.join();
  for (auto& k : kids) {
    tell(k, "exit\n");
    ::close(k.in);
    ::close(k.out);
    int st = 0;
    ::waitpid(k.pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("a child failed");
  }
  using sec = std::chrono::duration<double>;
  return {sec(t_round - t0).count(), sec(t_joined - t0).count(), sec(t_recovered - t_kill).count(), reconnects, drops};
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  for (std::size_t p = 0; p < s.size();) {
    auto q = s.find(',', p);
    out.push_back(std::stoi(s.substr(p, q - p)));
    p = q == std::string::npos ? s.size() : q + 1;
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 7 && std::string(argv[1]) == "--clients")
    return run_clients(std::stoi(argv[2]), argv[3], std::stoi(argv[4]), std::stoi(argv[5]), std::stoi(argv[6]));
  std::vector<int> sizes{1024, 4096, 16384};
  int rounds = 3, per_process = 16384, slots = 8;
  std::size_t max_handshakes = 0;
  const char* usage =
      "usage: rendezvous_scale [--sizes 1024,4096,16384] [--rounds 3] [--per-process 16384] [--slots-per-host 8]\n"
      "                        [--max-handshakes K]\n";
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (i + 1 >= argc) throw std::invalid_argument(a);
      std::string v = argv[++i];
      if (a == "--rounds") rounds = std::stoi(v);
      else if (a == "--sizes") sizes = parse_list(v);
      else if (a == "--per-process") per_process = std::stoi(v);
      else if (a == "--slots-per-host") slots = std::stoi(v);
      else if (a == "--max-handshakes") max_handshakes = static_cast<std::size_t>(std::stoul(v));
      else throw std::invalid_argument(a);
    }
  } catch (const std::exception&) {
    std::fputs(usage, stderr);
    return 64;
  }
  if (rounds < 1 || per_process < 1 || slots < 1 || slots > er::discovery::kMaxSlotsPerHost || sizes.empty() ||
      *std::min_element(sizes.begin(), sizes.end()) < 2) {
    std::fputs(usage, stderr);
    return 64;
  }
  // The server's end of every connection, and the children's pipes.
  raise_fd_limit(*std::max_element(sizes.begin(), sizes.end()) + 256);
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  auto secret = er::auth::random_secret();
  std::printf("# %d repetitions each; workers in processes of %d, %d slots per host; the server's handshake cap %zu\n",
              rounds, per_process, slots, max_handshakes ? max_handshakes : er::rendezvous::ServerLimits{}.max_handshakes);
  std::printf("%8s %6s %10s %10s %10s %13s %8s %12s %13s %11s %8s\n", "N", "procs", "round_ms", "min_ms", "max_ms",
              "per_worker_us", "join_ms", "recovery_ms", "rec_per_w_us", "reconnects", "drops");
  for (int n : sizes) {
    std::vector<double> t, j, rec, again, lost;
    for (int r = 0; r < rounds; ++r) {
      auto x = repetition(self, n, per_process, slots, max_handshakes, secret);
      t.push_back(x.round);
      j.push_back(x.joined);
      rec.push_back(x.recovery);
      again.push_back(static_cast<double>(x.reconnects));
      lost.push_back(static_cast<double>(x.drops));
    }
    double m = median(t), mr = median(rec);
    std::printf("%8d %6d %10.1f %10.1f %10.1f %13.1f %8.1f %12.1f %13.1f %11.0f %8.0f\n", n,
                (n + per_process - 1) / per_process, m * 1e3, *std::min_element(t.begin(), t.end()) * 1e3,
                *std::max_element(t.begin(), t.end()) * 1e3, m * 1e6 / n, median(j) * 1e3, mr * 1e3, mr * 1e6 / n,
                median(again), median(lost));
    std::fflush(stdout);
  }
  return 0;
}
