// mpi_allreduce_bench: the collective sweep (sweep.h) over MPI_Allreduce (or, with
// --collective, MPI_Bcast / MPI_Allgather / MPI_Reduce_scatter_block / MPI_Alltoall),
// the baseline for allreduce_bench. Run it under mpirun:
//
//   mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 build/bench/mpi_allreduce_bench --csv
//
// Open MPI picks its own algorithm (the tuned component's size rules) unless its
// MCA parameters say otherwise; scripts/bench-compare documents the settings used.
#include "sweep.h"

#include <mpi.h>

namespace {

MPI_Datatype to_mpi(bench::Dtype t) {
  switch (t) {
    case bench::Dtype::f32: return MPI_FLOAT;
    case bench::Dtype::f64: return MPI_DOUBLE;
    case bench::Dtype::i32: return MPI_INT32_T;
  }
  return MPI_FLOAT;
}

MPI_Op to_mpi(bench::Op op) {
  switch (op) {
    case bench::Op::sum: return MPI_SUM;
    case bench::Op::min: return MPI_MIN;
    case bench::Op::max: return MPI_MAX;
  }
  return MPI_SUM;
}

class MpiBackend final : public bench::Backend {
 public:
  MpiBackend() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  void allreduce(const void* in, void* out, std::size_t count, bench::Dtype t, bench::Op op) override {
    // The sweep never exceeds 256 MiB, far below INT_MAX elements.
    MPI_Allreduce(in, out, static_cast<int>(count), to_mpi(t), to_mpi(op), MPI_COMM_WORLD);
  }
  void broadcast(void* buf, std::size_t count, bench::Dtype t, int root) override {
    MPI_Bcast(buf, static_cast<int>(count), to_mpi(t), root, MPI_COMM_WORLD);
  }
  void allgather(const void* in, void* out, std::size_t count, bench::Dtype t) override {
    MPI_Allgather(in, static_cast<int>(count), to_mpi(t), out, static_cast<int>(count), to_mpi(t), MPI_COMM_WORLD);
  }
  void reduce_scatter(const void* in, void* out, std::size_t count, bench::Dtype t, bench::Op op) override {
    MPI_Reduce_scatter_block(in, out, static_cast<int>(count), to_mpi(t), to_mpi(op), MPI_COMM_WORLD);
  }
  void alltoall(const void* in, void* out, std::size_t count, bench::Dtype t) override {
    MPI_Alltoall(in, static_cast<int>(count), to_mpi(t), out, static_cast<int>(count), to_mpi(t), MPI_COMM_WORLD);
  }
  double max_over_ranks(double v) override {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
  }

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace

int main(int argc, char** argv) {
  // Flags first: a bad flag or --help exits before MPI is initialised, which
  // mpirun treats as an ordinary exit rather than an abort.
  bench::Options opts = bench::parse_options(argc, argv);
  MPI_Init(&argc, &argv);
  MpiBackend backend;
  int rc = bench::run_sweep(backend, opts);
  MPI_Finalize();
  return rc;
}
