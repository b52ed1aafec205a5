#include "rendezvous/metrics.h"

#include <fmt/format.h>

#include <cmath>

namespace elasticrun::rendezvous {

Result<nlohmann::json> parse_metrics(std::string_view text, std::size_t max_text) {
  using nlohmann::json;
  if (text.size() > max_text) return fail(fmt::format("metrics of {} bytes (at most {})", text.size(), max_text));
  // Nothing nested is kept: the callback drops any value below the top level as soon as
  // it is parsed, so a deep or wide nesting costs no memory, and the flag says it was there.
  bool nested = false;
  json::parser_callback_t flat = [&nested](int depth, json::parse_event_t event, json&) {
    if (depth > 1 || (depth == 1 && (event == json::parse_event_t::object_start ||
                                     event == json::parse_event_t::array_start))) {
      nested = true;
      return false;
    }
    return true;
  };
  json j = json::parse(text.begin(), text.end(), flat, /*allow_exceptions=*/false);
  if (j.is_discarded()) return fail(nested ? "metrics must be a flat JSON object of numbers" : "metrics are not valid JSON");
  if (!j.is_object()) return fail(fmt::format("metrics must be a JSON object, not {}", j.type_name()));
  if (nested) return fail("metrics must be a flat JSON object of numbers");
  for (const auto& [name, value] : j.items()) {
    std::string shown = name.substr(0, 64);
    if (name.empty()) return fail("a metric has an empty name");
    if (name.size() > kMaxMetricName) return fail(fmt::format("metric name '{}...' is over {} bytes", shown, kMaxMetricName));
    if (!value.is_number()) return fail(fmt::format("metric '{}' is {}, not a number", shown, value.type_name()));
    if (!std::isfinite(value.get<double>())) return fail(fmt::format("metric '{}' is not finite", shown));
  }
  return j;
}

}  // namespace elasticrun::rendezvous
