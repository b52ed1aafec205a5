// elastic_probe: an elastic worker that only does small allreduces and says, for every
// epoch it trains in, when its first allreduce of that epoch completed. scripts/bench-elastic
// runs it under elasticrun, kills workers / adds hosts, and joins these times with its own.
//
//   elasticrun ... elastic_probe --dir DIR [--interval-us 1000]
//
// One line per epoch is appended to DIR/<pid>.log (O_APPEND, one write(2) per line, so a
// SIGKILL never leaves half a line):
//   epoch E rank R size S host H pid P start M0 err M1 rejoined M2 first M3 real R3 why W
// M* are CLOCK_MONOTONIC seconds (system-wide on Linux: the harness's time.monotonic()
// is the same clock); R3 is CLOCK_REALTIME of M3, for comparing with the discovery
// script's bash $EPOCHREALTIME. start = process start (first epoch) or, later, 0;
// err = when the previous epoch's allreduce threw; rejoined = when Context::rejoin()
// returned (the new communicator is built). 0 means "not applicable".
//
// The loop's allreduce carries {1, hosts_updated, stop}: its sum checks the size, makes
// all ranks act on a hosts-updated notice at the same iteration (as testprog does), and
// stops everyone once DIR/stop exists. --interval-us sleeps between allreduces so that
// four probes do not keep a 2-core machine at 100 % (it bounds the added latency).
#include <elasticrun/elasticrun.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <string>
#include <thread>

namespace {

double clock_s(clockid_t id) {
  timespec ts{};
  ::clock_gettime(id, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct EpochRecord {
  double start = 0, err = 0, rejoined = 0;
  std::string why;
};

void write_line(int fd, const EpochRecord& r, double first, double real) {
  const auto& t = elasticrun::context().topology();
  std::string why = r.why.substr(0, 80);
  for (char& c : why)
    if (c == ' ' || c == '\n') c = '_';
  char line[512];
  int n = std::snprintf(line, sizeof line,
                        "epoch %llu rank %d size %d host %s pid %d start %.6f err %.6f rejoined %.6f first %.6f "
                        "real %.6f why %s\n",
                        static_cast<unsigned long long>(t.epoch), t.rank, t.size, t.host.c_str(), ::getpid(), r.start,
                        r.err, r.rejoined, first, real, why.empty() ? "-" : why.c_str());
  if (n > 0) (void)!::write(fd, line, static_cast<std::size_t>(std::min<int>(n, sizeof line - 1)));
}

}  // namespace

int main(int argc, char** argv) {
  EpochRecord rec;
  rec.start = clock_s(CLOCK_MONOTONIC);
  std::string dir = ".";
  long interval_us = 1000;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--interval-us" && i + 1 < argc) interval_us = std::stol(argv[++i]);
    else {
      std::fprintf(stderr, "usage: elastic_probe --dir DIR [--interval-us N]\n");
      return 64;
    }
  }
  std::string log = dir + "/" + std::to_string(::getpid()) + ".log";
  int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror(log.c_str());
    return 1;
  }
  std::string stop_path = dir + "/stop";
  elasticrun::init();
  bool first_pending = true, stop = false;
  auto next_stop_check = std::chrono::steady_clock::now();
  while (!stop) {
    try {
      // Checking for the stop file costs a stat(); every 20 ms is plenty.
      std::int32_t want_stop = 0;
      if (auto now = std::chrono::steady_clock::now(); now >= next_stop_check) {
        struct stat st{};
        want_stop = ::stat(stop_path.c_str(), &st) == 0;
        next_stop_check = now + std::chrono::milliseconds(20);
      }
      std::int32_t v[3] = {1, elasticrun::context().hosts_updated() ? 1 : 0, want_stop};
      elasticrun::allreduce(std::span(v, 3), elasticrun::ReduceOp::sum);
      if (first_pending) {
        // Both clocks are read back to back: the realtime one only serves to line up
        // with the discovery script's bash timestamps.
        double mono = clock_s(CLOCK_MONOTONIC), real = clock_s(CLOCK_REALTIME);
        write_line(fd, rec, mono, real);
        first_pending = false;
        rec = EpochRecord{};
      }
      if (v[0] != elasticrun::size()) {
        std::fprintf(stderr, "elastic_probe: allreduce sum %d != size %d\n", v[0], elasticrun::size());
        return 1;
      }
      if (v[1] > 0) throw elasticrun::HostsUpdated("hosts updated");
      stop = v[2] > 0;
      if (interval_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(interval_us));
    } catch (const elasticrun::Error& e) {
      bool failed = dynamic_cast<const elasticrun::WorkersFailed*>(&e) != nullptr;
      if (!failed && !dynamic_cast<const elasticrun::HostsUpdated*>(&e)) throw;
      rec.err = clock_s(CLOCK_MONOTONIC);
      rec.why = failed ? std::string("failed:") + e.what() : "hosts_updated";
      try {
        elasticrun::context().rejoin();
      } catch (const elasticrun::Error& x) {
        // Not in the new epoch (its host was removed): a normal end for this worker.
        std::fprintf(stderr, "elastic_probe: leaving: %s\n", x.what());
        ::close(fd);
        elasticrun::shutdown();
        return 0;
      }
      rec.rejoined = clock_s(CLOCK_MONOTONIC);
      first_pending = true;
    }
  }
  ::close(fd);
  elasticrun::shutdown();
  return 0;
}
