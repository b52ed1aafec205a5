// device_allreduce_bench: libelasticrun's device allreduce (through NCCL) against plain
// NCCL measured in the same run (needs the NCCL backend and a GPU).
//
//   elasticrun -np 2 build/bench/device_allreduce_bench [--min-bytes B] [--max-bytes B]
//
// NCCL refuses two ranks of one communicator on one GPU unless every process has its own
// NCCL_HOSTID: NCCL then takes the ranks for separate hosts and connects them with
// sockets. Slow, so only the ratio to plain NCCL means anything then; scripts/gpu-check
// runs it that way too on a one-GPU machine.
//
// Allreduce of f32 in nccl-tests columns (busbw = algbw * 2(n-1)/n), sizes from
// --min-bytes (default 8) to --max-bytes (default 64 MiB; plain byte counts, no K/M/G)
// by factors of 4, ours against plain NCCL: a communicator this program makes with ncclCommInitRank, each call
// followed by cudaStreamSynchronize (ours also returns only when the operation is
// complete, by polling, and checks its arguments and the abort flag on every call: that
// overhead is what the ratio shows). Per size, the median of 5 alternating timings of
// each; "vs nccl" is NCCL's time over ours (above 1: we are faster). With one rank NCCL's
// in-place allreduce moves nothing: overhead only.
//
// Exit status: 0 done, 1 an error, 2 bad arguments, 77 no device.
#include "device_support.h"

#include <elasticrun/device.hpp>
#include <elasticrun/elasticrun.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

using namespace device_support;  // the helpers shared by the device programs

constexpr const char* kProg = "device_allreduce_bench";

struct Options {
  std::size_t min_bytes = 8, max_bytes = 64u << 20;
};

Options parse(int argc, char** argv) {
  Options o;
  Args a(kProg, argc, argv);
  while (a.next()) {
    if (a.is("--min-bytes")) o.min_bytes = static_cast<std::size_t>(a.number());
    else if (a.is("--max-bytes")) o.max_bytes = static_cast<std::size_t>(a.number());
    else a.unknown();
  }
  if (o.min_bytes < 4 || o.min_bytes > o.max_bytes) a.error("want 4 <= --min-bytes <= --max-bytes");
  return o;
}

// Plain NCCL, the peer we measure against: its own communicator, blocking init.
class PlainNccl {
 public:
  PlainNccl(elasticrun::Context& ctx) {
    ncclUniqueId id{};
    if (ctx.topology().rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    ctx.comm().broadcast(&id, sizeof id, elasticrun::DataType::u8, 0);
    check_nccl(ncclCommInitRank(&comm_, ctx.topology().size, id, ctx.topology().rank), "ncclCommInitRank");
  }
  ~PlainNccl() { ncclCommDestroy(comm_); }
  PlainNccl(const PlainNccl&) = delete;
  PlainNccl& operator=(const PlainNccl&) = delete;
  void allreduce(void* buf, std::size_t count, cudaStream_t s) {
    check_nccl(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm_, s), "ncclAllReduce");
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }

 private:
  ncclComm_t comm_ = nullptr;
};

template <class Fn>
double per_call_us(int iters, Fn&& fn) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int bench(elasticrun::Context& ctx, elasticrun::device::Collectives& coll, const Options& o) {
  int rank = ctx.topology().rank, n = ctx.topology().size;
  PlainNccl plain(ctx);
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  DeviceBuffer buf(o.max_bytes);
  check_cuda(cudaMemset(buf.p, 0, o.max_bytes), "cudaMemset");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // before work on the non-blocking stream
  if (rank == 0)
    std::printf("#%11s %12s %6s %10s %11s %11s %10s %11s %8s\n", "size(B)", "count", "type", "time(us)", "algbw(GB/s)",
                "busbw(GB/s)", "nccl(us)", "nccl busbw", "vs nccl");
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
    std::size_t count = bytes / sizeof(float);
    int iters = bytes <= (1u << 20) ? 50 : 10;
    auto ours = [&] {
      coll.allreduce(buf.p, buf.p, count, elasticrun::DataType::f32, elasticrun::ReduceOp::sum, s);
    };
    auto theirs = [&] { plain.allreduce(buf.p, count, s); };
    for (int i = 0; i < 5; ++i) {
      ours();
      theirs();
    }
    std::vector<double> t_ours, t_theirs;
    for (int rep = 0; rep < 5; ++rep) {
      t_ours.push_back(per_call_us(iters, ours));
      t_theirs.push_back(per_call_us(iters, theirs));
    }
    double us = median(t_ours), nus = median(t_theirs);
    double algbw = bytes / us / 1e3, factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
    if (rank == 0)
      std::printf(" %11zu %12zu %6s %10.1f %11.2f %11.2f %10.1f %11.2f %8.2f\n", bytes, count, "float", us, algbw,
                  algbw * factor, nus, bytes / nus / 1e3 * factor, nus / us);
  }
  if (rank == 0 && n == 1) std::printf("# one rank: busbw columns show algbw (nccl-tests would print 0)\n");
  cudaStreamDestroy(s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  return run_worker(kProg, true, [&](elasticrun::Context& ctx, int) {
    elasticrun::device::Collectives coll(ctx);
    return bench(ctx, coll, o);
  });
}
