// device_allreduce_check: device-memory collectives under the launcher (needs the NCCL
// backend and a GPU).
//
//   elasticrun -np 2 build/examples/device_allreduce_check --check
//   elasticrun -np 2 build/examples/device_allreduce_check --bench [--min-bytes B] [--max-bytes B]
//   elasticrun -np 3 --min-np 2 build/examples/device_allreduce_check --elastic --steps 200
//       --fail-at-step 50 [--fail-where host|device] [--fail-how exit|kill|stop] [--memory host]
//
// NCCL refuses two ranks of one communicator on one GPU unless every process has its own
// NCCL_HOSTID: NCCL then takes the ranks for separate hosts and connects them with
// sockets. Slow, but correct, and enough to check results and recovery on one GPU;
// scripts/gpu-check does that when ranks outnumber GPUs.
//
// --check: every collective, data type and op of the device path against the reference
// in collective_checks.h (inputs copied host to device, results back), on the legacy
// default stream and on a non-blocking stream of the program's own, in and out of place;
// then the same calls with host buffers, which Collectives routes to the host transport.
// Prints "device_allreduce_check: OK (N checks) on device D" per rank.
//
// --bench: allreduce of f32 in nccl-tests columns (busbw = algbw * 2(n-1)/n), ours against
// plain NCCL measured in the same run: a communicator this program makes with
// ncclCommInitRank, each call followed by cudaStreamSynchronize (ours also returns only
// when the operation is complete, by polling, and checks its arguments and the abort
// flag on every call: that overhead is what the ratio shows). Per size, the median of 5
// alternating timings of each; "vs nccl" is NCCL's time over ours (above 1: we are
// faster). With one rank NCCL's in-place allreduce moves nothing: overhead only.
//
// --elastic: steps under elasticrun::run(). Each step allreduces a device 1 (avg), then
// allreduces on the host ("still here?") and adds the device result to a committed total.
// At --fail-at-step, rank size-1 of the first epoch fails: --fail-where host (default)
// between the device and the host allreduce, so its peers' device communicators are
// intact and the next epoch can shrink them; --fail-where device just before the device
// allreduce, so its peers wait inside NCCL until the control plane aborts them (or NCCL
// reports the lost connection). --fail-how exit (default: _Exit(1)), kill (SIGKILL) or
// stop (SIGSTOP: a silent peer, found by ELASTICRUN_COLLECTIVE_TIMEOUT). The survivors must
// finish with total == steps, as a run without failures would. Two more running totals
// live in device memory, tracked by the State with a host and with a device snapshot, so
// restore and sync of device items are checked too: both must equal steps as well. They
// count the steps begun (each step adds 1 before its first allreduce, the host total
// adds the allreduced value after the last), so a failure in a step leaves them one
// ahead until State::restore() rolls them back: without the rollback they end at steps+1.
// --memory host runs the same on host buffers (the host transport; both extra totals
// then host memory with host snapshots), without a GPU: the integration tests do.
//
// Exit status: 0 passed, 1 a wrong result or an error, 2 bad arguments, 77 no device.
#include "collective_checks.h"

#include <elasticrun/device.hpp>
#include <elasticrun/elastic.hpp>
#include <elasticrun/elasticrun.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

using collective_checks::Checks;
using collective_checks::kOps;
using collective_checks::kTypes;
using elasticrun::DataType;
using elasticrun::ReduceOp;

constexpr const char* kProg = "device_allreduce_check";

struct Options {
  std::string mode = "--check";
  long steps = 100, fail_at_step = -1;
  std::string fail_where = "host", fail_how = "exit";
  bool host_memory = false;  // --memory host: --elastic on host buffers (no GPU needed)
  std::size_t min_bytes = 8, max_bytes = 64u << 20;
};

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "%s: %s\n", kProg, why.c_str());
  std::exit(2);
}

