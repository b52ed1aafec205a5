// The metrics of a worker's report (msg::Report): untrusted text that must be a JSON
// object whose values are finite numbers, e.g. {"loss":0.25,"accuracy":0.91}. Pure: no
// I/O, so that the server, its tests and a fuzzer share one check.
#pragma once

#include "common/result.h"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string_view>

namespace elasticrun::rendezvous {

// The accepted size of the text, and of each metric's name.
inline constexpr std::size_t kMaxMetricsText = 64 * 1024;
inline constexpr std::size_t kMaxMetricName = 256;

// The parsed object, or what is wrong with the text (a message naming the first
// offending metric where there is one). `max_text` bounds the text's length.
Result<nlohmann::json> parse_metrics(std::string_view text, std::size_t max_text = kMaxMetricsText);

}  // namespace elasticrun::rendezvous
