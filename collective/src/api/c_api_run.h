// er_run's retry loop, apart from the process-wide context so tests can drive it with a
// State of their own (c_api.cc).
#pragma once

#include <elasticrun/elastic.hpp>

#include <functional>

namespace elasticrun::capi {

// run_loop over a C body that reports failures as er_* codes: ER_WORKERS_FAILED,
// ER_HOSTS_UPDATED and ER_TIMEOUT restore (as needed) and re-join as their exceptions
// do. Returns the body's other codes as they are, or the code of a failed re-join or
// sync; er_last_error() says why.
int run(State& state, const std::function<int()>& body);

}  // namespace elasticrun::capi