long number(const char* flag, const char* v) {
  if (!v) usage_error(std::string(flag) + " needs a value");
  char* end = nullptr;
  errno = 0;
  long n = std::strtol(v, &end, 10);
  if (*v < '0' || *v > '9' || *end != '\0' || errno != 0)
    usage_error(std::string(flag) + " '" + v + "' is not a non-negative integer");
  return n;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--check" || a == "--bench" || a == "--elastic") {
      o.mode = a;
      continue;
    }
    if (a == "--memory" && v && (std::string(v) == "host" || std::string(v) == "device")) {
      o.host_memory = std::string(v) == "host";
      ++i;
      continue;
    }
    ++i;
    if (a == "--steps") o.steps = number("--steps", v);
    else if (a == "--fail-at-step") o.fail_at_step = number("--fail-at-step", v);
    else if (a == "--min-bytes") o.min_bytes = static_cast<std::size_t>(number("--min-bytes", v));
    else if (a == "--max-bytes") o.max_bytes = static_cast<std::size_t>(number("--max-bytes", v));
    else if (a == "--fail-where" && v && (std::string(v) == "host" || std::string(v) == "device")) o.fail_where = v;
    else if (a == "--fail-how" && v &&
             (std::string(v) == "exit" || std::string(v) == "kill" || std::string(v) == "stop"))
      o.fail_how = v;
    else if (a == "--memory") usage_error("--memory '" + std::string(v ? v : "") + "': want host or device");
    else if (a == "--fail-where" || a == "--fail-how")
      usage_error(a + " '" + (v ? v : "") + "': want " + (a == "--fail-where" ? "host or device" : "exit, kill or stop"));
    else usage_error("unknown argument '" + a + "'");
  }
  if (o.min_bytes < 4 || o.min_bytes > o.max_bytes) usage_error("want 4 <= --min-bytes <= --max-bytes");
  if (o.host_memory && o.mode != "--elastic") usage_error("--memory host goes with --elastic only");
  return o;
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw elasticrun::Error(std::string(what) + ": " + cudaGetErrorString(e));
}

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw elasticrun::Error(std::string(what) + ": " + ncclGetErrorString(r));
}

