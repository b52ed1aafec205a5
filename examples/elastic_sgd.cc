// elastic_sgd: data-parallel SGD whose result does not depend on the worker count,
// so a run that lost, gained or replaced workers can be checked bit for bit.
//
//   elasticrun -np 3 build/examples/elastic_sgd --steps 200
//   build/examples/elastic_sgd --steps 200 --reference     # one process, no launcher
//
// Both print the same last line: `final step=N begun=B commits=C commit_sum=X hash=H`.
//
// The problem is linear regression on synthetic data, all in fixed-point integers:
// the model w is int64 with 16 fractional bits, features have 7. Sample i of step s
// is generated from (seed, s, i) by a counter-based hash, the global batch of B
// samples is split across the current ranks (rank r takes i ≡ r mod size), and the
// per-sample integer gradients are summed with allreduce(sum). Integer addition is
// associative, so any partition gives the same sum, and the same w.
//
// Tracked state: w, the step counter, a count of the steps begun, and a commit log (how
// many commits, and the sum of the committed step numbers). The log is rolled back with
// everything else, so the final log proves each commit point of the surviving lineage
// was committed once. `begun` is incremented before a step's allreduce, so a failure
// there leaves it one ahead of `step` until State::restore() rolls it back: a run whose
// rollback were missing or partial ends with begun > step (the reference has begun ==
// step), even where the failure hit while w and step were still at the last commit.
#include <elasticrun/elastic.hpp>
#include <elasticrun/elasticrun.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

using elasticrun::DataType;
using elasticrun::ReduceOp;

constexpr int kFracW = 16;  // fractional bits of w (and of targets and errors)
constexpr int kFracX = 7;   // fractional bits of features: x in [-1, 1)
constexpr std::int64_t kLrNum = 3;

struct Options {
  std::int64_t steps = 100;
  int dim = 16;
  int batch = 64;
  std::int64_t commit_every = 10;
  bool report = false;  // report(step) to the driver after every commit; stop when told
  std::uint64_t seed = 1;
  int step_ms = 0;
  bool reference = false;
  std::string progress_file;
  std::int64_t fail_at_step = -1;
  int fail_rank = 0;
  int fail_signal = 0;  // 0: exit(1)
  int reset_ms = 0;     // rank 0 of a new epoch waits this long before its sync
  bool fail_in_commit = false;  // at step S's commit, after its allreduce, not before the step
};

struct CommitLog {
  std::int64_t commits = 0;
  std::int64_t commit_sum = 0;
};

struct Model {
  std::vector<std::int64_t> w;
  std::int64_t step = 0;   // steps completed
  std::int64_t begun = 0;  // steps begun: one ahead of step inside a step's allreduce
  CommitLog log;
};

const char* kUsage =
    "usage: elastic_sgd [--steps N] [--dim D] [--batch B] [--commit-every K] [--seed S]\n"
    "                   [--step-ms M] [--reference] [--progress-file F] [--report]\n"
    "                   [--fail-at-step S --fail-rank R [--fail-signal SIG] [--fail-in-commit]]\n"
    "                   [--reset-ms M]\n";

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "elastic_sgd: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

long long parse_int(const std::string& flag, const char* v, long long min) {
  char* end = nullptr;
  long long n = std::strtoll(v, &end, 10);
  if (*v == '\0' || *end != '\0' || n < min)
    usage_error(flag + " needs an integer >= " + std::to_string(min) + ", got '" + v + "'");
  return n;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "--reference") { o.reference = true; continue; }
    if (f == "--report") { o.report = true; continue; }
    if (f == "--fail-in-commit") { o.fail_in_commit = true; continue; }
    if (f == "--help" || f == "-h") { std::fputs(kUsage, stdout); std::exit(0); }
    if (i + 1 >= argc) usage_error("unknown flag or missing value: " + f);
    const char* v = argv[++i];
    if (f == "--steps") o.steps = parse_int(f, v, 0);
    else if (f == "--dim") o.dim = static_cast<int>(parse_int(f, v, 1));
    else if (f == "--batch") o.batch = static_cast<int>(parse_int(f, v, 1));
    else if (f == "--commit-every") o.commit_every = parse_int(f, v, 1);
    else if (f == "--seed") o.seed = static_cast<std::uint64_t>(parse_int(f, v, 0));
    else if (f == "--step-ms") o.step_ms = static_cast<int>(parse_int(f, v, 0));
    else if (f == "--progress-file") o.progress_file = v;
    else if (f == "--fail-at-step") o.fail_at_step = parse_int(f, v, 0);
    else if (f == "--fail-rank") o.fail_rank = static_cast<int>(parse_int(f, v, 0));
    else if (f == "--fail-signal") o.fail_signal = static_cast<int>(parse_int(f, v, 0));
    else if (f == "--reset-ms") o.reset_ms = static_cast<int>(parse_int(f, v, 0));
    else usage_error("unknown flag: " + f);
  }
  if (o.dim > 1 << 20 || o.batch > 1 << 24) usage_error("--dim or --batch is too large");
  if (o.fail_in_commit && o.fail_at_step % o.commit_every != 0 && o.fail_at_step != o.steps)
    usage_error("--fail-in-commit needs a --fail-at-step that is a commit step");
  return o;
}

