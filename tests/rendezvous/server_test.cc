// The rendezvous server against the real worker-side client, over loopback TCP.
#include "server_fixture.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <thread>

namespace elasticrun {
namespace {

TEST_F(RendezvousTest, JoinAssignsRanksAndTopology) {
  auto c = join("h1", 0);
  EXPECT_EQ(c->joined().rank, 2);
  EXPECT_EQ(c->joined().size, 3);
  EXPECT_EQ(c->joined().local_size, 1);
  EXPECT_EQ(c->joined().cross_rank, 1);
  EXPECT_EQ(c->joined().cross_size, 2);
}

// A place that left and joins the same epoch again (shutdown() and init() in one
// process) is told which join of the epoch this is: its key-value scope then differs
// from the one its previous incarnation published in.
TEST_F(RendezvousTest, AJoinAgainOfTheSameEpochIsCounted) {
  auto c = join("h1", 0);
  EXPECT_EQ(c->joined().join_seq, 1u);
  c->leave();
  c.reset();
  auto again = join("h1", 0);
  EXPECT_EQ(again->joined().rank, 2);
  EXPECT_EQ(again->joined().join_seq, 2u);
  EXPECT_EQ(join("h0", 0)->joined().join_seq, 1u);  // counted by place
}

TEST_F(RendezvousTest, KeyValueGetWaitsForSet) {
  auto a = join("h0", 0), b = join("h0", 1);
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    a->set("addr/0", {1, 2, 3});
  });
  auto v = b->get("addr/0", Clock::now() + std::chrono::seconds(5));
  setter.join();
  EXPECT_EQ(v, (collective::Bytes{1, 2, 3}));
  EXPECT_THROW(b->get("never", Clock::now() + std::chrono::milliseconds(100)), TimeoutError);
}

TEST_F(RendezvousTest, BarrierReleasesAllOnlyWhenAllArrive) {
  auto a = join("h0", 0), b = join("h0", 1), c = join("h1", 0);
  std::atomic<int> passed{0};
  std::thread ta([&] { a->barrier("x", Clock::now() + std::chrono::seconds(5)); ++passed; });
  std::thread tb([&] { b->barrier("x", Clock::now() + std::chrono::seconds(5)); ++passed; });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(passed.load(), 0);
  c->barrier("x", Clock::now() + std::chrono::seconds(5));
  ta.join();
  tb.join();
  EXPECT_EQ(passed.load(), 2);
}

TEST_F(RendezvousTest, WrongSecretIsRefused) {
  auto wrong = auth::random_secret();
  EXPECT_THROW(join("h0", 0, &wrong), ProtocolError);
  auto ok = join("h0", 0);  // the server still serves the others
  EXPECT_EQ(ok->joined().rank, 0);
}

TEST_F(RendezvousTest, UnknownSlotIsRefused) {
  EXPECT_THROW(join("h9", 0), Error);
  EXPECT_THROW(join("h1", 1), Error);
}

