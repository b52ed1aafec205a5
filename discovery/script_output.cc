#include "discovery/script_output.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace elasticrun::discovery {
namespace {

// The first byte that cannot appear in a host line, as "byte 0x00 at column 3"; empty
// when the text is clean. Tabs are separators; everything else must be printable ASCII.
std::string first_bad_byte(std::string_view s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c == '\t' || (c >= 0x20 && c < 0x7f)) continue;
    return fmt::format("byte 0x{:02x} at column {}", c, i + 1);
  }
  return {};
}

// One line through the hostfile parser, so that both stay one format. Its errors say
// "line 1: ..." about the single line it saw; the caller puts the real number back.
Result<std::vector<Host>> parse_one_line(std::string_view line, int default_slots) {
  auto r = parse_hostfile(line, default_slots);
  if (r) return r;
  std::string msg = r.error();
  constexpr std::string_view prefix = "line 1: ";
  if (std::string_view(msg).substr(0, prefix.size()) == prefix) msg.erase(0, prefix.size());
  return fail(msg);
}

// Checks and parses one line; an empty vector for blank and comment-only lines.
Result<std::vector<Host>> parse_line(std::string_view line, int default_slots) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // CRLF
  // Anything may follow '#' (UTF-8 prose, say): it is dropped unread.
  if (auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
  if (line.size() > kMaxDiscoveryLine)
    return fail(fmt::format("longer than {} characters ({} characters)", kMaxDiscoveryLine, line.size()));
  if (auto bad = first_bad_byte(line); !bad.empty())
    return fail(fmt::format("not text: {}", bad));
  return parse_one_line(line, default_slots);
}

}  // namespace

Result<ScriptHosts> parse_script_output(std::string_view text, int default_slots) {
  ScriptHosts out;
  std::map<std::string, std::size_t, std::less<>> index;  // name -> position in out.hosts
  int lineno = 0;
  while (!text.empty()) {
    std::string_view line = next_line(text);
    ++lineno;
    auto parsed = parse_line(line, default_slots);
    if (!parsed) return fail(fmt::format("line {}: {}", lineno, parsed.error()));
    for (Host& h : *parsed) {
      auto it = index.find(h.name);
      if (it == index.end()) {
        index.emplace(h.name, out.hosts.size());
        out.hosts.push_back(std::move(h));
        continue;
      }
      // A repeated host offers more slots on the same machine: add them up.
      Host& first = out.hosts[it->second];
      if (first.slots > kMaxSlotsPerHost - h.slots)
        return fail(fmt::format("line {}: host '{}' totals {} slots, more than {}", lineno, h.name,
                                first.slots + h.slots, kMaxSlotsPerHost));
      first.slots += h.slots;
      if (out.merged.empty() || out.merged.back() != h.name) out.merged.push_back(h.name);
    }
  }
  // A name repeated three times, not consecutively, may sit twice in `merged`.
  std::sort(out.merged.begin(), out.merged.end());
  out.merged.erase(std::unique(out.merged.begin(), out.merged.end()), out.merged.end());
  return out;
}

std::string human_size(std::size_t bytes) {
  constexpr std::size_t kib = 1024, mib = kib * 1024;
  if (bytes >= mib && bytes % mib == 0) return fmt::format("{} MiB", bytes / mib);
  if (bytes >= kib && bytes % kib == 0) return fmt::format("{} KiB", bytes / kib);
  return fmt::format("{} bytes", bytes);
}

}  // namespace elasticrun::discovery
