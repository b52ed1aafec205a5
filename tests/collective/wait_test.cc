// How a blocking UcxTransport waits (host/ucx_transport.h): with nothing to do, a wait
// first yields the core for Options::yield_window, then sleeps on the worker's event
// descriptor; after sleep_at_once(true) it sleeps at once, and after sleep_at_once(false)
// it yields first again. Seen in the waiting thread's own CPU time: a message 150 ms late
// costs a yielding wait most of its 60 ms window (the other rank sleeps, so the yields
// come straight back), and a sleeping one nearly nothing.
#include "rank_fixture.h"
#include "host/sub_transport.h"
#include "host/ucx_transport.h"

#include <gtest/gtest.h>

#include <ctime>
#include <thread>

namespace elasticrun::collective::testing {
namespace {

using namespace std::chrono_literals;

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Rank 0 receives three messages, each sent 150 ms after rank 1 hears that rank 0 waits:
// first with the default wait, then sleeping at once, then (sleep_at_once(false)) the
// default again. Returns rank 0's CPU time in each wait, in ms.
std::vector<double> cpu_per_wait(bool blocking) {
  World w(2);
  std::vector<double> cpu;
  auto rank = [&](int r) {
    UcxTransport::Options o;
    o.rank = r;
    o.size = 2;
    o.local_size = 2;
    o.scope = "wait/";
    o.blocking = blocking;
    o.yield_window = 60ms;
    UcxTransport ucx(o, w.store, w.aborts[r]);
    Transport& tp = ucx;
    SubTransport sub(ucx, {0, 1});
    Transport& both = sub;  // what the hierarchy's leaders wait through
    for (int round = 0; round < 3; ++round) {
      std::uint64_t go = 0, data = 0;
      if (r == 1) {
        Transport::Request req = tp.irecv(0, Transport::make_tag(round, 0), &go, sizeof go);
        tp.wait(req, Clock::now() + 10s, "go");
        std::this_thread::sleep_for(150ms);
        data = 100 + round;
        req = tp.isend(0, Transport::make_tag(round, 1), &data, sizeof data);
        tp.wait(req, Clock::now() + 10s, "data");
        continue;
      }
      both.sleep_at_once(round == 1);
      Transport::Request req = tp.isend(1, Transport::make_tag(round, 0), &go, sizeof go);
      tp.wait(req, Clock::now() + 10s, "go");
      req = both.irecv(1, Transport::make_tag(round, 1), &data, sizeof data);
      const double before = thread_cpu_ms();
      both.wait(req, Clock::now() + 10s, "data");
      cpu.push_back(thread_cpu_ms() - before);
      EXPECT_EQ(data, 100u + round);
    }
    // Rank 1 stays until rank 0 is done with it (closing endpoints wants both sides).
    std::uint64_t bye = 0;
    Transport::Request req = r == 0 ? tp.isend(1, Transport::make_tag(9, 0), &bye, sizeof bye)
                                    : tp.irecv(0, Transport::make_tag(9, 0), &bye, sizeof bye);
    tp.wait(req, Clock::now() + 10s, "bye");
  };
  std::thread one(rank, 1);
  rank(0);
  one.join();
  return cpu;
}

TEST(Wait, ABlockingWaitSleepsAtOnceWhenToldAndYieldsFirstOtherwise) {
  std::vector<double> cpu = cpu_per_wait(true);
  ASSERT_EQ(cpu.size(), 3u);
  std::printf("CPU in a wait of 150 ms: yielding first %.1f ms, sleeping at once %.1f ms, yielding again %.1f ms\n",
              cpu[0], cpu[1], cpu[2]);
  EXPECT_GT(cpu[0], 15.0);
  EXPECT_LT(cpu[1], 5.0);
  EXPECT_GT(cpu[2], 15.0);
}

TEST(Wait, OnlyABlockingTransportSleeps) {
  World w(1);
  UcxTransport::Options o;
  o.scope = "sleeps/";
  UcxTransport busy(o, w.store, w.aborts[0]);
  EXPECT_FALSE(busy.sleeps());
  EXPECT_FALSE(SubTransport(busy, {0}).sleeps());
  o.blocking = true;
  o.scope = "sleeps2/";
  UcxTransport blocking(o, w.store, w.aborts[0]);
  EXPECT_TRUE(blocking.sleeps());
  EXPECT_TRUE(SubTransport(blocking, {0}).sleeps());
}

}  // namespace
}  // namespace elasticrun::collective::testing
