// A failed worker's error file, as torch's @record writes it and as anything else a
// worker may leave there.
#include "cmd/error_report.h"

#include <gtest/gtest.h>

namespace elasticrun::cmd {
namespace {

constexpr std::size_t kLimit = 65536;

WorkerError parse(std::string_view text) { return parse_error_file(text, text.size(), kLimit); }

TEST(ErrorReport, TorchsRecordFormat) {
  auto e = parse(R"({"message": {"message": "ValueError: bad lr", "extraInfo": {"py_callstack": )"
                 R"("Traceback (most recent call last):\n  File \"t.py\"\nValueError: bad lr\n", "timestamp": "17"}}})");
  EXPECT_EQ(e.problem, "");
  EXPECT_EQ(e.message, "ValueError: bad lr");
  EXPECT_EQ(e.traceback, "Traceback (most recent call last):\n  File \"t.py\"\nValueError: bad lr");
  EXPECT_EQ(e.timestamp, 17);
}

TEST(ErrorReport, ThePlainForm) {
  auto e = parse(R"({"message": "killed by the watchdog", "timestamp": 1700000000})");
  EXPECT_EQ(e.message, "killed by the watchdog");
  EXPECT_EQ(e.traceback, "");
  EXPECT_EQ(e.timestamp, 1700000000);
  e = parse(R"({"message": "no time", "timestamp": "soon"})");
  EXPECT_EQ(e.problem, "");
  EXPECT_FALSE(e.timestamp);
}

TEST(ErrorReport, AnythingElseIsAProblemWithAPrintableExcerpt) {
  struct {
    std::string text;
    std::string problem;
  } cases[] = {
      {"", "not JSON"},
      {"Traceback (most recent", "not JSON: Traceback (most recent"},
      {"[1, 2]", "no \"message\" in it: [1, 2]"},
      {R"({"msg": 1})", "no \"message\" in it: {\"msg\": 1}"},
      {R"({"message": 42})", "its \"message\" is neither text nor an object with a \"message\": {\"message\": 42}"},
      {R"({"message": {"extraInfo": {}}})", "its \"message\" is neither text"},
      {"\xff\xfe{\x1b[2J", "not JSON: ??{?[2J"},
      {std::string(300, 'x'), "not JSON: " + std::string(200, 'x') + "..."},
  };
  for (const auto& c : cases) {
    auto e = parse(c.text);
    EXPECT_EQ(e.problem.substr(0, c.problem.size()), c.problem) << c.text;
    EXPECT_EQ(e.message, "");
  }
  auto big = parse_error_file("", 1 << 20, kLimit);
  EXPECT_EQ(big.problem, "the file holds 1048576 bytes, over the 65536-byte limit");
}

TEST(ErrorReport, TextFromTheWorkerIsMadePrintable) {
  auto e = parse("{\"message\": \"bad \\u001b[31mred\\u001b[0m\\tend\"}");
  EXPECT_EQ(e.message, "bad ?[31mred?[0m\tend");
  EXPECT_EQ(printable("caf\xc3\xa9 \xe2\x9c\x93 \xc3", 100), "caf\xc3\xa9 \xe2\x9c\x93 ?");  // a cut sequence
  EXPECT_EQ(printable("abcdef", 3), "abc...");
  EXPECT_EQ(printable("a\r\nb\x7f", 100), "a?\nb?");
}

TEST(ErrorReport, TheRootCauseAsTorchrunTellsIt) {
  WorkerError e{"RuntimeError: x", "Traceback:\n  line 1\nRuntimeError: x", 0, ""};
  EXPECT_EQ(root_cause({"n2", 3, 1, 777, 1, 0}, e), "root cause (first observed failure):\n"
                                                     "  time      : 1970-01-01 00:00:00 UTC\n"
                                                     "  host      : n2\n"
                                                     "  rank      : 3 (local_rank: 1)\n"
                                                     "  exitcode  : 1 (pid: 777)\n"
                                                     "  message   : RuntimeError: x\n"
                                                     "  traceback : Traceback:\n"
                                                     "                line 1\n"
                                                     "              RuntimeError: x");
  WorkerError bad;
  bad.problem = "not JSON: oops";
  EXPECT_EQ(root_cause({"n2", 0, 0, 9, 0, 6}, bad), "root cause (first observed failure):\n"
                                                     "  host      : n2\n"
                                                     "  rank      : 0 (local_rank: 0)\n"
                                                     "  signal    : 6 (SIGABRT) (pid: 9)\n"
                                                     "  error_file: unreadable: not JSON: oops");
}

}  // namespace
}  // namespace elasticrun::cmd
