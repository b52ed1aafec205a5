#include "host/tuner.h"

#include <common/log.h>

#include <algorithm>
#include <bit>
#include <cmath>

namespace elasticrun::collective {

Tuner::Key Tuner::key(Kind k, std::size_t bytes) {
  return {k, static_cast<int>(std::bit_width(bytes > 0 ? bytes - 1 : 0))};
}

std::pair<std::size_t, std::size_t> Tuner::size_class(std::size_t bytes) {
  const int b = key(Kind::allreduce, bytes).second;
  return {b == 0 ? 0 : std::size_t{1} << (b - 1), std::size_t{1} << b};
}

int Tuner::pick(Kind k, std::size_t bytes) const {
  auto it = entries_.find(key(k, bytes));
  if (it == entries_.end()) return 0;
  const Entry& e = it->second;
  if (e.choice >= 0) return e.choice;
  return e.calls >= kWarm + kRun && e.calls < kCalls ? 1 : 0;
}

bool Tuner::record(Kind k, std::size_t bytes, int candidate, double seconds) {
  Entry& e = entries_[key(k, bytes)];
  if (e.choice >= 0 || e.calls >= kCalls) return false;
  const int i = e.calls - kWarm, at = i % kRun;  // at < kSettle: a run's untimed first calls
  if (i >= 0 && at >= kSettle) e.times[candidate][at - kSettle] = seconds;
  return ++e.calls == kCalls;
}

std::array<double, 2> Tuner::samples(Kind k, std::size_t bytes) const {
  auto it = entries_.find(key(k, bytes));
  if (it == entries_.end()) return {-1, -1};
  std::array<double, 2> median{};
  for (int c = 0; c < 2; ++c) {
    auto t = it->second.times[c];
    std::nth_element(t.begin(), t.begin() + kTrials / 2, t.end());
    median[c] = t[kTrials / 2];
  }
  return median;
}

int Tuner::decide(Kind k, std::size_t bytes, std::array<double, 2> summed) {
  Entry& e = entries_[key(k, bytes)];
  e.choice = summed[1] < summed[0] * (1 - kMargin) ? 1 : 0;
  return e.choice;
}

void Tuner::agree(Step& st, Kind k, std::size_t bytes, const std::function<void(const std::string&)>& on_tuned) {
  constexpr std::uint64_t kAgreementSteps = std::uint64_t{1} << 20;
  std::array<double, 2> sum = samples(k, bytes);
  Step agreement = st;
  agreement.step_base = kAgreementSteps;
  allreduce_rd(agreement, sum.data(), sum.data(), 2, DataType::f64, ReduceOp::sum);
  const int choice = decide(k, bytes, sum);
  const bool ar = k == Kind::allreduce;
  const char* names[2] = {ar ? "rhd" : "scatter-allgather", ar ? "rd" : "binomial"};
  const auto [lo, hi] = size_class(bytes);
  const int n = st.tp.size();
  std::string text = std::string(ar ? "allreduce" : "broadcast") + " of " + std::to_string(lo + 1) + "-" +
                     std::to_string(hi) + " bytes over " + std::to_string(n) + " ranks: " + names[0] + " " +
                     std::to_string(std::lround(sum[0] / n * 1e6)) + " us, " + names[1] + " " +
                     std::to_string(std::lround(sum[1] / n * 1e6)) + " us (median of " + std::to_string(kTrials) +
                     ", mean over ranks): " + names[choice];
  ER_LOG(collective, info, "tuned {}", text);
  if (on_tuned) on_tuned(text);
}

}  // namespace elasticrun::collective