// splitmix64's finaliser: a counter-based generator, so sample i of step s is a pure
// function of its coordinates and needs no generator state to be carried or synced.
std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
std::uint64_t hash4(std::uint64_t seed, std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  return mix(seed ^ mix(a ^ mix(b ^ mix(c))));
}

// Feature j of sample i of step s, in [-128, 128): x = value / 2^7.
std::int64_t feature(const Options& o, std::int64_t s, std::int64_t i, int j) {
  return static_cast<std::int64_t>(hash4(o.seed, s, i, j) & 0xFF) - 128;
}
// The true model, in [-2, 2) with kFracW fractional bits.
std::int64_t true_weight(const Options& o, int j) {
  return static_cast<std::int64_t>(hash4(o.seed, ~0ULL, 0, j) % (4ULL << kFracW)) - (2LL << kFracW);
}

// The gradient of the squared error, summed over this rank's share of the batch.
// Each sample's contribution is computed alone and rounded (shifted) alone, so the
// total does not depend on which rank computed which sample. `x` and `wstar` are
// scratch and constants passed in to keep the loop free of allocations.
void local_gradient(const Options& o, const Model& m, int rank, int size, const std::vector<std::int64_t>& wstar,
                    std::vector<std::int64_t>& x, std::vector<std::int64_t>& grad) {
  std::fill(grad.begin(), grad.end(), 0);
  for (std::int64_t i = rank; i < o.batch; i += size) {
    std::int64_t pred = 0, target = 0;
    for (int j = 0; j < o.dim; ++j) {
      x[j] = feature(o, m.step, i, j);
      pred += m.w[j] * x[j];
      target += wstar[j] * x[j];
    }
    std::int64_t noise = static_cast<std::int64_t>(hash4(o.seed, m.step, i, ~0ULL) & 0x3FF) - 512;
    std::int64_t err = (pred >> kFracX) - (target >> kFracX) - noise;
    for (int j = 0; j < o.dim; ++j) grad[j] += (err * x[j]) >> kFracX;
  }
}

// lr = kLrNum / 2^shift with 2^shift > 4B: about a sixth of the stable step size for
// features uniform in [-1, 1), so w converges without oscillating.
void apply_gradient(const Options& o, Model& m, const std::vector<std::int64_t>& grad) {
  int shift = static_cast<int>(std::bit_width(static_cast<unsigned>(o.batch))) + 2;
  for (int j = 0; j < o.dim; ++j) m.w[j] -= (kLrNum * grad[j]) >> shift;
}

bool commit_due(const Options& o, std::int64_t step) { return step % o.commit_every == 0 || step == o.steps; }

void record_commit(Model& m) {
  ++m.log.commits;
  m.log.commit_sum += m.step;
}

std::string final_line(const Model& m) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over w's bytes, little endian
  for (std::int64_t v : m.w)
    for (int b = 0; b < 8; ++b) h = (h ^ ((static_cast<std::uint64_t>(v) >> (8 * b)) & 0xFF)) * 0x100000001b3ULL;
  char buf[160];
  std::snprintf(buf, sizeof buf, "final step=%lld begun=%lld commits=%lld commit_sum=%lld hash=%016llx",
                static_cast<long long>(m.step), static_cast<long long>(m.begun), static_cast<long long>(m.log.commits),
                static_cast<long long>(m.log.commit_sum), static_cast<unsigned long long>(h));
  return buf;
}

// The whole training loop in one process, as the check for the elastic runs.
void run_reference(const Options& o, Model& m) {
  std::vector<std::int64_t> wstar(o.dim), x(o.dim), grad(o.dim);
  for (int j = 0; j < o.dim; ++j) wstar[j] = true_weight(o, j);
  while (m.step < o.steps) {
    ++m.begun;
    local_gradient(o, m, 0, 1, wstar, x, grad);
    apply_gradient(o, m, grad);
    ++m.step;
    if (commit_due(o, m.step)) record_commit(m);
  }
}

// Written to a temporary name and renamed, so a reader never sees a partial file.
void write_progress(const std::string& path, std::int64_t step) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return;
  std::fprintf(f, "%lld\n", static_cast<long long>(step));
  bool ok = std::fclose(f) == 0;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

void report_commit(const Options& o, const Model& m, const elasticrun::Topology& t) {
  if (t.rank != 0) return;
  std::printf("committed step %lld size %d epoch %llu\n", static_cast<long long>(m.step), t.size,
              static_cast<unsigned long long>(t.epoch));
  std::fflush(stdout);
  if (!o.progress_file.empty()) write_progress(o.progress_file, m.step);
}