TEST_F(RendezvousTest, GarbageAndOversizedFramesCloseOnlyThatConnection) {
  auto good = join("h0", 0);
  int g = raw_connect();
  std::string junk = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_EQ(::write(g, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  EXPECT_TRUE(closed_by_peer(g, 2000));
  ::close(g);
  int big = raw_connect();
  auto h = encode_header(msg::kAuth, kMaxFramePayload + 1);
  ASSERT_EQ(::write(big, h.data(), h.size()), static_cast<ssize_t>(h.size()));
  EXPECT_TRUE(closed_by_peer(big, 2000));
  ::close(big);
  // Silent connections are dropped at the handshake deadline.
  int silent = raw_connect();
  EXPECT_TRUE(closed_by_peer(silent, 3000));
  ::close(silent);
  good->set("still", {9});
  EXPECT_EQ(good->get("still", Clock::now() + std::chrono::seconds(2)), (collective::Bytes{9}));
}

// Before the secret is proved, a frame may be as large as an Auth frame: a peer that
// announces more is closed at once, not buffered until the handshake timeout (here
// longer than the test). After the handshake, frames up to kMaxFramePayload pass.
class LongHandshakeTest : public RendezvousTest {
 protected:
  LongHandshakeTest() { handshake_timeout_ = std::chrono::seconds(60); }
};

TEST_F(LongHandshakeTest, AnUnprovenPeerCannotAnnounceALargeFrame) {
  int fd = raw_connect();
  char hello[256];
  ASSERT_GT(::read(fd, hello, sizeof hello), 0);
  auto h = encode_header(msg::kAuth, handshake::kMaxPayload + 1);
  ASSERT_EQ(::write(fd, h.data(), h.size()), static_cast<ssize_t>(h.size()));
  EXPECT_TRUE(closed_by_peer(fd, 5000)) << "a frame header above the handshake limit was not refused";
  ::close(fd);
  // A proven worker's frames are not held to that limit.
  auto w = join("h0", 0);
  collective::Bytes value(256 << 10, 7);
  w->set("big", value);
  EXPECT_EQ(w->get("big", Clock::now() + std::chrono::seconds(5)), value);
}

TEST_F(RendezvousTest, MalformedFrameAfterJoinClosesThatWorker) {
  int fd = raw_connect();
  // A well-framed but undecodable auth message.
  auto f = encode_frame(Frame{msg::kAuth, {1, 2, 3}});
  // Read the hello first so the server is in the auth phase.
  char buf[256];
  ASSERT_GT(::read(fd, buf, sizeof buf), 0);
  ASSERT_EQ(::write(fd, f.data(), f.size()), static_cast<ssize_t>(f.size()));
  EXPECT_TRUE(closed_by_peer(fd, 2000));
  ::close(fd);
}

TEST_F(RendezvousTest, NotificationsRaiseTheAbortSignalPromptly) {
  auto c = join("h0", 0);
  auto t0 = Clock::now();
  asio::post(io_, [this] { server_->abort_epoch("rank 1 died"); });
  while (!c->abort_signal()->raised() && Clock::now() - t0 < std::chrono::seconds(2))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(c->abort_signal()->raised());
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(200));
  EXPECT_THROW(c->abort_signal()->check(), WorkersFailed);
  EXPECT_EQ(c->abort_signal()->reason(), "rank 1 died");
  // A blocked get returns with the abort rather than at its deadline.
  EXPECT_THROW(c->get("never", Clock::now() + std::chrono::seconds(10)), WorkersFailed);
}

TEST_F(RendezvousTest, RejoinWaitsForTheNextEpochAndTakesTheNewPlace) {
  auto a = join("h0", 0), b = join("h0", 1), c = join("h1", 0);
  std::thread starter([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    // h0 failed: the next epoch has h1 only.
    asio::post(io_, [this] {
      server_->start_epoch(rendezvous::assign({{"h1", 1}}, 0, 2), msg::NotifyKind::abort, "h0 failed");
    });
  });
  auto j = c->rejoin(2, Clock::now() + std::chrono::seconds(5));
  starter.join();
  EXPECT_EQ(j.epoch, 2u);
  EXPECT_EQ(j.rank, 0);
  EXPECT_EQ(j.size, 1);
  EXPECT_FALSE(c->abort_signal()->raised());  // the abort for epoch 2 is answered
  // A worker not in the new epoch learns it was removed.
  EXPECT_THROW(a->rejoin(2, Clock::now() + std::chrono::seconds(5)), Error);
  // Key-value state is per epoch: c works in epoch 2.
  c->set("k", {1});
  EXPECT_EQ(c->get("k", Clock::now() + std::chrono::seconds(2)), (collective::Bytes{1}));
}

TEST_F(RendezvousTest, HostsUpdatedOnlyFlagsAndKeepsTheOldEpochServing) {
  auto a = join("h0", 0), b = join("h0", 1);
  a->set("addr/0", {7});
  std::promise<void> done;
  asio::post(io_, [&] {
    server_->start_epoch(rendezvous::assign({{"h0", 2}, {"h1", 1}, {"h2", 1}}, 0, 2), msg::NotifyKind::hosts_updated,
                         "host added");
    done.set_value();
  });
  done.get_future().wait();
  auto t0 = Clock::now();
  while (!a->hosts_updated() && Clock::now() - t0 < std::chrono::seconds(2))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(a->hosts_updated());
  EXPECT_FALSE(a->abort_signal()->raised());
  // The old epoch's table still answers its workers until they re-join.
  EXPECT_EQ(b->get("addr/0", Clock::now() + std::chrono::seconds(2)), (collective::Bytes{7}));
  auto j = a->rejoin(2, Clock::now() + std::chrono::seconds(2));
  EXPECT_EQ(j.size, 4);
  EXPECT_FALSE(a->hosts_updated());
}

TEST_F(RendezvousTest, ConnectionLossWithoutLeaveIsReported) {
  {
    auto c = join("h0", 1);
    c->leave();  // a clean exit: not a loss
  }
  { auto d = join("h1", 0); }  // closes without leave, as a crashed worker would
  int fd = raw_connect();
  ::close(fd);  // never joined: not a worker loss
  std::vector<int> lost;
  for (int i = 0; i < 100 && lost.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::promise<std::vector<int>> p;
    asio::post(io_, [&] { p.set_value(lost_ranks_); });
    lost = p.get_future().get();
  }
  EXPECT_EQ(lost, (std::vector<int>{2}));
}

// h1 is removed in epoch 2 and listed again in epoch 3, where a new worker (started in
// epoch 3) holds its place. The old worker, still stopping, may neither re-join nor join
// it, and its lost connection is reported as its own (started in epoch 1).
TEST_F(RendezvousTest, PlaceListedAgainBelongsToItsNewWorkerOnly) {
  auto old = join("h1", 0);
  on_io([this] { server_->start_epoch(rendezvous::assign({{"h0", 2}}, 0, 2), msg::NotifyKind::abort, "removed"); });
  on_io([this] {
    auto a = rendezvous::assign({{"h0", 2}, {"h1", 1}}, 0, 3);
    for (auto& w : a.workers) w.started_epoch = w.host == "h1" ? 3 : 1;
    server_->start_epoch(a, msg::NotifyKind::hosts_updated, "listed again");
  });
  EXPECT_THROW(old->rejoin(3, Clock::now() + std::chrono::seconds(5)), Error);
  EXPECT_THROW(join("h1", 0, nullptr, 1), Error);
  auto fresh = join("h1", 0, nullptr, 3);
  EXPECT_EQ(fresh->joined().epoch, 3u);
  EXPECT_EQ(fresh->joined().rank, 2);
  old.reset();  // closes without leave
  std::vector<std::uint64_t> lost;
  for (int i = 0; i < 100 && lost.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    lost = on_io([this] { return lost_started_; });
  }
  EXPECT_EQ(lost, (std::vector<std::uint64_t>{1}));
}

}  // namespace
TEST_F(RendezvousTest, ACheckpointRequestReachesEveryWorkerAndThoseThatJoinLater) {
  auto a = join("h0", 0);
  EXPECT_EQ(a->checkpoint_requests(), 0u);
  asio::post(io_, [this] { server_->request_checkpoint("SIGTERM"); });
  auto t0 = Clock::now();
  while (a->checkpoint_requests() == 0 && Clock::now() - t0 < std::chrono::seconds(2))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(a->checkpoint_requests(), 1u);
  // A request interrupts nothing: it is not an abort, and the epoch's table still answers.
  EXPECT_FALSE(a->abort_signal()->raised());
  a->set("k", {3});
  EXPECT_EQ(a->get("k", Clock::now() + std::chrono::seconds(2)), (collective::Bytes{3}));
  // A worker that joins after the request (a new epoch's, which may be the rank 0 that
  // commits next) is told too.
  auto b = join("h0", 1);
  t0 = Clock::now();
  while (b->checkpoint_requests() == 0 && Clock::now() - t0 < std::chrono::seconds(2))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(b->checkpoint_requests(), 1u);
  EXPECT_EQ(a->checkpoint_requests(), 1u);
}

}  // namespace elasticrun
