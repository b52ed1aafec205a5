// The durable checkpoint file (control/checkpoint_file.h): its layout, its checks, the
// atomic write with pruning, and the loader's fall-back past files that do not verify.
#include "control/checkpoint_file.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace elasticrun::collective::checkpoint {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/er-ckpt-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
};

Manifest manifest(std::uint64_t commit) {
  Manifest m;
  m.epoch = 3;
  m.commit = commit;
  m.items = {{"weights", 5, 12}, {"step", 7, 8}};
  m.host = "node1";
  m.pid = 42;
  m.unix_ms = 1700000000000;
  return m;
}

std::vector<std::byte> payload(std::uint64_t commit) {
  std::vector<std::byte> p(20);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::byte>(commit * 31 + i);
  return p;
}

std::vector<std::byte> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return std::vector<std::byte>(reinterpret_cast<std::byte*>(c.data()), reinterpret_cast<std::byte*>(c.data()) + c.size());
}

void spill(const std::string& path, const std::vector<std::byte>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

TEST(CheckpointFile, NamesSortByCommitAndParseBack) {
  EXPECT_EQ(file_name(42), "commit-00000000000000000042.ckpt");
  EXPECT_EQ(commit_of(file_name(42)), 42u);
  EXPECT_EQ(commit_of(file_name(UINT64_MAX)), UINT64_MAX);
  for (const char* bad : {"commit-42.ckpt", "commit-0000000000000000004x.ckpt", ".commit-00000000000000000042.ckpt.tmp-1-2",
                          "commit-00000000000000000042.ckpt.bak", "commit-99999999999999999999.ckpt"})
    EXPECT_FALSE(commit_of(bad)) << bad;
}

TEST(CheckpointFile, EncodeDecodeRoundTrip) {
  auto file = encode(manifest(7), payload(7));
  auto l = decode(file);
  ASSERT_TRUE(l) << l.error();
  EXPECT_EQ(l->manifest.kind, "state");
  EXPECT_EQ(l->manifest.epoch, 3u);
  EXPECT_EQ(l->manifest.commit, 7u);
  EXPECT_EQ(l->manifest.items, manifest(7).items);
  EXPECT_EQ(l->manifest.payload_bytes, 20u);
  EXPECT_EQ(l->manifest.host, "node1");
  EXPECT_EQ(l->manifest.pid, 42u);
  EXPECT_EQ(l->payload, payload(7));
}

// Every shorter prefix of a file (a torn write) and every single flipped bit is rejected.
TEST(CheckpointFile, EveryTruncationAndEveryFlippedBitIsRejected) {
  auto file = encode(manifest(7), payload(7));
  for (std::size_t n = 0; n < file.size(); ++n) {
    auto l = decode(std::span(file).first(n));
    EXPECT_FALSE(l) << "a prefix of " << n << " of " << file.size() << " bytes was accepted";
  }
  for (std::size_t i = 0; i < file.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      auto bad = file;
      bad[i] ^= static_cast<std::byte>(1 << bit);
      EXPECT_FALSE(decode(bad)) << "byte " << i << " bit " << bit << " flipped was accepted";
    }
  }
  auto longer = file;
  longer.push_back(std::byte{0});
  EXPECT_FALSE(decode(longer));
}

TEST(CheckpointFile, ReasonsNameTheProblem) {
  auto file = encode(manifest(7), payload(7));
  EXPECT_NE(decode(std::span(file).first(10)).error().find("truncated"), std::string::npos);
  auto torn = std::span(file).first(file.size() - 3);
  EXPECT_NE(decode(torn).error().find("truncated"), std::string::npos) << decode(torn).error();
  auto bad = file;
  bad[bad.size() - 9] ^= std::byte{1};  // the last payload byte
  EXPECT_NE(decode(bad).error().find("payload's checksum"), std::string::npos) << decode(bad).error();
  bad = file;
  bad[0] = std::byte{'X'};
  EXPECT_NE(decode(bad).error().find("not a checkpoint"), std::string::npos);
}

TEST(CheckpointFile, WriteIsAtomicAndKeepsTheNewestTwo) {
  TempDir d;
  for (std::uint64_t c : {10, 20, 30}) {
    auto w = write(d.str(), manifest(c), payload(c));
    ASSERT_TRUE(w) << w.error();
    EXPECT_EQ(*w, d.str() + "/" + file_name(c));
  }
  auto files = list(d.str());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].first, 30u);
  EXPECT_EQ(files[1].first, 20u);
  for (const auto& e : fs::directory_iterator(d.path))  // no temporary file left
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  auto l = read(files[0].second);
  ASSERT_TRUE(l) << l.error();
  EXPECT_EQ(l->payload, payload(30));
  EXPECT_EQ(l->path, files[0].second);
}

TEST(CheckpointFile, StaleTemporaryFilesArePrunedFreshOnesKept) {
  TempDir d;
  std::string stale = d.str() + "/.commit-00000000000000000005.ckpt.tmp-1-1";
  std::string fresh = d.str() + "/.commit-00000000000000000006.ckpt.tmp-2-2";
  spill(stale, payload(1));
  spill(fresh, payload(1));
  fs::last_write_time(stale, fs::file_time_type::clock::now() - std::chrono::hours(1));
  ASSERT_TRUE(write(d.str(), manifest(10), payload(10)));
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(fresh));  // another writer may still be at it
}

TEST(CheckpointFile, NewestSkipsFilesThatDoNotVerify) {
  TempDir d;
  ASSERT_TRUE(write(d.str(), manifest(10), payload(10), 5));
  ASSERT_TRUE(write(d.str(), manifest(20), payload(20), 5));
  ASSERT_TRUE(write(d.str(), manifest(30), payload(30), 5));
  // 30 truncated (a torn write on a filesystem that lost it), 20 with a flipped byte.
  auto f30 = slurp(d.str() + "/" + file_name(30));
  f30.resize(f30.size() / 2);
  spill(d.str() + "/" + file_name(30), f30);
  auto f20 = slurp(d.str() + "/" + file_name(20));
  f20[f20.size() / 2] ^= std::byte{0x40};
  spill(d.str() + "/" + file_name(20), f20);
  auto n = newest(d.str());
  ASSERT_TRUE(n.loaded);
  EXPECT_EQ(n.loaded->manifest.commit, 10u);
  EXPECT_EQ(n.loaded->payload, payload(10));
  ASSERT_EQ(n.skipped.size(), 2u);
  EXPECT_EQ(n.skipped[0].first, d.str() + "/" + file_name(30));
  EXPECT_NE(n.skipped[0].second.find("truncated"), std::string::npos) << n.skipped[0].second;
  EXPECT_EQ(n.skipped[1].first, d.str() + "/" + file_name(20));
  EXPECT_NE(n.skipped[1].second.find("corrupted"), std::string::npos) << n.skipped[1].second;

  spill(d.str() + "/" + file_name(10), {});
  n = newest(d.str());
  EXPECT_FALSE(n.loaded);
  EXPECT_EQ(n.skipped.size(), 3u);
  EXPECT_FALSE(newest(d.str() + "/missing").loaded);
}

TEST(CheckpointFile, WriteIntoAMissingDirectorySaysWhy) {
  TempDir d;
  auto w = write(d.str() + "/missing", manifest(1), payload(1));
  ASSERT_FALSE(w);
  EXPECT_NE(w.error().find("cannot create"), std::string::npos) << w.error();
}

}  // namespace
}  // namespace elasticrun::collective::checkpoint
