// Worker output: rank-prefixed whole lines, and the per-rank files of --output-dir.
#include "cmd/output.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace elasticrun::cmd {
namespace {

std::string slurp(std::FILE* f) {
  std::rewind(f);
  std::string s;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) s.append(buf, n);
  return s;
}

TEST(Output, PrefixesCompleteLinesOnlyAndFlushesTheRest) {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  {
    OutputRouter r("", out, err);
    auto w = [&](int rank, int s, std::string_view d) {
      ASSERT_TRUE(r.write(rank, s, {reinterpret_cast<const std::uint8_t*>(d.data()), d.size()}).ok());
    };
    w(1, 1, "hel");
    w(0, 1, "zero\n");
    w(1, 1, "lo\nwor");
    w(1, 2, "oops\n");
    r.finish(1);
  }
  EXPECT_EQ(slurp(out), "[0]<stdout>: zero\n[1]<stdout>: hello\n[1]<stdout>: wor\n");
  EXPECT_EQ(slurp(err), "[1]<stderr>: oops\n");
  std::fclose(out);
  std::fclose(err);
}

TEST(Output, TeesToPerRankFiles) {
  char tmpl[] = "/tmp/er-output-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::FILE* devnull = std::fopen("/dev/null", "w");
  {
    OutputRouter r(tmpl, devnull, devnull);
    std::string d = "a\nb";
    ASSERT_TRUE(r.write(3, 1, {reinterpret_cast<const std::uint8_t*>(d.data()), d.size()}).ok());
  }
  std::ifstream f(std::string(tmpl) + "/rank.3/stdout");
  std::string content((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(content, "a\nb");
  std::fclose(devnull);
  std::system((std::string("rm -rf ") + tmpl).c_str());
}

}  // namespace
}  // namespace elasticrun::cmd
