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
  std::fseek(f, 0, SEEK_END);  // a write may follow a read only after a seek
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

// A progress bar (tqdm) writes "\r" and an update, over and over, and a newline only at
// its end: each update is shown as it comes, ended by its '\r', so that it redraws in
// place with its prefix; "\r\n" still ends a line once, even split over two chunks. The
// file gets the bytes as they came.
TEST(Output, CarriageReturnsShowProgressBarUpdatesAsTheyCome) {
  char tmpl[] = "/tmp/er-output-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::FILE* out = std::tmpfile();
  std::string raw;
  {
    OutputRouter r(tmpl, out, out);
    auto w = [&](std::string_view d) {
      raw += d;
      ASSERT_TRUE(r.write({"h", 0}, 0, 2, {reinterpret_cast<const std::uint8_t*>(d.data()), d.size()}).ok());
    };
    w("\r 10%|#");
    EXPECT_EQ(slurp(out), "");  // the update ends at the next '\r'
    w("\r 20%|##\r");
    EXPECT_EQ(slurp(out), "[0]<stderr>:  10%|#\r");
    w("100%|###\n");
    w("crlf\r");
    w("\nnext\r");
    w("x\n");
  }
  EXPECT_EQ(slurp(out),
            "[0]<stderr>:  10%|#\r[0]<stderr>:  20%|##\r[0]<stderr>: 100%|###\n[0]<stderr>: crlf\r\n"
            "[0]<stderr>: next\r[0]<stderr>: x\n");
  std::ifstream f(std::string(tmpl) + "/rank.0/stderr");
  std::string content((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(content, raw);
  std::fclose(out);
  std::system((std::string("rm -rf ") + tmpl).c_str());
}

// Output that never ends a line is cut at kMaxLine: shown, and not held without bound.
TEST(Output, ALineWithoutAnEndIsCutAtTheLimit) {
  std::FILE* out = std::tmpfile();
  std::string chunk(100, 'x');
  {
    OutputRouter r("", out, out);
    for (int i = 0; i < 2048; ++i)  // 200 KiB
      ASSERT_TRUE(r.write({"h", 0}, 0, 1, {reinterpret_cast<const std::uint8_t*>(chunk.data()), chunk.size()}).ok());
    EXPECT_EQ(slurp(out).size() / OutputRouter::kMaxLine, 3u) << "three cut lines before the end";
  }
  std::string all = slurp(out);
  std::size_t lines = 0, xs = 0, at = 0;
  for (std::size_t nl; (nl = all.find('\n', at)) != std::string::npos; at = nl + 1, ++lines) {
    std::string_view line = std::string_view(all).substr(at, nl - at);
    ASSERT_EQ(line.substr(0, 13), "[0]<stdout>: ");
    EXPECT_LE(line.size() - 13, OutputRouter::kMaxLine + chunk.size());
    xs += line.size() - 13;
  }
  EXPECT_EQ(lines, 4u);
  EXPECT_EQ(xs, 2048u * 100u);
  std::fclose(out);
}

}  // namespace
}  // namespace elasticrun::cmd
