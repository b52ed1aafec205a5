// elasticrun: start a data-parallel job and see it through.
#include "cmd/exit_codes.h"
#include "cmd/job.h"
#include "cmd/options.h"
#include "cmd/sweep/sweep.h"
#include "common/fd_limit.h"
#include "common/log.h"

#include <csignal>
#include <cstdio>
#include <fmt/format.h>
#include <string_view>

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  using namespace elasticrun;
  log::set_program("elasticrun");
  raise_open_file_limit();
  if (argc > 1 && std::string_view(argv[1]) == "sweep") return sweep::sweep_main(argc - 1, argv + 1);
  auto parsed = cmd::parse_options(argc, argv);
  if (!parsed) {
    fmt::print(stderr, "elasticrun: {}\nTry 'elasticrun --help' for more information.\n", parsed.error());
    return cmd::exit_code::kUsage;
  }
  if (!parsed->options) {
    fmt::print("{}", parsed->print);
    return 0;
  }
  if (!parsed->options->log_level.empty() && !log::configure(parsed->options->log_level)) {
    fmt::print(stderr, "elasticrun: bad --log-level '{}'\n", parsed->options->log_level);
    return cmd::exit_code::kUsage;
  }
  cmd::Job job(std::move(*parsed->options));
  return job.run();
}
