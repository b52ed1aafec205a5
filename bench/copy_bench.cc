// copy_bench: what one copy costs between two processes on this machine, the question
// behind the one-host collectives' design (two copies through a shared segment, or one
// straight from the peer's memory).
//
//   build/bench/copy_bench [--reps 5]
//
// For each size and page kind (4 KiB pages, or transparent huge pages through
// MADV_HUGEPAGE, as glibc.malloc.hugetlb=1 gives Open MPI's and our benchmarks), the
// median over --reps of:
//   memcpy  one process copying the size in 256 KiB pieces (how the slot path copies;
//           the shared-memory collectives make two such copies: into the slot, out of it)
//   cma     a child reading the size from its parent with process_vm_readv in 1 MiB
//           pieces (a single copy, Open MPI vader's mechanism)
// and "cma/2memcpy": cma's time over two memcpys' (below 1: one cross-process copy beats
// two local ones, and a single-copy path would pay off).
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr std::size_t kHuge = 2u << 20;

// `bytes` on 2 MiB-aligned pages of the kind asked for, touched.
char* pages(std::size_t bytes, bool huge) {
  void* p = mmap(nullptr, bytes + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("copy_bench: mmap");
    std::exit(1);
  }
  auto* q = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1));
  madvise(q, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  std::memset(q, 1, bytes);
  return q;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Fn>
double us_per_call(int iters, Fn&& fn) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
}

// The child's time per process_vm_readv sweep of `bytes` from the parent's `src`.
double cma_us(const char* src, std::size_t bytes, bool huge, int iters) {
  int fds[2];
  if (pipe(fds) != 0) std::exit(1);
  pid_t parent = getpid();
  pid_t child = fork();
  if (child == 0) {
    char* mine = pages(bytes, huge);
    double us = us_per_call(iters, [&] {
      for (std::size_t o = 0; o < bytes; o += 1u << 20) {
        std::size_t len = std::min<std::size_t>(1u << 20, bytes - o);
        iovec local{mine + o, len}, remote{const_cast<char*>(src) + o, len};
        if (process_vm_readv(parent, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(len)) {
          std::perror("copy_bench: process_vm_readv");
          _exit(1);
        }
      }
    });
    if (write(fds[1], &us, sizeof us) != sizeof us) _exit(1);
    _exit(0);
  }
  double us = -1;
  if (read(fds[0], &us, sizeof us) != sizeof us) us = -1;
  int st = 0;
  waitpid(child, &st, 0);
  close(fds[0]);
  close(fds[1]);
  if (us < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    std::fprintf(stderr, "copy_bench: the reading child failed (ptrace permission?)\n");
    std::exit(1);
  }
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc && std::atoi(argv[i + 1]) > 0) reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "copy_bench: usage: copy_bench [--reps N]\n");
      return 2;
    }
  }
  std::printf("# median of %d; GB/s = bytes / time\n", reps);
  std::printf("%-6s %10s %12s %9s %12s %9s %12s\n", "pages", "bytes", "memcpy_us", "GB/s", "cma_us", "GB/s",
              "cma/2memcpy");
  for (bool huge : {false, true}) {
    for (std::size_t bytes : {256u << 10, 1u << 20, 4u << 20, 16u << 20}) {
      char* src = pages(bytes, huge);
      char* dst = pages(bytes, huge);
      int iters = std::max<int>(10, static_cast<int>((128u << 20) / bytes));
      std::vector<double> mc, cma;
      for (int r = 0; r < reps; ++r) {
        mc.push_back(us_per_call(iters, [&] {
          for (std::size_t o = 0; o < bytes; o += 256u << 10)
            std::memcpy(dst + o, src + o, std::min<std::size_t>(256u << 10, bytes - o));
        }));
        cma.push_back(cma_us(src, bytes, huge, iters));
      }
      double m = median(mc), c = median(cma);
      std::printf("%-6s %10zu %12.1f %9.2f %12.1f %9.2f %12.2f\n", huge ? "huge" : "4k", bytes, m, bytes / m / 1e3, c,
                  bytes / c / 1e3, c / (2 * m));
      munmap(src, bytes);  // page-aligned inside the mapping; the tail stays mapped (bench only)
      munmap(dst, bytes);
    }
  }
  return 0;
}
