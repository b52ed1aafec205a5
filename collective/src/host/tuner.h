// The online choice among two or three algorithms where the fixed crossovers only guess.
//
// A fixed crossover (HostCommConfig::Crossover) is right for the network it was measured
// on: on zero-latency links behind 200 Mbit/s, recursive halving-doubling beats recursive
// doubling from 8 KiB, but where a message takes a millisecond to cross, rhd's extra
// log2(n) rounds cost more than rd's extra bytes up to far larger sizes (bench/RESULTS.md).
// So, in the ranges where the choice depends on the network, the communicator measures
// each size class (a power-of-two range of bytes) on its first calls: kWarm calls of the
// fixed choice, not counted (a program's first calls run slow: behind 200 Mbit/s links
// whichever candidate went first measured 1.5-2.5x its steady time), then a run of kRun
// calls of the fixed choice and one of each alternative. The first kSettle calls of each
// run are not counted either: they pay for what the other left behind (a token bucket
// the other drained or left full; alternating the two call by call favoured whichever
// used more bytes). Each rank keeps the median of each candidate's timed calls (not the
// fastest: that is the one that caught a full bucket, not the pace of a loop of calls),
// the ranks sum those (an allreduce of one double per candidate, by recursive doubling,
// in the same call; for a broadcast they take the slowest rank's, and each of its timed
// calls starts from a barrier: line_up), and from then on the class runs the candidate
// with the smallest (an alternative only when it is kMargin faster than the fixed choice).
// An alternative that wins must win again: a second round runs it and then the fixed
// choice (the other order), and only if it is again kMargin faster does it stay; else
// the fixed choice does. One disturbance on shared cores (rd's five calls at 280 us, its
// usual 95-140, behind 200 Mbit/s links) had made the direct allreduce, 2x slower there,
// the choice of a class; a second disturbance in the same place is far less likely, and
// the fixed choice is what runs without a tuner anyway. Every rank makes the same calls in the
// same order, so every rank reaches the agreement in the same call and decides alike.
// Behind a bursty rate limit the runs are still too short to see a loop's steady state
// (bench/RESULTS.md: rd picked at 8 KiB on 200 Mbit/s token buckets, run at 0.68x).
//
// Where waits sleep (blocking progress: more ranks than cores), each algorithm is also a
// candidate with waits that sleep at once (Transport::sleep_at_once), after the ones with
// the default wait, which yields the core first: "rd+sleep". On one machine's 2 cores
// the yielding made the calls of 8 namespace hosts 1.6-1.9x faster across unshaped links
// (8 B-4 KiB allreduces), and 1.6-2x slower behind 1 ms links (256 KiB-2 MiB
// broadcasts, 4 KiB allreduces): there every rank waits a millisecond per exchange, and
// eight ranks yielding for it kept both cores busy (bench/RESULTS.md, session 28). A
// call leaves the waits as its candidate set them, for whatever the program runs next:
// set for the class's own calls only, the ranks done early yielded in the barrier that
// followed a broadcast while the others still forwarded (7.1 ms a call, not 4.4).
//
// A Tuner holds the decisions of one set of ranks (a communicator's transport, or the
// hierarchy's leaders) for the life of that communicator: an elastic epoch, whose new
// communicator measures again.
#pragma once

#include "host/algorithms.h"

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>

namespace elasticrun::collective {

class Tuner {
 public:
  // allgatherv and reduce_scatterv: blocks of different sizes, which have other candidates.
  enum class Kind { allreduce, broadcast, allgather, reduce_scatter, allgatherv, reduce_scatterv };
  static const char* name(Kind k);
  static constexpr int kMaxAlgorithms = 3;
  static constexpr int kMaxCandidates = 2 * kMaxAlgorithms;  // each algorithm, then each sleeping
  static constexpr int kWarm = 4;          // untimed calls of the fixed choice first
  static constexpr int kSettle = 2;        // untimed calls at the start of each candidate's run
  static constexpr int kTrials = 5;        // timed calls per candidate (after kSettle untimed)
  static constexpr int kRun = kSettle + kTrials;
  // An alternative must be this much faster, in both rounds. Where the candidates differ
  // by the network (1 ms links) the winner took 0.3-0.7x the fixed choice's time; where
  // they do not, 8 ranks on 2 cores measured 50-500 us calls with alternatives 10-70 %
  // apart one round and reversed the next (small broadcasts behind 200 Mbit/s links).
  static constexpr double kMargin = 0.2;
  // A class's calls until the first agreement, with `candidates` candidates; and until
  // its choice is fixed when an alternative won that one (the confirming round).
  static constexpr int calls(int candidates) { return kWarm + candidates * kRun; }
  static constexpr int most_calls(int candidates) { return calls(candidates) + 2 * kRun; }

  // A class's algorithms by name (for the log), in order: [0] the fixed crossover's
  // choice, then the alternatives; where `sleeping`, each again with waits that sleep at
  // once, in the same order after them. The same on every rank for a class: it may
  // depend on the world and the class (its upper bound), never on the exact size of a call.
  struct Candidates {
    std::array<const char*, kMaxAlgorithms> names{};
    int count = 0;  // algorithms
    bool sleeping = false;
    void add(const char* name) { names[count++] = name; }
    int total() const { return sleeping ? 2 * count : count; }
    int algorithm(int candidate) const { return candidate % count; }
    bool sleeps(int candidate) const { return candidate >= count; }
    std::string name(int candidate) const {
      return std::string(names[algorithm(candidate)]) + (sleeps(candidate) ? "+sleep" : "");
    }
  };
  using Times = std::array<double, kMaxCandidates>;

