// What a HostCommConfig resolves to on this machine and in this environment, apart from
// the communicator (host_communicator.h).
#include "host/host_communicator.h"

#include <thread>

namespace elasticrun::collective {

bool spans_hosts(const HostCommConfig& cfg) { return cfg.local_size > 0 && cfg.local_size < cfg.size; }

Progress resolve_progress(const HostCommConfig& cfg) {
  Progress p = cfg.progress ? *cfg.progress : settings::progress();
  if (p != Progress::automatic) return p;
  int local = cfg.local_size > 0 ? cfg.local_size : cfg.size;
  unsigned cores = std::thread::hardware_concurrency();
  // Spinning only pays when every local rank has a core to itself.
  return cores != 0 && static_cast<unsigned>(local) <= cores ? Progress::busy : Progress::block;
}

Segments resolve_segments(const HostCommConfig& cfg) {
  const std::optional<std::size_t> forced = cfg.segment ? cfg.segment : settings::segment();
  if (forced) return {*forced, 0};
  if (spans_hosts(cfg)) return {cfg.net_segment_bytes, cfg.net_segment_max_bytes};
  return {cfg.segment_bytes, 0};
}

}  // namespace elasticrun::collective
