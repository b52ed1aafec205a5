#include "common/auth.h"
#include "common/frame.h"
#include "common/messages.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <random>

namespace elasticrun {
namespace {

TEST(Wire, RoundTripsEveryFieldKind) {
  wire::Encoder e;
  e.u8(7).u32(0xdeadbeef).u64(1ull << 40).i32(-5).str("héllo").strings({"a", "", "c"});
  wire::Bytes b = e.take();
  wire::Decoder d(b);
  EXPECT_EQ(d.u8(), 7);
  EXPECT_EQ(d.u32(), 0xdeadbeefu);
  EXPECT_EQ(d.u64(), 1ull << 40);
  EXPECT_EQ(d.i32(), -5);
  EXPECT_EQ(d.str(), "héllo");
  EXPECT_EQ(d.strings(), (std::vector<std::string>{"a", "", "c"}));
  EXPECT_NO_THROW(d.finish());
}

TEST(Wire, TruncatedInputThrowsDecodeError) {
  wire::Bytes b = wire::Encoder().str("abcdef").take();
  b.resize(b.size() - 1);
  wire::Decoder d(b);
  EXPECT_THROW(d.str(), wire::DecodeError);
}

TEST(Wire, OversizedFieldsAndListsAreRejected) {
  wire::Bytes b = wire::Encoder().u32(1000).take();
  wire::Decoder d(b, /*max_string=*/10);
  EXPECT_THROW(d.str(), wire::DecodeError);
  wire::Bytes l = wire::Encoder().u32(1u << 30).take();
  wire::Decoder dl(l);
  EXPECT_THROW(dl.strings(), wire::DecodeError);
}

TEST(Wire, TrailingBytesFailFinish) {
  wire::Bytes b = wire::Encoder().u32(1).u8(0).take();
  wire::Decoder d(b);
  d.u32();
  EXPECT_THROW(d.finish(), wire::DecodeError);
}

TEST(Frame, ParserReassemblesFramesSplitAnywhere) {
  wire::Bytes stream;
  for (int i = 0; i < 5; ++i) {
    auto f = encode_frame(msg::to_frame(msg::KvSet{static_cast<std::uint64_t>(i), fmt::format("k{}", i), wire::Bytes(i * 100, 1)}));
    stream.insert(stream.end(), f.begin(), f.end());
  }
  for (std::size_t chunk : {1u, 3u, 7u, 64u, 100000u}) {
    FrameParser p;
    std::vector<Frame> got;
    for (std::size_t off = 0; off < stream.size(); off += chunk) {
      std::size_t n = std::min(chunk, stream.size() - off);
      ASSERT_TRUE(p.feed({stream.data() + off, n}).ok());
      while (p.has_frame()) got.push_back(p.pop());
    }
    ASSERT_EQ(got.size(), 5u) << "chunk " << chunk;
    for (int i = 0; i < 5; ++i) {
      auto m = msg::parse<msg::KvSet>(got[i]);
      EXPECT_EQ(m.req, static_cast<std::uint64_t>(i));
      EXPECT_EQ(m.value.size(), static_cast<std::size_t>(i * 100));
    }
  }
}

TEST(Frame, BadMagicVersionAndLengthAreRejected) {
  FrameParser p;
  const char* http = "GET / HTTP/1.1\r\n\r\n";
  auto r = p.feed({reinterpret_cast<const std::uint8_t*>(http), std::strlen(http)});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("magic"), std::string::npos);

  auto h = encode_header(msg::kJoin, 10);
  h[3] = 9;
  FrameParser p2;
  EXPECT_FALSE(p2.feed(h).ok());

