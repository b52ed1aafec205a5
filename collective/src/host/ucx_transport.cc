#include "host/ucx_transport.h"

#include <common/log.h>
#include <elasticrun/types.hpp>

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>

namespace elasticrun::collective {
namespace {

// The low bits of the wire tag carry the sender's rank, so receives match a peer.
constexpr int kRankBits = 20;
static_assert(kRankBits + Transport::kTagBits <= 64, "a wire tag holds the sender's rank and the whole tag");
constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};

ucp_tag_t wire_tag(std::uint64_t tag, int src) { return (tag << kRankBits) | static_cast<ucp_tag_t>(src); }

[[noreturn]] void throw_ucs(const std::string& what, ucs_status_t st) {
  throw Error(what + ": " + ucs_status_string(st));
}

// Sets UCX option `name` (no UCX_ prefix) on `cfg`, unless the user set UCX_<name>:
// an explicit environment setting always wins over our defaults. Returns the value in force.
// A transport's option goes by its name within the transport's table (`field`: TCP_RX_SEG_SIZE
// is RX_SEG_SIZE there); UCP keeps it and hands it to every interface that has it.
std::string tune(ucp_config_t* cfg, const char* name, const std::string& value, const char* field = nullptr) {
  std::string env = std::string("UCX_") + name;
  if (const char* theirs = std::getenv(env.c_str())) return theirs;
  ucs_status_t st = ucp_config_modify(cfg, field ? field : name, value.c_str());
  if (st != UCS_OK) throw_ucs("ucp_config_modify " + env + "=" + value, st);
  return value;
}

// Owns a ucp_config_t for the duration of ucp_init.
struct ConfigGuard {
  ucp_config_t* cfg = nullptr;
  ~ConfigGuard() {
    if (cfg) ucp_config_release(cfg);
  }
};

}  // namespace

UcxTransport::UcxTransport(const Options& opts, std::shared_ptr<Store> store, std::shared_ptr<AbortSignal> abort)
    : opts_(opts), store_(std::move(store)), abort_(std::move(abort)), here_(this_locality()), eps_(opts.size, nullptr) {
  if (opts_.size >= (1 << kRankBits)) throw Error("ucx transport: world size too large");
  ConfigGuard config;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config.cfg);
  if (st != UCS_OK) throw_ucs("ucp_config_read", st);
  // On one host, or where RDMA may carry messages between hosts: eager (copy through the
  // shared-memory FIFO) below 256 KiB instead of UCX's automatic switch to rendezvous
  // at ~8-16 KiB: a rendezvous costs a handshake and a process_vm_readv with page
  // pinning per message, and with oversubscribed ranks every handshake waits for the
  // peer to be scheduled. Measured (bench/RESULTS.md): 4 ranks 64 KiB-2 MiB 1.1-2x
  // faster; 2 ranks 64-128 KiB 1.3-1.7x. Ring chunks of 256 KiB (large messages) still
  // use the single-copy rendezvous, which wins there. Across hosts over TCP alone, every
  // message eager (host/ucx_address.h).
  const bool tcp_across =
      opts_.local_size < opts_.size && network_is_tcp_only(std::getenv("UCX_TLS"), has_rdma_devices());
  rendezvous_threshold_ = tune(config.cfg, "RNDV_THRESH", tcp_across ? "inf" : "256K");
  // UCX's largest message fragment over TCP (am_zcopy, the eager protocol's) is the
  // receiver's buffer, TCP_RX_SEG_SIZE, 64 KiB by default: a ring's 512 KiB segment went
  // in 8 sends, each a header and a recv() of its own. 1 MiB holds the largest segment
  // whole (bench/RESULTS.md, session 39: 4 hosts of 2 ranks behind 500 us links, 4-32
  // MiB in 0.81-0.93x the time; 2 hosts on unshaped links, 0.65-0.73x from 2 MiB).
  if (tcp_across) tcp_rx_segment_ = tune(config.cfg, "TCP_RX_SEG_SIZE", kTcpRxSegment, kTcpRxSegmentField);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                      UCP_PARAM_FIELD_ESTIMATED_NUM_EPS | UCP_PARAM_FIELD_ESTIMATED_NUM_PPN |
                      UCP_PARAM_FIELD_NAME;
  // Wakeup is only asked for when we block: it can restrict which transports qualify.
  params.features = UCP_FEATURE_TAG | (opts_.blocking ? UCP_FEATURE_WAKEUP : 0);
  params.mt_workers_shared = 0;
  params.estimated_num_eps = static_cast<size_t>(opts_.size);
  params.estimated_num_ppn = static_cast<size_t>(std::max(1, opts_.local_size));
  params.name = "elasticrun";
  ucp_context_h ctx = nullptr;
  st = ucp_init(&params, config.cfg, &ctx);
  if (st != UCS_OK) throw_ucs("ucp_init", st);
  context_.reset(ctx);
  create_worker();
  publish_address();
}

