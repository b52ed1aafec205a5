// Communicators are rebuilt every epoch: building and destroying them, also after
// an abort, must not leak file descriptors, threads or shared-memory segments.
#include "rank_fixture.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace elasticrun::collective::testing {
namespace {

// Entries of `dir` whose names start with `prefix` (all of them, . and .., when empty).
int count_entries(const std::string& dir, const std::string& prefix = "") {
  int n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::string_view(e->d_name).starts_with(prefix)) ++n;
    ::closedir(d);
  }
  return n;
}

// Shared-memory segments only this process can have made: a private directory that UCX
// (UCX_POSIX_DIR) and the library's shared-memory allreduce (which follows it) put their
// segments in, as under a daemon, plus any of the library's segments in /dev/shm itself
// named with this pid. Other processes' entries in /dev/shm (another test suite, a job)
// come and go without affecting the count.
struct OwnSegments {
  OwnSegments() {
    char tmpl[] = "/dev/shm/elasticrun-lifecycle-test.XXXXXX";
    if (::mkdtemp(tmpl)) dir = tmpl;
    if (!dir.empty()) ::setenv("UCX_POSIX_DIR", dir.c_str(), 1);  // before UCX reads its configuration
  }
  ~OwnSegments() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
  int count() const {
    std::string mine = "elasticrun-coll.";
    mine += std::to_string(::getpid());
    mine += '.';
    return count_entries(dir) + count_entries("/dev/shm", mine);
  }
  std::string dir;
};

void one_epoch(int epoch, bool abort_midway) {
  World w(3);
  HostCommConfig cfg;
  cfg.timeout = std::chrono::seconds(30);
  std::atomic<int> waiting{0};
  run_ranks(w, cfg, "e" + std::to_string(epoch) + "/", [&](int r, elasticrun::Communicator& c) {
    std::vector<float> buf(100000, 1.0f);
    c.allreduce(buf.data(), buf.data(), buf.size(), DataType::f32, ReduceOp::sum);
    c.barrier();
    if (!abort_midway) return;
    if (r == 2) {  // never joins; once the others are inside the allreduce, abort them
      while (waiting.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      w.aborts[0]->raise(AbortSignal::Kind::hosts_updated, "grow");
      w.aborts[1]->raise(AbortSignal::Kind::hosts_updated, "grow");
      return;
    }
    waiting.fetch_add(1);
    EXPECT_THROW(c.allreduce(buf.data(), buf.data(), buf.size(), DataType::f32, ReduceOp::sum), HostsUpdated);
  });
}

long rss_kib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  char line[256];
  long kib = 0;
  while (f && std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  if (f) std::fclose(f);
  return kib;
}

// Hundreds of resets, half of them aborted mid-collective, as a long elastic job sees:
// file descriptors, threads and shared-memory segments stay flat, memory bounded.
TEST(Lifecycle, RebuildingDoesNotLeak) {
  const int epochs = std::getenv("ER_LIFECYCLE_EPOCHS") ? std::atoi(std::getenv("ER_LIFECYCLE_EPOCHS")) : 200;
  OwnSegments segments;
  ASSERT_FALSE(segments.dir.empty()) << "cannot make a directory in /dev/shm";
  for (int e = 0; e < 3; ++e) one_epoch(e, e == 2);  // UCX sets up process-wide state once
  int fds = count_entries("/proc/self/fd"), threads = count_entries("/proc/self/task");
  int shm = segments.count();
  long rss = rss_kib();
  for (int e = 3; e < 3 + epochs; ++e) one_epoch(e, e % 2 == 0);
  EXPECT_EQ(count_entries("/proc/self/fd"), fds);
  EXPECT_EQ(count_entries("/proc/self/task"), threads);
  EXPECT_LE(segments.count(), shm) << "shared-memory segments left in " << segments.dir << " or /dev/shm";
  EXPECT_LT(rss_kib() - rss, 64 * 1024) << "resident memory grew by more than 64 MiB over " << epochs << " resets";
}

}  // namespace
}  // namespace elasticrun::collective::testing
