// Whether a host name refers to this machine (then it is launched without SSH).
#pragma once

#include <string>

namespace elasticrun::discovery {

// The host part of a name: "user@host" and "[addr]" by their bare host part.
std::string bare_name(const std::string& name);

// Where a host is, as this machine sees it: this machine itself, or a remote host that
// traffic to leaves from our address `toward`. Neither: the name does not resolve, or
// no route leads there.
struct HostPlace {
  bool local = false;
  std::string toward;
  bool found() const { return local || !toward.empty(); }
};

// Whether `name` is this machine (its host name, or every address it resolves to is a
// loopback one or one of our interfaces'), and if not our address that traffic to it
// leaves from (the kernel's routing picks it; nothing is sent), from one resolution of
// the name. It may block for as long as the resolver takes: see HostLookups.
HostPlace look_up_host(const std::string& name);

}  // namespace elasticrun::discovery
