// The collective sweep (allreduce unless --collective says otherwise) shared by
// every benchmark in bench/: ours (libelasticrun),
// Open MPI and Gloo each implement the small Backend interface below and hand it
// to run_sweep(), so all three measure, check and print in exactly the same way.
//
// Method (nccl-tests style, out of place):
//   for each size from --min-bytes to --max-bytes (times --step):
//     warm up, then take up to 25 samples; each sample is a barrier followed by a
//     timed batch of k back-to-back allreduces, and records the mean time per call;
//     a rank's time is the median of its samples, the reported time is the maximum
//     of the ranks' medians (one allreduce(max) over the ranks);
//     algbw = bytes / time, busbw = algbw * 2 (n - 1) / n;
//     "ok" checks every output element of the last call on every rank.
// Large sizes run fewer calls (a per-size byte budget), so a whole sweep stays short
// on a small machine.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace bench {

enum class Dtype { f32, f64, i32 };
enum class Op { sum, min, max };
// What is timed (nccl-tests conventions). The size column is the whole result for
// allgather (each rank contributes 1/n), the whole input for reduce_scatter (each
// rank gets 1/n, reduced) and each rank's whole buffer for alltoall (1/n to each
// peer). busbw = algbw times 2(n-1)/n for allreduce, (n-1)/n for allgather,
// reduce_scatter and alltoall, 1 for broadcast (from rank 0, in place).
enum class Collective { allreduce, broadcast, allgather, reduce_scatter, alltoall };

std::size_t size_of(Dtype t);
const char* name_of(Dtype t);
const char* name_of(Op op);
const char* name_of(Collective c);

struct Options {
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{256} << 20;
  std::size_t step = 2;            // size multiplier between rows
  int iters = 200;                 // most timed calls per size
  int warmup = -1;                 // most untimed calls per size; -1: kWarmup, or the backend's tuning_calls()
  int batch = 0;                   // calls per timed batch; 0: iters / 25 (at least 1)
  std::size_t budget_bytes = std::size_t{1} << 30;  // timed calls per size <= budget / bytes
  Dtype dtype = Dtype::f32;
  Op op = Op::sum;
  Collective collective = Collective::allreduce;
  bool csv = false;
  bool check = true;
  // Values of the benchmark-specific flags a program asked parse_options for.
  std::map<std::string, std::string> extra;
};

// One way of doing an allreduce among the ranks of a job.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;  // "elasticrun", "mpi", "gloo": the CSV impl column
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void barrier() = 0;
  // Out of place, `count` elements; `in` and `out` never alias here.
  virtual void allreduce(const void* in, void* out, std::size_t count, Dtype t, Op op) = 0;
  // The other collectives, for backends that have them (the defaults throw).
  virtual void broadcast(void* buf, std::size_t count, Dtype t, int root);
  virtual void allgather(const void* in, void* out, std::size_t count_per_rank, Dtype t);
  virtual void reduce_scatter(const void* in, void* out, std::size_t count_per_rank, Dtype t, Op op);
  virtual void alltoall(const void* in, void* out, std::size_t count_per_rank, Dtype t);
  // The maximum of `v` over all ranks, returned on every rank.
  virtual double max_over_ranks(double v) = 0;
  // The most calls of a size before the backend runs it as it will from then on (a
  // tuner's trials, which are not what a long-running program runs): the warm-up is at
  // least this long, whatever the budget, unless --warmup asks for fewer.
  virtual int tuning_calls() const { return 0; }
};

// Parses the common flags. `extra_flags` lists benchmark-specific flags that take a
// value (e.g. {"--store-dir"}); their values land in Options::extra. Prints usage
// and exits on --help (status 0) or on a bad flag (status 2); only the process whose
// launcher-given rank (ELASTICRUN_RANK, OMPI_COMM_WORLD_RANK) is 0 or unknown prints.
Options parse_options(int argc, char** argv, const std::vector<std::string>& extra_flags = {},
                      const std::string& extra_help = "");

// Runs the sweep and prints the table (or CSV) on rank 0. Returns 0 when every
// check passed, 1 otherwise (the same value on every rank).
int run_sweep(Backend& backend, const Options& opts);

}  // namespace bench
