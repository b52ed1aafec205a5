// The host-memory Communicator: UCX transport underneath, algorithms on top.
//
// Algorithm choice: when every rank runs on this host, every collective goes
// through shared memory (shm_collectives.h; the segment is set up at the first
// call, and if any rank cannot map it every rank falls back to UCX). Otherwise UCX, by
// size (HostCommConfig::Crossover; host/flat.h): allreduce by recursive doubling for
// small vectors (or when there are fewer elements than ranks), recursive
// halving-doubling for middle ones where the ranks span hosts, and the pipelined ring
// above; broadcast binomial, by scatter-allgather (middle sizes across hosts) or
// chained; allgather(v) and reduce_scatter by rings, or where the ranks span hosts and
// the call is small, by Bruck's allgather (equal blocks) and the halving
// reduce-scatter. Across hosts that hold several ranks, allreduces and allgathers of
// any size and reduce-scatters of any size (on hosts of any sizes) are
// hierarchical (hierarchical.h): shared memory within each host, UCX among one rank per
// host, or for allreduces of rails_above_bytes..rails_max_bytes on hosts of equal size
// among each host's j-th ranks, rail by rail (bench/RESULTS.md: on shaped 4 x 2 hosts the allreduce 2x at 8-32 KiB and 1.2x
// at 64 KiB-8 MiB, the allgather 1.0-2.3x, the reduce-scatter 1.1-2.3x). Across hosts, where the
// crossovers only guess, the first calls of each size class measure the candidates
// (the direct and two-shot algorithms among them) and the ranks agree on the fastest
// (host/tuner.h; HostCommConfig::tune). ELASTICRUN_ALGORITHM=shm|ring|rd|rhd|direct|
// twoshot|hier|rails|auto forces it (ring, rd, rhd, direct and twoshot: UCX for every
// collective, and that allreduce algorithm; direct also every broadcast, allgather and
// reduce-scatter); it is read at every call unless HostCommConfig fixes it, so a test
// program can switch algorithms without rebuilding the communicator.
// ELASTICRUN_ALGORITHM=hier makes every allreduce, allgather and reduce-scatter across
// hosts hierarchical (the allreduce in the leaders' form), rails the same with every
// allreduce in rails (hosts of equal size only).
//
// Progress: busy-polling when this host runs no more ranks than it has cores,
// blocking on the UCX event fd otherwise; ELASTICRUN_PROGRESS=busy|block|auto forces it.
#pragma once

#include "control/abort_signal.h"
#include "control/settings.h"
#include "control/store.h"

#include <elasticrun/elasticrun.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace elasticrun::collective {

