// Transport over the UCP tag API: one ucp context and worker per communicator.
//
// The worker's address is published in the Store under `<scope>addr/<rank>` when
// the transport is built; an endpoint to a peer is created the first time
// something is sent to it, so a rank only fetches the addresses of the peers its
// algorithms actually use (receives match on the worker and need no endpoint).
//
// The published value also says where the rank runs (ucx_address.h): a peer on this
// machine but in another network namespace is reached over UCX's network transports
// only, because UCX would pair the two over shared memory and its wake-ups cannot cross
// network namespaces (a rank whose first action is a receive would wait until its
// collective timed out).
//
// Endpoints use no UCX peer-error handling: in UCX 1.13 that mode drops shared
// memory on one host. Failure detection is the control plane's job (AbortSignal).
//
// Progress: `busy` spins in ucp_worker_progress (fastest when every rank has a
// core); `block` arms the worker and poll()s its event fd together with the abort
// fd, so oversubscribed ranks give their core to the peer they wait for (after a
// sched_yield() window of 3 ms, which keeps latency low inside an active collective).
//
// Defaults we set on the UCX configuration (each only when the user has not set the
// UCX_ variable): RNDV_THRESH=256K, so messages below a ring chunk go eager; where the
// ranks span hosts and only TCP joins them (host/ucx_address.h), RNDV_THRESH=inf and
// TCP_RX_SEG_SIZE=1M (which is also the largest fragment UCX sends over TCP).
#pragma once

#include "control/abort_signal.h"
#include "control/settings.h"
#include "control/store.h"
#include "host/transport.h"
#include "host/ucx_address.h"

#include <ucp/api/ucp.h>

#include <memory>
#include <string>
#include <vector>

namespace elasticrun::collective {

class UcxTransport final : public Transport {
 public:
  struct Options {
    int rank = 0, size = 1, local_size = 1;
    std::string scope;
    bool blocking = false;
    std::chrono::milliseconds timeout = settings::kDefaultCollectiveTimeout;  // bounds fetching a peer's address
    // Blocking mode yields (sched_yield) this long without progress before it sleeps.
    // Sleeping costs a wake-up (tens of us on a VM) per message; 3 ms covers a peer
    // that needs the core for a scheduler slice (1 ms: 34 us at 8 B with 4 ranks on
    // 2 cores, 3 ms: 18-25 us; sleeping at once: 1.5-3x slower from 1 KiB to 256 KiB).
    std::chrono::microseconds yield_window{3000};
  };
  // How long a failed send or receive waits for the abort notice before it is reported
  // as the transport's own error (see fail()).
  static constexpr std::chrono::milliseconds kNoticeGrace{2000};

  UcxTransport(const Options& opts, std::shared_ptr<Store> store, std::shared_ptr<AbortSignal> abort);
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  int rank() const override { return opts_.rank; }
  int size() const override { return opts_.size; }
  Request isend(int peer, std::uint64_t tag, const void* buf, std::size_t bytes) override;
  Request irecv(int peer, std::uint64_t tag, void* buf, std::size_t bytes) override;
  void wait(std::span<Request> reqs, Clock::time_point deadline, const char* what) override;
  void cancel_all() override;

  bool sleeps() const override { return opts_.blocking; }
  void sleep_at_once(bool yes) override { sleep_at_once_ = yes; }
  // UCX_RNDV_THRESH as this transport's context runs it: the user's, or ours.
  const std::string& rendezvous_threshold() const { return rendezvous_threshold_; }
  // UCX_TCP_RX_SEG_SIZE where we set it (TCP between hosts; the user's over ours), else empty.
  const std::string& tcp_rx_segment() const { return tcp_rx_segment_; }
  static constexpr const char* kTcpRxSegment = "1M";
  // Its name in UCX's TCP interface table, the name it is set by.
  static constexpr const char* kTcpRxSegmentField = "RX_SEG_SIZE";
  void progress() override;

 private:
  struct ContextDeleter {
    void operator()(ucp_context_h c) const { ucp_cleanup(c); }
  };
  struct WorkerDeleter {
    void operator()(ucp_worker_h w) const { ucp_worker_destroy(w); }
  };
  using ContextPtr = std::unique_ptr<std::remove_pointer_t<ucp_context_h>, ContextDeleter>;
  using WorkerPtr = std::unique_ptr<std::remove_pointer_t<ucp_worker_h>, WorkerDeleter>;

  void create_worker();
  Bytes worker_address(std::uint32_t flags);
  void publish_address();
  [[noreturn]] void peer_unreachable(const std::string& what);
  [[noreturn]] void fail(const std::string& msg, ucs_status_t st);
  void await_notice();
  ucp_ep_h endpoint(int peer, Clock::time_point deadline);
  Request track(ucs_status_ptr_t p, int peer, bool recv, const char* what);
  bool reap(Request& r, const char* what);
  void forget(void* handle);
  void idle(Clock::time_point& idle_since, Clock::time_point deadline);
  void wait_for_event(Clock::time_point deadline);
  [[noreturn]] void fail_timeout(std::span<Request> reqs, const char* what);
  void drain(Clock::time_point until);
  void close_endpoints(bool force, bool progress);

  Options opts_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<AbortSignal> abort_;
  Locality here_;                      // this rank's, published with its addresses
  ContextPtr context_;
  WorkerPtr worker_;
  int event_fd_ = -1;
  std::vector<ucp_ep_h> eps_;          // lazily created, indexed by rank
  std::vector<void*> live_;            // posted, not yet freed (unordered)
  // A cancel left requests under way (a receive already matched cannot be cancelled):
  // from then on the worker is never progressed, which would land their data in
  // buffers their callers may have restored or freed.
  bool stale_ = false;
  bool sleep_at_once_ = false;         // blocking: skip the yield window (sleep_at_once())
  std::string rendezvous_threshold_;
  std::string tcp_rx_segment_;
};

}  // namespace elasticrun::collective
