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
#include "rendezvous/server.h"
#include "rendezvous_workers.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace er = elasticrun;
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

using namespace rendezvous_bench;

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
