#include "host/host_communicator.h"

#include "host/algorithms.h"
#include "host/flat.h"
#include "host/reduce.h"
#include "host/hierarchical.h"
#include "host/shm_collectives.h"
#include "host/shm_setup.h"
#include "host/self_transport.h"
#include "host/sub_transport.h"
#include "host/tuner.h"
#include "host/ucx_transport.h"

#include <common/log.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string_view>
#include <vector>

namespace elasticrun::collective {
namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

class HostCommunicator final : public elasticrun::Communicator {
 public:
  HostCommunicator(const HostCommConfig& cfg, std::shared_ptr<Store> store, std::shared_ptr<AbortSignal> abort)
      : cfg_(cfg), store_(store), abort_(abort) {
    blocking_ = resolve_progress(cfg) == Progress::block;
    const bool across_hosts = spans_hosts(cfg);
    const Segments seg = resolve_segments(cfg);
    segment_ = seg.least;
    segment_max_ = seg.most;
    crossover_ = cfg.crossover.value_or(across_hosts ? cfg.net_crossover : cfg.local_crossover);
    tune_ = cfg.size > 1 && (cfg.tune ? *cfg.tune : across_hosts && settings::tune());
    if (cfg.size == 1) {
      tp_ = std::make_unique<SelfTransport>();
      return;
    }
    UcxTransport::Options o;
    o.rank = cfg.rank;
    o.size = cfg.size;
    o.local_size = cfg.local_size > 0 ? cfg.local_size : cfg.size;
    o.scope = cfg.scope;
    o.blocking = blocking_;
    o.timeout = cfg.timeout;
    tp_ = std::make_unique<UcxTransport>(o, std::move(store), std::move(abort));
  }

  // A process set's communicator: `members` of the parent's transport `tp`, in space
  // `id`. UCX algorithms only (no shared memory, no hierarchy), on the parent's progress.
  HostCommunicator(const HostCommConfig& cfg, std::shared_ptr<Store> store, std::shared_ptr<AbortSignal> abort,
                   std::unique_ptr<Transport> tp)
      : cfg_(cfg), store_(std::move(store)), abort_(std::move(abort)), tp_(std::move(tp)) {
    segment_ = cfg.segment.value_or(cfg.segment_bytes);
    segment_max_ = cfg.net_segment_max_bytes;  // the parent's, 0 where its segment is fixed
    crossover_ = cfg.crossover.value_or(cfg.local_crossover);
    shm_unavailable_ = hier_unavailable_ = "a process set runs on the UCX algorithms";
  }

  int rank() const override { return cfg_.rank; }
  int size() const override { return cfg_.size; }
  int tuning_calls() const override { return tune_ ? Tuner::most_calls(Tuner::kMaxCandidates) : 0; }

  Communicator& subset(int id, std::span<const int> members) override {
    if (id < 1 || id > kMaxSubsets)
      throw Error("subset: id " + std::to_string(id) + " is not in 1.." + std::to_string(kMaxSubsets));
    if (cfg_.parent_size > 0) throw Error("subset: a process set has no subsets of its own");
    std::vector<int> m(members.begin(), members.end());
    if (m.empty()) throw Error("subset: no members");
    std::vector<int> seen = m;
    std::sort(seen.begin(), seen.end());
    if (seen.front() < 0 || seen.back() >= cfg_.size)
      throw Error("subset: rank " + std::to_string(seen.front() < 0 ? seen.front() : seen.back()) +
                  " is not a rank of this communicator (size " + std::to_string(cfg_.size) + ")");
    if (std::adjacent_find(seen.begin(), seen.end()) != seen.end())
      throw Error("subset: rank " + std::to_string(*std::adjacent_find(seen.begin(), seen.end())) +
                  " is named twice");
    auto me = std::find(m.begin(), m.end(), cfg_.rank);
    if (me == m.end()) throw Error("subset: rank " + std::to_string(cfg_.rank) + " is not a member");
    Subset& s = subsets_[id];
    if (s.comm && s.members == m) return *s.comm;
    HostCommConfig c = cfg_;
    c.rank = static_cast<int>(me - m.begin());
    c.size = c.local_size = static_cast<int>(m.size());
    c.local_rank = c.rank;
    c.parent_size = cfg_.size;
    c.segment = segment_;  // the parent's choices: the same on every member
    c.net_segment_max_bytes = segment_max_;
    c.crossover = crossover_;
    c.scope = cfg_.scope + "set" + std::to_string(id) + "/";
    s.comm = std::make_unique<HostCommunicator>(c, store_, abort_, std::make_unique<SubTransport>(*tp_, m, id));
    s.members = std::move(m);
    return *s.comm;
  }

