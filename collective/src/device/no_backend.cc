// The device backend of a library built without NCCL (meson -Dnccl=disabled, or NCCL not
// found): every pointer is host memory, and asking for a device communicator is an Error.
#include "device/device_backend.h"

#include <elasticrun/device.hpp>

#include <cstring>

namespace elasticrun::collective {
namespace {

const char* const kNoBackend =
    "device collectives: libelasticrun was built without the NCCL backend (meson -Dnccl=enabled)";

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

std::unique_ptr<device::Communicator> make_device_communicator(const DeviceCommConfig&, const IdExchange&,
                                                               std::shared_ptr<AbortSignal>) {
  throw Error(kNoBackend);
}
bool device_can_shrink(device::Communicator&) { return false; }
void discard_device_communicator(device::Communicator&) {}
std::unique_ptr<device::Communicator> shrink_device_communicator(device::Communicator&, std::span<const int>) {
  throw Error(kNoBackend);
}
device::Memory device_memory_of(const void*) { return device::Memory::host; }
int use_device(int) { throw Error(kNoBackend); }
bool device_available(std::string* why) {
  if (why) *why = "built without the NCCL backend";
  return false;
}
std::shared_ptr<MemoryOps> device_memory_ops() { return std::make_shared<HostMemoryOps>(); }
int device_backend_version() { return 0; }

}  // namespace elasticrun::collective

namespace elasticrun::device {

CurrentDevice::CurrentDevice(int) {}
CurrentDevice::~CurrentDevice() = default;

}  // namespace elasticrun::device
