// Reports to the driver (Context::report): the metrics' JSON text, and the collective
// that lets every rank learn rank 0's answer. Internal; elasticrun.hpp is the API.
#pragma once

#include "common/messages.h"

#include <elasticrun/elasticrun.hpp>

#include <cstdint>
#include <functional>
#include <string>

namespace elasticrun {

// The metrics as a JSON object, e.g. {"accuracy":0.91,"loss":0.25}: names escaped,
// values with 17 significant digits (a double survives the round trip). Throws Error for
// an empty name or a value that is not finite (JSON has no NaN or infinity).
std::string metrics_json(const Metrics& metrics);

// The collective behind Context::report. Rank 0 runs `ask` (send the report, wait for
// the decision) and broadcasts an outcome byte over `comm`: the decision, or the kind
// of error `ask` threw; every rank then returns that decision or throws that kind, so
// all ranks leave the call the same way. Rank 0 rethrows its own error (with its message).
msg::Decision report_collective(Communicator& comm, const std::function<msg::Decision()>& ask);

}  // namespace elasticrun
