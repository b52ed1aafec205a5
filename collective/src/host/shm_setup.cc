#include "host/shm_setup.h"

#include <cstdint>
#include <cstring>

namespace elasticrun::collective {

bool make_shm_group(const ShmGroup::Options& wish, Store& store, const std::string& key, Step& agree,
                    const AbortSignal& abort, std::unique_ptr<ShmGroup>& out, std::string& why) {
  ShmGroup::Options o = wish;
  constexpr std::size_t kFixed = 3 * sizeof(std::uint64_t);  // token, slot, small_max, then the path
  std::unique_ptr<ShmGroup> g;
  std::string mine;
  try {
    if (o.size == 1) {
      // nothing to share
    } else if (o.rank == 0) {
      g = ShmGroup::create(o);
    } else {
      Bytes v = store.get(key, agree.deadline);
      if (v.size() <= kFixed) throw Error("rank 0 of the host could not create the segment");
      std::uint64_t fixed[3];
      std::memcpy(fixed, v.data(), kFixed);
      o.slot_bytes = fixed[1];
      o.small_max = fixed[2];
      g = ShmGroup::attach(o, std::string(v.begin() + kFixed, v.end()), fixed[0]);
    }
  } catch (const std::exception& e) {
    if (dynamic_cast<const TimeoutError*>(&e) || abort.raised()) throw;
    mine = e.what();
  }
  // From here on group rank 0 removes the file whatever happens: the others have
  // it mapped (or have given up) once the agreement is over.
  std::int32_t ok = mine.empty() ? 1 : 0;
  const bool creator = o.size > 1 && o.rank == 0;
  try {
    if (creator) {
      Bytes v(g ? kFixed + g->path().size() : 0);  // empty: there is no segment
      if (g) {
        std::uint64_t fixed[3] = {g->token(), g->slot_bytes(), g->small_max()};
        std::memcpy(v.data(), fixed, kFixed);
        std::memcpy(v.data() + kFixed, g->path().data(), g->path().size());
      }
      store.set(key, v);
    }
    // Whether every rank has its group: the minimum over all ranks, by UCX (a step of its own).
    allreduce_rd(agree, &ok, &ok, 1, DataType::i32, ReduceOp::min);
  } catch (...) {
    if (g && creator) g->unlink();
    throw;
  }
  if (g && creator) g->unlink();
  if (ok == 0) {
    why = !mine.empty() ? mine : "another rank could not map its shared segment";
    return false;
  }
  out = std::move(g);
  return true;
}

}  // namespace elasticrun::collective
