// device_elastic_check: device-memory collectives under elasticrun::run(), with one
// rank made to fail (needs the NCCL backend and a GPU, except with --memory host).
//
//   elasticrun -np 3 --min-np 2 build/examples/device_elastic_check --steps 200
//       --fail-at-step 50 [--fail-where host|device] [--fail-how exit|kill|stop] [--memory host]
//
// NCCL refuses two ranks of one communicator on one GPU unless every process has its own
// NCCL_HOSTID: NCCL then takes the ranks for separate hosts and connects them with
// sockets. Slow, but correct, and enough to check recovery on one GPU; scripts/gpu-check
// does that when ranks outnumber GPUs.
//
// --steps steps (default 100): each allreduces a device 1 (avg), then allreduces on the
// host ("still here?") and adds the device result to a committed total. At --fail-at-step,
// rank size-1 of the first epoch fails: --fail-where host (default) between the device
// and the host allreduce, so its peers' device communicators are intact and the next
// epoch can shrink them; --fail-where device just before the device allreduce, so its
// peers wait inside NCCL until the control plane aborts them (or NCCL reports the lost
// connection). --fail-how exit (default: _Exit(1)), kill (SIGKILL) or
// stop (SIGSTOP: a silent peer, found by ELASTICRUN_COLLECTIVE_TIMEOUT). The survivors must
// finish with total == steps, as a run without failures would. Two more running totals
// live in device memory, tracked by the State with a host and with a device snapshot, so
// restore and sync of device items are checked too: both must equal steps as well. They
// count the steps begun (each step adds 1 before its first allreduce, the host total
// adds the allreduced value after the last), so a failure in a step leaves them one
// ahead until State::restore() rolls them back: without the rollback they end at steps+1.
// --memory host runs the same on host buffers (the host transport; both extra totals
// then host memory with host snapshots), without a GPU: the integration tests do.
// Prints "rank R: final steps=S total=T state totals=H,D resets=N OK" (or WRONG) per rank.
//
// Exit status: 0 passed, 1 a wrong result or an error, 2 bad arguments, 77 no device.
#include "device_support.h"

#include <elasticrun/device.hpp>
#include <elasticrun/elastic.hpp>
#include <elasticrun/elasticrun.hpp>

#include <cuda_runtime_api.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace {

using namespace device_support;  // the helpers shared by the device programs
using elasticrun::DataType;
using elasticrun::ReduceOp;

constexpr const char* kProg = "device_elastic_check";

struct Options {
  long steps = 100, fail_at_step = -1;
  std::string fail_where = "host", fail_how = "exit";
  bool host_memory = false;  // --memory host: host buffers (no GPU needed)
};

Options parse(int argc, char** argv) {
  Options o;
  Args a(kProg, argc, argv);
  while (a.next()) {
    if (a.is("--steps")) o.steps = a.number();
    else if (a.is("--fail-at-step")) o.fail_at_step = a.number();
    else if (a.is("--fail-where")) o.fail_where = a.choice({"host", "device"});
    else if (a.is("--fail-how")) o.fail_how = a.choice({"exit", "kill", "stop"});
    else if (a.is("--memory")) o.host_memory = a.choice({"host", "device"}) == "host";
    else a.unknown();
  }
  return o;
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
  return run_worker(kProg, !o.host_memory, [&](elasticrun::Context& ctx, int) { return elastic(ctx, o); });
}
