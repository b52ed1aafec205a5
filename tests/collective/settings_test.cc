// The settings reader (control/settings.h): each ELASTICRUN_* variable's default, its
// bounds, and the error a bad value gives (naming the variable and the value).
#include "control/settings.h"
#include "host/host_communicator.h"

#include "common/env.h"
#include "common/socket_options.h"

#include <elasticrun/types.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace elasticrun::collective::settings {
namespace {

using namespace std::chrono_literals;

// Sets `name` to `value` (null: unsets it) for the scope of one test, then unsets it.
class Env {
 public:
  Env(const char* name, const char* value) : name_(name) { set(value); }
  ~Env() { ::unsetenv(name_); }
  void set(const char* value) {
    if (value) ::setenv(name_, value, 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
};

// The message of the Error `fn` throws; fails the test if it throws none.
template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no Error thrown";
  return "";
}

TEST(Settings, Defaults) {
  for (const char* name : {env::kCollectiveTimeout, env::kRejoinTimeout, env::kHostTimeout, env::kAlgorithm,
                           env::kProgress, env::kDevice, env::kDeviceHint, env::kNcclShrink, env::kSegment, env::kTune})
    ::unsetenv(name);
  EXPECT_EQ(collective_timeout(), 300s);
  EXPECT_EQ(collective_timeout(), kDefaultCollectiveTimeout);
  EXPECT_EQ(rejoin_timeout(7s), 7s);
  EXPECT_EQ(host_timeout(), net::kDefaultHostTimeout);
  EXPECT_EQ(algorithm(), Algorithm::automatic);
  EXPECT_EQ(progress(), Progress::automatic);
  EXPECT_FALSE(device());
  EXPECT_FALSE(device_hint());
  EXPECT_TRUE(nccl_shrink());
  EXPECT_EQ(segment(), std::nullopt);
  EXPECT_TRUE(tune());
}

TEST(Settings, Tune) {
  Env e(env::kTune, "0");
  EXPECT_FALSE(tune());
  e.set("1");
  EXPECT_TRUE(tune());
  e.set("");
  EXPECT_TRUE(tune());
  for (const char* bad : {"yes", "2", " 0"}) {
    e.set(bad);
    EXPECT_EQ(error_of([] { tune(); }), std::string("ELASTICRUN_TUNE='") + bad + "' is not 0 or 1");
  }
}

TEST(Settings, EmptyMeansDefault) {
  Env t(env::kCollectiveTimeout, ""), a(env::kAlgorithm, ""), p(env::kProgress, ""), d(env::kDevice, ""),
      s(env::kNcclShrink, "");
  EXPECT_EQ(collective_timeout(), kDefaultCollectiveTimeout);
  EXPECT_EQ(algorithm(), Algorithm::automatic);
  EXPECT_EQ(progress(), Progress::automatic);
  EXPECT_FALSE(device());
  EXPECT_TRUE(nccl_shrink());
}

// The three seconds settings share one rule: a positive number of seconds, at most
// kMaxSeconds, fractions allowed.
TEST(Settings, SecondsWithinBounds) {
  Env t(env::kCollectiveTimeout, "2");
  EXPECT_EQ(collective_timeout(), 2s);
  t.set("0.25");
  EXPECT_EQ(collective_timeout(), 250ms);
  t.set("1e7");
  EXPECT_EQ(collective_timeout(), std::chrono::milliseconds(10'000'000'000LL));
  Env h(env::kHostTimeout, "3");
  EXPECT_EQ(host_timeout(), 3s);
}

TEST(Settings, BadSecondsNameTheVariable) {
  for (const char* name : {env::kCollectiveTimeout, env::kRejoinTimeout, env::kHostTimeout}) {
    for (const char* bad : {"0", "-1", "abc", "5s", "1e8", "inf", "nan", " "}) {
      Env e(name, bad);
      std::string what = error_of([] {
        collective_timeout();
        rejoin_timeout(1s);
        host_timeout();
      });
      EXPECT_EQ(what, std::string(name) + "='" + bad + "' is not a positive number of seconds");
    }
  }
}

// A rejoin waits at least as long as a collective: the shorter of the two is raised.
TEST(Settings, RejoinTimeoutIsNeverShorterThanTheCollectiveOne) {
  Env r(env::kRejoinTimeout, "5");
  EXPECT_EQ(rejoin_timeout(2s), 5s);
  EXPECT_EQ(rejoin_timeout(60s), 60s);
}

TEST(Settings, AlgorithmAndProgress) {
  Env a(env::kAlgorithm, "hier"), p(env::kProgress, "block");
  EXPECT_EQ(algorithm(), Algorithm::hier);
  EXPECT_EQ(progress(), Progress::block);
  a.set("ring");
  p.set("busy");
  EXPECT_EQ(algorithm(), Algorithm::ring);  // read at every call
  EXPECT_EQ(progress(), Progress::busy);
  a.set("fast");
  EXPECT_EQ(error_of([] { algorithm(); }),
            "ELASTICRUN_ALGORITHM: unknown algorithm 'fast' (expected auto, shm, hier, rails, ring, rd, rhd, direct or twoshot)");
  p.set("spin");
  EXPECT_EQ(error_of([] { progress(); }),
            "ELASTICRUN_PROGRESS: unknown progress mode 'spin' (expected auto, busy or block)");
}

TEST(Settings, Segment) {
  Env s(env::kSegment, "65536");
  EXPECT_EQ(segment(), std::optional<std::size_t>(65536));
  s.set("64K");
  EXPECT_EQ(segment(), std::optional<std::size_t>(65536));
  s.set("1k");
  EXPECT_EQ(segment(), std::optional<std::size_t>(1024));
  s.set("64M");
  EXPECT_EQ(segment(), std::optional<std::size_t>(64u << 20));
  s.set("");
  EXPECT_EQ(segment(), std::nullopt);
  for (const char* bad : {"1023", "0", "65M", "67108865", "-4K", "+4K", " 4K", "4KB", "4G", "K", "99999999999999999999K"}) {
    s.set(bad);
    EXPECT_EQ(error_of([] { segment(); }), std::string("ELASTICRUN_SEGMENT='") + bad +
                                               "' is not a byte count from 1K to 64M (digits, then K or M for KiB or MiB)");
  }
}

// Where the ranks span hosts and nothing fixes it, the rings' segment grows (from 32 KiB
// to 512 KiB); ELASTICRUN_SEGMENT or HostCommConfig::segment fixes it; one host: 256 KiB.
TEST(Settings, SegmentsByLayout) {
  Env s(env::kSegment, nullptr);
  auto of = [](int local_size, std::optional<std::size_t> segment = std::nullopt) {
    HostCommConfig c;
    c.size = 8;
    c.local_size = local_size;
    c.segment = segment;
    const Segments r = resolve_segments(c);
    return std::pair{r.least, r.most};
  };
  using P = std::pair<std::size_t, std::size_t>;
  EXPECT_EQ(of(1), P(32 << 10, 512 << 10));
  EXPECT_EQ(of(2), P(32 << 10, 512 << 10));
  EXPECT_EQ(of(8), P(256 << 10, 0));
  EXPECT_EQ(of(0), P(256 << 10, 0));  // unknown: all on one host
  EXPECT_EQ(of(1, 4096), P(4096, 0));
  s.set("128K");
  EXPECT_EQ(of(1), P(128 << 10, 0));
  EXPECT_EQ(of(8), P(128 << 10, 0));
  EXPECT_EQ(of(1, 4096), P(4096, 0));  // the config's over the variable
}

TEST(Settings, Devices) {
  Env d(env::kDevice, "3"), h(env::kDeviceHint, "5");
  EXPECT_EQ(device(), 3);
  EXPECT_EQ(device_hint(), 5);
  d.set("1048576");  // 2^20, the largest index taken
  EXPECT_EQ(device(), 1 << 20);
  for (const char* bad : {"-1", "+1", " 1", "1x", "1048577", "99999999999999999999"}) {
    d.set(bad);
    EXPECT_EQ(error_of([] { device(); }),
              std::string("ELASTICRUN_DEVICE='") + bad + "' is not a device index (a non-negative integer)");
  }
  h.set("x");
  EXPECT_EQ(error_of([] { device_hint(); }),
            "ELASTICRUN_DEVICE_HINT='x' is not a device index (a non-negative integer)");
}

TEST(Settings, NcclShrink) {
  Env s(env::kNcclShrink, "0");
  EXPECT_FALSE(nccl_shrink());
  s.set("1");
  EXPECT_TRUE(nccl_shrink());
  s.set("yes");
  EXPECT_EQ(error_of([] { nccl_shrink(); }), "ELASTICRUN_NCCL_SHRINK='yes' is not 0 or 1");
}

// What the daemon sets: all required, slot and epoch non-negative integers.
TEST(Settings, Worker) {
  Env secret(env::kSecret, "ab"), host(env::kHost, "node3"), slot(env::kSlot, "2"), epoch(env::kEpoch, "7"),
      addr(env::kRendezvousAddr, "127.0.0.1:4000");
  Worker w = worker();
  EXPECT_EQ(w.secret_hex, "ab");
  EXPECT_EQ(w.host, "node3");
  EXPECT_EQ(w.slot, 2);
  EXPECT_EQ(w.epoch, 7u);
  EXPECT_EQ(w.rendezvous, "127.0.0.1:4000");
  slot.set("-2");
  EXPECT_EQ(error_of([] { worker(); }), "ELASTICRUN_SLOT='-2' is not a non-negative integer");
  slot.set("2");
  addr.set(nullptr);
  EXPECT_EQ(error_of([] { worker(); }),
            "ELASTICRUN_RENDEZVOUS_ADDR is not set: run this program under elasticrun (elasticrun -np N program ...)");
}

}  // namespace
}  // namespace elasticrun::collective::settings
