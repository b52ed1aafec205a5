// Setting up a ShmGroup among ranks that find each other through the Store.
#pragma once

#include "host/algorithms.h"
#include "host/shm_group.h"

#include <memory>
#include <string>

namespace elasticrun::collective {

// Makes this rank's shared-memory group (`o`: its rank and size in the group, and this
// rank's wishes), found under Store key `key`. Group rank 0 creates the segment with its
// settings and publishes them with the path; the others adopt them (the progress mode
// behind small_max is each rank's own). Collective over every rank of `agree`'s
// transport (the whole communicator, whose every rank calls it in the same call, each for
// its own group): the result is whether every rank's group is usable (false: `why` says
// why), agreed by a minimum over `agree`. A group of one needs no segment and leaves
// `out` null. A timeout or an abort is thrown, not agreed.
bool make_shm_group(const ShmGroup::Options& o, Store& store, const std::string& key, Step& agree,
                    const AbortSignal& abort, std::unique_ptr<ShmGroup>& out, std::string& why);

}  // namespace elasticrun::collective
