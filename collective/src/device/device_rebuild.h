// How a device communicator follows a new epoch: shrink the old one, or start afresh.
//
// NCCL can derive a communicator for a subset of an existing one (ncclCommShrink with
// NCCL_SHRINK_ABORT), skipping the unique-id exchange and most of the bootstrap of a
// fresh init. That is possible only when the new epoch's ranks are exactly some ranks of
// one earlier communicator, in the same relative order (the shrunk communicator numbers
// survivors in their old order), and every one of them still holds that communicator
// alive. Growing, any newcomer, a reordering, or a survivor whose communicator was
// aborted (an error or an abort interrupted one of its waits: ncclCommAbort freed it)
// means a fresh init with a new unique id.
//
// Nothing in the rendezvous protocol says who survived: each rank knows only its own
// previous device communicator (its epoch, rank and size). So every rank of the new
// epoch contributes that "place" to one small allgather over the new epoch's host
// communicator, and all ranks then apply the same pure rule to the same list: they
// agree on the plan without any new server message.
#pragma once

#include <elasticrun/device.hpp>
#include <elasticrun/elasticrun.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace elasticrun::collective {

// One rank's previous device communicator, as it reports it to the new epoch.
struct DevicePlace {
  std::uint64_t epoch = 0;  // epoch the communicator was built for; 0: this rank has none
  int rank = -1;            // this rank's place in it
  int size = 0;             // its size
  bool shrinkable = false;  // alive, and shrinking not disabled (ELASTICRUN_NCCL_SHRINK=0)
};

struct RebuildPlan {
  bool shrink = false;
  std::vector<int> excluded;  // ranks of the old communicator to leave out, ascending
  std::string why;            // the reason for a fresh init (for the log); empty when shrinking
};

// The plan for a new epoch whose rank i reported places[i]. Shrink iff every place names
// the same old communicator (epoch and size), all are shrinkable, their old ranks are
// strictly increasing (same survivors, same order), and at least one old rank is gone.
RebuildPlan plan_rebuild(std::span<const DevicePlace> places);

// Every rank's place, gathered over the new epoch's host communicator (collective).
std::vector<DevicePlace> gather_places(Communicator& host, const DevicePlace& mine);

// What rebuild() needs from the device backend (device_backend.h gives the real one;
// tests give fakes).
struct DeviceBackend {
  std::function<bool(device::Communicator&)> can_shrink;  // alive and of this backend
  std::function<std::unique_ptr<device::Communicator>(device::Communicator&, std::span<const int>)> shrink;
  std::function<std::unique_ptr<device::Communicator>()> make;  // a fresh one for the new epoch
  std::function<void(device::Communicator&)> discard;            // end an old one at once (may be empty)
};

// The device communicator of the new epoch, whose host communicator is `host`: `old`
// (null if none) was built for `old_epoch`. Collective over `host`. With a shrink plan
// every survivor shrinks `old`; otherwise `old` is discarded (backend.discard: an abort,
// since a clean finalize could wait on peers that are gone) and destroyed before a fresh
// one is made.
// Logs which, why and how long it took (component collective, info).
std::unique_ptr<device::Communicator> rebuild(Communicator& host, std::unique_ptr<device::Communicator> old,
                                              std::uint64_t old_epoch, std::uint64_t new_epoch, bool shrink_enabled,
                                              const DeviceBackend& backend);

}  // namespace elasticrun::collective
