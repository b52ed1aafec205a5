// libFuzzer target: the metrics text of a worker's report (rendezvous::parse_metrics),
// which the server checks before the driver sees it.
//
// Properties checked (any violation aborts):
//  - parse_metrics returns or fails with a non-empty message; nothing escapes;
//  - what it accepts is a JSON object of finite numbers with non-empty names of at
//    most kMaxMetricName bytes, from a text within the limit;
//  - accepting is stable: the accepted object, dumped, is accepted again as the same object.
#include "rendezvous/metrics.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

using namespace elasticrun;

namespace {

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "metrics_fuzz: property violated: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = rendezvous::parse_metrics(text);
  if (!r) {
    if (r.error().empty()) violated("empty error message");
    return 0;
  }
  if (text.size() > rendezvous::kMaxMetricsText) violated("accepted a text over the limit");
  if (!r->is_object()) violated("accepted something other than an object");
  for (const auto& [name, value] : r->items()) {
    if (name.empty() || name.size() > rendezvous::kMaxMetricName) violated("accepted a bad name");
    if (!value.is_number() || !std::isfinite(value.get<double>())) violated("accepted a value that is not a finite number");
  }
  std::string again = r->dump();
  auto r2 = rendezvous::parse_metrics(again, again.size());
  if (!r2 || *r2 != *r) violated("the accepted object, dumped, does not read back the same");
  return 0;
}
