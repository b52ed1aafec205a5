// Whether a host name refers to this machine (then it is launched without SSH).
#pragma once

#include <string>

namespace elasticrun::discovery {

// True when every address `name` resolves to is a loopback address or one assigned
// to a local interface. "user@host" is judged by its host part.
bool is_local_host(const std::string& name);

// The address of this machine that traffic to `name` leaves from (what the kernel's
// routing picks; nothing is sent), so that a remote host can reach back to us. Empty
// if `name` cannot be resolved or routed.
std::string local_address_towards(const std::string& name);

// Where a host is, as this machine sees it: this machine itself, or a remote host that
// traffic to leaves from our address `toward`. Neither: the name does not resolve, or
// no route leads there.
struct HostPlace {
  bool local = false;
  std::string toward;
  bool found() const { return local || !toward.empty(); }
};

// Both of the above from one resolution of the name (it may block for as long as the
// resolver takes: see HostLookups).
HostPlace look_up_host(const std::string& name);

}  // namespace elasticrun::discovery
