// Whether a host name refers to this machine (then it is launched without SSH).
#pragma once

#include <string>

namespace elasticrun::discovery {

// True when every address `name` resolves to is a loopback address or one assigned
// to a local interface. "user@host" is judged by its host part.
bool is_local_host(const std::string& name);

}  // namespace elasticrun::discovery