// Test hook: dies at one step on one rank, only in the job's first epoch, so the
// replacement worker (or this rank's successor) gets past that step. With
// --fail-in-commit it dies once step S is done, just before committing it: the other
// ranks' commit() takes its snapshot and then fails in its closing allreduce.
void maybe_fail(const Options& o, const Model& m, const elasticrun::Topology& t, bool at_commit) {
  if (at_commit != o.fail_in_commit) return;
  if (m.step != o.fail_at_step || t.rank != o.fail_rank || t.epoch != 1) return;
  std::fprintf(stderr, "elastic_sgd: injected failure at step %lld on rank %d\n", static_cast<long long>(m.step),
               t.rank);
  std::fflush(nullptr);
  if (o.fail_signal > 0) std::raise(o.fail_signal);
  std::_Exit(1);
}

// With --report, whether the synced commit still has to be reported to the driver: one
// whose commit() failed after its snapshot (a peer died in the closing allreduce) stands,
// and was told on stdout only, since report() is collective. The ranks agree on it (a
// collective follows): the newest step any of them saw reported, against the synced one.
// A newcomer saw none; a survivor of the failed commit saw the one before.
bool report_due(Model& m, elasticrun::Context& ctx, std::int64_t reported) {
  if (m.step == 0) return false;
  ctx.comm().allreduce(&reported, &reported, 1, DataType::i64, ReduceOp::max);
  return reported < m.step;
}

// One pass of the elastic loop: train from the synced state to the end. An error out
// of commit() after its snapshot was taken leaves a commit that stands: reported first
// (on stdout at once, to the driver at the start of the next pass). `reported`: the
// last step this process saw reported to the driver.
void train(const Options& o, Model& m, elasticrun::State& st, std::int64_t& reported) {
  elasticrun::Context& ctx = st.context();
  std::vector<std::int64_t> wstar(o.dim), x(o.dim), grad(o.dim);
  for (int j = 0; j < o.dim; ++j) wstar[j] = true_weight(o, j);
  if (o.report && report_due(m, ctx, reported)) {
    if (elasticrun::report(m.step, {{"step", static_cast<double>(m.step)}})) return;
    reported = m.step;
  }
  while (m.step < o.steps) {
    const elasticrun::Topology& t = ctx.topology();  // re-read: rejoin() replaces it
    maybe_fail(o, m, t, false);
    if (o.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.step_ms));
    ++m.begun;  // tracked state changes before the collective: a failure in it must be rolled back
    local_gradient(o, m, t.rank, t.size, wstar, x, grad);
    ctx.comm().allreduce(grad.data(), grad.data(), grad.size(), DataType::i64, ReduceOp::sum);
    apply_gradient(o, m, grad);
    ++m.step;
    if (!commit_due(o, m.step)) continue;
    record_commit(m);
    maybe_fail(o, m, t, true);
    // commit() takes the snapshot first and then shares the host-update flag in a small
    // allreduce, which can also fail (a peer died at this step). Either way the commit
    // stands (the next epoch may sync from it), so it is reported before leaving: on
    // stdout and in --progress-file; to the driver (report() is collective) once the
    // next epoch synced it (report_due).
    const std::uint64_t before = st.commits();
    try {
      st.commit();
    } catch (...) {
      if (st.commits() != before) report_commit(o, m, t);
      throw;
    }
    report_commit(o, m, t);
    // Progress for the driver (its --events, or a sweep): what scripts/schedule 8gpu_exp
    // resizes on. Right after the commit, so a reset it raises loses no step. Told to
    // stop (elasticrun --report-fd: scripts/chaos ends its soak so), every rank leaves
    // here, at this committed step: the final model is the reference's for --steps N.
    if (o.report) {
      if (elasticrun::report(m.step, {{"step", static_cast<double>(m.step)}})) return;
      reported = m.step;
    }
  }
}

int run_elastic(const Options& o, Model& m) {
  elasticrun::init();
  {
    elasticrun::State st;
    st.track("w", std::span(m.w));
    st.track_value("step", m.step);
    st.track_value("begun", m.begun);
    st.track_value("commit_log", m.log);
    // Test hook (--reset-ms): the reset callbacks run after the re-join and before the
    // sync, so rank 0 waiting here holds a formed epoch's newcomers in the sync, waiting
    // for its state: the window in which a test kills it.
    st.on_reset([&st, &o] {
      const auto& t = st.context().topology();
      std::printf("reset: size %d rank %d\n", t.size, t.rank);
      std::fflush(stdout);
      if (t.rank == 0 && o.reset_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.reset_ms));
    });
    std::int64_t reported = 0;
    elasticrun::run(st, [&](elasticrun::State& s) { train(o, m, s, reported); });
  }
  std::printf("%s\n", final_line(m).c_str());
  std::fflush(stdout);
  elasticrun::shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  Model m;
  m.w.assign(o.dim, 0);
  if (o.reference) {
    run_reference(o, m);
    std::printf("%s\n", final_line(m).c_str());
    return 0;
  }
  try {
    return run_elastic(o, m);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "elastic_sgd: %s\n", e.what());
    return 1;
  }
}
