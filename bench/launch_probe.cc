// launch_probe: the smallest useful elasticrun job. It joins, allreduces one float
// and exits, so `time elasticrun -np N launch_probe` measures the launch path
// (driver, daemon, rendezvous, transport set-up, teardown) and nothing else.
// scripts/bench-launch compares it with mpi_launch_probe under mpirun.
#include <elasticrun/elasticrun.hpp>

#include <cstdio>
#include <exception>
#include <span>

int main() {
  try {
    elasticrun::init();
    float x = 1.0f;
    elasticrun::allreduce(std::span<float>(&x, 1), elasticrun::ReduceOp::sum);
    int n = elasticrun::size();
    elasticrun::shutdown();
    if (x != static_cast<float>(n)) {
      std::fprintf(stderr, "launch_probe: allreduce gave %g, expected %d\n", x, n);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch_probe: %s\n", e.what());
    return 1;
  }
}
