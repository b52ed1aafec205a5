// parse_script_output: every kind of bad output is a message naming the line, never a
// crash; odd but valid output (CRLF, no final newline, repeats, nothing) parses.
#include "discovery/script_output.h"

#include <gtest/gtest.h>

namespace elasticrun::discovery {
namespace {

using Hosts = std::vector<Host>;

Hosts parse_ok(std::string_view text, int default_slots = 1) {
  auto r = parse_script_output(text, default_slots);
  EXPECT_TRUE(r.ok()) << r.error();
  return r ? r->hosts : Hosts{};
}

std::string parse_err(std::string_view text, int default_slots = 1) {
  auto r = parse_script_output(text, default_slots);
  EXPECT_FALSE(r.ok()) << "parsed: " << (r ? r->hosts.size() : 0) << " hosts";
  return r ? std::string{} : r.error();
}

TEST(ScriptOutput, AllLineForms) {
  EXPECT_EQ(parse_ok("a:4\nb\nc slots=2\n", 3), (Hosts{{"a", 4}, {"b", 3}, {"c", 2}}));
}

TEST(ScriptOutput, CommentsBlanksCrlfAndNoFinalNewline) {
  EXPECT_EQ(parse_ok("# header\r\n\r\n  a:2  # first\r\n\t\nb:1"), (Hosts{{"a", 2}, {"b", 1}}));
}

TEST(ScriptOutput, CommentsMayHoldAnything) {
  EXPECT_EQ(parse_ok("a:1 # nœud \x01 \xff\n"), (Hosts{{"a", 1}}));
}

TEST(ScriptOutput, NothingIsZeroHostsNotAnError) {
  EXPECT_TRUE(parse_ok("").empty());
  EXPECT_TRUE(parse_ok("\n\n# no hosts right now\n").empty());
}

TEST(ScriptOutput, RepeatedHostsAddUpInFirstPosition) {
  auto r = parse_script_output("a:2\nb\na:3\nc\nb\na\n", 1);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->hosts, (Hosts{{"a", 6}, {"b", 2}, {"c", 1}}));
  EXPECT_EQ(r->merged, (std::vector<std::string>{"a", "b"}));
}

TEST(ScriptOutput, RepeatsMayNotExceedTheSlotLimit) {
  std::string e = parse_err("a:4000\nb\na:100\n");
  EXPECT_NE(e.find("line 3"), std::string::npos) << e;
  EXPECT_NE(e.find("4100"), std::string::npos) << e;
}

TEST(ScriptOutput, BadSlotsNameTheLine) {
  EXPECT_EQ(parse_err("a:1\nb:2\n\nc:x\n"), "line 4: slots 'x' is not a number");
  EXPECT_NE(parse_err("a:-1\n").find("line 1: slots -1 out of range"), std::string::npos);
  EXPECT_NE(parse_err("a:0\n").find("out of range"), std::string::npos);
  EXPECT_NE(parse_err("a:99999999999999999999\n").find("is not a number"), std::string::npos);
  EXPECT_NE(parse_err("a slots=\n").find("line 1"), std::string::npos);
  EXPECT_NE(parse_err("a cpus=3\n").find("want 'slots=N'"), std::string::npos);
  EXPECT_NE(parse_err("a:\n").find("line 1"), std::string::npos);
}

TEST(ScriptOutput, BadNamesNameTheLine) {
  EXPECT_NE(parse_err("ok\nbad/name\n").find("line 2: 'bad/name' is not a valid host name"), std::string::npos);
  EXPECT_NE(parse_err("-rf\n").find("line 1"), std::string::npos);
}

TEST(ScriptOutput, BinaryGarbageIsNamedNotEchoed) {
  std::string garbage("a:1\n\x00\x01\xfe\xff\n", 9);
  std::string e = parse_err(garbage);
  EXPECT_EQ(e, "line 2: not text: byte 0x00 at column 1");
  EXPECT_EQ(parse_err("a\rb\n"), "line 1: not text: byte 0x0d at column 2");
  EXPECT_EQ(parse_err("h\xc3\xa9te\n"), "line 1: not text: byte 0xc3 at column 2");
}

TEST(ScriptOutput, OverlongLinesAreRejectedShortly) {
  std::string line(2'000'000, 'a');
  std::string e = parse_err("ok\n" + line);
  EXPECT_NE(e.find("line 2: longer than 1024 characters"), std::string::npos) << e.substr(0, 200);
  EXPECT_LT(e.size(), 200u);
  // A name of 300 characters fits the line but not a host name.
  EXPECT_NE(parse_err(std::string(300, 'b') + "\n").find("not a valid host name"), std::string::npos);
}

TEST(ScriptOutput, ManyLinesParse) {
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "h" + std::to_string(i) + ":2\n";
  EXPECT_EQ(parse_ok(text).size(), 20000u);
}

TEST(ScriptOutput, HumanSizes) {
  EXPECT_EQ(human_size(1 << 20), "1 MiB");
  EXPECT_EQ(human_size(4096), "4 KiB");
  EXPECT_EQ(human_size(1000), "1000 bytes");
}

}  // namespace
}  // namespace elasticrun::discovery
