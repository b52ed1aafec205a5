// mpi_launch_probe: launch_probe's twin for `mpirun`. It initialises MPI,
// allreduces one float and exits, so scripts/bench-launch can compare launch cost.
#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  float x = 1.0f;
  int n = 0;
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Finalize();
  if (x != static_cast<float>(n)) {
    std::fprintf(stderr, "mpi_launch_probe: allreduce gave %g, expected %d\n", x, n);
    return 1;
  }
  return 0;
}
