// libFuzzer target: text a discovery script prints, a hostfile, a -H host list.
//
// Input layout:  byte 0  default slots: bit 7 set = kMaxSlotsPerHost, else (bits 0..2) + 1
//                rest    the text, given to all three parsers
//
// Properties checked (any violation aborts, reported by libFuzzer as a crash):
//  - every accepted host has a valid name and 1..kMaxSlotsPerHost slots;
//  - hostfiles and -H lists never accept a name twice; script output merges repeats,
//    and `merged` is sorted, unique, and names only hosts in the answer;
//  - on clean text (printable ASCII, tabs, '\n'; no line over kMaxDiscoveryLine) with no
//    repeated host, the script parser and the hostfile parser agree exactly;
//  - error messages are never empty.
#include "discovery/hosts.h"
#include "discovery/script_output.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

using namespace elasticrun;
using namespace elasticrun::discovery;

namespace {

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "discovery_fuzz: property violated: %s\n", what);
  std::abort();
}

void check_hosts(const std::vector<Host>& hosts) {
  std::set<std::string> names;
  for (const Host& h : hosts) {
    if (!valid_host_name(h.name)) violated("accepted an invalid host name");
    if (h.slots < 1 || h.slots > kMaxSlotsPerHost) violated("slots out of range");
    if (!names.insert(h.name).second) violated("a host appears twice in the answer");
  }
}

// Text the script parser takes as it is: no CR (it strips only a trailing one), only
// printable ASCII and tabs, every line short enough.
bool clean_text(std::string_view text) {
  std::size_t line = 0;
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      line = 0;
      continue;
    }
    if (!(c == '\t' || (u >= 0x20 && u < 0x7f))) return false;
    if (++line > kMaxDiscoveryLine) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const int default_slots = (data[0] & 0x80) ? kMaxSlotsPerHost : (data[0] & 7) + 1;
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  auto list = parse_host_list(text, default_slots);
  if (list) {
    if (list->empty()) violated("-H list accepted with no hosts");
    check_hosts(*list);
  } else if (list.error().empty()) {
    violated("empty -H error");
  }

  auto file = parse_hostfile(text, default_slots);
  if (file) check_hosts(*file);
  else if (file.error().empty()) violated("empty hostfile error");

  auto script = parse_script_output(text, default_slots);
  if (script) {
    check_hosts(script->hosts);
    const auto& m = script->merged;
    if (!std::is_sorted(m.begin(), m.end())) violated("merged not sorted");
    if (std::adjacent_find(m.begin(), m.end()) != m.end()) violated("merged not unique");
    for (const auto& name : m)
      if (std::none_of(script->hosts.begin(), script->hosts.end(), [&](const Host& h) { return h.name == name; }))
        violated("merged names a host not in the answer");
  } else if (script.error().empty() || script.error().rfind("line ", 0) != 0) {
    violated("script error without a line number");
  }

  if (clean_text(text)) {
    if (file && !script) violated("hostfile accepted clean text the script parser refused");
    if (file && script && (script->hosts != *file || !script->merged.empty()))
      violated("hostfile and script parsers disagree");
    if (script && script->merged.empty() && !file)
      violated("script parser accepted clean text without repeats that the hostfile parser refused");
  }

  (void)human_size(size * (data[0] | 1u));
  return 0;
}
