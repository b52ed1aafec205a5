// torchrun's environment for a worker (torch.distributed.run's variables), so that a
// program written for torchrun (init_process_group from env://, DistributedDataParallel,
// ranks read from the environment) runs under elasticrun unchanged.
//
// Pure: the values come from the epoch's assignment and the port rank 0's daemon
// reserved for it (daemon/port_reservation.h). The entries go before the user's -x in
// the worker's environment, so -x wins over each. The daemon adds the per-worker
// TORCHELASTIC_ERROR_FILE and, unless set, OMP_NUM_THREADS.
#pragma once

#include "rendezvous/assignment.h"

#include <string>
#include <vector>

namespace elasticrun::cmd {

// One worker in torchrun's terms: its host is its "group" (torchrun's node), hosts
// numbered in the order of their first rank.
struct TorchWorker {
  int rank = 0, world_size = 0, local_rank = 0, local_world_size = 0;
  int group_rank = 0, group_world_size = 0;
  std::string master_addr;  // rank 0's host as the driver names it, without a "user@"
  int master_port = 0;      // 0: none could be reserved (MASTER_PORT is left unset)
  int restart_count = 0;    // restarts after failures so far (--max-restarts)
  int max_restarts = 0;
  bool agent_store = false;  // rank 0's daemon hosts torch's store on master_port
  // Horovod's terms: the worker's index among the workers of its local rank, one per
  // host, and their number; its host as the driver names it, without a "user@".
  int cross_rank = 0, cross_size = 0;
  std::string host;
};

// The worker of `rank` in `a` (which must have that rank), without the port and the
// restart counts.
TorchWorker torch_worker(const rendezvous::Assignment& a, int rank);

// KEY=VALUE entries: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID,
// TORCHELASTIC_USE_AGENT_STORE (True: torch's store is up before the worker starts, and
// every rank connects to it as a client, under a prefix of its restart count), and
// NCCL_ASYNC_ERROR_HANDLING=1 (as torchrun sets it: a failed NCCL collective ends the
// process instead of hanging it); then horovodrun's HOROVOD_RANK, HOROVOD_SIZE,
// HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE, HOROVOD_CROSS_RANK, HOROVOD_CROSS_SIZE and
// HOROVOD_HOSTNAME (not its Gloo or MPI settings: there is no Horovod underneath).
std::vector<std::string> torch_env(const TorchWorker& w, const std::string& run_id);

}  // namespace elasticrun::cmd
