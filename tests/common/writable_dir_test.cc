// check_writable_dir (common/writable_dir.h): made when missing, or the reason it cannot be.
#include "common/writable_dir.h"

#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace elasticrun {
namespace {

namespace fs = std::filesystem;

TEST(WritableDir, MadeWhenMissingOrSaysWhyNot) {
  char tmpl[] = "/tmp/er-writable-test-XXXXXX";
  fs::path d = ::mkdtemp(tmpl);
  auto sub = (d / "a/b").string();
  ASSERT_TRUE(check_writable_dir(sub));
  EXPECT_TRUE(fs::is_directory(sub));
  EXPECT_TRUE(fs::is_empty(sub));  // the probe is gone
  std::ofstream(d / "file") << "x";
  auto r = check_writable_dir((d / "file/sub").string());
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("cannot create"), std::string::npos) << r.error();
  r = check_writable_dir((d / "file").string());
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("ot a directory"), std::string::npos) << r.error();
  // A read-only filesystem refuses even root.
  r = check_writable_dir("/proc/elasticrun-checkpoints");
  EXPECT_FALSE(r);
  fs::remove_all(d);
}

}  // namespace
}  // namespace elasticrun
