// What the library's own parts may reach inside a Context (not part of the public API).
#pragma once

#include "rendezvous_client.h"

#include <elasticrun/elasticrun.hpp>

#include <memory>

namespace elasticrun {

struct ContextInternals {
  // The context's rendezvous connection (its Store and AbortSignal); null for a context
  // built around a bare Communicator.
  static std::shared_ptr<collective::RendezvousClient> client(Context& ctx);
};

}  // namespace elasticrun
