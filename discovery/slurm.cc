#include "discovery/slurm.h"

#include <fmt/format.h>

#include <charconv>
#include <set>

namespace elasticrun::discovery {
namespace {

// The entries of a comma-separated list whose commas inside brackets do not separate.
Result<std::vector<std::string_view>> split_top(std::string_view list) {
  std::vector<std::string_view> out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    char c = i < list.size() ? list[i] : ',';
    if (c == '[' && ++depth > 1) return fail(fmt::format("nested '[' at offset {}", i));
    if (c == ']' && --depth < 0) return fail(fmt::format("']' without '[' at offset {}", i));
    if (c == ',' && depth == 0) {
      if (i == start) return fail(fmt::format("empty entry at offset {}", i));
      out.push_back(list.substr(start, i - start));
      start = i + 1;
    }
  }
  if (depth != 0) return fail("'[' without ']'");
  return out;
}

Result<long long> number(std::string_view s, std::string_view what) {
  long long v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < 0 || v > 999999999)
    return fail(fmt::format("{} '{}' is not a number 0..999999999", what, s));
  return v;
}

// "01-03,7" -> 01 02 03 7.
Result<std::vector<std::string>> expand_group(std::string_view group, std::size_t limit) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= group.size(); ++i) {
    if (i < group.size() && group[i] != ',') continue;
    std::string_view item = group.substr(start, i - start);
    start = i + 1;
    std::size_t dash = item.find('-');
    std::string_view lo_text = item.substr(0, dash);
    auto lo = number(lo_text, "range bound");
    if (!lo) return Failure{lo.error()};
    long long hi = *lo;
    if (dash != std::string_view::npos) {
      auto h = number(item.substr(dash + 1), "range bound");
      if (!h) return Failure{h.error()};
      hi = *h;
      if (hi < *lo) return fail(fmt::format("range '{}' goes down", item));
    }
    if (static_cast<std::size_t>(hi - *lo) + out.size() >= limit)
      return fail(fmt::format("more than {} hosts", kMaxSlurmNodes));
    for (long long v = *lo; v <= hi; ++v) out.push_back(fmt::format("{:0{}}", v, lo_text.size()));
  }
  return out;
}

}  // namespace

Result<std::vector<std::string>> expand_hostlist(std::string_view list) {
  auto entries = split_top(list);
  if (!entries) return fail("hostlist '" + std::string(list) + "': " + entries.error());
  std::vector<std::string> hosts;
  for (std::string_view entry : *entries) {
    // The names so far, each followed by the next literal or expanded group.
    std::vector<std::string> names{""};
    std::size_t at = 0;
    while (at < entry.size()) {
      std::size_t open = entry.find('[', at);
      std::string_view literal = entry.substr(at, open - at);
      for (auto& n : names) n += literal;
      if (open == std::string_view::npos) break;
      std::size_t close = entry.find(']', open);
      auto group = expand_group(entry.substr(open + 1, close - open - 1), kMaxSlurmNodes - hosts.size());
      if (!group) return fail(fmt::format("hostlist '{}': {}", list, group.error()));
      if (names.size() * group->size() + hosts.size() > kMaxSlurmNodes)
        return fail(fmt::format("hostlist '{}': more than {} hosts", list, kMaxSlurmNodes));
      std::vector<std::string> next;
      next.reserve(names.size() * group->size());
      for (const auto& n : names)
        for (const auto& g : *group) next.push_back(n + g);
      names = std::move(next);
      at = close + 1;
    }
    for (auto& n : names) {
      if (!valid_host_name(n)) return fail(fmt::format("hostlist '{}': '{}' is not a host name", list, n));
      hosts.push_back(std::move(n));
    }
  }
  return hosts;
}

Result<std::vector<int>> expand_tasks_per_node(std::string_view list) {
  auto entries = split_top(list);
  if (!entries) return fail("'" + std::string(list) + "': " + entries.error());
  std::vector<int> out;
  for (std::string_view entry : *entries) {
    std::size_t paren = entry.find('(');
    auto tasks = number(entry.substr(0, paren), "task count");
    if (!tasks) return fail(fmt::format("'{}': {}", list, tasks.error()));
    if (*tasks < 1 || *tasks > kMaxSlotsPerHost)
      return fail(fmt::format("'{}': {} tasks on a node, out of range 1..{}", list, *tasks, kMaxSlotsPerHost));
    long long repeat = 1;
    if (paren != std::string_view::npos) {
      std::string_view rest = entry.substr(paren);
      if (rest.size() < 4 || rest.substr(0, 2) != "(x" || rest.back() != ')')
        return fail(fmt::format("'{}': '{}' is not N(xM)", list, entry));
      auto r = number(rest.substr(2, rest.size() - 3), "repeat count");
      if (!r || *r < 1) return fail(fmt::format("'{}': '{}' is not N(xM) with M at least 1", list, entry));
      repeat = *r;
    }
    if (out.size() + static_cast<std::size_t>(repeat) > kMaxSlurmNodes)
      return fail(fmt::format("'{}': more than {} nodes", list, kMaxSlurmNodes));
    out.insert(out.end(), static_cast<std::size_t>(repeat), static_cast<int>(*tasks));
  }
  return out;
}

Result<std::optional<std::vector<Host>>> slurm_allocation(const GetEnv& getenv, int default_slots) {
  const char* nodelist = getenv("SLURM_JOB_NODELIST");
  if (!nodelist || !*nodelist) nodelist = getenv("SLURM_NODELIST");
  if (!nodelist || !*nodelist) return std::optional<std::vector<Host>>{};
  auto names = expand_hostlist(nodelist);
  if (!names) return fail("SLURM_JOB_NODELIST: " + names.error());
  std::vector<int> slots(names->size(), default_slots);
  if (const char* tpn = getenv("SLURM_TASKS_PER_NODE"); tpn && *tpn) {
    auto t = expand_tasks_per_node(tpn);
    if (!t) return fail("SLURM_TASKS_PER_NODE: " + t.error());
    if (t->size() != names->size())
      return fail(fmt::format("SLURM_TASKS_PER_NODE '{}' counts {} nodes, SLURM_JOB_NODELIST {}", tpn, t->size(),
                              names->size()));
    slots = std::move(*t);
  } else if (const char* ntpn = getenv("SLURM_NTASKS_PER_NODE"); ntpn && *ntpn) {
    auto t = number(ntpn, "SLURM_NTASKS_PER_NODE");
    if (!t || *t < 1 || *t > kMaxSlotsPerHost)
      return fail(fmt::format("SLURM_NTASKS_PER_NODE '{}' is not a task count 1..{}", ntpn, kMaxSlotsPerHost));
    slots.assign(names->size(), static_cast<int>(*t));
  }
  std::vector<Host> hosts;
  std::set<std::string_view> seen;
  for (const auto& n : *names)
    if (!seen.insert(n).second) return fail(fmt::format("SLURM_JOB_NODELIST: '{}' is listed twice", n));
  for (std::size_t i = 0; i < names->size(); ++i) hosts.push_back({(*names)[i], slots[i]});
  return std::optional<std::vector<Host>>(std::move(hosts));
}

}  // namespace elasticrun::discovery