  void allreduce(const void* in, void* out, std::size_t count, DataType t, ReduceOp op) override {
    std::size_t bytes = count * size_of(t);
    check_buffers("allreduce", in, out, bytes);
    run("allreduce", [&](Step& st) {
      const Algorithm a = algorithm();
      if (cfg_.size == 1) {
        if (in != out) std::memcpy(out, in, bytes);
      } else if (ShmGroup* g = shm(st, a)) {
        allreduce_shm(*g, in, out, count, t, op, shm_wait(st));
      } else if (Hierarchy* h = use_hier(a, bytes) ? hierarchy(st) : nullptr) {
        allreduce_hierarchical(*h, st, a, in, out, count, t, op);
      } else if (forced_hier(a)) {
        throw Error(forced_but("allreduce", a) + hier_unavailable_);
      } else {
        allreduce_flat(st, flat(tuner_), a, in, out, count, t, op);
      }
    });
  }

  void broadcast(void* buf, std::size_t count, DataType t, int root) override {
    std::size_t bytes = count * size_of(t);
    if (root < 0 || root >= cfg_.size) throw Error("broadcast: root " + std::to_string(root) + " out of range");
    check_buffers("broadcast", buf, buf, bytes);
    run("broadcast", [&](Step& st) {
      if (cfg_.size == 1 || bytes == 0) return;
      const Algorithm a = algorithm();
      ShmGroup* g = bytes >= cfg_.shm_broadcast_min_bytes || a == Algorithm::shm ? shm(st, a) : nullptr;
      if (g) return broadcast_shm(*g, buf, bytes, root, shm_wait(st));
      if (Hierarchy* h = hierarchy(st, a)) return broadcast_hierarchical(*h, st, buf, bytes, root);
      if (forced_hier(a)) throw Error(forced_but("broadcast", a) + hier_unavailable_);
      broadcast_flat(st, flat(tuner_), a, buf, bytes, root);
    });
  }

  void allgather(const void* in, void* out, std::size_t count, DataType t) override {
    std::vector<std::size_t> counts(cfg_.size, count);
    allgatherv(in, out, counts, t);
  }

  void allgatherv(const void* in, void* out, std::span<const std::size_t> counts, DataType t) override {
    if (counts.size() != static_cast<std::size_t>(cfg_.size)) throw Error("allgatherv: counts must have size() entries");
    std::size_t total = 0;
    for (std::size_t c : counts) total += c;
    std::size_t elem = size_of(t);
    check_buffers("allgatherv", counts[cfg_.rank] ? in : out, out, total * elem);
    run("allgatherv", [&](Step& st) {
      if (total == 0) return;
      if (cfg_.size == 1) {
        if (in != out) std::memcpy(out, in, total * elem);
        return;
      }
      const Algorithm a = algorithm();
      if (ShmGroup* g = shm(st)) allgatherv_shm(*g, in, out, counts, elem, shm_wait(st));
      // Hierarchical at every size where hosts hold several ranks: flat, each rank's block
      // crosses the links once per rank of a remote host (direct), or the ring's n-1
      // steps cross them (bench/RESULTS.md: 4 hosts x 2 ranks, 1 KiB-8 MiB, against the
      // flat fixed choices 1.03-2.34x faster behind 200 Mbit/s links, 1.27-1.70x
      // unshaped, 1.26-2.07x behind 500 us ones).
      else if (Hierarchy* h = hierarchy(st, a))
        allgather_hierarchical(*h, st, in, out, counts, elem);
      else if (forced_hier(a)) throw Error(forced_but("allgatherv", a) + hier_unavailable_);
      else allgatherv_flat(st, flat(tuner_), a, in, out, counts, elem);
    });
  }

  void reduce_scatter(const void* in, void* out, std::size_t count, DataType t, ReduceOp op) override {
    std::size_t bytes = count * size_of(t);
    check_buffers("reduce_scatter", in, out, bytes);
    run("reduce_scatter", [&](Step& st) {
      if (cfg_.size == 1) {
        if (in != out) std::memcpy(out, in, bytes);
      } else if (bytes > 0) {
        const Algorithm a = algorithm();
        if (ShmGroup* g = shm(st)) reduce_scatter_shm(*g, in, out, count, t, op, shm_wait(st));
        else if (Hierarchy* h = hierarchy(st, a); h && hier_rs_unavailable(*h, t).empty())
          reduce_scatter_hierarchical(*h, st, in, out, count, t, op);
        else if (forced_hier(a))
          throw Error(forced_but("reduce_scatter", a) + (h ? hier_rs_unavailable(*h, t) : hier_unavailable_));
        else reduce_scatter_flat(st, flat(tuner_), a, in, out, count, t, op);
      }
    });
  }