  // The candidate the next call of `bytes` runs (an index into its Candidates).
  int pick(Kind k, std::size_t bytes) const;
  // Whether the next call of `bytes` is one of the timed trials.
  bool timed(Kind k, std::size_t bytes) const;
  // Lines st's ranks up (a dissemination barrier on steps past any algorithm's) before a
  // broadcast's timed trial, so that it times the broadcast from a common start: its
  // latency, as a program that waits for the data sees it. Back to back, a broadcast's
  // root runs ahead and every rank finds its data there already: the binomial tree and
  // direct measured 1-5 us a call at every size behind 1 ms links, a coin toss.
  static void line_up(Step& st);
  // Records the call's time (seconds) on this rank; true when the class has all its
  // samples (of the round) and the ranks must now agree: sum samples() over them and pass
  // it to decide().
  bool record(Kind k, std::size_t bytes, int candidates, int candidate, double seconds);
  Times samples(Kind k, std::size_t bytes) const;  // each candidate's median; 0 past the last
  // After the first round: the fastest alternative if it is kMargin faster than the fixed
  // choice, which then runs the confirming round (not yet decided()), else the fixed
  // choice, decided. After the confirming round: that alternative if it is again kMargin
  // faster, else the fixed choice; decided. Returns the candidate chosen or confirming.
  int decide(Kind k, std::size_t bytes, int candidates, const Times& summed);
  bool decided(Kind k, std::size_t bytes) const;
  // The agreement, once record() said so: sums samples() over st's ranks (recursive
  // doubling in st's own collective, on steps past any algorithm's), decides, logs the
  // decision at info and tells `on_tuned` (if set).
  void agree(Step& st, Kind k, std::size_t bytes, const Candidates& c,
             const std::function<void(const std::string&)>& on_tuned);

  // The size class of `bytes`: (lo, hi], the power-of-two range it falls in.
  static std::pair<std::size_t, std::size_t> size_class(std::size_t bytes);
  // Whether the direct algorithms are among the candidates of `bytes`'s class among n
  // ranks: 3 to max_ranks of them, a rank's n-1 copies of the class's largest call within
  // max_bytes (by the class, not the call, so that every call of a class has the same
  // candidates). HostCommConfig::direct_max_*.
  static bool direct_fits(int n, std::size_t bytes, int max_ranks, std::size_t max_bytes);
  // The candidates of an automatic allreduce's class among n ranks, after its `fixed`
  // choice: rd's try rhd where every call of the class is larger than halving_above bytes
  // and holds at least one element (of 8 bytes at most) per rank, as halving needs
  // (HostCommConfig::halving_tuned_above), and direct where `direct`; rhd's try rd and
  // direct where `direct`, else twoshot where `twoshot`; the ring's try rhd and twoshot
  // where `twoshot`.
  static Candidates allreduce_candidates(std::string_view fixed, int n, std::size_t bytes, std::size_t halving_above,
                                         bool direct, bool twoshot, bool sleeping);

 private:
  struct Entry {
    int calls = 0;      // in this round
    int finalist = -1;  // set: the confirming round of this alternative against the fixed choice
    std::array<std::array<double, kTrials>, kMaxCandidates> times{};  // each candidate's trials
    std::string first;  // the first round's figures, for the decision's log line
    int choice = -1;    // decided: an index into the class's candidates
  };
  // The candidate that call `i` of the confirming round runs: the finalist's run, then the fixed choice's.
  static int confirming(const Entry& e, int i) { return i < kRun ? e.finalist : 0; }
  // The class's next call counted from its round's first run (negative: a warm call).
  static int in_runs(const Entry& e) { return e.calls - (e.finalist >= 0 ? 0 : kWarm); }
  using Key = std::pair<Kind, int>;
  static Key key(Kind k, std::size_t bytes);
  std::map<Key, Entry> entries_;
};

// Runs the candidate the tuner picks for this call (run_algorithm(i) runs candidates'
// names[i]; 0 is the fixed choice), times it, and agrees with the other ranks once the
// call's size class has its samples. With one candidate it just runs it. Where the class
// has sleeping candidates, the call first sets st.tp's waits to its candidate's, and
// they stay so after it, until the next such call.
template <class F>
void run_tuned(Step& st, Tuner& tuner, Tuner::Kind k, std::size_t bytes, const Tuner::Candidates& candidates,
               const std::function<void(const std::string&)>& on_tuned, F&& run_algorithm) {
  if (candidates.total() < 2) return run_algorithm(0);
  const int c = tuner.pick(k, bytes);
  if (k == Tuner::Kind::broadcast && tuner.timed(k, bytes)) Tuner::line_up(st);
  const auto t0 = Clock::now();
  if (candidates.sleeping) st.tp.sleep_at_once(candidates.sleeps(c));
  run_algorithm(candidates.algorithm(c));
  if (tuner.record(k, bytes, candidates.total(), c, std::chrono::duration<double>(Clock::now() - t0).count()))
    tuner.agree(st, k, bytes, candidates, on_tuned);
}

}  // namespace elasticrun::collective
