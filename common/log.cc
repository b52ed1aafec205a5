#include "common/log.h"

#include "common/env.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace elasticrun::log {
namespace {

constexpr std::array<std::string_view, static_cast<int>(Component::count)> kComponents = {
    "driver", "rendezvous", "discovery", "daemon", "collective"};
constexpr std::array<std::string_view, 4> kLevels = {"error", "warn", "info", "debug"};

int parse_level(std::string_view s) {
  for (std::size_t i = 0; i < kLevels.size(); ++i)
    if (s == kLevels[i]) return static_cast<int>(i);
  return -1;
}

bool configure_into(Levels& ls, std::string_view spec);

struct State {
  Levels levels;
  std::mutex mu;
  std::string program = "elasticrun";
  State() {
    for (auto& l : levels.level) l.store(static_cast<int>(Level::warn));
    if (const char* spec = std::getenv(env::kLogLevel)) configure_into(levels, spec);
  }
};

State& state() {
  static State s;
  return s;
}

}  // namespace

Levels& levels() { return state().levels; }

bool configure(std::string_view spec) { return configure_into(levels(), spec); }

namespace {
bool configure_into(Levels& ls, std::string_view spec) {
  while (!spec.empty()) {
    auto comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    auto eq = item.find('=');
    if (eq == std::string_view::npos) {
      int l = parse_level(item);
      if (l < 0) return false;
      for (auto& a : ls.level) a.store(l);
      continue;
    }
    int l = parse_level(item.substr(eq + 1));
    std::string_view name = item.substr(0, eq);
    bool found = false;
    for (std::size_t i = 0; i < kComponents.size(); ++i)
      if (kComponents[i] == name) {
        ls.level[i].store(l);
        found = true;
      }
    if (l < 0 || !found) return false;
  }
  return true;
}
}  // namespace

void set_program(std::string_view name) {
  std::lock_guard lock(state().mu);
  state().program = std::string(name);
}

void write(Component c, Level l, std::string_view message) {
  State& s = state();
  std::string line = fmt::format("{}[{}] {}: {}\n", s.program, kComponents[static_cast<int>(c)],
                                 kLevels[static_cast<int>(l)], message);
  std::lock_guard lock(s.mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace elasticrun::log
