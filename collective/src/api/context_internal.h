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
};

}  // namespace elasticrun
