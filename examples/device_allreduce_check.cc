// device_allreduce_check: device-memory collectives under the launcher (needs NCCL + GPUs,
// one GPU per rank: NCCL refuses two ranks of a communicator on one GPU).
//
//   elasticrun -np 2 build/examples/device_allreduce_check --check
//   elasticrun -np 2 build/examples/device_allreduce_check --bench [--min-bytes B --max-bytes B]
//   elasticrun -np 3 --min-np 2 build/examples/device_allreduce_check --elastic --steps 200 --fail-at-step 50
//
// --check verifies sum/avg allreduce results; --bench prints nccl-tests style rows (size,
// count, time, algbw, busbw = algbw * 2(n-1)/n); --elastic runs steps under
// elasticrun::run(), rank size-1 of the first epoch exits at --fail-at-step, and the
// survivors must finish with the value a fixed-size run would give.
#include <elasticrun/device.hpp>
#include <elasticrun/elastic.hpp>
#include <elasticrun/elasticrun.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using elasticrun::DataType;
using elasticrun::ReduceOp;

struct Options {
  std::string mode = "--check";
  long steps = 100, fail_at_step = -1;
  std::size_t min_bytes = 8, max_bytes = 64u << 20;
};

struct DeviceBuffer {
  explicit DeviceBuffer(std::size_t bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) throw elasticrun::Error("cudaMalloc failed");
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* f() { return static_cast<float*>(p); }
  void* p = nullptr;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::strtol(argv[++i], nullptr, 10) : 0L; };
    if (a == "--check" || a == "--bench" || a == "--elastic") o.mode = a;
    else if (a == "--steps") o.steps = next();
    else if (a == "--fail-at-step") o.fail_at_step = next();
    else if (a == "--min-bytes") o.min_bytes = static_cast<std::size_t>(next());
    else if (a == "--max-bytes") o.max_bytes = static_cast<std::size_t>(next());
    else {
      std::fprintf(stderr, "device_allreduce_check: unknown argument '%s'\n", a.c_str());
      std::exit(2);
    }
  }
  return o;
}

float first_element(const float* d) {
  float v = 0;
  cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost);
  return v;
}

int check(elasticrun::device::Collectives& coll, int rank, int n) {
  constexpr std::size_t kCount = 1 << 22;
  DeviceBuffer buf(kCount * sizeof(float));
  std::vector<float> host(kCount, static_cast<float>(rank + 1));
  cudaMemcpy(buf.p, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice);
  coll.allreduce(buf.p, buf.p, kCount, DataType::f32, ReduceOp::sum);
  float sum = first_element(buf.f());
  coll.allreduce(buf.p, buf.p, kCount, DataType::f32, ReduceOp::avg);
  float avg = first_element(buf.f());
  float want = n * (n + 1) / 2.0f;
  bool ok = sum == want && avg == want;
  std::printf("rank %d: device allreduce sum=%g avg=%g want=%g %s\n", rank, sum, avg, want, ok ? "OK" : "WRONG");
  return ok ? 0 : 1;
}

int bench(elasticrun::device::Collectives& coll, int rank, int n, const Options& o) {
  DeviceBuffer buf(o.max_bytes);
  if (rank == 0) std::printf("#%12s %12s %6s %10s %10s %10s\n", "size(B)", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)");
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
    std::size_t count = bytes / sizeof(float);
    int iters = bytes <= (1u << 20) ? 50 : 10;
    for (int i = 0; i < 5; ++i) coll.allreduce(buf.p, buf.p, count, DataType::f32, ReduceOp::sum);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) coll.allreduce(buf.p, buf.p, count, DataType::f32, ReduceOp::sum);
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    double algbw = bytes / us / 1e3;
    double busbw = algbw * 2.0 * (n - 1) / n;
    if (rank == 0) std::printf(" %12zu %12zu %6s %10.1f %10.2f %10.2f\n", bytes, count, "float", us, algbw, busbw);
  }
  return 0;
}

// Each step adds 1 on every rank with a device allreduce of `size` ones, then a host
// allreduce ("still here?"). The failing rank exits between the two, after the device
// collective completed, so survivors notice through the control plane on the host path.
int elastic(elasticrun::Context& ctx, const Options& o) {
  elasticrun::device::Collectives coll(ctx);
  long step = 0;
  double total = 0;
  elasticrun::State state(ctx);
  state.track_value("step", step);
  state.track_value("total", total);
  DeviceBuffer ones(sizeof(float));
  elasticrun::run(state, [&](elasticrun::State& st) {
    for (; step < o.steps; ++step) {
      float one = 1.0f;
      cudaMemcpy(ones.p, &one, sizeof one, cudaMemcpyHostToDevice);
      coll.allreduce(ones.p, ones.p, 1, DataType::f32, ReduceOp::avg);
      const auto& t = ctx.topology();
      if (step == o.fail_at_step && t.epoch == 1 && t.rank == t.size - 1) std::_Exit(1);
      int alive = 1;
      ctx.comm().allreduce(&alive, &alive, 1, DataType::i32, ReduceOp::sum);
      total += first_element(ones.f());
      if (step % 10 == 0) st.commit();
    }
  });
  std::printf("rank %d: final steps=%ld total=%g resets=%d %s\n", ctx.topology().rank, step, total, ctx.resets(),
              total == static_cast<double>(o.steps) ? "OK" : "WRONG");
  return total == static_cast<double>(o.steps) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  try {
    elasticrun::init();
    std::string why;
    if (!elasticrun::device::available(&why)) {
      std::fprintf(stderr, "device_allreduce_check: %s\n", why.c_str());
      return 77;  // "skipped" for test harnesses
    }
    auto& ctx = elasticrun::context();
    int rc = 0;
    if (o.mode == "--elastic") {
      rc = elastic(ctx, o);
    } else {
      elasticrun::device::Collectives coll(ctx);
      rc = o.mode == "--bench" ? bench(coll, ctx.topology().rank, ctx.topology().size, o)
                               : check(coll, ctx.topology().rank, ctx.topology().size);
    }
    elasticrun::shutdown();
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "device_allreduce_check: %s\n", e.what());
    return 1;
  }
}
