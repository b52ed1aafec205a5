#include "sweep.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>

namespace bench {
namespace {

using Clock = std::chrono::steady_clock;

// Samples per size: enough for a stable median, few enough that the barriers
// between batches do not dominate the run time of small sizes.
constexpr int kMaxSamples = 25;
// Every size gets at least this many timed calls, whatever the byte budget says.
constexpr int kMinIters = 3;
// Untimed calls per size where --warmup is not given (or the backend's tuning_calls()).
constexpr int kWarmup = 20;

// The launcher-given rank, before any library is initialised (for messages only).
int launcher_rank() {
  for (const char* name : {"ELASTICRUN_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 0;
}

[[noreturn]] void usage(const char* prog, const std::string& extra_help, int status) {
  if (launcher_rank() == 0) {
    std::FILE* f = status == 0 ? stdout : stderr;
    std::fprintf(f,
                 "usage: %s [options]\n"
                 "  --min-bytes N    smallest message (default 8; K/M/G suffixes allowed)\n"
                 "  --max-bytes N    largest message (default 256M)\n"
                 "  --step F         size multiplier between rows, 2 or 4 (default 2)\n"
                 "  --iters N        most timed calls per size (default 200)\n"
                 "  --warmup N       untimed calls per size (default 20, or as many as the\n"
                 "                   library's tuner may take to settle a size, 60, where it\n"
                 "                   tunes; fewer where the budget times fewer than 5N calls,\n"
                 "                   but not fewer than the tuner's)\n"
                 "  --batch N        calls per timed batch, each batch after a barrier (default\n"
                 "                   iters/25, at least 1); 1 times every call from a common\n"
                 "                   start: a broadcast's latency, not back-to-back calls' pace\n"
                 "  --budget N       timed bytes per size; large sizes run budget/bytes calls,\n"
                 "                   at least %d (default 1G)\n"
                 "  --dtype T        f32|f64|i32 (default f32)\n"
                 "  --op OP          sum|min|max (default sum)\n"
                 "  --collective C   allreduce|broadcast|allgather|reduce_scatter|alltoall\n"
                 "                   (default allreduce)\n"
                 "  --csv            machine-readable output\n"
                 "  --no-check       skip the result check (the ok column says '-')\n"
                 "%s",
                 prog, kMinIters, extra_help.c_str());
  }
  std::exit(status);
}

// "4096", "64K", "256M", "1G" -> bytes. Throws on anything else.
std::size_t parse_size(const std::string& s) {
  std::size_t pos = 0;
  unsigned long long v = std::stoull(s, &pos);
  std::string unit = s.substr(pos);
  if (unit == "K" || unit == "k") v <<= 10;
  else if (unit == "M" || unit == "m") v <<= 20;
  else if (unit == "G" || unit == "g") v <<= 30;
  else if (!unit.empty()) throw std::invalid_argument("unknown unit '" + unit + "'");
  return static_cast<std::size_t>(v);
}

// A whole number of calls, at least `least`. Throws with the reason on anything else.
int parse_count(const std::string& s, int least) {
  std::size_t pos = 0;
  int v = 0;
  try {
    v = std::stoi(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != s.size() || v < least)
    throw std::invalid_argument("expected a whole number >= " + std::to_string(least) + ", got '" + s + "'");
  return v;
}

// Buffers are page-aligned and touched once up front, so page faults never land in
// a timed call and every implementation sees the same memory.
struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte, AlignedFree>;

Buffer allocate(std::size_t bytes) {
  std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(4096, rounded));
  if (!p) throw std::runtime_error("out of memory allocating " + std::to_string(bytes) + " bytes");
  std::memset(p, 0, rounded);
  return Buffer(p);
}

// Input element i on rank r is (r + 1) * v(i) with v(i) = 1 + i % 7: small
// integers, so sums, minima and maxima are exact in every type and the expected
// result has a closed form.
template <class T>
void fill_input(void* buf, std::size_t count, int rank) {
  auto* p = static_cast<T*>(buf);
  for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<T>((rank + 1) * (1 + static_cast<int>(i % 7)));
}

// Element i must be factor * v(first + i).
template <class T>
bool check_output(const void* buf, std::size_t count, long long factor, std::size_t first) {
  const auto* p = static_cast<const T*>(buf);
  for (std::size_t i = 0; i < count; ++i)
    if (p[i] != static_cast<T>(factor * (1 + static_cast<long long>((first + i) % 7)))) return false;
  return true;
}

void fill_input(Dtype t, void* buf, std::size_t count, int rank) {
  switch (t) {
    case Dtype::f32: return fill_input<float>(buf, count, rank);
    case Dtype::f64: return fill_input<double>(buf, count, rank);
    case Dtype::i32: return fill_input<std::int32_t>(buf, count, rank);
  }
}

bool check_output(Dtype t, const void* buf, std::size_t count, long long factor, std::size_t first = 0) {
  switch (t) {
    case Dtype::f32: return check_output<float>(buf, count, factor, first);
    case Dtype::f64: return check_output<double>(buf, count, factor, first);
    case Dtype::i32: return check_output<std::int32_t>(buf, count, factor, first);
  }
  return false;
}

long long reduced_factor(Op op, int n) { return op == Op::sum ? 1LL * n * (n + 1) / 2 : op == Op::max ? n : 1; }

// The result of the collective on n ranks' fill_input() data.
bool check_result(const Options& o, const void* out, std::size_t count, int n, int rank) {
  const std::size_t per = count / static_cast<std::size_t>(n), elem = size_of(o.dtype);
  switch (o.collective) {
    case Collective::allreduce:
      return check_output(o.dtype, out, count, reduced_factor(o.op, n));
    case Collective::reduce_scatter:  // block `rank` of the reduced input
      return check_output(o.dtype, out, per, reduced_factor(o.op, n), rank * per);
    case Collective::alltoall:  // block q: rank q's block `rank`
      for (int q = 0; q < n; ++q)
        if (!check_output(o.dtype, static_cast<const std::byte*>(out) + q * per * elem, per, q + 1, rank * per))
          return false;
      return true;
    case Collective::broadcast:
      return check_output(o.dtype, out, count, 1);  // rank 0's input
    case Collective::allgather: {
      for (int q = 0; q < n; ++q)
        if (!check_output(o.dtype, static_cast<const std::byte*>(out) + q * per * elem, per, q + 1))
          return false;
      return true;
    }
  }
  return false;
}

double bus_factor(Collective c, int n) {
  switch (c) {
    case Collective::allreduce: return 2.0 * (n - 1) / n;
    case Collective::allgather:
    case Collective::reduce_scatter:
    case Collective::alltoall: return 1.0 * (n - 1) / n;
    case Collective::broadcast: return 1.0;
  }
  return 1.0;
}

struct Row {
  std::size_t bytes = 0, count = 0;
  int iters = 0;
  int warmup = 0;  // untimed calls before them
  double time_us = 0;
  bool ok = true;
};

// How many timed and untimed calls a size gets: all of --iters for small
// messages, budget/bytes (at least kMinIters) for large ones.
int iters_for(const Options& o, std::size_t bytes) {
  std::size_t by_budget = o.budget_bytes / std::max<std::size_t>(bytes, 1);
  return static_cast<int>(std::clamp<std::size_t>(by_budget, kMinIters, std::max(o.iters, kMinIters)));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// Times one size: warm-up calls, then batches of back-to-back calls, each after a
// barrier. Timing a batch rather than each call keeps the clock and the barrier's
// exit skew out of small-message latencies; the median over batches drops the
// batches a noisy neighbour (or the other ranks sharing our core) disturbed.
Row measure(Backend& b, const Options& o, std::size_t count, const void* in, void* out) {
  // Everything but allreduce and broadcast splits count into a whole number of blocks.
  const std::size_t n = static_cast<std::size_t>(b.size());
  const std::size_t per = std::max<std::size_t>(count / n, 1);
  if (o.collective != Collective::allreduce && o.collective != Collective::broadcast) count = per * n;
  auto call = [&] {
    switch (o.collective) {
      case Collective::allreduce: return b.allreduce(in, out, count, o.dtype, o.op);
      case Collective::broadcast: return b.broadcast(out, count, o.dtype, 0);
      case Collective::allgather: return b.allgather(in, out, per, o.dtype);
      case Collective::reduce_scatter: return b.reduce_scatter(in, out, per, o.dtype, o.op);
      case Collective::alltoall: return b.alltoall(in, out, per, o.dtype);
    }
  };
  Row row;
  row.count = count;
  row.bytes = count * size_of(o.dtype);
  row.iters = iters_for(o, row.bytes);
  // Capped where the budget allows few calls (large sizes), but never below the calls
  // the backend's tuner may spend on a size class (its trials of every candidate, 60
  // for ours), unless --warmup asks for fewer: with a cap of budget/bytes/5 alone, a
  // sweep's timed calls from 512 KiB up (--budget 64M) were the tuner's trials, not
  // its choice (an 8-host broadcast of 512 KiB timed at 0.87x Open MPI, 1.53x once
  // warm).
  const std::size_t by_budget = o.budget_bytes / std::max<std::size_t>(row.bytes, 1);
  const int tuning = b.tuning_calls();
  const int asked = o.warmup >= 0 ? o.warmup : std::max(kWarmup, tuning);
  const std::size_t cap = std::max<std::size_t>({1, by_budget / 5, static_cast<std::size_t>(tuning)});
  const int warmup = row.warmup = static_cast<int>(std::min<std::size_t>(asked, cap));
  int per_batch = o.batch > 0 ? std::min(o.batch, row.iters) : std::max(1, row.iters / kMaxSamples);
  int samples = std::max(1, row.iters / per_batch);
  row.iters = samples * per_batch;

  // Poison the output so a call that writes nothing cannot pass the check.
  std::memset(out, 0xff, row.bytes);
  if (o.collective == Collective::broadcast && b.rank() == 0) std::memcpy(out, in, row.bytes);
  for (int i = 0; i < warmup; ++i) call();

  std::vector<double> per_call_us;
  per_call_us.reserve(samples);
  for (int s = 0; s < samples; ++s) {
    b.barrier();
    auto t0 = Clock::now();
    for (int i = 0; i < per_batch; ++i) call();
    std::chrono::duration<double, std::micro> dt = Clock::now() - t0;
    per_call_us.push_back(dt.count() / per_batch);
  }
  row.time_us = b.max_over_ranks(median(per_call_us));
  if (o.check) {
    bool mine = check_result(o, out, count, b.size(), b.rank());
    row.ok = b.max_over_ranks(mine ? 0.0 : 1.0) == 0.0;
  }
  return row;
}

void print_header(const Backend& b, const Options& o) {
  if (o.csv) {
    std::printf("impl,ranks,bytes,count,dtype,op,iters,time_us,algbw_gbs,busbw_gbs,ok,collective,warmup\n");
    return;
  }
  std::printf("# %s %s: %d ranks, %s %s, %s; time = max over ranks of the median call\n", b.name(),
              name_of(o.collective), b.size(), name_of(o.dtype), name_of(o.op),
              o.collective == Collective::broadcast ? "in place from rank 0" : "out of place");
  std::printf("# %12s %12s %6s %12s %11s %11s %4s %6s\n", "bytes", "count", "iters", "time_us", "algbw_GB/s",
              "busbw_GB/s", "ok", "warmup");
}

void print_row(const Backend& b, const Options& o, const Row& r) {
  int n = b.size();
  double algbw = r.time_us > 0 ? static_cast<double>(r.bytes) / (r.time_us * 1e3) : 0;  // GB/s
  double busbw = algbw * bus_factor(o.collective, n);
  const char* ok = !o.check ? "-" : r.ok ? "yes" : "NO";
  if (o.csv) {
    std::printf("%s,%d,%zu,%zu,%s,%s,%d,%.3f,%.6g,%.6g,%s,%s,%d\n", b.name(), n, r.bytes, r.count, name_of(o.dtype),
                name_of(o.op), r.iters, r.time_us, algbw, busbw, ok, name_of(o.collective), r.warmup);
  } else {
    std::printf("  %12zu %12zu %6d %12.2f %11.3f %11.3f %4s %6d\n", r.bytes, r.count, r.iters, r.time_us, algbw,
                busbw, ok, r.warmup);
  }
  std::fflush(stdout);
}

}  // namespace

std::size_t size_of(Dtype t) { return t == Dtype::f64 ? 8 : 4; }

const char* name_of(Dtype t) {
  switch (t) {
    case Dtype::f32: return "f32";
    case Dtype::f64: return "f64";
    case Dtype::i32: return "i32";
  }
  return "?";
}

const char* name_of(Collective c) {
  switch (c) {
    case Collective::allreduce: return "allreduce";
    case Collective::broadcast: return "broadcast";
    case Collective::allgather: return "allgather";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::alltoall: return "alltoall";
  }
  return "?";
}

void Backend::broadcast(void*, std::size_t, Dtype, int) {
  throw std::runtime_error(std::string(name()) + " has no broadcast in this benchmark");
}

void Backend::allgather(const void*, void*, std::size_t, Dtype) {
  throw std::runtime_error(std::string(name()) + " has no allgather in this benchmark");
}

void Backend::reduce_scatter(const void*, void*, std::size_t, Dtype, Op) {
  throw std::runtime_error(std::string(name()) + " has no reduce_scatter in this benchmark");
}

void Backend::alltoall(const void*, void*, std::size_t, Dtype) {
  throw std::runtime_error(std::string(name()) + " has no alltoall in this benchmark");
}

const char* name_of(Op op) {
  switch (op) {
    case Op::sum: return "sum";
    case Op::min: return "min";
    case Op::max: return "max";
  }
  return "?";
}

Options parse_options(int argc, char** argv, const std::vector<std::string>& extra_flags,
                      const std::string& extra_help) {
  Options o;
  const char* prog = argc > 0 ? argv[0] : "bench";
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(prog, extra_help, 2);
      return argv[++i];
    };
    try {
      if (flag == "-h" || flag == "--help") usage(prog, extra_help, 0);
      else if (flag == "--csv") o.csv = true;
      else if (flag == "--no-check") o.check = false;
      else if (flag == "--min-bytes") o.min_bytes = parse_size(value());
      else if (flag == "--max-bytes") o.max_bytes = parse_size(value());
      else if (flag == "--budget") o.budget_bytes = parse_size(value());
      else if (flag == "--step") o.step = parse_size(value());
      else if (flag == "--iters") o.iters = parse_count(value(), 1);
      else if (flag == "--warmup") o.warmup = parse_count(value(), 0);
      else if (flag == "--batch") o.batch = parse_count(value(), 0);
      else if (flag == "--dtype") {
        std::string v = value();
        if (v == "f32") o.dtype = Dtype::f32;
        else if (v == "f64") o.dtype = Dtype::f64;
        else if (v == "i32") o.dtype = Dtype::i32;
        else throw std::invalid_argument("unknown dtype '" + v + "'");
      } else if (flag == "--op") {
        std::string v = value();
        if (v == "sum") o.op = Op::sum;
        else if (v == "min") o.op = Op::min;
        else if (v == "max") o.op = Op::max;
        else throw std::invalid_argument("unknown op '" + v + "'");
      } else if (flag == "--collective") {
        std::string v = value();
        if (v == "allreduce") o.collective = Collective::allreduce;
        else if (v == "broadcast") o.collective = Collective::broadcast;
        else if (v == "allgather") o.collective = Collective::allgather;
        else if (v == "reduce_scatter") o.collective = Collective::reduce_scatter;
        else if (v == "alltoall") o.collective = Collective::alltoall;
        else throw std::invalid_argument("unknown collective '" + v + "'");
      } else if (std::find(extra_flags.begin(), extra_flags.end(), flag) != extra_flags.end()) {
        o.extra[flag] = value();
      } else {
        throw std::invalid_argument("unknown flag");
      }
    } catch (const std::exception& e) {
      if (launcher_rank() == 0) std::fprintf(stderr, "%s: %s: %s\n", prog, flag.c_str(), e.what());
      usage(prog, extra_help, 2);
    }
  }
  if (o.step < 2 || o.min_bytes > o.max_bytes) {
    if (launcher_rank() == 0) std::fprintf(stderr, "%s: need --step >= 2 and --min-bytes <= --max-bytes\n", prog);
    std::exit(2);
  }
  return o;
}

int run_sweep(Backend& b, const Options& o) {
  std::size_t elem = size_of(o.dtype);
  std::size_t max_count = std::max<std::size_t>(o.max_bytes / elem, 1);
  Buffer in = allocate(max_count * elem), out = allocate(max_count * elem);
  fill_input(o.dtype, in.get(), max_count, b.rank());

  if (b.rank() == 0) print_header(b, o);
  bool all_ok = true;
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.step) {
    std::size_t count = std::max<std::size_t>(bytes / elem, 1);
    Row r = measure(b, o, count, in.get(), out.get());
    all_ok = all_ok && r.ok;
    if (b.rank() == 0) print_row(b, o, r);
    if (bytes > std::numeric_limits<std::size_t>::max() / o.step) break;
  }
  return all_ok ? 0 : 1;
}

}  // namespace bench
