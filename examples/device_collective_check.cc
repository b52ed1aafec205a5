// device_collective_check: every device-memory collective under the launcher (needs the
// NCCL backend and a GPU).
//
//   elasticrun -np 2 build/examples/device_collective_check
//
// NCCL refuses two ranks of one communicator on one GPU unless every process has its own
// NCCL_HOSTID: NCCL then takes the ranks for separate hosts and connects them with
// sockets. Slow, but correct, and enough to check results on one GPU; scripts/gpu-check
// does that when ranks outnumber GPUs.
//
// Every collective, data type and op of the device path against the reference in
// collective_checks.h (inputs copied host to device, results back), on the legacy
// default stream and on a non-blocking stream of the program's own, in and out of place;
// then the same calls with host buffers, which Collectives routes to the host transport.
// Prints "device_collective_check: OK (N checks) on device D" per rank.
//
// Exit status: 0 passed, 1 a wrong result or an error, 2 bad arguments, 77 no device.
#include "collective_checks.h"
#include "device_support.h"

#include <elasticrun/device.hpp>
#include <elasticrun/elasticrun.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>

namespace {

using collective_checks::Checks;
using collective_checks::kOps;
using collective_checks::kTypes;
using namespace device_support;  // the helpers shared by the device programs
using elasticrun::DataType;
using elasticrun::ReduceOp;

constexpr const char* kProg = "device_collective_check";

// The host-buffer calls collective_checks.h drives, carried out in device memory: inputs
// are copied to the device, the device collective runs on `stream`, results come back.
// In-place calls stay in place on the device.
class Staged {
 public:
  Staged(elasticrun::device::Collectives& coll, cudaStream_t stream, int size)
      : coll_(coll), stream_(stream), size_(size) {}

  void allreduce(const void* in, void* out, std::size_t count, DataType t, ReduceOp op) {
    std::size_t bytes = count * elasticrun::size_of(t);
    DeviceBuffer din(bytes), dout(bytes);
    up(din, in, bytes);
    void* res = in == out ? din.p : dout.p;
    coll_.allreduce(din.p, res, count, t, op, stream_);
    down(out, res, bytes);
  }

  void broadcast(void* buf, std::size_t count, DataType t, int root) {
    std::size_t bytes = count * elasticrun::size_of(t);
    DeviceBuffer d(bytes);
    up(d, buf, bytes);
    coll_.broadcast(d.p, count, t, root, stream_);
    down(buf, d.p, bytes);
  }

  // In place when `in` lies inside `out` (this rank's block of the output).
  void allgather(const void* in, void* out, std::size_t count, DataType t) {
    std::size_t bytes = count * elasticrun::size_of(t), all = bytes * size_;
    DeviceBuffer din(bytes), dout(all);
    auto* i = static_cast<const unsigned char*>(in);
    auto* o = static_cast<unsigned char*>(out);
    const void* src = din.p;
    if (all > 0 && i >= o && i < o + all) {
      up(dout, out, all);
      src = dout.b() + (i - o);
    } else {
      up(din, in, bytes);
    }
    coll_.allgather(src, dout.p, count, t, stream_);
    down(out, dout.p, all);
  }

  void reduce_scatter(const void* in, void* out, std::size_t count, DataType t, ReduceOp op) {
    std::size_t bytes = count * elasticrun::size_of(t);
    DeviceBuffer din(bytes * size_), dout(bytes);
    up(din, in, bytes * size_);
    coll_.reduce_scatter(din.p, dout.p, count, t, op, stream_);
    down(out, dout.p, bytes);
  }

  void alltoall(const void* in, void* out, std::size_t count, DataType t) {
    std::size_t all = count * elasticrun::size_of(t) * size_;
    DeviceBuffer din(all), dout(all);
    up(din, in, all);
    void* res = in == out ? din.p : dout.p;
    coll_.alltoall(din.p, res, count, t, stream_);
    down(out, res, all);
  }

 private:
  elasticrun::device::Collectives& coll_;
  cudaStream_t stream_;
  int size_;
};

// Every collective of the device path; `others` adds broadcast, allgather, reduce_scatter
// and alltoall to the allreduces.
template <class C>
void run_checks(Checks<C>& c, const char* label, bool others) {
  const std::size_t mib2 = 2u << 20;
  for (DataType t : kTypes)
    for (ReduceOp op : kOps)
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1023}, mib2 / elasticrun::size_of(t) + 1})
        for (bool in_place : {false, true}) c.allreduce(label, t, op, count, in_place);
  if (!others) return;
  for (int root = 0; root < c.size(); ++root) {
    for (std::size_t count : {std::size_t{0}, std::size_t{5}, mib2 / 4 + 3}) c.broadcast(DataType::f32, count, root);
    c.broadcast(DataType::bf16, 7, root);
  }
  for (DataType t : kTypes)
    for (std::size_t count : {std::size_t{0}, std::size_t{3}, std::size_t{70001}})
      for (bool in_place : {false, true}) {
        c.allgather(t, count, in_place);
        c.alltoall(t, count, in_place);
      }
  for (DataType t : kTypes)
    for (ReduceOp op : kOps)
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{33333}}) c.reduce_scatter(t, op, count);
}

int check(elasticrun::device::Collectives& coll, int device, int rank, int n) {
  cudaStream_t own = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  int checks = 0;
  {
    // NCCL's avg scales each input before summing: a few more roundings than the host's.
    Staged on_default(coll, nullptr, n), on_own(coll, own, n);
    Checks<Staged> d(on_default, rank, n, kProg, 4), s(on_own, rank, n, kProg, 4);
    run_checks(d, "device, default stream", false);
    run_checks(s, "device, own stream", true);
    Checks<elasticrun::device::Collectives> h(coll, rank, n, kProg);
    run_checks(h, "host buffers", true);
    checks = d.checks() + s.checks() + h.checks();
  }
  cudaStreamDestroy(own);
  std::printf("%s: OK (%d checks) on device %d\n", kProg, checks, device);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args(kProg, argc, argv);
  if (args.next()) args.unknown();
  return run_worker(kProg, true, [](elasticrun::Context& ctx, int device) {
    elasticrun::device::Collectives coll(ctx);
    return check(coll, device, ctx.topology().rank, ctx.topology().size);
  });
}
