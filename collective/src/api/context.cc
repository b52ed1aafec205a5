// Context: one worker's membership in the job, and the process-wide default.
#include "api/context_internal.h"
#include "api/report.h"
#include "control/rendezvous_client.h"
#include "control/settings.h"
#include "device/nccl_id_exchange.h"
#include "host/host_communicator.h"

#include "common/env.h"

#include <elasticrun/elasticrun.hpp>

#include <algorithm>
#include <mutex>

namespace elasticrun {

struct Context::Impl {
  Topology topo;
  std::chrono::milliseconds timeout = collective::settings::kDefaultCollectiveTimeout;
  std::chrono::milliseconds rejoin_timeout = collective::settings::kDefaultCollectiveTimeout;
  int resets = 0;
  std::uint32_t join_seq = 1;  // of the epoch joined (msg::JoinOk)
  bool stop = false;  // a report was answered "stop"
  std::shared_ptr<collective::RendezvousClient> client;  // null for a standalone communicator
  std::unique_ptr<Communicator> comm;
  collective::DeviceScopes device_scopes;
};

namespace {

// The process-wide default context of init()/shutdown().
struct Default {
  std::mutex mu;
  std::unique_ptr<Context> ctx;
};
Default& default_context() {
  static Default d;
  return d;
}

std::unique_ptr<Communicator> make_comm(const msg::JoinOk& j, const std::shared_ptr<collective::RendezvousClient>& client,
                                        std::chrono::milliseconds timeout) {
  collective::HostCommConfig cfg;
  cfg.rank = j.rank;
  cfg.size = j.size;
  cfg.local_size = j.local_size;
  cfg.local_rank = j.local_rank;
  // A later join of the same epoch by this place (shutdown() and init() again) has a
  // scope of its own: nothing the previous incarnations published is read.
  cfg.scope = "e" + std::to_string(j.epoch) + (j.join_seq > 1 ? "." + std::to_string(j.join_seq) : "") + "/";
  cfg.timeout = timeout;
  return collective::make_host_communicator(cfg, client, client->abort_signal());
}

Topology topology_of(const msg::JoinOk& j, const std::string& host) {
  return Topology{j.rank, j.size, j.local_rank, j.local_size, j.cross_rank, j.cross_size, j.epoch, host};
}

}  // namespace

std::unique_ptr<Context> Context::from_environment() {
  namespace settings = collective::settings;
  settings::Worker w = settings::worker();
  auto secret = auth::secret_from_hex(w.secret_hex);
  if (!secret) throw Error(std::string(env::kSecret) + ": " + secret.error());
  auto timeout = settings::collective_timeout();
  auto deadline = collective::Clock::now() + std::min(timeout, std::chrono::milliseconds(60000));
  auto client = std::make_shared<collective::RendezvousClient>(w.rendezvous, *secret, w.host, w.slot, w.epoch,
                                                               deadline, settings::host_timeout());
  auto ctx = std::unique_ptr<Context>(new Context());
  ctx->impl_->client = std::move(client);
  ctx->impl_->timeout = timeout;
  ctx->impl_->rejoin_timeout = settings::rejoin_timeout(timeout);
  ctx->impl_->topo.host = w.host;
  ctx->connect(ctx->impl_->client->joined(), collective::Clock::now() + ctx->impl_->rejoin_timeout);
  return ctx;
}

Context::Context() : impl_(std::make_unique<Impl>()) {}

// Builds the communicator of epoch `j`. If yet another epoch starts meanwhile (a failure
// during start-up or recovery), building fails with WorkersFailed: join the newer one.
void Context::connect(msg::JoinOk j, std::chrono::steady_clock::time_point deadline) {
  auto& client = impl_->client;
  while (true) {
    try {
      impl_->comm = make_comm(j, client, impl_->timeout);
      impl_->topo = topology_of(j, impl_->topo.host);
      impl_->join_seq = j.join_seq;
      return;
    } catch (const WorkersFailed&) {
      j = client->rejoin(j.epoch + 1, deadline);
    }
  }
}

void Context::rejoin() {
  if (!impl_->client) throw Error("rejoin: this context has no rendezvous connection");
  impl_->comm.reset();  // release the old epoch's transport before building the next
  auto deadline = collective::Clock::now() + impl_->rejoin_timeout;
  connect(impl_->client->rejoin(impl_->topo.epoch + 1, deadline), deadline);
  ++impl_->resets;
}

std::shared_ptr<collective::RendezvousClient> ContextInternals::client(Context& ctx) { return ctx.impl_->client; }

void ContextInternals::state_synced(Context& ctx, std::uint64_t commits) {
  if (ctx.impl_->client) (void)ctx.impl_->client->synced(commits);
}
std::string ContextInternals::next_device_scope(Context& ctx) {
  return ctx.impl_->device_scopes.next(ctx.impl_->topo.epoch, ctx.impl_->join_seq);
}

bool Context::hosts_updated() const { return impl_->client && impl_->client->hosts_updated(); }
int Context::resets() const { return impl_->resets; }

bool Context::report(std::int64_t step, const Metrics& metrics) {
  if (!impl_->client) throw Error("report: this context has no rendezvous connection");
  // Rank 0 gives up on the driver a little before the others' broadcast would time out,
  // so that they learn of it from rank 0 rather than each by its own timeout.
  auto margin = std::min(impl_->timeout / 10, std::chrono::milliseconds(5000));
  auto& client = *impl_->client;
  auto ask = [&] {
    std::string text = metrics_json(metrics);
    return client.report(step, text, collective::Clock::now() + impl_->timeout - margin);
  };
  bool stop = report_collective(*impl_->comm, ask) == msg::Decision::stop;
  impl_->stop = impl_->stop || stop;
  return stop;
}

bool Context::should_stop() const { return impl_->stop; }

Context::Context(std::unique_ptr<Communicator> comm) : impl_(std::make_unique<Impl>()) {
  impl_->topo.rank = comm->rank();
  impl_->topo.size = comm->size();
  impl_->comm = std::move(comm);
}

Context::~Context() {
  if (!impl_) return;
  impl_->comm.reset();  // tear the transport down before the control connection
  if (impl_->client) impl_->client->leave();
}

const Topology& Context::topology() const { return impl_->topo; }
Communicator& Context::comm() {
  if (!impl_->comm)
    throw Error("no communicator: this worker's epoch was abandoned after a failure, or its last re-join failed; "
                "rejoin() first");
  return *impl_->comm;
}

void Context::abandon() { impl_->comm.reset(); }

void init() {
  auto& d = default_context();
  std::lock_guard lock(d.mu);
  if (d.ctx) return;
  d.ctx = Context::from_environment();
}

void shutdown() {
  auto& d = default_context();
  std::lock_guard lock(d.mu);
  d.ctx.reset();
}

bool initialized() {
  auto& d = default_context();
  std::lock_guard lock(d.mu);
  return d.ctx != nullptr;
}

Context& context() {
  auto& d = default_context();
  std::lock_guard lock(d.mu);
  if (!d.ctx) throw Error("elasticrun::init() has not been called");
  return *d.ctx;
}

int rank() { return context().topology().rank; }
int size() { return context().topology().size; }
int local_rank() { return context().topology().local_rank; }
int local_size() { return context().topology().local_size; }
int cross_rank() { return context().topology().cross_rank; }
int cross_size() { return context().topology().cross_size; }
bool report(std::int64_t step, const Metrics& metrics) { return context().report(step, metrics); }
bool should_stop() { return context().should_stop(); }

Communicator& Communicator::subset(int, std::span<const int>) {
  throw Error("subset: this communicator has no subsets (process sets)");
}

}  // namespace elasticrun
