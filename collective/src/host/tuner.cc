#include "host/tuner.h"

#include <common/log.h>

#include <algorithm>
#include <bit>
#include <cmath>

namespace elasticrun::collective {

Tuner::Key Tuner::key(Kind k, std::size_t bytes) {
  return {k, static_cast<int>(std::bit_width(bytes > 0 ? bytes - 1 : 0))};
}

const char* Tuner::name(Kind k) {
  switch (k) {
    case Kind::allreduce: return "allreduce";
    case Kind::broadcast: return "broadcast";
    case Kind::allgather: return "allgather";
    case Kind::reduce_scatter: return "reduce_scatter";
    case Kind::allgatherv: return "allgatherv";
    case Kind::reduce_scatterv: return "reduce_scatterv";
  }
  return "?";
}

std::pair<std::size_t, std::size_t> Tuner::size_class(std::size_t bytes) {
  const int b = key(Kind::allreduce, bytes).second;
  return {b == 0 ? 0 : std::size_t{1} << (b - 1), std::size_t{1} << b};
}

bool Tuner::direct_fits(int n, std::size_t bytes, int max_ranks, std::size_t max_bytes) {
  return n >= 3 && n <= max_ranks && static_cast<std::size_t>(n - 1) * size_class(bytes).second <= max_bytes;
}

Tuner::Candidates Tuner::allreduce_candidates(std::string_view fixed, int n, std::size_t bytes,
                                              std::size_t halving_above, bool direct, bool twoshot, bool sleeping) {
  Candidates c{{}, 0, sleeping};
  if (fixed == "ring") {
    c.add("ring");
    c.add("rhd");
    if (twoshot) c.add("twoshot");
    return c;
  }
  const bool rhd = fixed == "rhd";
  c.add(rhd ? "rhd" : "rd");
  if (rhd) c.add("rd");
  else if (size_class(bytes).first >= std::max(halving_above, 8 * static_cast<std::size_t>(n))) c.add("rhd");
  if (direct) c.add("direct");
  else if (rhd && twoshot) c.add("twoshot");  // past direct's bytes: the next fewest exchanges
  return c;
}

int Tuner::pick(Kind k, std::size_t bytes) const {
  auto it = entries_.find(key(k, bytes));
  if (it == entries_.end()) return 0;
  const Entry& e = it->second;
  if (e.choice >= 0) return e.choice;
  if (e.finalist >= 0) return confirming(e, e.calls);
  // Past the warm calls, each candidate's run in turn (pick is not asked past the last:
  // the agreement decides in the call that ends it).
  return e.calls < kWarm ? 0 : std::min((e.calls - kWarm) / kRun, kMaxCandidates - 1);
}

bool Tuner::timed(Kind k, std::size_t bytes) const {
  auto it = entries_.find(key(k, bytes));
  if (it == entries_.end() || it->second.choice >= 0) return false;
  const int i = in_runs(it->second);
  return i >= 0 && i % kRun >= kSettle;
}

void Tuner::line_up(Step& st) {
  constexpr std::uint64_t kLineUpSteps = std::uint64_t{1} << 21;
  Step sync = st;
  sync.step_base = kLineUpSteps;
  barrier_dissemination(sync);
}

bool Tuner::record(Kind k, std::size_t bytes, int candidates, int candidate, double seconds) {
  Entry& e = entries_[key(k, bytes)];
  const int round = e.finalist >= 0 ? 2 * kRun : calls(candidates);
  if (e.choice >= 0 || e.calls >= round) return false;
  const int i = in_runs(e), at = i % kRun;  // at < kSettle: a run's untimed first calls
  if (i >= 0 && at >= kSettle) e.times[candidate][at - kSettle] = seconds;
  return ++e.calls == round;
}

bool Tuner::decided(Kind k, std::size_t bytes) const {
  auto it = entries_.find(key(k, bytes));
  return it != entries_.end() && it->second.choice >= 0;
}

Tuner::Times Tuner::samples(Kind k, std::size_t bytes) const {
  auto it = entries_.find(key(k, bytes));
  if (it == entries_.end()) return {};
  Times median{};
  for (int c = 0; c < kMaxCandidates; ++c) {
    auto t = it->second.times[c];
    std::nth_element(t.begin(), t.begin() + kTrials / 2, t.end());
    median[c] = t[kTrials / 2];
  }
  return median;
}

int Tuner::decide(Kind k, std::size_t bytes, int candidates, const Times& summed) {
  Entry& e = entries_[key(k, bytes)];
  int best = e.finalist;
  if (best < 0) {
    best = 1;
    for (int c = 2; c < candidates; ++c)
      if (summed[c] < summed[best]) best = c;
  }
  const bool wins = summed[best] < summed[0] * (1 - kMargin);
  if (wins && e.finalist < 0) {
    e.finalist = best;  // once more, to be sure
    e.calls = 0;
    return best;
  }
  e.choice = wins ? best : 0;
  return e.choice;
}

void Tuner::agree(Step& st, Kind k, std::size_t bytes, const Candidates& c,
                  const std::function<void(const std::string&)>& on_tuned) {
  constexpr std::uint64_t kAgreementSteps = std::uint64_t{1} << 20;
  // An allreduce ends at about the same time everywhere: the ranks' mean (their sum, to
  // compare) is its time. A broadcast has ended when its last rank has the data: the
  // slowest rank's time is the broadcast's (the mean would count the root, done at once).
  const bool slowest = k == Kind::broadcast;
  Times sum = samples(k, bytes);
  Step agreement = st;
  agreement.step_base = kAgreementSteps;
  allreduce_rd(agreement, sum.data(), sum.data(), static_cast<std::size_t>(c.total()), DataType::f64,
               slowest ? ReduceOp::max : ReduceOp::sum);
  Entry& e = entries_[key(k, bytes)];
  const bool confirming = e.finalist >= 0;
  const int choice = decide(k, bytes, c.total(), sum);
  const int n = st.tp.size();
  const double per = slowest ? 1e6 : 1e6 / n;
  auto us = [&](int i) { return c.name(i) + " " + std::to_string(std::lround(sum[i] * per)) + " us"; };
  if (!confirming) {
    const auto [lo, hi] = size_class(bytes);
    e.first = std::string(name(k)) + " of " + std::to_string(lo + 1) + "-" +
              std::to_string(hi) + " bytes over " + std::to_string(n) + " ranks: ";
    for (int i = 0; i < c.total(); ++i) e.first += (i ? ", " : "") + us(i);
    e.first += std::string(" (median of ") + std::to_string(kTrials) +
               (slowest ? ", slowest rank)" : ", mean over ranks)");
  }
  if (e.choice < 0) {
    ER_LOG(collective, debug, "tuning {}; {} ahead, once more", e.first, c.name(choice));
    return;
  }
  std::string text = e.first;
  if (confirming) text += "; again " + us(e.finalist) + ", " + us(0);
  text += ": " + c.name(choice);
  ER_LOG(collective, info, "tuned {}", text);
  if (on_tuned) on_tuned(text);
}

}  // namespace elasticrun::collective
