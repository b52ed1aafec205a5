// allreduce_bench: the collective sweep (sweep.h) over libelasticrun's collectives
// (allreduce; the others with --collective).
//
//   elasticrun -np 4 build/bench/allreduce_bench [--csv] [--max-bytes 64M] ...
//
// The algorithm and progress mode are the library's own choices unless
// ELASTICRUN_ALGORITHM / ELASTICRUN_PROGRESS say otherwise.
#include "sweep.h"

#include <elasticrun/elasticrun.hpp>

#include <cstdio>
#include <exception>

namespace {

elasticrun::DataType to_library(bench::Dtype t) {
  switch (t) {
    case bench::Dtype::f32: return elasticrun::DataType::f32;
    case bench::Dtype::f64: return elasticrun::DataType::f64;
    case bench::Dtype::i32: return elasticrun::DataType::i32;
  }
  return elasticrun::DataType::f32;
}

elasticrun::ReduceOp to_library(bench::Op op) {
  switch (op) {
    case bench::Op::sum: return elasticrun::ReduceOp::sum;
    case bench::Op::min: return elasticrun::ReduceOp::min;
    case bench::Op::max: return elasticrun::ReduceOp::max;
  }
  return elasticrun::ReduceOp::sum;
}

// Calls the communicator directly (not the span templates) so the benchmark pays
// exactly what a type-erased caller such as the C API pays.
class ElasticrunBackend final : public bench::Backend {
 public:
  explicit ElasticrunBackend(elasticrun::Communicator& comm) : comm_(comm) {}
  const char* name() const override { return "elasticrun"; }
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void barrier() override { comm_.barrier(); }
  void allreduce(const void* in, void* out, std::size_t count, bench::Dtype t, bench::Op op) override {
    comm_.allreduce(in, out, count, to_library(t), to_library(op));
  }
  void broadcast(void* buf, std::size_t count, bench::Dtype t, int root) override {
    comm_.broadcast(buf, count, to_library(t), root);
  }
  void allgather(const void* in, void* out, std::size_t count, bench::Dtype t) override {
    comm_.allgather(in, out, count, to_library(t));
  }
  void reduce_scatter(const void* in, void* out, std::size_t count, bench::Dtype t, bench::Op op) override {
    comm_.reduce_scatter(in, out, count, to_library(t), to_library(op));
  }
  void alltoall(const void* in, void* out, std::size_t count, bench::Dtype t) override {
    comm_.alltoall(in, out, count, to_library(t));
  }
  int tuning_calls() const override { return comm_.tuning_calls(); }
  double max_over_ranks(double v) override {
    comm_.allreduce(&v, &v, 1, elasticrun::DataType::f64, elasticrun::ReduceOp::max);
    return v;
  }

 private:
  elasticrun::Communicator& comm_;
};

}  // namespace

int main(int argc, char** argv) {
  bench::Options opts = bench::parse_options(argc, argv);
  try {
    elasticrun::init();
    ElasticrunBackend backend(elasticrun::context().comm());
    int rc = bench::run_sweep(backend, opts);
    elasticrun::shutdown();
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    return 1;
  }
}
