// A worker for the integration tests: each flag is one behaviour to provoke.
//
//   testprog [--init] [--topology] [--fail-rank R (--fail-code C | --fail-signal S)]
//            [--allreduce-seconds T] [--slow-rank R --slow-seconds T] [--sleep T] [--print-env VAR]
//            [--tag X] [--reinit N]
//
// --reinit: N times init(), an allreduce checked against its sum, shutdown() (the
// library re-initialised in one process, as Horovod's test suite does between tests).
// --slow-rank: that rank of epoch 1 spends T seconds in its own code before its first
// allreduce (a long step), while its peers wait for it there.
#include <elasticrun/elasticrun.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

int main(int argc, char** argv) {
  bool init = false, topology = false, elastic = false;
  int fail_rank = -1, fail_code = 0, fail_signal = 0, slow_rank = -1, reinit = 0;
  double allreduce_seconds = 0, sleep_seconds = 0, slow_seconds = 0;
  std::vector<std::string> print_env;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--init") init = true;
    else if (a == "--topology") init = topology = true;
    else if (a == "--fail-rank") fail_rank = std::stoi(next());
    else if (a == "--fail-code") fail_code = std::stoi(next());
    else if (a == "--fail-signal") fail_signal = std::stoi(next());
    else if (a == "--allreduce-seconds") init = true, allreduce_seconds = std::stod(next());
    else if (a == "--sleep") sleep_seconds = std::stod(next());
    else if (a == "--slow-rank") slow_rank = std::stoi(next());
    else if (a == "--slow-seconds") slow_seconds = std::stod(next());
    else if (a == "--elastic") init = elastic = true;
    else if (a == "--print-env") print_env.push_back(next());
    else if (a == "--tag") next();
    else if (a == "--reinit") reinit = std::stoi(next());
    else {
      std::fprintf(stderr, "testprog: unknown argument %s\n", a.c_str());
      return 64;
    }
  }
  for (const auto& v : print_env) {
    const char* val = std::getenv(v.c_str());
    std::printf("%s=%s\n", v.c_str(), val ? val : "(unset)");
  }
  for (int cycle = 0; cycle < reinit; ++cycle) {
    elasticrun::init();
    const auto& t = elasticrun::context().topology();
    std::vector<std::int64_t> x(4096, t.rank + 1);  // past the small-message paths too
    elasticrun::allreduce(std::span(x), elasticrun::ReduceOp::sum);
    const std::int64_t want = static_cast<std::int64_t>(t.size) * (t.size + 1) / 2;
    for (std::int64_t got : x)
      if (got != want) {
        std::fprintf(stderr, "testprog: cycle %d: allreduce gave %lld, want %lld\n", cycle,
                     static_cast<long long>(got), static_cast<long long>(want));
        return 1;
      }
    elasticrun::context().comm().barrier();
    std::printf("reinit cycle %d rank %d ok\n", cycle, t.rank);
    std::fflush(stdout);
    elasticrun::shutdown();
  }
  if (reinit > 0) return 0;
  int rank = -1;
  if (init) {
    elasticrun::init();
    const auto& t = elasticrun::context().topology();
    rank = t.rank;
    if (topology)
      std::printf("rank %d size %d local_rank %d local_size %d cross_rank %d cross_size %d host %s\n", t.rank,
                  t.size, t.local_rank, t.local_size, t.cross_rank, t.cross_size, t.host.c_str());
    std::fflush(stdout);
  }
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(allreduce_seconds);
  std::vector<float> v(1024, 1.0f);
  int iter = 0;
  // Ranks agree on when to stop (max of everyone's "time is up"), so that none is left
  // waiting in an allreduce that the others never enter.
  std::int32_t stop = allreduce_seconds > 0 ? 0 : 1;
  while (!stop) {
    if (rank == fail_rank && iter == 20 && elasticrun::context().topology().epoch == 1) {
      if (fail_signal) ::raise(fail_signal);
      std::exit(fail_code);
    }
    if (rank == slow_rank && iter == 0 && elasticrun::context().topology().epoch == 1)
      std::this_thread::sleep_for(std::chrono::duration<double>(slow_seconds));
    try {
      elasticrun::allreduce(std::span(v), elasticrun::ReduceOp::avg);
      // Agree on stopping and on acting on a hosts-updated notice: each rank sees the
      // notice at its own time, and all must re-join at the same iteration.
      std::int32_t flags[2] = {std::chrono::steady_clock::now() >= until ? 1 : 0,
                               elastic && elasticrun::context().hosts_updated() ? 1 : 0};
      elasticrun::allreduce(std::span(flags, 2), elasticrun::ReduceOp::max);
      if (flags[1]) throw elasticrun::HostsUpdated("hosts updated");
      stop = flags[0];
    } catch (const elasticrun::Error& e) {
      // --elastic: survive membership changes by re-joining the next epoch.
      if (!elastic || (!dynamic_cast<const elasticrun::WorkersFailed*>(&e) &&
                       !dynamic_cast<const elasticrun::HostsUpdated*>(&e)))
        throw;
      try {
        elasticrun::context().rejoin();
      } catch (const std::exception& x) {
        std::fprintf(stderr, "DEBUG rejoin threw: %s\n", x.what());
        throw;
      }
      const auto& t = elasticrun::context().topology();
      rank = t.rank;
      std::printf("rejoined epoch %llu rank %d size %d (%s)\n", static_cast<unsigned long long>(t.epoch), t.rank,
                  t.size, e.what());
      std::fflush(stdout);
      stop = 0;
      continue;
    }
    ++iter;
  }
  // Fail only in the first epoch, so that an elastic job does not fail forever.
  if (rank == fail_rank && rank >= 0 && elasticrun::context().topology().epoch == 1) {
    if (fail_signal) ::raise(fail_signal);
    std::exit(fail_code);
  }
  if (sleep_seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(sleep_seconds));
  if (init) {
    std::printf("rank %d done after %d allreduces\n", rank, iter);
    elasticrun::shutdown();
  }
  return 0;
}
