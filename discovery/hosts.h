// Host lists: parsing `-H`, hostfiles and discovery-script output into (host, slots).
//
// All of it is untrusted text from the user: every problem is a Result error that
// names the line (or the entry) and what is wrong with it.
#pragma once

#include "common/result.h"

#include <string>
#include <string_view>
#include <vector>

namespace elasticrun::discovery {

struct Host {
  std::string name;
  int slots = 1;
  bool operator==(const Host&) const = default;
};

inline constexpr int kMaxSlotsPerHost = 4096;

// "a:4,b:2,c" (slots default to `default_slots`).
Result<std::vector<Host>> parse_host_list(std::string_view list, int default_slots);
// Lines "host", "host slots=N", "host:N"; '#' comments and blank lines ignored.
Result<std::vector<Host>> parse_hostfile(std::string_view text, int default_slots);
Result<std::vector<Host>> read_hostfile(const std::string& path, int default_slots);
// Takes the next line (without its '\n') off the front of `text`.
std::string_view next_line(std::string_view& text);
// A host name as the driver will use it: letters, digits, '.', '-', '_', ':' (IPv6 in []).
bool valid_host_name(std::string_view name);

}  // namespace elasticrun::discovery