struct HostCommConfig {
  int rank = 0, size = 1;
  // Ranks sharing this host, and this rank's place among them; 0 means unknown
  // (assume all `size`). A host's ranks are consecutive: this host has ranks
  // rank - local_rank .. rank - local_rank + local_size - 1.
  int local_size = 0;
  int local_rank = 0;
  std::string scope;    // Store key prefix unique to this epoch, e.g. "e3/"
  std::chrono::milliseconds timeout = settings::kDefaultCollectiveTimeout;  // per-collective deadline
  // Unset: settings::algorithm() / settings::progress() (ELASTICRUN_ALGORITHM / _PROGRESS).
  std::optional<Algorithm> algorithm;
  std::optional<Progress> progress;
  // Pipeline chunk of the UCX ring and chain: `segment` if set, else ELASTICRUN_SEGMENT,
  // else by layout (the same on every rank): net_segment_bytes where the ranks span hosts
  // (eager messages below UCX_RNDV_THRESH, no rendezvous handshake per chunk; 1.19x at 4
  // MiB over 8 hosts' 100 Mbit/s links against 256 KiB; 32 KiB, with its header within
  // UCX_TCP_RX_SEG_SIZE's 64K (UCX's default, as it was then: ucx_transport.h), 1.2-1.9x
  // 64 KiB from 512 KiB on unshaped and 200 Mbit/s
  // links, the same at 100 Mbit/s; bench/RESULTS.md), segment_bytes on one host (a
  // single-copy rendezvous per chunk wins there). Where the ranks span hosts and nothing
  // forces the segment, the rings' grows with their blocks up to net_segment_max_bytes
  // (schedule::ring_segment: a quarter of one, less among few ranks; fewer messages per byte
  // where the blocks are large; bench/RESULTS.md, session 38); 0 keeps it fixed.
  std::optional<std::size_t> segment;
  std::size_t segment_bytes = 256 * 1024;
  std::size_t net_segment_bytes = 32 * 1024;
  std::size_t net_segment_max_bytes = 512 * 1024;
  int window = 4;                          // receives posted ahead in pipelines
  // The automatic flat allreduce: recursive doubling up to rd_max bytes (and in a size
  // class whose calls may hold fewer elements, of 8 bytes at most, than ranks), recursive
  // halving-doubling up to rhd_max, the ring above. `crossover` if set, else by layout
  // (the same on every rank). Where the ranks span hosts the bytes on the links are the
  // cost from a few KiB up (on 8 namespace hosts behind 200 Mbit/s links rhd took 1.3-2.2x
  // less time than rd at 8-32 KiB and the ring 1.3x less than rhd from 256 KiB;
  // bench/RESULTS.md). On one host (UCX there is a forced or fallback path) rd up to
  // 32 KiB and the ring above, as measured before rhd existed.
  // Allgather (equal blocks) and reduce_scatter: Bruck's allgather and the halving
  // reduce-scatter up to few_rounds_max bytes of result (input), the ring above (on 8
  // such hosts the ring's 7 rounds took 0.6-0.8x Open MPI's time up to 16 KiB).
  // Broadcast: scatter-allgather from scatter_min up to chain_min_bytes (the binomial
  // tree below, the chain above it; the tree's root sends the message log2(n) times).
  struct Crossover {
    std::size_t rd_max = 0, rhd_max = 0, few_rounds_max = 0;
    std::size_t scatter_min = SIZE_MAX;
  };
  std::optional<Crossover> crossover;
  Crossover local_crossover{32 * 1024, 32 * 1024, 0};
  Crossover net_crossover{4 * 1024, 128 * 1024, 64 * 1024, 8 * 1024};
  // Where the fixed crossovers only guess, measure (host/tuner.h, host/flat.h), each size
  // class on its first calls: an automatic allreduce up to rd_max tries rd against direct
  // (and rhd above halving_tuned_above), between rd_max and rhd_max rhd against rd and
  // direct (twoshot where direct does not fit), above it up to ring_tuned_max the ring
  // against rhd and twoshot; an allgather
  // of equal blocks or a reduce-scatter up to ring_tuned_max its fixed choice against the
  // other (Bruck's or halving, the ring) and direct, and of unequal blocks (the
  // hierarchical ones' leaders, on hosts of different sizes) direct against the ring; a broadcast below scatter_min the
  // binomial tree against direct, from scatter_min up to chain_min_bytes scatter-allgather
  // against the binomial tree and direct, above it the chain against the pipelined binary
  // tree and direct (direct only within direct_max_* and direct_broadcast_max_bytes,
  // below, and for a broadcast among 4 or more: among 3 the binomial tree is direct).
  // Unset: ELASTICRUN_TUNE (default on) where the ranks span hosts, off on one host.
  // `on_tuned`, if set, hears each decision (as the log does, at info).
  std::optional<bool> tune;
  std::function<void(const std::string&)> on_tuned;
  // The direct algorithms (one exchange: each rank sends its vector to every other; a
  // broadcast's root sends to every rank) are tuned against the others in a world of 3 to
  // direct_max_ranks where a rank's n-1 copies of the size class's largest call fit in
  // direct_max_bytes (the direct allgather and reduce-scatter, which send no more than
  // the ring, wherever their class is tuned). Where a message takes longer to cross than n-1 of them to send,
  // they beat the trees' log2(n) exchanges; elsewhere the tuner keeps the fixed choice.
  // A broadcast's direct sends its n-1 copies from the root alone, not from every rank: it
  // is tried up to direct_broadcast_max_bytes of them (8 ranks: up to 256 KiB, where behind
  // 1 ms links the chain's 7 hops took 2x Open MPI's root sending to all).
  // 256 KiB: on 8 ranks the allreduce's direct up to 32 KiB, two-shot (2(n-1)/n of the
  // vector in two exchanges) from 64 KiB; among 8 hosts behind 500 us links, at 64 KiB
  // direct's 448 KiB a rank took 5.9 ms in the tuner's trials; the calls after them 3.4-
  // 4.7 ms with two-shot, 4.8-5.0 with rd, chosen before (bench/RESULTS.md, session 36).
  std::size_t direct_max_bytes = 256 * 1024;
  // Recursive halving-doubling is also tried in rd's classes (below rd_max) whose calls are
  // all larger than this and hold an element per rank (Tuner::allreduce_candidates): rd
  // sends the whole vector log2(n) times, rhd twice its size in 2 log2(n) rounds. Among 8
  // hosts behind 100 Mbit/s links the tuner chose rhd at 4 KiB: 579-625 us a call against
  // rd's 1056 (and Open MPI's 1037); at 1-2 KiB it kept rd (bench/RESULTS.md, session 29).
  std::size_t halving_tuned_above = 512;
  // The ring's classes (above rhd_max) up to this are tuned too: the ring against rhd and,
  // among 3 to direct_max_ranks, the two-shot allreduce (a reduce-scatter and an allgather
  // in one exchange each). Forced among 8 hosts (bench/RESULTS.md, session 29): behind
  // 500 us links at 256 KiB the ring's 14 exchanges took 16 ms, rhd 10-11, two-shot 7;
  // on unshaped links rhd took 0.5-0.9x the ring's time at 256 KiB-1 MiB; behind
  // 200 Mbit/s links the ring and two-shot were level and rhd 1.3x slower at 256 KiB.
  // Up to 64 MiB (a DDP bucket of 25 MiB, Horovod's 64 MiB fusion buffer): with every
  // message eager over TCP (host/ucx_address.h), behind 500 us links among 8 hosts the
  // ring with the default wait took 1.5-2x the others' time at 2-4 MiB, where halving-
  // doubling or two-shot with waits that sleep at once won; behind 200 Mbit/s links the
  // ring stays ahead (rhd 1.4-1.5x its time at 2-16 MiB). Above it latency weighs less
  // against the bytes and each trial call costs more: the ring runs untuned.
  std::size_t ring_tuned_max = 64 * 1024 * 1024;
  std::size_t direct_broadcast_max_bytes = 2 * 1024 * 1024;
  int direct_max_ranks = 16;
  std::size_t chain_min_bytes = 128 * 1024;  // automatic broadcast: the chain above this size
  // Automatic allreduce: hierarchical up to this size (every size: since the leaders
  // allreduce the host sums in one call, it took 0.66-0.88x the flat algorithms' time at
  // 1-8 MiB on 4 x 2 hosts behind 200 Mbit/s links, 0.68-1.0x unshaped, level behind
  // 500 us ones; bench/RESULTS.md).
  std::size_t hier_max_bytes = SIZE_MAX;
  // Automatic hierarchical allreduce where every host holds the same number of ranks:
  // in rails (hierarchical.h: the hosts' j-th ranks allreduce the j-th part of the host
  // sums, every rank on the network) above rails_above_bytes up to rails_max_bytes, the
  // leaders' form elsewhere. On 4 x 2 namespace hosts (bench/RESULTS.md, session 34)
  // behind 500 us links rails took 0.77-0.81x the leaders' time at 2 MiB and 0.87-0.98x
  // at 4 MiB; 0.83-1.07x at 32 KiB-1 MiB, 0.82-1.21x at 8 MiB and 1.05-1.28x at 16 MiB
  // (every rank of 8 on the network, on 2 cores; the leaders sum the host as their ring
  // reads it, the rails sum it all first); behind 200 Mbit/s links both ran at the link
  // (0.99-1.03x) from 32 KiB to 16 MiB.
  std::size_t rails_above_bytes = 1024 * 1024;
  std::size_t rails_max_bytes = 4 * 1024 * 1024;
  // Shared-memory allreduce (bench/RESULTS.md has the measurements behind these):
  std::size_t shm_slot_bytes = 1024 * 1024;       // vector bytes per round (fewer barriers)
  std::size_t shm_max_segment = 16 * 1024 * 1024; // caps the slots when there are many ranks
  std::size_t shm_small_max = 8 * 1024;           // one barrier, every rank reduces it all, up to
  std::size_t shm_small_max_blocking = 32 * 1024; // ... this when ranks share cores (barriers cost more)
  // Broadcasts below this go by UCX even on one host: a binomial tree of eager
  // messages lets the root run ahead, where shared memory waits for every rank.
  std::size_t shm_broadcast_min_bytes = 4 * 1024;
  std::optional<std::string> shm_dir;        // for the segment; unset: $UCX_POSIX_DIR, else /dev/shm
  int parent_size = 0;  // a process set's communicator: the size of the one it is part of
};

// Whether `cfg`'s ranks span hosts (a known local_size below the size).
bool spans_hosts(const HostCommConfig& cfg);

// The progress mode that `cfg` resolves to on this machine (env and oversubscription).
Progress resolve_progress(const HostCommConfig& cfg);

// The pipeline segment `cfg` resolves to (HostCommConfig::segment): `least`, and the
// most the rings' grows to with their blocks (0: fixed at `least`).
struct Segments {
  std::size_t least = 0, most = 0;
};
Segments resolve_segments(const HostCommConfig& cfg);

std::unique_ptr<elasticrun::Communicator> make_host_communicator(const HostCommConfig& cfg,
                                                                std::shared_ptr<Store> store,
                                                                std::shared_ptr<AbortSignal> abort);

}  // namespace elasticrun::collective
