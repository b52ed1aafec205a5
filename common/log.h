// Logging with per-component levels, checked before anything is formatted.
//
//   ER_LOG(kRendezvous, info, "epoch {} started with {} workers", e, n);
//
// Lines go to stderr as "elasticrun[component] level: message". Levels come from
// ELASTICRUN_LOG_LEVEL ("warn", or "info,rendezvous=debug").
#pragma once

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <string_view>

namespace elasticrun::log {

enum class Level : int { error = 0, warn, info, debug };
enum class Component : int { driver = 0, rendezvous, discovery, daemon, collective, count };

struct Levels {
  std::array<std::atomic<int>, static_cast<int>(Component::count)> level;
};
// The one piece of process-wide state: logging configuration.
Levels& levels();
// Parses a spec like "info,rendezvous=debug"; returns false on a bad spec.
bool configure(std::string_view spec);
void set_program(std::string_view name);
void write(Component c, Level l, std::string_view message);

inline bool enabled(Component c, Level l) {
  return static_cast<int>(l) <=
         levels().level[static_cast<int>(c)].load(std::memory_order_relaxed);
}

}  // namespace elasticrun::log

#define ER_LOG(component, lvl, ...)                                                       \
  do {                                                                                    \
    if (::elasticrun::log::enabled(::elasticrun::log::Component::component,               \
                                   ::elasticrun::log::Level::lvl))                        \
      ::elasticrun::log::write(::elasticrun::log::Component::component,                   \
                               ::elasticrun::log::Level::lvl, fmt::format(__VA_ARGS__)); \
  } while (0)
