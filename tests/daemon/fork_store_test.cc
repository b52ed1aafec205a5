// torch's store hosted by the fork-server launcher (Launcher::host_store), with a real fork
// server of Debian's /usr/bin/python3: the store is answered only once it listens on its
// port, a new one and drop_store() end the one before, and a launcher without a ready
// server says why it cannot. Also the launcher's refusal of a worker pid that no forked
// worker can have. The server here preloads json only, so the store imports
// torch.distributed itself (a second or more): an answer given before it listens is seen.
#include "daemon/launcher.h"
#include "daemon/port_reservation.h"

#include <boost/asio/io_context.hpp>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <deque>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

extern char** environ;

namespace ed = elasticrun::daemon;
using namespace std::chrono_literals;

namespace {

constexpr const char* kPython = "/usr/bin/python3";

bool has_torch() {
  return std::system("/usr/bin/python3 -c 'import torch.distributed' > /dev/null 2>&1") == 0;
}

std::vector<std::string> environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  return env;
}

bool alive(int pid) { return ::kill(pid, 0) == 0 && std::filesystem::exists("/proc/" + std::to_string(pid)); }

// Runs the io_context until `done` or `limit`.
bool run_until(boost::asio::io_context& io, const std::function<bool()>& done, std::chrono::seconds limit) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (!done() && std::chrono::steady_clock::now() < until) {
    io.restart();
    io.run_for(10ms);
  }
  return done();
}

struct Fixture {
  boost::asio::io_context io;
  int exits = 0;
  std::unique_ptr<ed::Launcher> launcher;

  Fixture() {
    ed::WorkerEvents ev;
    ev.on_output = [](std::uint32_t, int, std::span<const std::uint8_t>) {};
    ev.on_exit = [this](std::uint32_t, int, int, int) { ++exits; };
    launcher = ed::make_launcher(io, ev, {"json"});
  }
  ~Fixture() {
    launcher->signal_all(SIGKILL);
    run_until(io, [this] { return launcher->running() == 0; }, 10s);
  }

  // A worker forked by the server: once it has started, the server is ready.
  void start_server() {
    ed::WorkerSpec w{0, {kPython, "-c", "import time; time.sleep(60)"}, environment(),
                     std::filesystem::current_path().string()};
    std::optional<bool> started;
    launcher->spawn(w, [&](elasticrun::Result<int> pid) { started = static_cast<bool>(pid); });
    ASSERT_TRUE(run_until(io, [&] { return started.has_value(); }, 60s));
    ASSERT_TRUE(*started);
  }

  // A new port held for the test (the reservations live as long as the fixture).
  std::uint16_t new_port() {
    auto port = ports.emplace_back().renew();
    EXPECT_TRUE(port) << port.error();
    return port ? *port : 0;
  }
  std::deque<ed::PortReservation> ports;

  // host_store's answer for `port`.
  std::optional<elasticrun::Result<int>> host(std::uint16_t port) {
    std::optional<elasticrun::Result<int>> got;
    launcher->host_store(port, [&](elasticrun::Result<int> pid) { got = std::move(pid); });
    run_until(io, [&] { return got.has_value(); }, 30s);
    return got;
  }
};

TEST(ForkStore, AnsweredOnceItListensAndEndedByTheNextOrADrop) {
  if (!has_torch()) GTEST_SKIP() << kPython << " has no torch.distributed";
  Fixture f;
  f.start_server();
  std::uint16_t port = f.new_port();
  auto got = f.host(port);
  ASSERT_TRUE(got.has_value()) << "no answer within 30 s";
  ASSERT_TRUE(*got) << got->error();
  EXPECT_TRUE(ed::port_listening(port)) << "answered before the store listened";
  int pid = **got;
  EXPECT_TRUE(alive(pid));

  // A new store ends the one before.
  std::uint16_t port2 = f.new_port();
  got = f.host(port2);
  ASSERT_TRUE(got.has_value() && *got);
  EXPECT_TRUE(ed::port_listening(port2));
  EXPECT_TRUE(run_until(f.io, [&] { return !alive(pid) && !ed::port_listening(port); }, 10s))
      << "the first store still runs";

  // drop_store() ends the current one; the worker is not touched.
  int pid2 = **got;
  f.launcher->drop_store();
  EXPECT_TRUE(run_until(f.io, [&] { return !alive(pid2); }, 10s));
  EXPECT_EQ(f.exits, 0);
  EXPECT_EQ(f.launcher->running(), 1u);
}

