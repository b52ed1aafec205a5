#include "discovery/hosts.h"

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

namespace elasticrun::discovery {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

Result<int> parse_slots(std::string_view s) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size())
    return fail(fmt::format("slots '{}' is not a number", s));
  if (v < 1 || v > kMaxSlotsPerHost)
    return fail(fmt::format("slots {} out of range 1..{}", v, kMaxSlotsPerHost));
  return v;
}

// An IPv6 address without brackets: "2001:db8::10:4" is an address with 4 slots or an
// address alone, nobody can tell, so it is refused with both bracketed spellings.
Result<void> check_unbracketed(std::string_view e) {
  std::string_view host = e.substr(e.find('@') == std::string_view::npos ? 0 : e.find('@') + 1);
  if (host.empty() || host.front() == '[' || host.find(':') == host.rfind(':')) return {};
  std::size_t last = host.rfind(':');
  std::string_view user = e.substr(0, e.size() - host.size()), address = host.substr(0, last);
  if (address.back() == ':')  // "fe80::1": no address before the last colon, no slots after it
    return fail(fmt::format("'{}': an IPv6 address goes in brackets: '{}[{}]'", e, user, host));
  return fail(fmt::format("'{}' is ambiguous: an IPv6 address goes in brackets, '{}[{}]:{}' for {} slots or "
                          "'{}[{}]'",
                          e, user, address, host.substr(last + 1), host.substr(last + 1), user, host));
}

// "host" or "host:N"; a bracketed IPv6 address may carry ":N" after the bracket.
Result<Host> parse_entry(std::string_view e, int default_slots) {
  if (auto ok = check_unbracketed(e); !ok) return Failure{ok.error()};
  Host h{std::string(e), default_slots};
  std::size_t colon = e.rfind(':');
  bool bracketed = !e.empty() && e.front() == '[';
  if (colon != std::string_view::npos && (!bracketed || colon > e.find(']'))) {
    auto slots = parse_slots(e.substr(colon + 1));
    if (!slots) return Failure{slots.error()};
    h.name = std::string(e.substr(0, colon));
    h.slots = *slots;
  }
  if (!valid_host_name(h.name)) return fail(fmt::format("'{}' is not a valid host name", h.name));
  return h;
}

Result<void> add_unique(std::vector<Host>& hosts, std::set<std::string>& seen, Host h) {
  if (!seen.insert(h.name).second) return fail(fmt::format("host '{}' is listed twice", h.name));
  hosts.push_back(std::move(h));
  return {};
}

}  // namespace

std::string_view next_line(std::string_view& text) {
  std::size_t nl = text.find('\n');
  std::string_view line = text.substr(0, nl);
  text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
  return line;
}

bool valid_host_name(std::string_view name) {
  if (name.empty() || name.size() > 255) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == '_' || c == ':' || c == '[' || c == ']' || c == '@';
    if (!ok) return false;
  }
  return name.front() != '-';
}

Result<std::vector<Host>> parse_host_list(std::string_view list, int default_slots) {
  std::vector<Host> hosts;
  std::set<std::string> seen;
  while (true) {
    std::size_t comma = list.find(',');
    std::string_view item = trim(list.substr(0, comma));
    if (item.empty()) return fail("empty host entry");
    auto h = parse_entry(item, default_slots);
    if (!h) return Failure{h.error()};
    if (auto ok = add_unique(hosts, seen, std::move(*h)); !ok) return Failure{ok.error()};
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return hosts;
}

Result<std::vector<Host>> parse_hostfile(std::string_view text, int default_slots) {
  std::vector<Host> hosts;
  std::set<std::string> seen;
  int lineno = 0;
  while (!text.empty()) {
    std::string_view line = next_line(text);
    ++lineno;
    if (auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;
    std::string_view name = line, rest;
    if (auto sp = line.find_first_of(" \t"); sp != std::string_view::npos) {
      name = line.substr(0, sp);
      rest = trim(line.substr(sp));
    }
    Result<Host> h = parse_entry(name, default_slots);
    if (h && !rest.empty()) {
      if (rest.substr(0, 6) != "slots=") {
        h = fail(fmt::format("unexpected '{}' (want 'slots=N')", rest));
      } else if (auto s = parse_slots(rest.substr(6)); s) {
        h->slots = *s;
      } else {
        h = Failure{s.error()};
      }
    }
    if (!h) return fail(fmt::format("line {}: {}", lineno, h.error()));
    if (auto ok = add_unique(hosts, seen, std::move(*h)); !ok)
      return fail(fmt::format("line {}: {}", lineno, ok.error()));
  }
  return hosts;
}

Result<std::vector<Host>> read_hostfile(const std::string& path, int default_slots) {
  std::ifstream in(path);
  if (!in) return fail(fmt::format("cannot read hostfile '{}': {}", path, std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  auto hosts = parse_hostfile(ss.str(), default_slots);
  if (!hosts) return fail(fmt::format("hostfile '{}': {}", path, hosts.error()));
  if (hosts->empty()) return fail(fmt::format("hostfile '{}' lists no hosts", path));
  return hosts;
}

}  // namespace elasticrun::discovery
