// The public device API (device.hpp) on top of the backend factory.
#include "api/context_internal.h"
#include "control/settings.h"
#include "device/device_backend.h"
#include "device/device_rebuild.h"
#include "device/nccl_id_exchange.h"

#include <elasticrun/device.hpp>

namespace elasticrun {

std::shared_ptr<MemoryOps> default_memory_ops() { return collective::device_memory_ops(); }

}  // namespace elasticrun

namespace elasticrun::device {

Memory memory_of(const void* p) { return collective::device_memory_of(p); }

bool available(std::string* why) { return collective::device_available(why); }
int nccl_version() { return collective::device_backend_version(); }

int use_device(const Context& ctx) { return collective::use_device(ctx.topology().local_rank); }

// The unique id travels through the rendezvous store under a scope of this communicator's
// own (DeviceScopes: the epoch and a count), and the communicator watches the control
// plane's AbortSignal, so a dead peer (which NCCL may never report) ends a device wait
// as promptly as a host one. A context without a
// rendezvous connection (built around a bare Communicator) broadcasts the id instead.
namespace {

std::unique_ptr<Communicator> make_on(Context& ctx, int device) {
  const Topology& topo = ctx.topology();
  collective::DeviceCommConfig cfg;
  cfg.device = device;
  cfg.rank = topo.rank;
  cfg.size = topo.size;
  cfg.local_rank = topo.local_rank;
  cfg.timeout = collective::settings::collective_timeout();
  int rank = topo.rank;
  if (auto client = ContextInternals::client(ctx)) {
    auto exchange = collective::store_id_exchange(client, ContextInternals::next_device_scope(ctx), rank);
    return collective::make_device_communicator(cfg, exchange, client->abort_signal());
  }
  collective::IdExchange exchange = [&ctx, rank](const std::function<collective::Bytes()>& make_id,
                                                 collective::Clock::time_point) {
    collective::Bytes id(collective::kNcclIdBytes);
    if (rank == 0) id = make_id();
    ctx.comm().broadcast(id.data(), id.size(), DataType::u8, 0);
    return id;
  };
  return collective::make_device_communicator(cfg, exchange, std::make_shared<collective::AbortSignal>());
}

}  // namespace

std::unique_ptr<Communicator> make_communicator(Context& ctx) { return make_on(ctx, -1); }

Collectives::Collectives(Context& ctx, int device) : ctx_(ctx), device_(device) {}
Collectives::~Collectives() = default;

Communicator* Collectives::device_for(const void* buf) {
  if (memory_of(buf) != Memory::device) return nullptr;
  std::uint64_t epoch = ctx_.topology().epoch;
  if (!dev_ || dev_epoch_ != epoch) {
    // Shrink the old epoch's communicator when the new epoch only removed ranks, else
    // build afresh (device_rebuild.h). On an error dev_ stays empty: the next epoch
    // starts afresh.
    // The first communicator's device holds for later epochs: the caller's buffers live
    // there, even if this rank's local rank changed.
    collective::DeviceBackend backend{collective::device_can_shrink, collective::shrink_device_communicator,
                                      [this] { return make_on(ctx_, device_); },
                                      collective::discard_device_communicator};
    dev_ = collective::rebuild(ctx_.comm(), std::move(dev_), dev_epoch_, epoch,
                               collective::settings::nccl_shrink(), backend);
    dev_epoch_ = epoch;
    device_ = dev_->device();
  }
  return dev_.get();
}

void Collectives::allreduce(const void* in, void* out, std::size_t count, DataType t, ReduceOp op, void* stream) {
  CurrentDevice on(device_);  // the communicator's, for the pointer query too; the caller's after
  if (auto* d = device_for(in)) return d->allreduce(in, out, count, t, op, stream);
  ctx_.comm().allreduce(in, out, count, t, op);
}

void Collectives::broadcast(void* buf, std::size_t count, DataType t, int root, void* stream) {
  CurrentDevice on(device_);  // the communicator's, for the pointer query too; the caller's after
  if (auto* d = device_for(buf)) return d->broadcast(buf, count, t, root, stream);
  ctx_.comm().broadcast(buf, count, t, root);
}

void Collectives::allgather(const void* in, void* out, std::size_t count, DataType t, void* stream) {
  CurrentDevice on(device_);  // the communicator's, for the pointer query too; the caller's after
  if (auto* d = device_for(out)) return d->allgather(in, out, count, t, stream);
  ctx_.comm().allgather(in, out, count, t);
}

void Collectives::reduce_scatter(const void* in, void* out, std::size_t count, DataType t, ReduceOp op,
                                 void* stream) {
  CurrentDevice on(device_);  // the communicator's, for the pointer query too; the caller's after
  if (auto* d = device_for(in)) return d->reduce_scatter(in, out, count, t, op, stream);
  ctx_.comm().reduce_scatter(in, out, count, t, op);
}

void Collectives::alltoall(const void* in, void* out, std::size_t count, DataType t, void* stream) {
  CurrentDevice on(device_);  // the communicator's, for the pointer query too; the caller's after
  if (auto* d = device_for(in)) return d->alltoall(in, out, count, t, stream);
  ctx_.comm().alltoall(in, out, count, t);
}

}  // namespace elasticrun::device
