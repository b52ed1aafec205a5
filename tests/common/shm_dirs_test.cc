// shm_dirs: the stale directories of dead daemons go, those of live ones stay, and so do
// those of another PID namespace's daemons (their pid means nothing here, and the same
// number can be a daemon of each namespace). On the real /dev/shm, with real
// directories and a real dead pid.
#include "common/shm_dirs.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace elasticrun {
namespace {

namespace fs = std::filesystem;

// A pid that no process has now: a child that exited and was reaped.
pid_t dead_pid() {
  pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  ::waitpid(p, nullptr, 0);
  return p;
}

TEST(ShmDirs, NamesCarryThePidNamespace) {
  ASSERT_NE(shm_dirs::pid_namespace(), 0u);
  std::string ns = std::to_string(shm_dirs::pid_namespace());
  EXPECT_EQ(shm_dirs::path(42, 3, 7), "/dev/shm/elasticrun.42." + ns + ".3.7");
  EXPECT_EQ(shm_dirs::errors_path(42), "/dev/shm/elasticrun.42." + ns + ".errors");
}

TEST(ShmDirs, StaleDirectoriesOfThisNamespaceGoAndAnotherNamespacesStay) {
  pid_t dead = dead_pid();
  std::string d = std::to_string(dead), other_ns = std::to_string(shm_dirs::pid_namespace() + 1);
  std::string ours = shm_dirs::path(dead, 0, 1), errors = shm_dirs::errors_path(dead),
              live = shm_dirs::path(::getpid(), 7, 1),
              old_format = "/dev/shm/elasticrun." + d + ".1.1",  // before the namespace was named
              foreign = "/dev/shm/elasticrun." + d + "." + other_ns + ".2.1",
              foreign_errors = "/dev/shm/elasticrun." + d + "." + other_ns + ".errors";
  for (const auto& dir : {ours, errors, live, old_format, foreign, foreign_errors})
    ASSERT_TRUE(fs::create_directory(dir)) << dir;
  shm_dirs::remove_stale();
  EXPECT_FALSE(fs::exists(ours));
  EXPECT_FALSE(fs::exists(errors));
  EXPECT_FALSE(fs::exists(old_format));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(foreign));
  EXPECT_TRUE(fs::exists(foreign_errors));
  shm_dirs::remove_all_of(::getpid());
  EXPECT_FALSE(fs::exists(live));
  std::error_code ec;
  fs::remove_all(foreign, ec);
  fs::remove_all(foreign_errors, ec);
}

}  // namespace
}  // namespace elasticrun