  void alltoall(const void* in, void* out, std::size_t count, DataType t) override {
    std::size_t bytes = count * size_of(t);
    check_buffers("alltoall", in, out, bytes);
    run("alltoall", [&](Step& st) {
      if (bytes == 0) return;
      if (ShmGroup* g = shm(st)) alltoall_shm(*g, in, out, bytes, shm_wait(st));
      else alltoall_pairwise(st, in, out, bytes);
    });
  }

  void barrier() override {
    run("barrier", [&](Step& st) {
      if (ShmGroup* g = shm(st)) g->barrier(st.deadline, *abort_, st.what);
      else barrier_dissemination(st);
    });
  }

 private:
  static void check_buffers(const char* what, const void* in, const void* out, std::size_t bytes) {
    if (bytes > 0 && (!in || !out)) throw Error(std::string(what) + ": null buffer");
  }

  Algorithm algorithm() const { return cfg_.algorithm ? *cfg_.algorithm : settings::algorithm(); }

  // The flat algorithms' choices (host/flat.h) with this communicator's settings, measured
  // by `tuner` where tuning is on.
  Flat flat(Tuner& tuner) { return {cfg_, crossover_, tune_ ? &tuner : nullptr}; }

  // The two levels of a hierarchical collective, as this rank sees them.
  struct Hierarchy {
    std::unique_ptr<ShmGroup> host;          // null when this rank is alone on its host
    std::unique_ptr<SubTransport> leaders;   // the hosts' first ranks; used by them only
    Tuner tuner;                             // the leaders' decisions (theirs alone)
    std::vector<int> hosts;                  // each host's ranks, in rank order
    bool leader = false;
    int index = 0;                           // this host's place in `hosts`
    std::size_t round_bytes = 0;             // the same on every rank
    std::vector<std::byte> sums;             // the leader's: a reduce-scatter's host sums
    // Where every host holds the same number of ranks: this rank's rail (the hosts' ranks
    // of its local rank) and its decisions; null elsewhere.
    std::unique_ptr<SubTransport> rail;
    Tuner rail_tuner;
    HostCommConfig::Crossover rail_crossover;  // the flat crossovers' rd_max and rhd_max over L
  };

  // Whether an allreduce of `bytes` is to be hierarchical where the hosts allow it (the
  // same answer on every rank: hierarchy() is collective the first time). Automatic: up
  // to hier_max_bytes (every size by default), and only where this rank's host holds
  // several ranks or some other's may (local_size() is this host's; hierarchy() gathers
  // everyone's).
  bool use_hier(Algorithm a, std::size_t bytes) const {
    return forced_hier(a) || (a == Algorithm::automatic && bytes <= cfg_.hier_max_bytes);
  }
  static bool forced_hier(Algorithm a) { return a == Algorithm::hier || a == Algorithm::rails; }
  static std::string forced_but(const char* what, Algorithm a) {
    return std::string(what) + ": ELASTICRUN_ALGORITHM=" + (a == Algorithm::rails ? "rails" : "hier") + ", but ";
  }

