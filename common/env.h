// Environment variables that cross process boundaries, declared once.
// The daemon sets the worker ones; `elasticrun(1)` and `libelasticrun(3)` document them.
#pragma once

namespace elasticrun::env {

// Set by elasticrund for every worker.
inline constexpr const char* kRendezvousAddr = "ELASTICRUN_RENDEZVOUS_ADDR";  // host:port
inline constexpr const char* kSecret = "ELASTICRUN_SECRET";                   // hex, 64 chars
inline constexpr const char* kHost = "ELASTICRUN_HOST";    // the host's name as the driver knows it
inline constexpr const char* kSlot = "ELASTICRUN_SLOT";    // slot index on that host
inline constexpr const char* kEpoch = "ELASTICRUN_EPOCH";  // epoch the worker was started in
inline constexpr const char* kRank = "ELASTICRUN_RANK";    // rank at start (informational)
inline constexpr const char* kSize = "ELASTICRUN_SIZE";    // world size at start (informational)
// Seconds a worker waits in rejoin for the next epoch: the driver's own bound on
// forming one (--elastic-timeout + --rendezvous-timeout), since it ends the job past it.
inline constexpr const char* kRejoinTimeout = "ELASTICRUN_REJOIN_TIMEOUT";
// elasticrun --host-timeout: the worker's rendezvous connection is given up a little
// after that much silence (TCP keep-alive, net::keep_alive).
inline constexpr const char* kHostTimeout = "ELASTICRUN_HOST_TIMEOUT";

// Read by the collective library, the user may set them; collective/src/control/settings.h
// has each one's default and rule (and reads the worker ones above).
inline constexpr const char* kAlgorithm = "ELASTICRUN_ALGORITHM";  // auto|shm|hier|rails|ring|rd|rhd|direct
inline constexpr const char* kProgress = "ELASTICRUN_PROGRESS";    // auto|busy|block
inline constexpr const char* kCollectiveTimeout = "ELASTICRUN_COLLECTIVE_TIMEOUT";  // seconds
inline constexpr const char* kSegment = "ELASTICRUN_SEGMENT";      // bytes, K/M suffix
// The CUDA device index a worker uses (among its visible ones): the user's choice, an
// error when out of range.
inline constexpr const char* kDevice = "ELASTICRUN_DEVICE";
// elasticrund's suggestion, from the slot and the GPUs the daemon can see (unless the user
// set ELASTICRUN_DEVICE or CUDA_VISIBLE_DEVICES). The worker may see fewer (a wrapper's
// CUDA_VISIBLE_DEVICES, MIG, cgroups), so the library takes it modulo its device count.
inline constexpr const char* kDeviceHint = "ELASTICRUN_DEVICE_HINT";
// 0: a device communicator never shrinks, every epoch builds a fresh one (default 1).
inline constexpr const char* kNcclShrink = "ELASTICRUN_NCCL_SHRINK";
// 0: the algorithms across hosts follow the fixed crossovers only, never measured (default 1).
inline constexpr const char* kTune = "ELASTICRUN_TUNE";
// Durable checkpoints of the elastic State (elasticrun --checkpoint-dir, --checkpoint-every,
// --checkpoint-interval set them for every worker): the directory (on a filesystem every
// host sees), and when rank 0 writes one: every N commits, or at a commit T seconds
// after the last one.
inline constexpr const char* kCheckpointDir = "ELASTICRUN_CHECKPOINT_DIR";
inline constexpr const char* kCheckpointEvery = "ELASTICRUN_CHECKPOINT_EVERY";      // commits
inline constexpr const char* kCheckpointInterval = "ELASTICRUN_CHECKPOINT_INTERVAL";  // seconds

// Set by elasticrun sweep for the workers of one trial (passed with -x), read by the
// trial program (Python: elasticrun.sweep): its configuration (a JSON object), its id,
// and its own directory for checkpoints.
inline constexpr const char* kTrialConfig = "ELASTICRUN_TRIAL_CONFIG";
inline constexpr const char* kTrialId = "ELASTICRUN_TRIAL_ID";
inline constexpr const char* kTrialDir = "ELASTICRUN_TRIAL_DIR";

// torchrun's variables (torch.distributed.run), so that a program written for torchrun
// runs unchanged: the driver sets these for every worker (cmd/torch_env.h), from the
// epoch's assignment; -x wins over each.
inline constexpr const char* kTorchRank = "RANK";
inline constexpr const char* kTorchLocalRank = "LOCAL_RANK";
inline constexpr const char* kTorchWorldSize = "WORLD_SIZE";
inline constexpr const char* kTorchLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr const char* kTorchGroupRank = "GROUP_RANK";        // the host's index in the assignment
inline constexpr const char* kTorchGroupWorldSize = "GROUP_WORLD_SIZE";  // hosts in the assignment
inline constexpr const char* kTorchRoleRank = "ROLE_RANK";
inline constexpr const char* kTorchRoleWorldSize = "ROLE_WORLD_SIZE";
inline constexpr const char* kTorchRoleName = "ROLE_NAME";
inline constexpr const char* kTorchMasterAddr = "MASTER_ADDR";  // rank 0's host, as the driver names it
inline constexpr const char* kTorchMasterPort = "MASTER_PORT";  // reserved there for the epoch
inline constexpr const char* kTorchRestartCount = "TORCHELASTIC_RESTART_COUNT";
inline constexpr const char* kTorchMaxRestarts = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr const char* kTorchRunId = "TORCHELASTIC_RUN_ID";
// True: the worker's store (at MASTER_ADDR:MASTER_PORT) is hosted beside the workers,
// not by rank 0 (torch's _create_c10d_store then connects every rank as a client).
inline constexpr const char* kTorchUseAgentStore = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr const char* kTorchNcclAsyncErrors = "NCCL_ASYNC_ERROR_HANDLING";
// Horovod's launcher's (horovodrun's) per-worker variables, from the same assignment:
// scripts that read them before hvd.init() (and Horovod's own tests) find them.
inline constexpr const char* kHorovodRank = "HOROVOD_RANK";
inline constexpr const char* kHorovodSize = "HOROVOD_SIZE";
inline constexpr const char* kHorovodLocalRank = "HOROVOD_LOCAL_RANK";
inline constexpr const char* kHorovodLocalSize = "HOROVOD_LOCAL_SIZE";
inline constexpr const char* kHorovodCrossRank = "HOROVOD_CROSS_RANK";
inline constexpr const char* kHorovodCrossSize = "HOROVOD_CROSS_SIZE";
inline constexpr const char* kHorovodHostname = "HOROVOD_HOSTNAME";
// Set by elasticrund: a file of the worker's own, where torch's @record writes the
// exception that ended it (daemon/error_files.h); and, unless set, OMP_NUM_THREADS.
inline constexpr const char* kTorchErrorFile = "TORCHELASTIC_ERROR_FILE";
inline constexpr const char* kOmpNumThreads = "OMP_NUM_THREADS";

// Read by every program (common/log.cc): "warn", or "info,rendezvous=debug".
inline constexpr const char* kLogLevel = "ELASTICRUN_LOG_LEVEL";
// Read by elasticrun: the port of the elasticrund --listen on every host (--daemon-port).
inline constexpr const char* kDaemonPort = "ELASTICRUN_DAEMON_PORT";
// Read by elasticrun when its flag is not given: --daemon-secret-file, --ssh-identity-file,
// --ssh-known-hosts, --ssh-config.
inline constexpr const char* kDaemonSecretFile = "ELASTICRUN_DAEMON_SECRET_FILE";
inline constexpr const char* kSshKey = "ELASTICRUN_SSH_KEY";
inline constexpr const char* kSshKnownHosts = "ELASTICRUN_SSH_KNOWN_HOSTS";
inline constexpr const char* kSshConfig = "ELASTICRUN_SSH_CONFIG";

// What elasticrun passes from its own environment to every worker on every host
// (local workers inherit the rest too; remote ones get only this and -x): the
// library's settings above, OMP_NUM_THREADS, and the transports' (names starting UCX_
// or NCCL_), so that a job is tuned the same everywhere. -x VAR=VALUE overrides.
inline constexpr const char* kForwarded[] = {kAlgorithm, kProgress, kSegment, kCollectiveTimeout, kLogLevel,
                                             kNcclShrink, kTune, kOmpNumThreads};
inline constexpr const char* kForwardedPrefixes[] = {"UCX_", "NCCL_"};

}  // namespace elasticrun::env
