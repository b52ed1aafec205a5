// gloo_allreduce_bench: the allreduce sweep (sweep.h) over Gloo's ring allreduce
// (gloo::allreduce with the RING algorithm) on Gloo's TCP transport, the second
// baseline for allreduce_bench. Each rank listens on --hostname ADDR, else on its host's
// name as elasticrun gives it (ELASTICRUN_HOST: an address across the namespace hosts
// of scripts/testcluster, "localhost" on one machine), else on 127.0.0.1.
//
// Rank and size come from the launcher: ELASTICRUN_RANK/ELASTICRUN_SIZE under
// elasticrun, OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE under mpirun. The ranks
// find each other through a gloo::rendezvous::FileStore in a directory they all
// see; it must be fresh for every run (stale keys would point at dead ports):
//
//   elasticrun -np 4 build/bench/gloo_allreduce_bench --store-dir "$(mktemp -d)"
#include "sweep.h"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>

namespace {

constexpr std::uint32_t kSweepTag = 1, kMaxTag = 2;

// The first of `names` that is set, as an int; -1 when none is.
int int_env(std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return -1;
}

// Gloo's reduction functions have the shape c[i] = a[i] op b[i] over n elements.
// (math.h overloads each name, so the wanted signature is spelled out.)
template <class T>
gloo::AllreduceOptions::Func reducer(bench::Op op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  switch (op) {
    case bench::Op::sum: return static_cast<Fn>(&gloo::sum<T>);
    case bench::Op::min: return static_cast<Fn>(&gloo::min<T>);
    case bench::Op::max: return static_cast<Fn>(&gloo::max<T>);
  }
  return static_cast<Fn>(&gloo::sum<T>);
}

class GlooBackend final : public bench::Backend {
 public:
  GlooBackend(int rank, int size, const std::string& store_dir, const std::string& hostname) {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(store_dir);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(std::chrono::seconds(120));
    ctx->connectFullMesh(store, device);
    ctx_ = ctx;
  }

  const char* name() const override { return "gloo"; }
  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }

  void barrier() override {
    gloo::BarrierOptions opts(ctx_);
    gloo::barrier(opts);
  }

  void allreduce(const void* in, void* out, std::size_t count, bench::Dtype t, bench::Op op) override {
    switch (t) {
      case bench::Dtype::f32: return run<float>(in, out, count, op, kSweepTag);
      case bench::Dtype::f64: return run<double>(in, out, count, op, kSweepTag);
      case bench::Dtype::i32: return run<std::int32_t>(in, out, count, op, kSweepTag);
    }
  }

  double max_over_ranks(double v) override {
    double result = 0;
    run<double>(&v, &result, 1, bench::Op::max, kMaxTag);
    return result;
  }

 private:
  // Builds the options per call, as a framework calling Gloo would; for the TCP
  // transport that only wraps the pointers (nothing is registered).
  template <class T>
  void run(const void* in, void* out, std::size_t count, bench::Op op, std::uint32_t tag) {
    gloo::AllreduceOptions opts(ctx_);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setInput(const_cast<T*>(static_cast<const T*>(in)), count);
    opts.setOutput(static_cast<T*>(out), count);
    opts.setReduceFunction(reducer<T>(op));
    opts.setTag(tag);
    gloo::allreduce(opts);
  }

  std::shared_ptr<gloo::Context> ctx_;
};

}  // namespace

int main(int argc, char** argv) {
  bench::Options opts = bench::parse_options(
      argc, argv, {"--store-dir", "--hostname"},
      "  --store-dir DIR  empty directory shared by the ranks for Gloo's FileStore\n"
      "                   (default: $GLOO_BENCH_STORE_DIR)\n"
      "  --hostname ADDR  the address this rank listens on (default: $ELASTICRUN_HOST, else 127.0.0.1)\n");
  int rank = int_env({"ELASTICRUN_RANK", "OMPI_COMM_WORLD_RANK"});
  int size = int_env({"ELASTICRUN_SIZE", "OMPI_COMM_WORLD_SIZE"});
  std::string dir = opts.extra.count("--store-dir") ? opts.extra["--store-dir"] : "";
  if (dir.empty())
    if (const char* v = std::getenv("GLOO_BENCH_STORE_DIR")) dir = v;
  if (rank < 0 || size < 1 || rank >= size) {
    std::fprintf(stderr, "gloo_allreduce_bench: no rank/size: run under elasticrun or mpirun\n");
    return 2;
  }
  if (dir.empty()) {
    if (rank == 0) std::fprintf(stderr, "gloo_allreduce_bench: give --store-dir or GLOO_BENCH_STORE_DIR\n");
    return 2;
  }
  // Every rank may race to create it; losing that race is fine.
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "gloo_allreduce_bench: mkdir %s: %s\n", dir.c_str(), std::strerror(errno));
    return 2;
  }
  try {
    std::string hostname = opts.extra.count("--hostname") ? opts.extra["--hostname"] : "";
    if (hostname.empty())
      if (const char* v = std::getenv("ELASTICRUN_HOST"); v && *v) hostname = v;
    if (hostname.empty()) hostname = "127.0.0.1";
    GlooBackend backend(rank, size, dir, hostname);
    return bench::run_sweep(backend, opts);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_allreduce_bench: rank %d: %s\n", rank, e.what());
    return 1;
  }
}
