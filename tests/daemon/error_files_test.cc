// Workers' error files: what a failed worker left is read, bounded, and removed; nothing a
// worker can put at its path blocks or misleads the daemon.
#include "daemon/error_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace ed = elasticrun::daemon;
namespace fs = std::filesystem;

namespace {

struct ErrorFilesTest : ::testing::Test {
  fs::path dir = fs::temp_directory_path() / ("er-errors-test." + std::to_string(::getpid()));
  void TearDown() override { fs::remove_all(dir); }
  static void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
};

}  // namespace

TEST_F(ErrorFilesTest, PathsAreNewInAPrivateDirectoryRemovedAtTheEnd) {
  std::string a, b;
  {
    ed::ErrorFiles files(dir.string());
    a = files.next_path(0);
    b = files.next_path(0);
    ASSERT_FALSE(a.empty());
    EXPECT_NE(a, b);
    EXPECT_EQ(fs::path(a).parent_path(), dir);
    EXPECT_EQ(fs::status(dir).permissions() & fs::perms::all, fs::perms::owner_all);
    write(a, "{}");
  }
  EXPECT_FALSE(fs::exists(dir));
}

TEST_F(ErrorFilesTest, NoDirectoryNoPath) {
  ed::ErrorFiles files((dir / "missing" / "deeper").string());
  EXPECT_EQ(files.next_path(0), "");
}

TEST_F(ErrorFilesTest, TakeReadsAndRemoves) {
  ed::ErrorFiles files(dir.string());
  auto p = files.next_path(1);
  write(p, R"({"message": "boom"})");
  auto got = ed::ErrorFiles::take(p, 1024);
  EXPECT_EQ(got.text, R"({"message": "boom"})");
  EXPECT_EQ(got.size, 19u);
  EXPECT_FALSE(fs::exists(p));
  got = ed::ErrorFiles::take(p, 1024);  // nothing there
  EXPECT_EQ(got.size, 0u);
  EXPECT_EQ(got.text, "");
}

TEST_F(ErrorFilesTest, AFileOverTheLimitIsSizedNotRead) {
  ed::ErrorFiles files(dir.string());
  auto p = files.next_path(0);
  write(p, std::string(1025, 'x'));
  auto got = ed::ErrorFiles::take(p, 1024);
  EXPECT_EQ(got.size, 1025u);
  EXPECT_EQ(got.text, "");
  EXPECT_FALSE(fs::exists(p));
  write(p, std::string(1024, 'x'));  // at the limit: read
  EXPECT_EQ(ed::ErrorFiles::take(p, 1024).text.size(), 1024u);
}

TEST_F(ErrorFilesTest, AFifoALinkOrADirectoryIsNoFileAndIsRemoved) {
  ed::ErrorFiles files(dir.string());
  auto fifo = files.next_path(0);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(ed::ErrorFiles::take(fifo, 1024).size, 0u);  // does not wait for a writer
  EXPECT_FALSE(fs::exists(fifo));
  auto target = dir / "target";
  write(target.string(), "not the worker's");
  auto link = files.next_path(0);
  fs::create_symlink(target, link);
  EXPECT_EQ(ed::ErrorFiles::take(link, 1024).size, 0u);
  EXPECT_FALSE(fs::exists(fs::symlink_status(link)));
  EXPECT_TRUE(fs::exists(target));  // the link is removed, not what it names
  auto sub = files.next_path(0);
  fs::create_directories(fs::path(sub) / "x");
  EXPECT_EQ(ed::ErrorFiles::take(sub, 1024).size, 0u);
  EXPECT_FALSE(fs::exists(sub));
}