void UcxTransport::create_worker() {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread drives a communicator; the abort signal only touches its own eventfd.
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h w = nullptr;
  ucs_status_t st = ucp_worker_create(context_.get(), &wp, &w);
  if (st != UCS_OK) throw_ucs("ucp_worker_create", st);
  worker_.reset(w);
  if (opts_.blocking) {
    st = ucp_worker_get_efd(w, &event_fd_);
    if (st != UCS_OK) throw_ucs("ucp_worker_get_efd", st);
  }
}

// This worker's address, packed by UCX with `flags` (ucp_worker_address_flags_t).
Bytes UcxTransport::worker_address(std::uint32_t flags) {
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_ADDRESS_FLAGS;
  attr.address_flags = flags;
  ucs_status_t st = ucp_worker_query(worker_.get(), &attr);
  if (st != UCS_OK) throw_ucs("ucp_worker_query (address)", st);
  const auto* p = reinterpret_cast<const std::uint8_t*>(attr.address);
  Bytes bytes(p, p + attr.address_length);
  ucp_worker_release_address(worker_.get(), attr.address);
  return bytes;
}

// Where this rank runs and both of its addresses (ucx_address.h: which one a peer uses).
void UcxTransport::publish_address() {
  PublishedAddress a{here_, worker_address(0), worker_address(UCP_WORKER_ADDRESS_FLAG_NET_ONLY)};
  store_->set(opts_.scope + "addr/" + std::to_string(opts_.rank), encode(a));
}

UcxTransport::~UcxTransport() {
  // Teardown must be bounded even if a peer is gone: cancel, close, then let
  // ucp_worker_destroy reclaim whatever a dead peer left pending.
  bool clean = live_.empty() && !abort_->raised();
  cancel_all();
  close_endpoints(!clean, !stale_);
  for (void* req : live_) ucp_request_free(req);
  live_.clear();
}

void UcxTransport::progress() {
  while (ucp_worker_progress(worker_.get()) != 0) {
  }
}

void UcxTransport::close_endpoints(bool force, bool progress) {
  std::vector<void*> closing;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  for (ucp_ep_h& ep : eps_) {
    if (!ep) continue;
    ucs_status_ptr_t p = ucp_ep_close_nbx(ep, &param);
    if (UCS_PTR_IS_PTR(p)) closing.push_back(p);
    ep = nullptr;
  }
  auto until = Clock::now() + (progress ? std::chrono::seconds(2) : std::chrono::seconds(0));
  while (!closing.empty() && Clock::now() < until) {
    ucp_worker_progress(worker_.get());
    std::erase_if(closing, [](void* r) {
      if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
      ucp_request_free(r);
      return true;
    });
  }
  for (void* r : closing) ucp_request_free(r);
}