  // Set up by the first hierarchical collective; null (with hier_unavailable_ saying
  // why, the same on every rank) when the ranks are on one host, one per host, or
  // laid out other than host by host, or when a host's segment could not be made.
  Hierarchy* hierarchy(Step& st, Algorithm a) {
    return forced_hier(a) || a == Algorithm::automatic ? hierarchy(st) : nullptr;
  }
  Hierarchy* hierarchy(Step& st) {
    if (hier_) return hier_.get();
    if (hier_unavailable_.empty() && local_size() == cfg_.size) hier_unavailable_ = "every rank is on one host";
    if (!hier_unavailable_.empty()) return nullptr;
    // Where every rank is: each one's (local_rank, local_size), gathered over UCX.
    const int n = cfg_.size;
    std::int32_t mine[2] = {cfg_.local_rank, local_size()};
    std::vector<std::int32_t> all(2 * static_cast<std::size_t>(n));
    std::vector<std::size_t> counts(n, 2);
    Step gather = step(st.tp, st.deadline, seq_++, st.what);
    allgatherv_ring(gather, mine, all.data(), counts, sizeof(std::int32_t));
    std::vector<int> leaders;
    int widest = 1;
    for (int q = 0; q < n && hier_unavailable_.empty();) {
      int ls = all[2 * q + 1];
      bool ok = all[2 * q] == 0 && ls >= 1 && q + ls <= n;
      for (int i = 0; ok && i < ls; ++i) ok = all[2 * (q + i)] == i && all[2 * (q + i) + 1] == ls;
      if (!ok) hier_unavailable_ = "the ranks are not laid out host by host (rank " + std::to_string(q) + ")";
      leaders.push_back(q);
      widest = std::max(widest, ls);
      q += std::max(ls, 1);
    }
    if (hier_unavailable_.empty() && leaders.size() == 1) hier_unavailable_ = "every rank is on one host";
    if (hier_unavailable_.empty() && widest == 1) hier_unavailable_ = "every host runs one rank";
    if (!hier_unavailable_.empty()) return nullptr;
    auto h = std::make_unique<Hierarchy>();
    for (int q : leaders) h->hosts.push_back(all[2 * q + 1]);
    // Every host's slots hold a round; the widest host decides how big one can be.
    h->round_bytes = std::min(cfg_.shm_slot_bytes, cfg_.shm_max_segment / (2 * (widest + 1))) / 4096 * 4096;
    h->round_bytes = std::max<std::size_t>(h->round_bytes, 4096);
    const int base = cfg_.rank - cfg_.local_rank;
    h->index = static_cast<int>(std::find(leaders.begin(), leaders.end(), base) - leaders.begin());
    if (!make_group(st, "hier/" + std::to_string(base), cfg_.local_rank, local_size(), h->round_bytes, h->host,
                    hier_unavailable_)) {
      ER_LOG(collective, warn, "hierarchical collectives are off for this epoch: {}", hier_unavailable_);
      return nullptr;
    }
    h->leader = cfg_.local_rank == 0;
    if (std::all_of(h->hosts.begin(), h->hosts.end(), [&](int l) { return l == h->hosts[0]; })) {
      std::vector<int> rail;  // every host has a rank of this local rank
      for (int q : leaders) rail.push_back(q + cfg_.local_rank);
      h->rail = std::make_unique<SubTransport>(*tp_, std::move(rail));
      // A host's link carries its L rails' parts at once: a rail's part of a vector is in
      // the class the vector's bytes on that link put it in.
      h->rail_crossover = crossover_;
      h->rail_crossover.rd_max /= static_cast<std::size_t>(h->hosts[0]);
      h->rail_crossover.rhd_max /= static_cast<std::size_t>(h->hosts[0]);
    }
    h->leaders = std::make_unique<SubTransport>(*tp_, std::move(leaders));
    hier_ = std::move(h);
    return hier_.get();
  }

  void allreduce_hierarchical(Hierarchy& h, Step& st, Algorithm a, const void* in, void* out, std::size_t count,
                              DataType t, ReduceOp op) {
    const std::uint64_t across = seq_++;  // every rank reserves the leaders' (or the rails') sequence number
    const std::size_t bytes = count * size_of(t);
    if (a == Algorithm::rails && !h.rail)
      throw Error(forced_but("allreduce", a) + "the hosts run different numbers of ranks");
    if (h.rail && (a == Algorithm::rails || (a == Algorithm::automatic && bytes > cfg_.rails_above_bytes &&
                                             bytes <= cfg_.rails_max_bytes))) {
      HierRails hr{h.host.get(), cfg_.size, [&](void* buf, std::size_t n) {
        Step sub = step(*h.rail, st.deadline, across, st.what);
        const Flat f{cfg_, h.rail_crossover, tune_ ? &h.rail_tuner : nullptr};
        allreduce_flat(sub, f, Algorithm::automatic, buf, buf, n, t, accumulate_op(op));
      }};
      return allreduce_rails(hr, in, out, count, t, op, shm_wait(st));
    }
    HierAllreduce ha{h.host.get(), h.leader, cfg_.size, static_cast<int>(h.hosts.size()), h.index, h.round_bytes, {}};
    if (h.leader)
      ha.across = [&](void* buf, std::size_t n, const InputReady& ready) {
        Step sub = step(*h.leaders, st.deadline, across, st.what);
        allreduce_flat(sub, flat(h.tuner), Algorithm::automatic, buf, buf, n, t, accumulate_op(op), &ready);
      };
    allreduce_hier(ha, in, out, count, t, op, shm_wait(st));
  }

