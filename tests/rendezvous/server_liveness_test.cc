// The worker timeout over loopback: the real client's heartbeat thread keeps an idle
// worker in, and a joined connection that sends nothing is given up as silent.
#include "server_fixture.h"

#include "common/handshake.h"

#include <sys/socket.h>
#include <unistd.h>

namespace elasticrun {
namespace {

using namespace std::chrono_literals;

class WorkerTimeoutTest : public RendezvousTest {
 protected:
  WorkerTimeoutTest() { worker_timeout_ = 400ms; }

  // A worker that joins (h1, slot 0) and then sends nothing by itself, as a stopped
  // process would: no heartbeat thread. Returns its socket.
  int silent_join() {
    int fd = raw_connect();
    FdChannel ch(fd, fd);
    auto deadline = Clock::now() + 5s;
    handshake::Client hs(secret_, "worker");
    auto hello = ch.read(deadline);
    EXPECT_TRUE(hello);
    EXPECT_TRUE(ch.write(msg::to_frame(hs.answer(msg::parse<msg::Hello>(*hello))), deadline));
    EXPECT_TRUE(ch.read(deadline));  // auth-ok
    join_sent_ = Clock::now();  // the server starts watching once it has the Join: later
    EXPECT_TRUE(ch.write(msg::to_frame(msg::Join{"h1", 0, 4242, 1}), deadline));
    auto ok = ch.read(deadline);
    EXPECT_TRUE(ok);
    joined_ = msg::parse<msg::JoinOk>(*ok);
    return fd;
  }
  std::vector<std::pair<int, std::chrono::milliseconds>> silent() {
    return on_io([this] { return silent_; });
  }
  std::vector<int> lost() {
    return on_io([this] { return lost_ranks_; });
  }

  msg::JoinOk joined_;
  Clock::time_point join_sent_;
};

TEST_F(WorkerTimeoutTest, JoinOkAsksForFiveBeatsPerTimeout) {
  auto c = join("h0", 0);
  EXPECT_EQ(c->joined().heartbeat_ms, 80u);
}

TEST_F(WorkerTimeoutTest, AWorkerWhoseProgramIsBusyKeepsItsPlace) {
  auto a = join("h0", 0), b = join("h0", 1);
  // Neither program does anything with its connection for three timeouts (a long step);
  // their heartbeat threads speak for them.
  std::this_thread::sleep_for(3 * worker_timeout_);
  EXPECT_TRUE(silent().empty());
  EXPECT_TRUE(lost().empty());
  a->set("k", {1});
  EXPECT_EQ(b->get("k", Clock::now() + 2s), (collective::Bytes{1}));
  EXPECT_FALSE(a->abort_signal()->raised());
}

TEST_F(WorkerTimeoutTest, ASilentWorkerIsGivenUpAfterTheTimeoutAndNotReportedLost) {
  int fd = silent_join();
  auto joined = Clock::now();
  EXPECT_EQ(joined_.rank, 2);
  EXPECT_TRUE(closed_by_peer(fd, 3000));
  auto closed = Clock::now();
  ::close(fd);
  // Not before the timeout (counted from before the Join was sent, which the server's
  // count starts after); after it within a tick (20 ms), and slack for a loaded machine.
  EXPECT_GE(closed - join_sent_, worker_timeout_);
  EXPECT_LT(closed - joined, worker_timeout_ + 600ms);
  auto s = silent();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].first, 2);
  EXPECT_GE(s[0].second, worker_timeout_);
  EXPECT_TRUE(lost().empty());  // reported once, as silent
}

// A worker that said it is leaving may take its time to exit: it is not watched.
TEST_F(WorkerTimeoutTest, AWorkerThatLeftIsNotGivenUp) {
  int fd = silent_join();
  FdChannel ch(fd, fd);
  ASSERT_TRUE(ch.write(msg::to_frame(msg::Leave{}), Clock::now() + 1s));
  EXPECT_FALSE(closed_by_peer(fd, 3 * static_cast<int>(worker_timeout_.count())));
  ::close(fd);
  EXPECT_TRUE(silent().empty());
}

class NoWorkerTimeoutTest : public WorkerTimeoutTest {
 protected:
  NoWorkerTimeoutTest() { worker_timeout_ = 0ms; }
};

TEST_F(NoWorkerTimeoutTest, WithoutATimeoutNoHeartbeatIsAskedForAndNobodyIsGivenUp) {
  EXPECT_EQ(join("h0", 0)->joined().heartbeat_ms, 0u);
  int fd = silent_join();
  EXPECT_EQ(joined_.heartbeat_ms, 0u);
  EXPECT_FALSE(closed_by_peer(fd, 1000));
  ::close(fd);
  EXPECT_TRUE(silent().empty());
}

}  // namespace
}  // namespace elasticrun
