// elasticrun's exit status, for scripts (documented in elasticrun(1), EXIT STATUS).
#pragma once

namespace elasticrun::cmd::exit_code {

inline constexpr int kOk = 0;
inline constexpr int kWorkerFailed = 1;  // a worker exited non-zero or was killed
inline constexpr int kUsage = 2;         // bad flags or host lists
inline constexpr int kLaunchFailed = 3;  // command or daemon could not start
inline constexpr int kTimeout = 4;       // workers did not start/join in time
// Interrupted by signal N: 128 + N (130 for SIGINT, 143 for SIGTERM).

}  // namespace elasticrun::cmd::exit_code