// Device memory of at least one byte, so that even an empty buffer is a device pointer.
struct DeviceBuffer {
  explicit DeviceBuffer(std::size_t bytes) { check_cuda(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* b() { return static_cast<unsigned char*>(p); }
  void* p = nullptr;
};

// cudaMemcpy from pageable memory may return before its last DMA lands; a collective
// on a non-blocking stream does not wait for the legacy stream, so wait here.
void up(DeviceBuffer& d, const void* host, std::size_t bytes) {
  if (!bytes) return;
  check_cuda(cudaMemcpy(d.p, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  check_cuda(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
}
void down(void* host, const void* dev, std::size_t bytes) {
  if (bytes) check_cuda(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

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

// Plain NCCL, the peer of --bench: its own communicator, blocking init.
class PlainNccl {
 public:
  PlainNccl(elasticrun::Context& ctx) {
    ncclUniqueId id{};
    if (ctx.topology().rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    ctx.comm().broadcast(&id, sizeof id, DataType::u8, 0);
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
    auto ours = [&] { coll.allreduce(buf.p, buf.p, count, DataType::f32, ReduceOp::sum, s); };
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

[[noreturn]] void fail_now(const Options& o, int rank, long step) {
  std::printf("rank %d: failing at step %ld (%s, before the %s allreduce)\n", rank, step, o.fail_how.c_str(),
              o.fail_where == "host" ? "host" : "device");
  std::fflush(stdout);
  if (o.fail_how == "kill") std::raise(SIGKILL);
  if (o.fail_how == "stop") std::raise(SIGSTOP);  // stays stopped until the launcher kills it
  std::_Exit(1);
}

// A running total in device memory (host memory with --memory host); the sum itself is
// done on the host, since what is checked is the State's copies of the memory.
class Total {
 public:
  explicit Total(bool device) : dev_(device ? std::make_unique<DeviceBuffer>(sizeof(double)) : nullptr) {
    if (dev_) check_cuda(cudaMemset(dev_->p, 0, sizeof(double)), "cudaMemset");
  }
  void* data() { return dev_ ? dev_->p : &host_; }
  double get() const {
    double v = host_;
    if (dev_) down(&v, dev_->p, sizeof v);
    return v;
  }
  void add(double v) {
    if (!dev_) {
      host_ += v;
      return;
    }
    double x = get() + v;
    up(*dev_, &x, sizeof x);
  }

 private:
  std::unique_ptr<DeviceBuffer> dev_;
  double host_ = 0;
};

int elastic(elasticrun::Context& ctx, const Options& o) {
  elasticrun::device::Collectives coll(ctx);
  long step = 0;
  double total = 0;
  elasticrun::State state(ctx);
  state.track_value("step", step);
  state.track_value("total", total);
  Total host_snap(!o.host_memory), dev_snap(!o.host_memory);
  state.track_raw("total on device, host snapshot", host_snap.data(), 1, DataType::f64);
  state.track_raw("total on device, device snapshot", dev_snap.data(), 1, DataType::f64,
                  o.host_memory ? elasticrun::Snapshot::host : elasticrun::Snapshot::device);
  // The step's value: device memory, or with --memory host a host float (the same run
  // on the host path, so the fault handling can be tried without a GPU).
  std::unique_ptr<DeviceBuffer> dev = o.host_memory ? nullptr : std::make_unique<DeviceBuffer>(sizeof(float));
  float host_value = 0;
  void* one = dev ? dev->p : &host_value;
  elasticrun::run(state, [&](elasticrun::State& st) {
    while (step < o.steps) {
      const auto& t = ctx.topology();
      bool failing = step == o.fail_at_step && t.epoch == 1 && t.rank == t.size - 1;
      float v = 1.0f;
      if (dev) check_cuda(cudaMemcpy(one, &v, sizeof v, cudaMemcpyHostToDevice), "cudaMemcpy to device");
      else host_value = v;
      if (failing && o.fail_where == "device") fail_now(o, t.rank, step);
      host_snap.add(1);  // steps begun, before the collectives: a failed step must be rolled back
      dev_snap.add(1);
      coll.allreduce(one, one, 1, DataType::f32, ReduceOp::avg);
      if (failing) fail_now(o, t.rank, step);
      int alive = 1;
      ctx.comm().allreduce(&alive, &alive, 1, DataType::i32, ReduceOp::sum);
      if (dev) down(&v, one, sizeof v);
      else v = host_value;
      total += v;
      ++step;  // before the commit: a restored state must not repeat this step
      if (step % 10 == 0) st.commit();
    }
  });
  const double want = static_cast<double>(o.steps), h = host_snap.get(), d = dev_snap.get();
  bool ok = total == want && h == want && d == want;
  std::printf("rank %d: final steps=%ld total=%g state totals=%g,%g resets=%d %s\n", ctx.topology().rank, step, total, h,
              d, ctx.resets(), ok ? "OK" : "WRONG");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  try {
    elasticrun::init();
    std::string why;
    if (!o.host_memory && !elasticrun::device::available(&why)) {
      std::fprintf(stderr, "%s: %s\n", kProg, why.c_str());
      return 77;  // "skipped" for test harnesses
    }
    auto& ctx = elasticrun::context();
    int device = o.host_memory ? -1 : elasticrun::device::use_device(ctx);  // before any allocation
    int rc = 0;
    if (o.mode == "--elastic") {
      rc = elastic(ctx, o);
    } else {
      elasticrun::device::Collectives coll(ctx);
      rc = o.mode == "--bench" ? bench(ctx, coll, o) : check(coll, device, ctx.topology().rank, ctx.topology().size);
    }
    elasticrun::shutdown();
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", kProg, e.what());
    return 1;
  }
}
