#include "cmd/torch_env.h"

#include "common/env.h"

#include <fmt/format.h>

#include <algorithm>

namespace elasticrun::cmd {

TorchWorker torch_worker(const rendezvous::Assignment& a, int rank) {
  TorchWorker t;
  const auto& me = a.workers.at(static_cast<std::size_t>(rank));
  t.rank = rank;
  t.world_size = a.size();
  t.local_rank = me.local_rank;
  t.local_world_size = me.local_size;
  std::vector<std::string> hosts;  // in the order of their first rank
  for (const auto& w : a.workers)
    if (std::find(hosts.begin(), hosts.end(), w.host) == hosts.end()) hosts.push_back(w.host);
  t.group_rank = static_cast<int>(std::find(hosts.begin(), hosts.end(), me.host) - hosts.begin());
  t.group_world_size = static_cast<int>(hosts.size());
  // "user@name" is how to log in there, not an address (the host part is).
  const std::string& first = a.workers.front().host;
  t.master_addr = first.substr(first.find('@') + 1);
  t.cross_rank = me.cross_rank;
  t.cross_size = me.cross_size;
  t.host = me.host.substr(me.host.find('@') + 1);
  return t;
}

std::vector<std::string> torch_env(const TorchWorker& w, const std::string& run_id) {
  std::vector<std::string> out;
  auto set = [&](const char* k, const auto& v) { out.push_back(fmt::format("{}={}", k, v)); };
  set(env::kTorchRank, w.rank);
  set(env::kTorchLocalRank, w.local_rank);
  set(env::kTorchWorldSize, w.world_size);
  set(env::kTorchLocalWorldSize, w.local_world_size);
  set(env::kTorchGroupRank, w.group_rank);
  set(env::kTorchGroupWorldSize, w.group_world_size);
  // One role, torchrun's default: its ranks are the job's.
  set(env::kTorchRoleRank, w.rank);
  set(env::kTorchRoleWorldSize, w.world_size);
  set(env::kTorchRoleName, "default");
  set(env::kTorchMasterAddr, w.master_addr);
  if (w.master_port > 0) set(env::kTorchMasterPort, w.master_port);
  set(env::kTorchRestartCount, w.restart_count);
  set(env::kTorchMaxRestarts, w.max_restarts);
  set(env::kTorchRunId, run_id);
  set(env::kTorchUseAgentStore, w.agent_store ? "True" : "False");
  set(env::kTorchNcclAsyncErrors, 1);
  set(env::kHorovodRank, w.rank);
  set(env::kHorovodSize, w.world_size);
  set(env::kHorovodLocalRank, w.local_rank);
  set(env::kHorovodLocalSize, w.local_world_size);
  set(env::kHorovodCrossRank, w.cross_rank);
  set(env::kHorovodCrossSize, w.cross_size);
  set(env::kHorovodHostname, w.host);
  return out;
}

}  // namespace elasticrun::cmd
