// What the library's own parts may reach inside a Context (not part of the public API).
#pragma once

#include "control/rendezvous_client.h"

#include <elasticrun/elasticrun.hpp>

#include <memory>
#include <string>

namespace elasticrun {

struct ContextInternals {
  // The context's rendezvous connection (its Store and AbortSignal); null for a context
  // built around a bare Communicator.
  static std::shared_ptr<collective::RendezvousClient> client(Context& ctx);
  // The store scope for the next device communicator of the context's current epoch.
  static std::string next_device_scope(Context& ctx);
  // Tells the driver that this worker's elastic state finished a sync (at `commits`
  // commits): only from then on does it count as holding the job's state, and may it be
  // the rank 0 that a later epoch syncs from. Every state holder calls it at the end of
  // its sync (State::sync, the Python package's states). Nothing for a context without
  // a rendezvous connection.
  static void state_synced(Context& ctx, std::uint64_t commits);
};

}  // namespace elasticrun
