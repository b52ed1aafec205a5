// allreduce_check: a worker that verifies every collective, data type and reduce
// op of libelasticrun against a locally computed reference.
//
//   elasticrun -np 4 build/examples/allreduce_check [--large BYTES]
//
// --large: the size of the large case of each collective (default 2 MiB, at least 4096;
// smaller for slow links, where 2 MiB times every type, op and algorithm takes minutes).
//
// Inputs are small integers that depend on the rank and the index, so the exact
// result is known in double precision; floating results are compared with a
// tolerance of half an ulp of their type (avg divides). Every allreduce algorithm
// (ring, recursive doubling and halving-doubling, direct, shared memory when all ranks
// share this host, and the hierarchical one when some host runs several ranks but not
// all), and the other collectives over UCX, over shared memory (all ranks on this host)
// or hierarchically (some host runs several ranks: the allgather(v), reduce_scatter and
// broadcast through each host's shared memory and one rank per host, on hosts of any
// sizes), and
// the direct broadcast, are exercised by switching ELASTICRUN_ALGORITHM, which the
// library reads per call.
// Prints "allreduce_check: OK (N checks)" and exits 0, or the first mismatch and exits 1.
#include "collective_checks.h"

#include <elasticrun/elasticrun.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using collective_checks::Buf;
using collective_checks::kOps;
using collective_checks::kTypes;
using elasticrun::DataType;
using elasticrun::ReduceOp;

class Checker : public collective_checks::Checks<elasticrun::Communicator> {
 public:
  Checker(elasticrun::Communicator& c, const elasticrun::Topology& t)
      : Checks(c, c.rank(), c.size(), "allreduce_check"), comm_(c), one_host_(t.local_size == t.size) {
    // A hierarchy exists when some host runs several ranks but not all of them:
    // every rank must agree, so take the largest host over all ranks.
    // Rails as well where every host runs as many ranks (the narrowest is the widest).
    std::int32_t widest = t.local_size, narrowest = t.local_size;
    comm_.allreduce(&widest, &widest, 1, DataType::i32, ReduceOp::max);
    comm_.allreduce(&narrowest, &narrowest, 1, DataType::i32, ReduceOp::min);
    hierarchy_ = widest > 1 && widest < size();
    rails_ = hierarchy_ && narrowest == widest;
    if (rank() == 0)
      std::printf("algorithms: ring rd rhd direct twoshot%s%s%s\n", one_host_ ? " shm" : "", hierarchy_ ? " hier" : "",
                  rails_ ? " rails" : "");
  }

  void allgatherv(DataType t, std::size_t base) {
    std::vector<std::size_t> counts(size());
    for (int r = 0; r < size(); ++r) counts[r] = r % 3 == 1 ? 0 : base + 13 * r;
    Buf want;
    for (int r = 0; r < size(); ++r) {
      Buf part = input(ReduceOp::sum, t, r, counts[r]);
      want.insert(want.end(), part.begin(), part.end());
    }
    Buf in = input(ReduceOp::sum, t, rank(), counts[rank()]), out(want.size());
    comm_.allgatherv(in.data(), out.data(), counts, t);
    if (out != want) fail("allgatherv base " + std::to_string(base), 0, 0, 0);
    count_check();
  }

  void run(std::size_t large) {
    const std::size_t mib2 = large;
    for (const char* algo : {"ring", "rd", "rhd", "direct", "twoshot", "shm", "hier", "rails"}) {
      if (std::strcmp(algo, "shm") == 0 && !one_host_) continue;
      if (std::strcmp(algo, "hier") == 0 && !hierarchy_) continue;
      if (std::strcmp(algo, "rails") == 0 && !rails_) continue;
      ::setenv("ELASTICRUN_ALGORITHM", algo, 1);
      for (DataType t : kTypes)
        for (ReduceOp op : kOps)
          for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1023}, mib2 / elasticrun::size_of(t) + 1})
            for (bool in_place : {false, true}) allreduce(algo, t, op, count, in_place);
    }
    // The other collectives: UCX ("ring" forces it for every collective), then
    // shared memory when every rank is on this host, or the hierarchy where hosts
    // hold several ranks.
    for (const char* path : {"ring", "shm", "hier"}) {
      if (std::strcmp(path, "shm") == 0 && !one_host_) continue;
      if (std::strcmp(path, "hier") == 0 && !hierarchy_) continue;
      ::setenv("ELASTICRUN_ALGORITHM", path, 1);
      others(mib2);
    }
    // "direct" changes the broadcast only (the others have no direct variant).
    ::setenv("ELASTICRUN_ALGORITHM", "direct", 1);
    broadcasts(mib2);
    ::setenv("ELASTICRUN_ALGORITHM", "auto", 1);
  }

  void broadcasts(std::size_t mib2) {
    for (std::size_t count : {std::size_t{0}, std::size_t{5}, mib2 / 4 + 3})
      for (int root = 0; root < size(); ++root) broadcast(DataType::f32, count, root);
  }

  void others(std::size_t mib2) {
    broadcasts(mib2);
    for (DataType t : kTypes)
      for (std::size_t count : {std::size_t{0}, std::size_t{3}, std::size_t{70001}})
        for (bool in_place : {false, true}) {
          allgather(t, count, in_place);
          alltoall(t, count, in_place);
        }
    for (std::size_t base : {0u, 1u, 100003u}) allgatherv(DataType::i32, base);
    for (DataType t : kTypes)
      for (ReduceOp op : kOps)
        for (std::size_t count : {0u, 1u, 33333u}) reduce_scatter(t, op, count);
    for (int i = 0; i < 10; ++i) comm_.barrier();
    count_check();
  }

 private:
  elasticrun::Communicator& comm_;
  bool one_host_, hierarchy_ = false, rails_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  std::size_t large = 2u << 20;
  if (argc == 3 && std::strcmp(argv[1], "--large") == 0) {
    char* end = nullptr;
    unsigned long long v = std::strtoull(argv[2], &end, 10);
    if (end == argv[2] || *end != '\0' || v < 4096 || v > (1ull << 30)) {
      std::fprintf(stderr, "allreduce_check: --large wants a number of bytes from 4096 to 2^30, not '%s'\n", argv[2]);
      return 2;
    }
    large = static_cast<std::size_t>(v);
  } else if (argc != 1) {
    std::fprintf(stderr, "usage: allreduce_check [--large BYTES]\n");
    return 2;
  }
  try {
    elasticrun::init();
    const elasticrun::Topology& t = elasticrun::context().topology();
    std::printf("rank %d/%d local %d/%d cross %d/%d host %s\n", t.rank, t.size, t.local_rank, t.local_size,
                t.cross_rank, t.cross_size, t.host.c_str());
    std::fflush(stdout);
    Checker checker(elasticrun::context().comm(), t);
    checker.run(large);
    std::printf("allreduce_check: OK (%d checks)\n", checker.checks());
    elasticrun::shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::printf("allreduce_check: ERROR rank %d: %s\n", elasticrun::initialized() ? elasticrun::rank() : -1, e.what());
    return 1;
  }
}
