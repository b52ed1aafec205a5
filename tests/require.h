// Skips that CI can forbid, for the GoogleTest suites (the integration tests read the same
// variable: tests/integration/conftest.py).
//
// A test that cannot run here for want of something skips with the reason:
//   ER_SKIP_UNLESS_REQUIRED("gpu", "no CUDA device: ...");
// With ELASTICRUN_TEST_REQUIRE naming that thing (comma-separated, e.g. netns,gpu) the test
// fails with the same reason instead, so a machine meant to run it cannot pass without.
// The names: netns (network namespaces), gpu (a CUDA device and the NCCL backend),
// multigpu (as many CUDA devices as any test wants). A name outside that list fails the
// test too: a typo would otherwise require nothing.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace elasticrun::testing {

// Why `reason` must fail instead of skipping (ELASTICRUN_TEST_REQUIRE names `what`, or
// something unknown); nothing when it may skip.
inline std::optional<std::string> required_failure(std::string_view what, const std::string& reason) {
  const char* env = std::getenv("ELASTICRUN_TEST_REQUIRE");
  std::string_view list = env ? env : "";
  bool named = false;
  while (!list.empty()) {
    std::size_t comma = list.find(',');
    std::string_view word = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    while (!word.empty() && word.front() == ' ') word.remove_prefix(1);
    while (!word.empty() && word.back() == ' ') word.remove_suffix(1);
    if (word.empty()) continue;
    if (word != "netns" && word != "gpu" && word != "multigpu")
      return "ELASTICRUN_TEST_REQUIRE: unknown requirement '" + std::string(word) +
             "' (known: netns, gpu, multigpu); this test would have skipped: " + reason;
    named = named || word == what;
  }
  if (!named) return std::nullopt;
  return reason + " (ELASTICRUN_TEST_REQUIRE=" + env + " requires " + std::string(what) + ", so this does not skip)";
}

}  // namespace elasticrun::testing

// Skips the test with `reason` (a std::string or string literal), or fails it with that
// reason when ELASTICRUN_TEST_REQUIRE names `what`. Returns from the test body either way.
#define ER_SKIP_UNLESS_REQUIRED(what, reason)                                                       \
  do {                                                                                              \
    const std::string er_reason_ = (reason);                                                        \
    if (auto er_failure_ = ::elasticrun::testing::required_failure((what), er_reason_)) {           \
      GTEST_FAIL() << *er_failure_;                                                                 \
    } else {                                                                                        \
      GTEST_SKIP() << er_reason_;                                                                   \
    }                                                                                               \
  } while (0)
