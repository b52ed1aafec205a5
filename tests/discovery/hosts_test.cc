// Host lists (-H), hostfiles and which names are this machine.
#include "discovery/hosts.h"
#include "discovery/local_host.h"

#include <gtest/gtest.h>

namespace elasticrun {
namespace {

using discovery::Host;

TEST(HostList, ParsesSlotsAndDefaults) {
  auto h = discovery::parse_host_list("a:4,b, c:1", 2);
  ASSERT_TRUE(h.ok()) << h.error();
  EXPECT_EQ(*h, (std::vector<Host>{{"a", 4}, {"b", 2}, {"c", 1}}));
}

TEST(HostList, RejectsBadEntriesWithAReason) {
  struct Case {
    const char* in;
    const char* why;
  } cases[] = {
      {"a:0", "out of range"}, {"a:-1", "out of range"}, {"a:x", "not a number"}, {"a,,b", "empty"},
      {"", "empty"},           {"a:2,a:3", "twice"},     {"bad host", "valid"},   {"a:99999", "out of range"},
      {"a:", "not a number"},
  };
  for (const auto& c : cases) {
    auto h = discovery::parse_host_list(c.in, 1);
    ASSERT_FALSE(h.ok()) << c.in;
    EXPECT_NE(h.error().find(c.why), std::string::npos) << c.in << " -> " << h.error();
  }
}

// An IPv6 address without brackets cannot carry slots unambiguously: refused, naming both
// bracketed spellings (it was taken for the host "2001:db8:" with 10 slots).
TEST(HostList, RefusesAnUnbracketedIpv6Address) {
  struct Case {
    const char* in;
    const char* why;
  } cases[] = {
      {"2001:db8::10:4", "'2001:db8::10:4' is ambiguous: an IPv6 address goes in brackets, '[2001:db8::10]:4' for 4 "
                         "slots or '[2001:db8::10:4]'"},
      {"a:2,2001:db8::10", "'[2001:db8::10]'"},
      {"me@fe80::1", "'me@fe80::1': an IPv6 address goes in brackets: 'me@[fe80::1]'"},
      {"fe80::1:8", "'[fe80::1]:8' for 8 slots or '[fe80::1:8]'"},
  };
  for (const auto& c : cases) {
    auto h = discovery::parse_host_list(c.in, 1);
    ASSERT_FALSE(h.ok()) << c.in;
    EXPECT_NE(h.error().find(c.why), std::string::npos) << c.in << " -> " << h.error();
  }
  auto f = discovery::parse_hostfile("::1 slots=2\n", 1);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().find("'[::1]'"), std::string::npos) << f.error();
  auto ok = discovery::parse_host_list("me@[2001:db8::10]:4,host:2", 1);
  ASSERT_TRUE(ok.ok()) << ok.error();
  EXPECT_EQ((*ok)[0], (Host{"me@[2001:db8::10]", 4}));
}

TEST(HostList, AcceptsBracketedIpv6) {
  auto h = discovery::parse_host_list("[::1]:3", 1);
  ASSERT_TRUE(h.ok()) << h.error();
  EXPECT_EQ((*h)[0], (Host{"[::1]", 3}));
}

TEST(Hostfile, ParsesOpenMpiStyleLinesAndComments) {
  auto h = discovery::parse_hostfile("# cluster\nnode1 slots=4\n\n  node2   # two\nnode3:3\r\n", 2);
  ASSERT_TRUE(h.ok()) << h.error();
  EXPECT_EQ(*h, (std::vector<Host>{{"node1", 4}, {"node2", 2}, {"node3", 3}}));
}

TEST(Hostfile, NamesTheBadLine) {
  auto h = discovery::parse_hostfile("node1 slots=2\nnode2 cpus=4\n", 1);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.error().find("line 2"), std::string::npos) << h.error();
  auto d = discovery::parse_hostfile("n1\nn1 slots=2\n", 1);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().find("line 2"), std::string::npos);
  EXPECT_FALSE(discovery::parse_hostfile("n1 slots=abc\n", 1).ok());
}

TEST(Hostfile, MissingFileIsAClearError) {
  auto h = discovery::read_hostfile("/nonexistent/hosts", 1);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.error().find("/nonexistent/hosts"), std::string::npos);
}

TEST(LocalHost, LoopbackNamesAreLocal) {
  EXPECT_TRUE(discovery::look_up_host("localhost").local);
  EXPECT_TRUE(discovery::look_up_host("127.0.0.2").local);
  EXPECT_TRUE(discovery::look_up_host("user@127.0.0.1").local);
  EXPECT_FALSE(discovery::look_up_host("192.0.2.1").local);  // TEST-NET-1, never assigned
}

}  // namespace
}  // namespace elasticrun
