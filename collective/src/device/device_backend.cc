// The single place that branches on whether the NCCL backend was built.
#include "device/device_backend.h"

#include "device/nccl_id_exchange.h"

#ifdef ELASTICRUN_HAVE_NCCL
#include "device/nccl/cuda_memory_ops.h"
#include "device/nccl/nccl_device_communicator.h"
#endif

#include <cstring>

namespace elasticrun::collective {

namespace {
// Without a device backend every pointer is host memory.
class HostMemoryOps final : public MemoryOps {
 public:
  device::Memory where(const void*) override { return device::Memory::host; }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void* allocate_device(std::size_t, const void*) override {
    throw Error("elastic state: device snapshots need the NCCL backend (meson -Dnccl=enabled)");
  }
  void free_device(void*) noexcept override {}
};
}  // namespace

IdExchange store_id_exchange(std::shared_ptr<Store> store, std::string scope, int rank) {
  return [store = std::move(store), scope = std::move(scope), rank](const std::function<Bytes()>& make_id,
                                                                      Clock::time_point deadline) {
    return exchange_nccl_id(*store, scope, rank, make_id, deadline);
  };
}

#ifdef ELASTICRUN_HAVE_NCCL
std::unique_ptr<device::Communicator> make_device_communicator(const DeviceCommConfig& cfg, const IdExchange& exchange,
                                                               std::shared_ptr<AbortSignal> abort) {
  return make_nccl_communicator(cfg, exchange, std::move(abort));
}
bool device_can_shrink(device::Communicator& c) { return nccl_can_shrink(c); }
void discard_device_communicator(device::Communicator& c) { nccl_discard(c); }
std::unique_ptr<device::Communicator> shrink_device_communicator(device::Communicator& old,
                                                                 std::span<const int> excluded) {
  return shrink_nccl_communicator(old, excluded);
}
device::Memory device_memory_of(const void* p) { return nccl_memory_of(p); }
int use_device(int local_rank) { return nccl_use_device(local_rank); }
bool device_available(std::string* why) { return nccl_available(why); }
std::shared_ptr<MemoryOps> device_memory_ops() { return make_cuda_memory_ops(settings::collective_timeout()); }
#else
std::unique_ptr<device::Communicator> make_device_communicator(const DeviceCommConfig&, const IdExchange&,
                                                               std::shared_ptr<AbortSignal>) {
  throw Error("device collectives: libelasticrun was built without the NCCL backend (meson -Dnccl=enabled)");
}
bool device_can_shrink(device::Communicator&) { return false; }
void discard_device_communicator(device::Communicator&) {}
std::unique_ptr<device::Communicator> shrink_device_communicator(device::Communicator&, std::span<const int>) {
  throw Error("device collectives: libelasticrun was built without the NCCL backend (meson -Dnccl=enabled)");
}
device::Memory device_memory_of(const void*) { return device::Memory::host; }
int use_device(int) {
  throw Error("device collectives: libelasticrun was built without the NCCL backend (meson -Dnccl=enabled)");
}
bool device_available(std::string* why) {
  if (why) *why = "built without the NCCL backend";
  return false;
}
std::shared_ptr<MemoryOps> device_memory_ops() { return std::make_shared<HostMemoryOps>(); }
#endif

std::shared_ptr<MemoryOps> host_memory_ops() { return std::make_shared<HostMemoryOps>(); }

}  // namespace elasticrun::collective