ucp_ep_h UcxTransport::endpoint(int peer, Clock::time_point deadline) {
  if (eps_[peer]) return eps_[peer];
  PublishedAddress addr = decode_address(store_->get(opts_.scope + "addr/" + std::to_string(peer), deadline), peer);
  const bool net_only = needs_network_only(here_, addr.where);
  if (net_only)
    ER_LOG(collective, debug, "rank {}: rank {} is on this machine in another network namespace: network transports only",
           opts_.rank, peer);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(addr.for_sender_at(here_).data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
  ucs_status_t st = ucp_ep_create(worker_.get(), &ep, &eps_[peer]);
  if (st != UCS_OK)
    peer_unreachable("connecting to rank " + std::to_string(peer) + ": " + ucs_status_string(st) +
                     (net_only ? " (it runs on this machine in another network namespace, where UCX's shared memory "
                                 "cannot wake it, and UCX has no network transport to it)"
                               : ""));
  return eps_[peer];
}

// A peer whose address we hold cannot be reached: typically it already left this epoch
// (its shared memory is gone) because a newer epoch started, and the notice is on its
// way. Wait briefly for it so the error says why; either way the epoch is broken.
void UcxTransport::peer_unreachable(const std::string& what) {
  await_notice();
  if (abort_->raised()) abort_->throw_error();
  throw WorkersFailed(what);
}

// Up to kNoticeGrace for the abort, unless it is raised already.
void UcxTransport::await_notice() {
  if (abort_->raised()) return;
  pollfd p{abort_->fd(), POLLIN, 0};
  ::poll(&p, 1, static_cast<int>(kNoticeGrace.count()));
}

// A send or receive failed with `st`. Once a new epoch has started, the peers leave this
// one at unknown points (a receive may even be matched by what a departing peer sent
// last), so whatever failed is reported as the abort: WorkersFailed, which elastic run()
// recovers from. The notice can reach this rank after a peer has already acted on its
// own, so a failure first waits briefly for it, as peer_unreachable does. Only without
// any notice is a message larger than its receive the program's error (ProtocolError:
// the ranks disagree on the collective); anything else is a peer gone (WorkersFailed).
void UcxTransport::fail(const std::string& msg, ucs_status_t st) {
  await_notice();
  if (abort_->raised()) abort_->throw_error();
  if (st == UCS_ERR_MESSAGE_TRUNCATED) throw ProtocolError(msg + " (peer sent more than expected)");
  throw WorkersFailed(msg);
}

Transport::Request UcxTransport::track(ucs_status_ptr_t p, int peer, bool recv, const char* what) {
  if (p == nullptr) return {nullptr, peer, recv};
  if (UCS_PTR_IS_ERR(p))
    fail(std::string(what) + " rank " + std::to_string(peer) + ": " + ucs_status_string(UCS_PTR_STATUS(p)),
         UCS_PTR_STATUS(p));
  live_.push_back(p);
  return {p, peer, recv};
}

Transport::Request UcxTransport::isend(int peer, std::uint64_t tag, const void* buf, std::size_t bytes) {
  ucp_ep_h ep = endpoint(peer, Clock::now() + opts_.timeout);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  param.memory_type = UCS_MEMORY_TYPE_HOST;
  ucs_status_ptr_t p = ucp_tag_send_nbx(ep, buf, bytes, wire_tag(tag, opts_.rank), &param);
  return track(p, peer, false, "send to");
}

Transport::Request UcxTransport::irecv(int peer, std::uint64_t tag, void* buf, std::size_t bytes) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  param.memory_type = UCS_MEMORY_TYPE_HOST;
  ucs_status_ptr_t p = ucp_tag_recv_nbx(worker_.get(), buf, bytes, wire_tag(tag, peer), kFullMask, &param);
  return track(p, peer, true, "receive from");
}

// Frees `r` if complete; returns whether it was. A failed completion throws.
bool UcxTransport::reap(Request& r, const char* what) {
  if (r.done()) return true;
  ucs_status_t st = ucp_request_check_status(r.handle);
  if (st == UCS_INPROGRESS) return false;
  ucp_request_free(r.handle);
  forget(r.handle);
  r.handle = nullptr;
  if (st == UCS_OK) return true;
  cancel_all();
  fail(std::string(what) + ": " + (r.recv ? "receive from" : "send to") + " rank " + std::to_string(r.peer) +
           " failed: " + ucs_status_string(st),
       st);
}

// Requests complete roughly in the order they were posted, so the search is short;
// a vector avoids a node allocation per message on the small-message path.
void UcxTransport::forget(void* handle) {
  auto it = std::find(live_.begin(), live_.end(), handle);
  if (it == live_.end()) return;
  *it = live_.back();
  live_.pop_back();
}