// Dropped before the server said its pid (a second reservation in the same read): it
// is killed once the server does, and never listens.
TEST(ForkStore, ADropBeforeTheForkIsAnsweredKillsItOnceForked) {
  if (!has_torch()) GTEST_SKIP() << kPython << " has no torch.distributed";
  Fixture f;
  f.start_server();
  std::uint16_t port = f.new_port();
  std::optional<elasticrun::Result<int>> got;
  f.launcher->host_store(port, [&](elasticrun::Result<int> pid) { got = std::move(pid); });
  f.launcher->drop_store();
  ASSERT_TRUE(got.has_value() && !*got);  // told at once
  // The store would import torch.distributed and listen within a few seconds.
  run_until(f.io, [] { return false; }, 6s);
  EXPECT_FALSE(ed::port_listening(port)) << "the dropped store runs";
}

// A store that dies after it was answered: the workers were told it is up, so this
// host's workers are stopped (a failure the driver handles) rather than left waiting.
TEST(ForkStore, AStoreThatDiesStopsThisHostsWorkers) {
  if (!has_torch()) GTEST_SKIP() << kPython << " has no torch.distributed";
  Fixture f;
  f.start_server();
  auto got = f.host(f.new_port());
  ASSERT_TRUE(got.has_value() && *got);
  ::kill(**got, SIGKILL);
  EXPECT_TRUE(run_until(f.io, [&] { return f.exits == 1; }, 10s)) << "the worker still runs";
}

TEST(ForkStore, NotWithoutAReadyServerNorWithTheProcessLauncher) {
  Fixture f;
  auto got = f.host(1);  // no worker yet: no server
  ASSERT_TRUE(got.has_value());
  ASSERT_FALSE(*got);
  EXPECT_NE(got->error().find("not ready"), std::string::npos) << got->error();

  boost::asio::io_context io;
  auto plain = ed::make_launcher(io, {}, {});
  std::optional<elasticrun::Result<int>> answer;
  plain->host_store(1, [&](elasticrun::Result<int> pid) { answer = std::move(pid); });
  ASSERT_TRUE(answer.has_value());
  ASSERT_FALSE(*answer);
  EXPECT_NE(answer->error().find("--preload"), std::string::npos) << answer->error();
}

}  // namespace

// A fork server that says it forked a worker whose pid is its own or the daemon's: the
// daemon signals a worker as a process group (kill(-pid)), so that would reach the
// server's group or the daemon's own. The frame is refused as the server failing, and
// the worker is exec'd instead. The fake interpreter runs the real fork_server.py with
// the pid it sends replaced, and execs /usr/bin/python3 for anything else. (Pid 1, refused
// by the same check, is not tried: were the check broken, the test would kill(-1, ...)
// every process it may signal.)
class ForkServerPid : public ::testing::TestWithParam<const char*> {};

TEST_P(ForkServerPid, APidNoForkedWorkerCanHaveIsRefused) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("fork-pid-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::path fake = dir / "python3", marker = dir / "sent";
  {
    std::ofstream py(fake);
    py << "#!/usr/bin/python3\n"
          "import os, sys\n"
          "if len(sys.argv) < 4 or sys.argv[1] != '-c' or sys.argv[3] != '3':\n"
          "    os.execv('/usr/bin/python3', ['/usr/bin/python3'] + sys.argv[1:])\n"
          "src, real = sys.argv[2], 'struct.pack(\"<QI\", req.id, pid)'\n"
          "with open("
       << "'" << marker.string() << "'"
       << ", 'w') as f:\n"
          "    f.write('sent' if real in src else 'fork_server.py no longer sends ' + real)\n"
          "sys.argv = ['-c'] + sys.argv[3:]\n"
          "exec(compile(src.replace(real, 'struct.pack(\"<QI\", req.id, "
       << GetParam()
       << ")'), '<fork_server>', 'exec'), {'__name__': '__main__'})\n";
  }
  fs::permissions(fake, fs::perms::owner_all);
  Fixture f;
  ed::WorkerSpec w{0, {fake.string(), "-c", "import time; time.sleep(60)"}, environment(), dir.string()};
  std::optional<elasticrun::Result<int>> started;
  f.launcher->spawn(w, [&](elasticrun::Result<int> pid) { started = std::move(pid); });
  ASSERT_TRUE(run_until(f.io, [&] { return started.has_value(); }, 60s));
  ASSERT_TRUE(*started) << started->error();
  int pid = **started;
  std::string sent;
  std::getline(std::ifstream(marker), sent);
  EXPECT_EQ(sent, "sent");
  EXPECT_NE(pid, ::getpid());
  // The exec'd worker, not the server (whose command line holds fork_server.py).
  std::ifstream cmdline("/proc/" + std::to_string(pid) + "/cmdline");
  std::string text((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("time.sleep(60)"), std::string::npos) << text;
  EXPECT_EQ(text.find("struct"), std::string::npos) << "the server was taken for the worker";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(OwnOrDaemons, ForkServerPid, ::testing::Values("os.getpid()", "os.getppid()"));
