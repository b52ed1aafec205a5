// What a rank publishes for its UCX peers (host/ucx_address.h): the encoding, its checks
// of what a peer sent, which address a sender uses, and the locality read from /proc;
// then a rank in a network namespace of its own, where UCX's shared memory would reach it
// but its wake-ups would not.
#include "../require.h"
#include "host/ucx_address.h"
#include "host/ucx_transport.h"
#include "control/memory_store.h"

#include <elasticrun/types.hpp>

#include <gtest/gtest.h>
#include <ucs/async/async_fwd.h>
#include <uct/api/uct.h>

#include <sched.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

namespace elasticrun::collective {
namespace {

using namespace std::chrono_literals;

PublishedAddress sample() {
  return {{"517ad38a-ba5e-47b1-bb54-d4023437a632", 4026532249}, Bytes{1, 2, 3, 4, 5}, Bytes{1, 2}};
}

TEST(UcxAddress, RoundTrips) {
  PublishedAddress a = sample();
  PublishedAddress b = decode_address(encode(a), 3);
  EXPECT_EQ(b.where, a.where);
  EXPECT_EQ(b.full, a.full);
  EXPECT_EQ(b.net_only, a.net_only);
  PublishedAddress unknown{{}, Bytes{9}, Bytes{}};
  EXPECT_FALSE(decode_address(encode(unknown), 0).where.known());
}

TEST(UcxAddress, MalformedNamesThePublisher) {
  Bytes good = encode(sample());
  auto rejects = [](const Bytes& b, const std::string& want) {
    try {
      decode_address(b, 7);
      ADD_FAILURE() << "accepted " << b.size() << " bytes";
    } catch (const ProtocolError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  rejects({}, "rank 7 published a malformed UCX address (truncated");
  for (std::size_t n : {std::size_t{1}, std::size_t{5}, good.size() - 1}) rejects(Bytes(good.begin(), good.begin() + n), "truncated");
  Bytes longer = good;
  longer.push_back(0);
  rejects(longer, "bytes after the end");
  Bytes version = good;
  version[0] = 9;
  rejects(version, "rank 7 published a UCX address of version 9");
  rejects(encode({{}, Bytes{}, Bytes{}}), "rank 7 published an empty UCX address");
}

TEST(UcxAddress, NetworkOnlyForAnotherNetworkNamespaceOfThisMachine) {
  Locality here{"boot-a", 100};
  EXPECT_FALSE(needs_network_only(here, here));
  EXPECT_TRUE(needs_network_only(here, {"boot-a", 101}));
  EXPECT_FALSE(needs_network_only(here, {"boot-b", 101}));  // another machine: UCX's own choice
  EXPECT_FALSE(needs_network_only(here, {"boot-b", 100}));
  EXPECT_FALSE(needs_network_only(here, {}));               // unknown: UCX's own choice
  EXPECT_FALSE(needs_network_only({}, here));
  PublishedAddress peer = sample();
  peer.where = {"boot-a", 101};
  EXPECT_EQ(peer.for_sender_at(here), peer.net_only);
  EXPECT_EQ(peer.for_sender_at({"boot-a", 101}), peer.full);
  EXPECT_EQ(peer.for_sender_at({"boot-b", 100}), peer.full);
}

// Where only TCP joins the hosts, every message goes eager (RNDV_THRESH=inf); a list
// that may name an RDMA transport, or an exclusion list, keeps the rendezvous.
TEST(UcxAddress, TcpOnlyWithoutRdmaDevicesOrWhereUcxTlsNamesNoRdmaTransport) {
  EXPECT_TRUE(network_is_tcp_only(nullptr, false));
  EXPECT_TRUE(network_is_tcp_only("rc,ud", false));  // no device: UCX has nothing but TCP
  EXPECT_FALSE(network_is_tcp_only(nullptr, true));
  EXPECT_FALSE(network_is_tcp_only("", true));
  EXPECT_TRUE(network_is_tcp_only("tcp", true));
  EXPECT_TRUE(network_is_tcp_only("tcp,self", true));
  EXPECT_TRUE(network_is_tcp_only("sm,tcp,cuda_copy,cuda_ipc", true));
  EXPECT_FALSE(network_is_tcp_only("rc,tcp", true));
  EXPECT_FALSE(network_is_tcp_only("tcp,ud_x", true));
  EXPECT_FALSE(network_is_tcp_only("all", true));
  EXPECT_FALSE(network_is_tcp_only("^rc", true));
  EXPECT_FALSE(network_is_tcp_only("tcp,", true));  // an empty name is not one we know
  EXPECT_FALSE(network_is_tcp_only("tcpx", true));
}

// A transport of 2 ranks, `local_size` of them on this host.
UcxTransport transport(int local_size) {
  UcxTransport::Options o;
  o.size = 2;
  o.local_size = local_size;
  o.scope = "rndv" + std::to_string(local_size) + "/";
  return UcxTransport(o, std::make_shared<MemoryStore>(), std::make_shared<AbortSignal>());
}

// The transport runs with it: eager at every size across hosts joined by TCP alone, the
// 256 KiB switch on one host; the user's UCX_RNDV_THRESH over either.
TEST(UcxAddress, TheTransportSendsEverythingEagerAcrossHostsJoinedByTcp) {
  if (std::getenv("UCX_RNDV_THRESH")) GTEST_SKIP() << "UCX_RNDV_THRESH is set here; the test sets it itself";
  const bool tcp = network_is_tcp_only(std::getenv("UCX_TLS"), has_rdma_devices());
  EXPECT_EQ(transport(1).rendezvous_threshold(), tcp ? "inf" : "256K");
  EXPECT_EQ(transport(2).rendezvous_threshold(), "256K");
  ::setenv("UCX_RNDV_THRESH", "64K", 1);
  EXPECT_EQ(transport(1).rendezvous_threshold(), "64K");
  ::unsetenv("UCX_RNDV_THRESH");
}

// Across hosts joined by TCP, UCX's receive buffer (and so its largest fragment) is 1
// MiB, the user's UCX_TCP_RX_SEG_SIZE wins, and one host leaves UCX's own. That UCX takes
// the setting by the name the transport gives it is the next test's: UCP keeps a name it
// does not know without an error, so the constructor's success says nothing of it.
TEST(UcxAddress, TheTransportReceivesTcpInSegmentsOfAMegabyte) {
  if (std::getenv("UCX_TCP_RX_SEG_SIZE")) GTEST_SKIP() << "UCX_TCP_RX_SEG_SIZE is set here; the test sets it itself";
  const bool tcp = network_is_tcp_only(std::getenv("UCX_TLS"), has_rdma_devices());
  EXPECT_EQ(transport(1).tcp_rx_segment(), tcp ? "1M" : "");
  EXPECT_EQ(transport(2).tcp_rx_segment(), "");
  ::setenv("UCX_TCP_RX_SEG_SIZE", "128K", 1);
  EXPECT_EQ(transport(1).tcp_rx_segment(), tcp ? "128K" : "");
  ::unsetenv("UCX_TCP_RX_SEG_SIZE");
}

// What the setting does in UCX: a TCP interface on loopback, its configuration read as
// UCP reads it and given the transport's field as UCP gives it (uct_config_modify), takes
// active messages of up to 1 MiB (less its header) where UCX's default takes 64 KiB. A
// wrong name (TCP_RX_SEG_SIZE, the environment's) leaves UCX's default: UCP keeps a name
// it does not know without a word.
std::size_t tcp_max_zcopy(const char* field, const char* value) {
  uct_component_h* comps = nullptr;
  unsigned ncomps = 0;
  EXPECT_EQ(uct_query_components(&comps, &ncomps), UCS_OK);
  std::size_t max_zcopy = 0;
  for (unsigned i = 0; i < ncomps; ++i) {
    uct_component_attr_t ca{};
    ca.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
    if (uct_component_query(comps[i], &ca) != UCS_OK || std::string(ca.name) != "tcp") continue;
    uct_md_config_t* mdc = nullptr;
    uct_md_h md = nullptr;
    EXPECT_EQ(uct_md_config_read(comps[i], nullptr, nullptr, &mdc), UCS_OK);
    EXPECT_EQ(uct_md_open(comps[i], "tcp", mdc, &md), UCS_OK);
    uct_config_release(mdc);
    uct_iface_config_t* ic = nullptr;
    EXPECT_EQ(uct_md_iface_config_read(md, "tcp", nullptr, nullptr, &ic), UCS_OK);
    if (field) {
      EXPECT_EQ(uct_config_modify(ic, field, value), UCS_OK) << field;
    }
    ucs_async_context_t* async = nullptr;
    EXPECT_EQ(ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async), UCS_OK);
    uct_worker_h worker = nullptr;
    EXPECT_EQ(uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker), UCS_OK);
    uct_iface_params_t ip{};
    ip.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE;
    ip.open_mode = UCT_IFACE_OPEN_MODE_DEVICE;
    ip.mode.device.tl_name = "tcp";
    ip.mode.device.dev_name = "lo";
    uct_iface_h iface = nullptr;
    if (uct_iface_open(md, worker, &ip, ic, &iface) == UCS_OK) {
      uct_iface_attr_t attr{};
      EXPECT_EQ(uct_iface_query(iface, &attr), UCS_OK);
      max_zcopy = attr.cap.am.max_zcopy;
      uct_iface_close(iface);
    }
    uct_config_release(ic);
    uct_worker_destroy(worker);
    ucs_async_context_destroy(async);
    uct_md_close(md);
  }
  uct_release_component_list(comps);
  return max_zcopy;
}

TEST(UcxAddress, UcxTakesTheReceiveSegmentByTheTransportsFieldName) {
  if (std::getenv("UCX_TCP_RX_SEG_SIZE")) GTEST_SKIP() << "UCX_TCP_RX_SEG_SIZE is set here; the test sets it itself";
  const std::size_t ucx_default = tcp_max_zcopy(nullptr, nullptr);
  ASSERT_GT(ucx_default, 0u) << "no TCP interface on loopback";
  EXPECT_LE(ucx_default, 64u * 1024);
  const std::size_t ours = tcp_max_zcopy(UcxTransport::kTcpRxSegmentField, UcxTransport::kTcpRxSegment);
  EXPECT_GT(ours, 1024u * 1024 - 1024);
  EXPECT_LE(ours, 1024u * 1024);
}

TEST(UcxAddress, LocalityIsBootIdAndNetworkNamespace) {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(f, boot);
  struct stat st {};
  ASSERT_EQ(::stat("/proc/self/ns/net", &st), 0) << std::strerror(errno);
  Locality l = this_locality();
  EXPECT_EQ(l.machine, boot);
  EXPECT_EQ(l.netns, st.st_ino);
  EXPECT_TRUE(l.known());
}

// Runs `fn` on a thread of its own in a new network namespace (a namespace is a thread's);
// returns why that is impossible here, or nothing.
std::string in_new_netns(const std::function<void()>& fn) {
  std::string why;
  std::thread t([&] {
    if (::unshare(CLONE_NEWNET) != 0) {
      why = std::string("unshare(CLONE_NEWNET): ") + std::strerror(errno);
      return;
    }
    fn();
  });
  t.join();
  return why;
}

TEST(UcxAddress, AThreadInANewNetworkNamespaceIsOnThisMachineElsewhere) {
  Locality here = this_locality(), there;
  if (auto why = in_new_netns([&] { there = this_locality(); }); !why.empty()) ER_SKIP_UNLESS_REQUIRED("netns", why);
  EXPECT_EQ(there.machine, here.machine);
  EXPECT_NE(there.netns, here.netns);
  EXPECT_TRUE(needs_network_only(here, there));
}

// Rank 1 lives in a network namespace of its own with no interface up: UCX would reach it
// over shared memory (same boot_id, same IPC namespace) and the send would seem to succeed
// while rank 1 never woke for it. Rank 0 must instead be told that it cannot reach rank 1,
// and why, within the grace it gives an abort notice (UcxTransport::kNoticeGrace).
TEST(UcxAddress, APeerInAnotherNetworkNamespaceIsNotReachedOverSharedMemory) {
  auto store = std::make_shared<MemoryStore>();
  auto options = [](int r) {
    UcxTransport::Options o;
    o.rank = r;
    o.size = 2;
    o.local_size = 2;
    o.scope = "netns/";
    return o;
  };
  std::unique_ptr<UcxTransport> far;
  auto abort1 = std::make_shared<AbortSignal>();
  std::string why = in_new_netns([&] { far = std::make_unique<UcxTransport>(options(1), store, abort1); });
  if (!why.empty()) ER_SKIP_UNLESS_REQUIRED("netns", why);
  ASSERT_TRUE(far);
  UcxTransport near(options(0), store, std::make_shared<AbortSignal>());
  std::uint64_t x = 42;
  auto start = Clock::now();
  try {
    Transport::Request s = near.isend(1, Transport::make_tag(1, 0), &x, sizeof x);
    near.wait(std::span(&s, 1), Clock::now() + 5s, "test");
    ADD_FAILURE() << "a send to rank 1 in another network namespace completed";
  } catch (const WorkersFailed& e) {
    EXPECT_NE(std::string(e.what()).find("connecting to rank 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("another network namespace"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, UcxTransport::kNoticeGrace + 1s);
}

}  // namespace
}  // namespace elasticrun::collective