  void allgather_hierarchical(Hierarchy& h, Step& st, const void* in, void* out, std::span<const std::size_t> counts,
                              std::size_t elem) {
    const std::uint64_t across = seq_++;  // every rank reserves the leaders' sequence number
    HierAllgather ha{h.host.get(), h.leader, cfg_.rank - cfg_.local_rank, h.hosts, {}};
    if (h.leader)
      ha.across = [&](const void* part, void* all, std::span<const std::size_t> parts) {
        Step sub = step(*h.leaders, st.deadline, across, st.what);
        allgatherv_flat(sub, flat(h.tuner), Algorithm::automatic, part, all, parts, elem);
      };
    allgather_hier(ha, in, out, counts, elem, shm_wait(st));
  }

  void broadcast_hierarchical(Hierarchy& h, Step& st, void* buf, std::size_t bytes, int root) {
    const std::uint64_t across = seq_++;  // every rank reserves the leaders' sequence number
    int first = 0, host = 0;  // the root's host: its first rank and its place among the hosts
    while (first + h.hosts[host] <= root) first += h.hosts[host++];
    HierBroadcast hb{h.host.get(), h.leader, host == h.index, root - first, {}};
    if (h.leader)
      hb.across = [&](void* data, std::size_t n) {
        Step sub = step(*h.leaders, st.deadline, across, st.what);
        broadcast_flat(sub, flat(h.tuner), Algorithm::automatic, data, n, host);
      };
    broadcast_hier(hb, buf, bytes, shm_wait(st));
  }

  // Why the reduce-scatter cannot be hierarchical on `h` (empty: it can; the same everywhere).
  std::string hier_rs_unavailable(const Hierarchy& h, DataType t) const {
    if (!hier_rs_piece(size_of(t), *std::max_element(h.hosts.begin(), h.hosts.end()), h.round_bytes))
      return "a round cannot hold an element of each host rank";
    return "";
  }

  void reduce_scatter_hierarchical(Hierarchy& h, Step& st, const void* in, void* out, std::size_t count, DataType t,
                                   ReduceOp op) {
    const std::uint64_t across = seq_++;  // every rank reserves the leaders' sequence number
    if (h.leader && h.host) h.sums.resize(std::max(h.sums.size(), count * size_of(t) * cfg_.size));
    HierReduceScatter hr{h.host.get(), h.leader, cfg_.rank - cfg_.local_rank, cfg_.size, h.index, h.hosts,
                         h.round_bytes, h.sums.data(), {}};
    if (h.leader)
      hr.across = [&](const std::byte* input, std::byte* ours, std::span<const std::size_t> parts,
                      const InputReady* ready) {
        Step sub = step(*h.leaders, st.deadline, across, st.what);
        reduce_scatterv_flat(sub, flat(h.tuner), Algorithm::automatic, input, ours, parts, t, accumulate_op(op), ready);
      };
    reduce_scatter_hier(hr, in, out, count, t, op, shm_wait(st));
  }

  // The shared-memory group if this call should use it: null under a forced ring or
  // rd (which mean the UCX algorithms for every collective), for a world of one, or
  // when it is unavailable. A forced shm that is unavailable is an error.
  ShmGroup* shm(Step& st) { return shm(st, algorithm()); }
  ShmGroup* shm(Step& st, Algorithm a) {
    if (cfg_.size < 2 || (a != Algorithm::shm && a != Algorithm::automatic)) return nullptr;
    if (ShmGroup* g = shared_memory(st)) return g;
    if (a == Algorithm::shm) throw Error(std::string(st.what) + ": ELASTICRUN_ALGORITHM=shm, but " + shm_unavailable_);
    return nullptr;
  }

  ShmWait shm_wait(const Step& st) const { return {st.deadline, *abort_, st.what}; }

  // The shared-memory group of this host's ranks, set up by the first call that
  // wants it; null when the ranks span hosts or any rank could not map the
  // segment (every rank then agrees to use the UCX algorithms). Collective: all
  // ranks reach it in the same call, because the choice depends only on the
  // configuration and the algorithm setting, which are the same everywhere.
  ShmGroup* shared_memory(Step& st) {
    if (shm_) return shm_.get();
    if (!shm_unavailable_.empty()) return nullptr;
    if (local_size() != cfg_.size) {
      shm_unavailable_ = "the ranks span hosts";
      return nullptr;
    }
    // Slots of shm_slot_bytes, smaller where many ranks would make the segment
    // (two sets of size+1 slots) larger than shm_max_segment.
    std::size_t slot = std::min(cfg_.shm_slot_bytes, cfg_.shm_max_segment / (2 * (cfg_.size + 1)));
    std::unique_ptr<ShmGroup> g;
    if (!make_group(st, "shm", cfg_.rank, cfg_.size, slot, g, shm_unavailable_)) {
      ER_LOG(collective, warn, "shared memory collectives are off for this epoch: {}", shm_unavailable_);
      return nullptr;
    }
    shm_ = std::move(g);
    return shm_.get();
  }

