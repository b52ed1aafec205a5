#include "device/device_rebuild.h"

#include "common/log.h"

#include <chrono>

namespace elasticrun::collective {

RebuildPlan plan_rebuild(std::span<const DevicePlace> places) {
  auto reinit = [](std::string why) { return RebuildPlan{false, {}, std::move(why)}; };
  if (places.empty()) return reinit("no ranks");
  const DevicePlace& first = places.front();
  for (std::size_t i = 0; i < places.size(); ++i) {
    const DevicePlace& p = places[i];
    std::string who = "rank " + std::to_string(i);
    if (p.epoch == 0) return reinit(who + " has no earlier device communicator (a newcomer)");
    if (p.epoch != first.epoch || p.size != first.size)
      return reinit(who + "'s device communicator is from epoch " + std::to_string(p.epoch) + ", rank 0's from " +
                    std::to_string(first.epoch));
    if (!p.shrinkable) return reinit(who + "'s device communicator was aborted or shrinking is disabled");
    if (p.rank < 0 || p.rank >= p.size) return reinit(who + " reports old rank " + std::to_string(p.rank));
    if (i > 0 && p.rank <= places[i - 1].rank) return reinit("survivors changed their relative order");
  }
  if (static_cast<int>(places.size()) >= first.size) return reinit("no rank left the communicator");
  RebuildPlan plan;
  plan.shrink = true;
  std::size_t next = 0;  // survivors' old ranks ascend, so one merge pass finds the gaps
  for (int r = 0; r < first.size; ++r) {
    if (next < places.size() && places[next].rank == r)
      ++next;
    else
      plan.excluded.push_back(r);
  }
  return plan;
}

std::vector<DevicePlace> gather_places(Communicator& host, const DevicePlace& mine) {
  constexpr std::size_t kFields = 4;
  std::int64_t out[kFields] = {static_cast<std::int64_t>(mine.epoch), mine.rank, mine.size, mine.shrinkable ? 1 : 0};
  std::vector<std::int64_t> all(kFields * static_cast<std::size_t>(host.size()));
  host.allgather(out, all.data(), kFields, DataType::i64);
  std::vector<DevicePlace> places(static_cast<std::size_t>(host.size()));
  for (std::size_t i = 0; i < places.size(); ++i) {
    const std::int64_t* f = all.data() + kFields * i;
    places[i] = DevicePlace{static_cast<std::uint64_t>(f[0]), static_cast<int>(f[1]), static_cast<int>(f[2]), f[3] != 0};
  }
  return places;
}

std::unique_ptr<device::Communicator> rebuild(Communicator& host, std::unique_ptr<device::Communicator> old,
                                              std::uint64_t old_epoch, std::uint64_t new_epoch, bool shrink_enabled,
                                              const DeviceBackend& backend) {
  DevicePlace mine;
  if (old) mine = DevicePlace{old_epoch, old->rank(), old->size(), shrink_enabled && backend.can_shrink(*old)};
  RebuildPlan plan = plan_rebuild(gather_places(host, mine));
  auto t0 = std::chrono::steady_clock::now();
  auto ms = [&t0] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  if (plan.shrink) {
    auto next = backend.shrink(*old, plan.excluded);
    old.reset();
    if (next->rank() != host.rank() || next->size() != host.size())
      throw Error("device communicator: shrinking gave rank " + std::to_string(next->rank()) + " of " +
                  std::to_string(next->size()) + ", the epoch says " + std::to_string(host.rank()) + " of " +
                  std::to_string(host.size()));
    ER_LOG(collective, info, "epoch {} rank {}: device communicator shrunk from epoch {} ({} ranks excluded) in {:.1f} ms",
           new_epoch, host.rank(), old_epoch, plan.excluded.size(), ms());
    return next;
  }
  if (old && backend.discard) backend.discard(*old);
  old.reset();  // the old epoch's communicator goes before the new one is built (timed too)
  auto next = backend.make();
  ER_LOG(collective, info, "epoch {} rank {}: device communicator initialised afresh in {:.1f} ms ({})", new_epoch,
         host.rank(), ms(), plan.why);
  return next;
}

}  // namespace elasticrun::collective
