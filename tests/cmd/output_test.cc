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
      ASSERT_TRUE(r.write({"h", rank}, rank, s, {reinterpret_cast<const std::uint8_t*>(d.data()), d.size()}).ok());
    };
    w(1, 1, "hel");
    w(0, 1, "zero\n");
    w(1, 1, "lo\nwor");
    w(1, 2, "oops\n");
    r.finish({"h", 1});
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
    ASSERT_TRUE(r.write({"h", 0}, 3, 1, {reinterpret_cast<const std::uint8_t*>(d.data()), d.size()}).ok());
  }
  std::ifstream f(std::string(tmpl) + "/rank.3/stdout");
  std::string content((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(content, "a\nb");
  std::fclose(devnull);
  std::system((std::string("rm -rf ") + tmpl).c_str());
}

// After resets two live workers can carry the same prefix (each keeps the rank it
// started as): their partial lines are gathered apart, on the terminal and in the file,
// and one's end flushes only its own.
TEST(Output, TwoWorkersUnderOneRankNeverMixTheirLines) {
  char tmpl[] = "/tmp/er-output-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::FILE* out = std::tmpfile();
  {
    OutputRouter r(tmpl, out, out);
    auto w = [&](std::string host, std::string_view d) {
      ASSERT_TRUE(r.write({host, 0}, 3, 1, {reinterpret_cast<const std::uint8_t*>(d.data()), d.size()}).ok());
    };
    w("a", "loss 0.");
    w("b", "epoch ");
    w("a", "25\nstep ");
    w("b", "7\n");
    r.finish({"b", 0});  // b ended: a's partial "step " stays a's
    w("a", "9\n");
  }
  EXPECT_EQ(slurp(out), "[3]<stdout>: loss 0.25\n[3]<stdout>: epoch 7\n[3]<stdout>: step 9\n");
  std::ifstream f(std::string(tmpl) + "/rank.3/stdout");
  std::string content((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(content, "loss 0.25\nepoch 7\nstep 9\n");
  std::fclose(out);
  std::system((std::string("rm -rf ") + tmpl).c_str());
}

}  // namespace
}  // namespace elasticrun::cmd
