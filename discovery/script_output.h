// Parsing a discovery script's stdout into hosts.
//
// The format is the hostfile's (see hosts.h: "host", "host:N", "host slots=N", '#'
// comments, blank lines, CRLF), with three differences that suit a program's output:
// a host listed more than once gets the SUM of its slots (one line per pod or per GPU
// is a natural way to print; Open MPI hostfiles count repeats the same way), zero hosts
// is a valid answer, and bytes that are not text or overlong lines are rejected with
// a message that never echoes the garbage itself.
#pragma once

#include "common/result.h"
#include "discovery/hosts.h"

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace elasticrun::discovery {

// Longest meaningful part of a line (comments excluded); a host name is at most 255.
inline constexpr std::size_t kMaxDiscoveryLine = 1024;

struct ScriptHosts {
  std::vector<Host> hosts;          // in order of first appearance
  std::vector<std::string> merged;  // names that appeared more than once
};

// Errors read "line 4: slots 'x' is not a number".
Result<ScriptHosts> parse_script_output(std::string_view text, int default_slots);

// "1 MiB", "512 KiB", "100 bytes": for limits in messages.
std::string human_size(std::size_t bytes);

}  // namespace elasticrun::discovery
