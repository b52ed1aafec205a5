#include "host/flat.h"

#include <algorithm>
#include <span>
#include <string_view>

namespace elasticrun::collective {
namespace {

bool equal_blocks(std::span<const std::size_t> counts) {
  return std::all_of(counts.begin(), counts.end(), [&](std::size_t c) { return c == counts[0]; });
}

bool tuned_up_to(const Flat& f, std::size_t bytes, std::size_t most) {
  return f.tuner && Tuner::size_class(bytes).second <= most;
}

// Runs candidate 0 where there is no tuner or nothing to choose, else as the tuner picks.
template <class F>
void run(Step& st, const Flat& f, Tuner::Kind k, std::size_t bytes, const Tuner::Candidates& c, F&& run_algorithm) {
  if (!f.tuner || c.total() < 2) return run_algorithm(0);
  run_tuned(st, *f.tuner, k, bytes, c, f.cfg.on_tuned, run_algorithm);
}

// An allgather's or reduce-scatter's candidates: direct where forced, else its fixed
// choice (`few_rounds` in a size class up to few_rounds_max, the ring above) and, where
// tuned, the other of the two and, up to direct_max_ranks, direct.
Tuner::Candidates gather_candidates(const Step& st, const Flat& f, Algorithm a, bool few, const char* few_rounds,
                                    bool tuned) {
  Tuner::Candidates c{};
  c.add(a == Algorithm::direct ? "direct" : few ? few_rounds : "ring");
  if (tuned) {
    c.add(few ? "ring" : few_rounds);
    if (st.tp.size() <= f.cfg.direct_max_ranks) c.add("direct");
    c.sleeping = st.tp.sleeps();
  }
  return c;
}

// The candidates where the blocks differ in size (Bruck's and halving need equal ones):
// direct where forced; else in few rounds direct (one exchange, among up to
// direct_max_ranks), else the ring, and where tuned each against the other.
Tuner::Candidates unequal_candidates(const Step& st, const Flat& f, Algorithm a, std::size_t bytes) {
  const int n = st.tp.size();
  const bool direct_fits = n <= f.cfg.direct_max_ranks;
  const bool few = direct_fits && Tuner::size_class(bytes).second <= f.crossover.few_rounds_max;
  Tuner::Candidates c{};
  c.add(a == Algorithm::direct || few ? "direct" : "ring");
  if (a == Algorithm::automatic && n > 2 && direct_fits && tuned_up_to(f, bytes, f.cfg.ring_tuned_max)) {
    c.add(few ? "ring" : "direct");
    c.sleeping = st.tp.sleeps();
  }
  return c;
}

}  // namespace

void allreduce_flat(Step& st, const Flat& f, Algorithm a, const void* in, void* out, std::size_t count, DataType t,
                    ReduceOp op, const InputReady* ready) {
  const std::size_t bytes = count * size_of(t);
  auto run_one = [&](Algorithm x) {
    const bool ring = x != Algorithm::rd && x != Algorithm::rhd && x != Algorithm::direct && x != Algorithm::twoshot;
    if (ring) return allreduce_ring(st, in, out, count, t, op, ready);
    if (ready) (*ready)(0, count);
    if (x == Algorithm::rd) allreduce_rd(st, in, out, count, t, op);
    else if (x == Algorithm::rhd) allreduce_rhd(st, in, out, count, t, op);
    else if (x == Algorithm::direct) allreduce_direct(st, in, out, count, t, op);
    else allreduce_twoshot(st, in, out, count, t, op);
  };
  if (a != Algorithm::automatic) return run_one(a);
  const int n = st.tp.size();
  const bool few = Tuner::size_class(bytes).first < 8 * static_cast<std::size_t>(n);  // Crossover
  a = bytes <= f.crossover.rd_max || few ? Algorithm::rd
      : bytes <= f.crossover.rhd_max     ? Algorithm::rhd
                                         : Algorithm::ring;
  if (!f.tuner || (a == Algorithm::ring && !tuned_up_to(f, bytes, f.cfg.ring_tuned_max))) return run_one(a);
  const Tuner::Candidates c = Tuner::allreduce_candidates(
      a == Algorithm::rd ? "rd" : a == Algorithm::rhd ? "rhd" : "ring", n, bytes, f.cfg.halving_tuned_above,
      Tuner::direct_fits(n, bytes, f.cfg.direct_max_ranks, f.cfg.direct_max_bytes),
      n >= 3 && n <= f.cfg.direct_max_ranks, st.tp.sleeps());
  run(st, f, Tuner::Kind::allreduce, bytes, c, [&](int i) { run_one(parse_algorithm(c.names[i], "tuned allreduce")); });
}

void broadcast_flat(Step& st, const Flat& f, Algorithm a, void* buf, std::size_t bytes, int root) {
  const int n = st.tp.size();
  if (a == Algorithm::direct) return broadcast_direct(st, buf, bytes, root);
  const bool tuned = f.tuner && a == Algorithm::automatic && n > 2;  // else the fixed choice
  const bool chain = bytes > f.cfg.chain_min_bytes && n > 2;
  const bool tree = !chain && (bytes < f.crossover.scatter_min || n <= 2);  // the binomial tree
  const char* fixed = chain ? "chain" : tree ? "binomial" : "scatter-allgather";
  const bool direct = n > 3 && Tuner::direct_fits(n, bytes, f.cfg.direct_max_ranks, f.cfg.direct_broadcast_max_bytes);
  Tuner::Candidates c{{fixed, chain ? "bintree" : tree ? "direct" : "binomial", "direct"},
                      tuned ? (tree ? 1 : 2) + direct : 1, tuned && st.tp.sleeps()};
  run(st, f, Tuner::Kind::broadcast, bytes, c, [&](int i) {
    const std::string_view name = c.names[i];
    if (name == "binomial") broadcast_binomial(st, buf, bytes, root);
    else if (name == "direct") broadcast_direct(st, buf, bytes, root);
    else if (name == "chain" || name == "bintree") broadcast_pipelined(st, buf, bytes, root, name == "chain" ? 1 : 2);
    else broadcast_scatter_allgather(st, buf, bytes, root);
  });
}

void allgatherv_flat(Step& st, const Flat& f, Algorithm a, const void* in, void* out,
                     std::span<const std::size_t> counts, std::size_t elem) {
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  const std::size_t bytes = total * elem;
  const int n = st.tp.size();
  const bool equal = equal_blocks(counts);
  const bool tuned = a == Algorithm::automatic && n > 2 && tuned_up_to(f, bytes, f.cfg.ring_tuned_max);
  const bool few = Tuner::size_class(bytes).second <= f.crossover.few_rounds_max;  // by the class
  const Tuner::Candidates c =
      equal ? gather_candidates(st, f, a, few, "bruck", tuned) : unequal_candidates(st, f, a, bytes);
  run(st, f, equal ? Tuner::Kind::allgather : Tuner::Kind::allgatherv, bytes, c, [&](int i) {
    const std::string_view name = c.names[i];
    if (name == "direct") allgatherv_direct(st, in, out, counts, elem);
    else if (name == "bruck") allgather_bruck(st, in, out, counts[0] * elem);
    else allgatherv_ring(st, in, out, counts, elem);
  });
}

void reduce_scatter_flat(Step& st, const Flat& f, Algorithm a, const void* in, void* out, std::size_t count,
                         DataType t, ReduceOp op, const InputReady* ready) {
  const int n = st.tp.size();
  const std::size_t bytes = count * size_of(t) * static_cast<std::size_t>(n);  // the input
  const bool tuned = a == Algorithm::automatic && n > 2 && tuned_up_to(f, bytes, f.cfg.ring_tuned_max);
  const bool few = Tuner::size_class(bytes).second <= f.crossover.few_rounds_max;  // by the class
  const Tuner::Candidates c = gather_candidates(st, f, a, few, "halving", tuned);
  run(st, f, Tuner::Kind::reduce_scatter, bytes, c, [&](int i) {
    const std::string_view name = c.names[i];
    if (name == "ring") return reduce_scatter_ring(st, in, out, count, t, op, ready);
    if (ready) (*ready)(0, count * static_cast<std::size_t>(n));
    if (name == "direct") reduce_scatter_direct(st, in, out, count, t, op);
    else reduce_scatter_halving(st, in, out, count, t, op);
  });
}

void reduce_scatterv_flat(Step& st, const Flat& f, Algorithm a, const void* in, void* out,
                          std::span<const std::size_t> counts, DataType t, ReduceOp op, const InputReady* ready) {
  if (equal_blocks(counts)) return reduce_scatter_flat(st, f, a, in, out, counts[0], t, op, ready);
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  const std::size_t bytes = total * size_of(t);
  const Tuner::Candidates c = unequal_candidates(st, f, a, bytes);
  run(st, f, Tuner::Kind::reduce_scatterv, bytes, c, [&](int i) {
    if (std::string_view(c.names[i]) == "ring") return reduce_scatterv_ring(st, in, out, counts, t, op, ready);
    if (ready) (*ready)(0, total);
    reduce_scatterv_direct(st, in, out, counts, t, op);
  });
}

}  // namespace elasticrun::collective