  auto big = encode_header(msg::kJoin, kMaxFramePayload + 1);
  FrameParser p3;
  auto r3 = p3.feed(big);
  ASSERT_FALSE(r3.ok());
  EXPECT_NE(r3.error().find("limit"), std::string::npos);
}

// A worker's program may leave SIGPIPE at its default: writing to a connection the
// server closed must be an error the caller sees, not the signal that kills it.
TEST(Frame, WritingToAClosedSocketIsAnErrorNotSigpipe) {
  auto old = std::signal(SIGPIPE, SIG_DFL);
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ::close(sv[1]);
  FdChannel ch(sv[0], sv[0]);
  auto ok = ch.write(msg::to_frame(msg::Heartbeat{}), FdChannel::Clock::now() + std::chrono::seconds(1));
  ::close(sv[0]);
  std::signal(SIGPIPE, old);
  ASSERT_FALSE(ok);
  EXPECT_NE(ok.error().find("write"), std::string::npos) << ok.error();
}

TEST(Frame, RandomGarbageNeverCrashesTheDecoders) {
  std::mt19937 rng(42);
  for (int i = 0; i < 2000; ++i) {
    wire::Bytes junk(rng() % 64);
    for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
    Frame f{static_cast<std::uint8_t>(rng() % 48), junk};
    // Each decoder either succeeds or throws DecodeError; nothing else escapes.
    auto attempt = [&](auto tag) {
      using M = decltype(tag);
      try {
        f.type = M::kType;
        (void)msg::parse<M>(f);
      } catch (const wire::DecodeError&) {
      }
    };
    attempt(msg::Hello{});
    attempt(msg::Auth{});
    attempt(msg::Join{});
    attempt(msg::KvSet{});
    attempt(msg::KvGet{});
    attempt(msg::Notify{});
    attempt(msg::Spawn{});
    attempt(msg::Output{});
    attempt(msg::Exited{});
    attempt(msg::Report{});
    attempt(msg::ReportReply{});
    attempt(msg::CheckpointNote{});
    attempt(msg::Synced{});
    attempt(msg::ReservePort{});
    attempt(msg::PortReserved{});
  }
}

// JoinOk's join sequence: round-trips; a first join's answer is the bytes it was before
// the field (what an older library reads), and one without it reads as the first join;
// 0 is malformed.
TEST(Messages, JoinOkCarriesItsJoinSequence) {
  msg::JoinOk j{7, 3, 1, 4, 1, 2, 0, 2, 250, 5};
  Frame f = msg::to_frame(j);
  EXPECT_EQ(msg::parse<msg::JoinOk>(f).join_seq, 5u);
  j.join_seq = 1;
  Frame first = msg::to_frame(j);
  EXPECT_EQ(first.payload.size() + 4, f.payload.size());
  auto back = msg::parse<msg::JoinOk>(first);
  EXPECT_EQ(back.join_seq, 1u);
  EXPECT_EQ(back.heartbeat_ms, 250u);
  wire::Encoder e;
  j.encode(e);
  e.u32(0);
  EXPECT_THROW(msg::parse<msg::JoinOk>(Frame{msg::kJoinOk, e.take()}), wire::DecodeError);
}

TEST(Messages, ParseRejectsTheWrongType) {
  Frame f = msg::to_frame(msg::Ok{3});
  EXPECT_THROW(msg::parse<msg::Join>(f), wire::DecodeError);
}

TEST(Messages, SpawnRoundTrips) {
  msg::Spawn s{3, 7, 2, 4, {"./train", "--lr", "0.1"}, {"A=1", "B=two"}, 5};
  auto back = msg::parse<msg::Spawn>(msg::to_frame(s));
  EXPECT_EQ(back.slot, 3u);
  EXPECT_EQ(back.epoch, 7u);
  EXPECT_EQ(back.rank, 2);
  EXPECT_EQ(back.argv, s.argv);
  EXPECT_EQ(back.env, s.env);
  EXPECT_EQ(back.local_size, 5);
}

TEST(Messages, ExitedCarriesTheErrorFile) {
  msg::Exited x{2, 4242, 1, 0, R"({"message": "boom"})", 19};
  auto back = msg::parse<msg::Exited>(msg::to_frame(x));
  EXPECT_EQ(back.pid, 4242u);
  EXPECT_EQ(back.code, 1);
  EXPECT_EQ(back.error_file, x.error_file);
  EXPECT_EQ(back.error_file_size, 19u);
}

TEST(Messages, APortReservationHasAPortOrAnErrorInRange) {
  auto back = msg::parse<msg::PortReserved>(msg::to_frame(msg::PortReserved{7, 29500, ""}));
  EXPECT_EQ(back.epoch, 7u);
  EXPECT_EQ(back.port, 29500u);
  back = msg::parse<msg::PortReserved>(msg::to_frame(msg::PortReserved{7, 0, "bind: no ports"}));
  EXPECT_EQ(back.error, "bind: no ports");
  EXPECT_FALSE(back.store);
  EXPECT_TRUE(msg::parse<msg::PortReserved>(msg::to_frame(msg::PortReserved{7, 29500, "", true})).store);
  for (const auto& bad : {msg::PortReserved{7, 0, ""}, msg::PortReserved{7, 29500, "and an error"},
                          msg::PortReserved{7, 65536, ""}, msg::PortReserved{7, 0, "no port", true}})
    EXPECT_THROW(msg::parse<msg::PortReserved>(msg::to_frame(bad)), wire::DecodeError) << bad.port;
  auto r = msg::parse<msg::ReservePort>(msg::to_frame(msg::ReservePort{9, true}));
  EXPECT_EQ(r.epoch, 9u);
  EXPECT_TRUE(r.host_store);
  EXPECT_FALSE(msg::parse<msg::ReservePort>(msg::to_frame(msg::ReservePort{9})).host_store);
  // A flag is one byte, 0 or 1: one encoding per value.
  wire::Encoder two;
  two.u64(9).u8(2);
  EXPECT_THROW(msg::parse<msg::ReservePort>(Frame{msg::kReservePort, two.take()}), wire::DecodeError);
  wire::Encoder stored;
  stored.u64(7).u32(29500).str("").u8(7);
  EXPECT_THROW(msg::parse<msg::PortReserved>(Frame{msg::kPortReserved, stored.take()}), wire::DecodeError);
}

TEST(Messages, ReportAndReplyRoundTrip) {
  msg::Report r{9, -3, R"({"loss":0.5})"};
  auto back = msg::parse<msg::Report>(msg::to_frame(r));
  EXPECT_EQ(back.req, 9u);
  EXPECT_EQ(back.step, -3);  // the step travels as a signed 64-bit number
  EXPECT_EQ(back.metrics, r.metrics);
  auto reply = msg::parse<msg::ReportReply>(msg::to_frame(msg::ReportReply{4, msg::Decision::stop}));
  EXPECT_EQ(reply.req, 4u);
  EXPECT_EQ(reply.decision, msg::Decision::stop);
}

TEST(Messages, UnknownReportDecisionIsADecodeError) {
  wire::Encoder e;
  e.u64(1).u8(2);
  EXPECT_THROW(msg::parse<msg::ReportReply>(Frame{msg::kReportReply, e.take()}), wire::DecodeError);
  EXPECT_THROW(msg::parse<msg::ReportReply>(Frame{msg::kReportReply, {1, 0, 0, 0, 0, 0, 0, 0}}), wire::DecodeError);
}

TEST(Messages, CheckpointNoteRoundTripsAndRejectsUnknownEvents) {
  msg::CheckpointNote n{msg::CheckpointEvent::skipped, 3, 40, 1 << 20, 17, "/ck/commit-40.ckpt", "corrupted"};
  auto back = msg::parse<msg::CheckpointNote>(msg::to_frame(n));
  EXPECT_EQ(back.event, msg::CheckpointEvent::skipped);
  EXPECT_EQ(back.epoch, 3u);
  EXPECT_EQ(back.commit, 40u);
  EXPECT_EQ(back.bytes, 1u << 20);
  EXPECT_EQ(back.millis, 17u);
  EXPECT_EQ(back.path, n.path);
  EXPECT_EQ(back.detail, n.detail);
  EXPECT_FALSE(back.requested);
  n.requested = true;
  EXPECT_TRUE(msg::parse<msg::CheckpointNote>(msg::to_frame(n)).requested);
  auto two = msg::to_frame(n);
  two.payload.back() = 2;
  EXPECT_THROW(msg::parse<msg::CheckpointNote>(two), wire::DecodeError);
  for (std::uint8_t bad : {0, 5}) {
    auto f = msg::to_frame(n);
    f.payload[0] = bad;
    EXPECT_THROW(msg::parse<msg::CheckpointNote>(f), wire::DecodeError) << int(bad);
  }
}

TEST(Messages, ConfigAndReadyCarryTheControlProtocol) {
  msg::Config c{wire::Bytes(32, 5), "10.0.0.1:1", "h", "/", 250, 1000};
  c.preload = {"torch", "torch.distributed"};
  c.preempt_grace_ms = 20000;
  auto back = msg::parse<msg::Config>(msg::to_frame(c));
  EXPECT_EQ(back.preempt_grace_ms, 20000u);
  EXPECT_EQ(back.protocol, msg::kControlProtocol);
  EXPECT_EQ(back.heartbeat_ms, 250u);
  EXPECT_EQ(back.host_timeout_ms, 1000u);
  EXPECT_EQ(back.preload, c.preload);
  EXPECT_EQ(msg::parse<msg::Ready>(msg::to_frame(msg::Ready{9, ""})).protocol, msg::kControlProtocol);
}

TEST(Messages, OtherProtocolVersionsDecodeToTheirNumber) {
  // Version 1 ended both messages before the protocol field.
  wire::Encoder old_config;
  old_config.bytes(wire::Bytes(32, 5)).str("10.0.0.1:1").str("h").str("/");
  auto c = msg::parse<msg::Config>(Frame{msg::kConfig, old_config.take()});
  EXPECT_EQ(c.protocol, 1u);
  EXPECT_EQ(c.host_timeout_ms, 0u);
  wire::Encoder old_ready;
  old_ready.u32(9).str("");
  EXPECT_EQ(msg::parse<msg::Ready>(Frame{msg::kReady, old_ready.take()}).protocol, 1u);
  // A later version may add fields of its own: only its number is read.
  wire::Encoder next;
  next.bytes(wire::Bytes(32, 5)).str("a").str("h").str("/").u32(msg::kControlProtocol + 1).str("what next").u64(1);
  EXPECT_EQ(msg::parse<msg::Config>(Frame{msg::kConfig, next.take()}).protocol, msg::kControlProtocol + 1);
  // One encoding per version: a version-1 message re-encodes without the field, and a
  // later version's re-encodes to its bytes up to the number (the fuzzer's regression).
  wire::Encoder v1;
  v1.bytes(wire::Bytes(32, 5)).str("10.0.0.1:1").str("h").str("/");
  EXPECT_EQ(msg::to_frame(c).payload, v1.buffer());
  wire::Encoder later, later_prefix;
  later_prefix.bytes(wire::Bytes(2, 5)).str("a").str("h").str("/").u32(7);
  later.bytes(wire::Bytes(2, 5)).str("a").str("h").str("/").u32(7).u32(250).u32(1000);
  auto l = msg::parse<msg::Config>(Frame{msg::kConfig, later.take()});
  EXPECT_EQ(l.protocol, 7u);
  EXPECT_EQ(msg::to_frame(l).payload, later_prefix.buffer());
  // An explicit 0 or 1 was never sent (version 1 ends the message before the field): a
  // second encoding of version 1, refused.
  for (std::uint32_t v : {0u, 1u}) {
    wire::Encoder explicit_old;
    explicit_old.u32(9).str("").u32(v);
    EXPECT_THROW(msg::parse<msg::Ready>(Frame{msg::kReady, explicit_old.take()}), wire::DecodeError) << v;
  }
  // Our own version with fields missing is malformed.
  wire::Encoder cut;
  cut.bytes(wire::Bytes(32, 5)).str("a").str("h").str("/").u32(msg::kControlProtocol).u32(250);
  EXPECT_THROW(msg::parse<msg::Config>(Frame{msg::kConfig, cut.take()}), wire::DecodeError);
  wire::Encoder no_preload;
  no_preload.bytes(wire::Bytes(32, 5)).str("a").str("h").str("/").u32(msg::kControlProtocol).u32(250).u32(1000);
  EXPECT_THROW(msg::parse<msg::Config>(Frame{msg::kConfig, no_preload.take()}), wire::DecodeError);
  wire::Encoder no_grace;
  no_grace.bytes(wire::Bytes(32, 5)).str("a").str("h").str("/").u32(msg::kControlProtocol).u32(250).u32(1000).strings(
      {});
  EXPECT_THROW(msg::parse<msg::Config>(Frame{msg::kConfig, no_grace.take()}), wire::DecodeError);
}

TEST(Messages, AnEarlierVersionsConfigDecodesWholeToItsNumber) {
  // Versions 2 and 3 ended after the heartbeat settings (no preload list): read whole,
  // so that the daemon names the version it refuses, and re-encoded to the same bytes.
  for (std::uint32_t v : {2u, 3u}) {
    wire::Encoder e;
    e.bytes(wire::Bytes(32, 5)).str("a").str("h").str("/").u32(v).u32(250).u32(1000);
    Frame f{msg::kConfig, e.take()};
    auto c = msg::parse<msg::Config>(f);
    EXPECT_EQ(c.protocol, v);
    EXPECT_EQ(c.heartbeat_ms, 250u);
    EXPECT_EQ(c.host_timeout_ms, 1000u);
    EXPECT_TRUE(c.preload.empty());
    EXPECT_EQ(msg::to_frame(c).payload, f.payload) << v;
  }
  // Versions 4 and 5 ended after the preload list.
  for (std::uint32_t v : {4u, 5u}) {
    wire::Encoder e;
    e.bytes(wire::Bytes(32, 5)).str("a").str("h").str("/").u32(v).u32(250).u32(1000).strings({"torch"});
    Frame f{msg::kConfig, e.take()};
    auto c = msg::parse<msg::Config>(f);
    EXPECT_EQ(c.protocol, v);
    EXPECT_EQ(c.preload, (std::vector<std::string>{"torch"}));
    EXPECT_EQ(c.preempt_grace_ms, 0u);
    EXPECT_EQ(msg::to_frame(c).payload, f.payload) << v;
  }
}

TEST(Messages, PreemptedAndTheCheckpointNotice) {
  EXPECT_EQ(msg::parse<msg::Preempted>(msg::to_frame(msg::Preempted{15})).signal, 15);
  msg::Notify n{msg::NotifyKind::checkpoint, 4, "SIGTERM"};
  EXPECT_EQ(msg::parse<msg::Notify>(msg::to_frame(n)).kind, msg::NotifyKind::checkpoint);
  auto f = msg::to_frame(n);
  f.payload[0] = 5;
  EXPECT_THROW(msg::parse<msg::Notify>(f), wire::DecodeError);
}

TEST(Auth, ProofsDependOnSecretNoncesAndRole) {
  auto s = auth::random_secret(), other = auth::random_secret();
  auto sn = auth::random_nonce(), cn = auth::random_nonce();
  auto p = auth::client_proof(s, "worker", sn, cn);
  EXPECT_TRUE(auth::digest_equal(p, auth::client_proof(s, "worker", sn, cn)));
  EXPECT_FALSE(auth::digest_equal(p, auth::client_proof(other, "worker", sn, cn)));
  EXPECT_FALSE(auth::digest_equal(p, auth::client_proof(s, "daemon", sn, cn)));
  EXPECT_FALSE(auth::digest_equal(p, auth::client_proof(s, "worker", auth::random_nonce(), cn)));
  // The server's proof is not the client's (no reflection).
  EXPECT_FALSE(auth::digest_equal(p, auth::server_proof(s, "worker", sn, cn)));
}

TEST(Auth, HmacMatchesAnIndependentImplementation) {
  // Expected value from Python: hmac.new(bytes(32), b"abc", hashlib.sha256).hexdigest()
  auth::Secret zero{};
  std::string m = "abc";
  auto d = auth::hmac_sha256(zero, {reinterpret_cast<const std::uint8_t*>(m.data()), m.size()});
  EXPECT_EQ(auth::to_hex(d), "fd7adb152c05ef80dccf50a1fa4c05d5a3ec6da95575fc312ae7c5d091836351");
}

TEST(Auth, SecretHexRoundTripAndRejection) {
  auto s = auth::random_secret();
  auto back = auth::secret_from_hex(auth::to_hex(s) + "\n");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, s);
  EXPECT_FALSE(auth::secret_from_hex("abc").ok());
  EXPECT_FALSE(auth::secret_from_hex(std::string(64, 'g')).ok());
}

}  // namespace
}  // namespace elasticrun