  int local_size() const { return cfg_.local_size > 0 ? cfg_.local_size : cfg_.size; }

  // Makes this rank's shared-memory group: `group_size` ranks, this one `group_rank`
  // among them, found under Store key scope + `name` (make_shm_group: collective over the
  // whole communicator).
  bool make_group(Step& st, const std::string& name, int group_rank, int group_size, std::size_t slot,
                  std::unique_ptr<ShmGroup>& out, std::string& why) {
    ShmGroup::Options o;
    o.rank = group_rank;
    o.size = group_size;
    o.first_rank = cfg_.rank - group_rank;  // a host's ranks are consecutive
    o.blocking = blocking_;
    o.dir = cfg_.shm_dir ? *cfg_.shm_dir : env_or("UCX_POSIX_DIR", "");  // the worker's own, under a daemon
    o.slot_bytes = slot;
    o.small_max = blocking_ ? cfg_.shm_small_max_blocking : cfg_.shm_small_max;
    o.progress = [tp = tp_.get()] { tp->progress(); };
    Step agree = step(st.tp, st.deadline, seq_++, st.what);
    return make_shm_group(o, *store_, cfg_.scope + name, agree, *abort_, out, why);
  }

  Step step(Transport& tp, Clock::time_point deadline, std::uint64_t seq, const char* what) {
    Step st{tp, deadline, seq, ws_, segment_, cfg_.window, what};
    st.segment_max = segment_max_;
    return st;
  }

  // Runs one collective with a fresh deadline and tag sequence. A failure leaves
  // peers at unknown points, so the communicator refuses further use afterwards:
  // the caller rebuilds it for the next epoch.
  template <class F>
  void run(const char* what, F&& body) {
    abort_->check();
    if (!broken_.empty()) throw Error(std::string(what) + ": communicator unusable after: " + broken_);
    Step st = step(*tp_, Clock::now() + cfg_.timeout, seq_++, what);
    try {
      body(st);
    } catch (const std::exception& e) {
      broken_ = e.what();
      tp_->cancel_all();
      throw;
    }
  }

  HostCommConfig cfg_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<AbortSignal> abort_;
  bool blocking_ = false;
  std::size_t segment_ = 0;  // the UCX algorithms' pipeline chunk (HostCommConfig::segment)
  std::size_t segment_max_ = 0;  // the ring's grows to this with its blocks; 0: fixed
  HostCommConfig::Crossover crossover_;
  bool tune_ = false;  // measure where the crossovers guess (HostCommConfig::tune)
  Tuner tuner_;        // this communicator's measured choices
  std::unique_ptr<Transport> tp_;  // UCX, or SelfTransport in a world of one
  std::unique_ptr<ShmGroup> shm_;
  std::string shm_unavailable_;  // why there is no shm_, once decided
  std::unique_ptr<Hierarchy> hier_;
  std::string hier_unavailable_;  // why there is no hier_, once decided
  Workspace ws_;
  std::uint64_t seq_ = 0;
  std::string broken_;
  // The process sets' communicators by id; they use tp_, so they go first.
  struct Subset {
    std::vector<int> members;
    std::unique_ptr<HostCommunicator> comm;
  };
  std::map<int, Subset> subsets_;
};

}  // namespace

std::unique_ptr<elasticrun::Communicator> make_host_communicator(const HostCommConfig& cfg,
                                                                std::shared_ptr<Store> store,
                                                                std::shared_ptr<AbortSignal> abort) {
  if (cfg.size < 1 || cfg.rank < 0 || cfg.rank >= cfg.size)
    throw Error("communicator: rank " + std::to_string(cfg.rank) + " of size " + std::to_string(cfg.size));
  if (!store || !abort) throw Error("communicator: store and abort signal are required");
  return std::make_unique<HostCommunicator>(cfg, std::move(store), std::move(abort));
}

}  // namespace elasticrun::collective