void UcxTransport::wait(std::span<Request> reqs, Clock::time_point deadline, const char* what) {
  unsigned spins = 0;
  Clock::time_point idle_since{};
  for (;;) {
    bool all = true;
    for (Request& r : reqs) all = reap(r, what) && all;
    if (all) return;
    if (abort_->raised()) {
      cancel_all();
      abort_->throw_error();
    }
    if (ucp_worker_progress(worker_.get()) != 0) {
      idle_since = {};
      continue;
    }
    if ((++spins & 63) == 0 && Clock::now() >= deadline) fail_timeout(reqs, what);
    if (opts_.blocking) idle(idle_since, deadline);
  }
}

// Oversubscribed waiting: while a collective is active the next message usually
// comes within microseconds, so first yield the core (to the peer we wait for) and
// poll again; only after the yield window without progress pay for arm + poll() +
// wakeup. Unless told to sleep at once (sleep_at_once(): the tuner found that yielding
// costs more than it saves, as behind links with latency).
void UcxTransport::idle(Clock::time_point& idle_since, Clock::time_point deadline) {
  auto now = Clock::now();
  if (idle_since == Clock::time_point{}) idle_since = now;
  if (!sleep_at_once_ && now - idle_since < opts_.yield_window) {
    sched_yield();
    return;
  }
  wait_for_event(deadline);
}

// Sleeps until the worker has events, the abort is raised, or the deadline passes.
void UcxTransport::wait_for_event(Clock::time_point deadline) {
  ucs_status_t st = ucp_worker_arm(worker_.get());
  if (st == UCS_ERR_BUSY) return;  // events arrived meanwhile: progress again
  if (st != UCS_OK) throw_ucs("ucp_worker_arm", st);
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  pollfd fds[2] = {{event_fd_, POLLIN, 0}, {abort_->fd(), POLLIN, 0}};
  int timeout = static_cast<int>(std::clamp<long long>(left + 1, 0, 1000));
  if (::poll(fds, 2, timeout) < 0 && errno != EINTR) throw Error("poll on the UCX event fd failed");
}

// Names every peer the wait still needed, receives first: "allreduce: timed out waiting
// for messages from ranks 2, 5 and for rank 3 to take a message".
void UcxTransport::fail_timeout(std::span<Request> reqs, const char* what) {
  std::vector<int> from, to;
  for (const Request& r : reqs)
    if (!r.done()) (r.recv ? from : to).push_back(r.peer);
  for (std::vector<int>* v : {&from, &to}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  auto ranks = [](const std::vector<int>& v) {
    constexpr std::size_t kNamed = 8;
    std::string s = v.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < v.size() && i < kNamed; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    if (v.size() > kNamed) s += " and " + std::to_string(v.size() - kNamed) + " more";
    return s;
  };
  std::string msg = std::string(what) + ": timed out waiting for ";
  if (!from.empty()) msg += (from.size() == 1 ? "a message from " : "messages from ") + ranks(from);
  if (!from.empty() && !to.empty()) msg += " and for ";
  if (!to.empty()) msg += ranks(to) + (to.size() == 1 ? " to take a message" : " to take their messages");
  cancel_all();
  throw TimeoutError(msg);
}

void UcxTransport::cancel_all() {
  if (live_.empty()) return;
  for (void* req : live_) ucp_request_cancel(worker_.get(), req);
  // Cancelled receives complete on the next progress; give them a moment, then
  // free the rest so UCX releases them whenever they finish.
  drain(Clock::now() + std::chrono::milliseconds(50));
  stale_ = stale_ || !live_.empty();
  for (void* req : live_) ucp_request_free(req);
  live_.clear();
}

void UcxTransport::drain(Clock::time_point until) {
  while (Clock::now() < until) {
    ucp_worker_progress(worker_.get());
    std::erase_if(live_, [](void* r) {
      if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
      ucp_request_free(r);
      return true;
    });
    if (live_.empty()) return;
  }
}

}  // namespace elasticrun::collective
