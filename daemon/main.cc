// elasticrund: the per-host supervisor of training processes.
//
//   elasticrund --stdio      control channel on stdin/stdout (started by elasticrun,
//                            locally or over SSH); exits when the channel closes.
#include "common/log.h"
#include "common/shm_dirs.h"
#include "daemon/supervisor.h"

#include <boost/asio.hpp>
#include <boost/program_options.hpp>

#include <csignal>
#include <cstdio>
#include <iostream>

namespace po = boost::program_options;

namespace {

constexpr const char* kUsage = "usage: elasticrund --stdio [--log-level LEVEL]\n";

int run_stdio() {
  // Reclaim what daemons that died before us left behind (Mesos's recover()).
  elasticrun::shm_dirs::remove_stale();
  boost::asio::io_context io;
  int exit_code = 0;
  // stdout is the control channel: nothing else may write there.
  int out = ::dup(STDOUT_FILENO);
  ::dup2(STDERR_FILENO, STDOUT_FILENO);
  elasticrun::daemon::Supervisor sup(io, ::dup(STDIN_FILENO), out, [&](int code) {
    exit_code = code;
    io.stop();
  });
  boost::asio::signal_set signals(io, SIGINT, SIGTERM, SIGHUP);
  signals.async_wait([&](boost::system::error_code ec, int sig) {
    if (ec) return;
    ER_LOG(daemon, info, "received signal {}; stopping all workers", sig);
    sup.stop(std::chrono::milliseconds(2000), 128 + sig);
  });
  sup.start();
  io.run();
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  elasticrun::log::set_program("elasticrund");
  po::options_description desc("elasticrund options");
  desc.add_options()
      ("help,h", "print this help and exit")
      ("version", "print the version and exit")
      ("stdio", "serve one job on stdin/stdout (how elasticrun starts the daemon)")
      ("log-level", po::value<std::string>(), "error|warn|info|debug, or per component: info,daemon=debug");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv)
                  .options(desc)
                  .style(po::command_line_style::unix_style ^ po::command_line_style::allow_guessing)
                  .run(),
              vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "elasticrund: " << e.what() << "\n" << kUsage;
    return 2;
  }
  if (vm.count("help")) {
    std::cout << kUsage << desc;
    return 0;
  }
  if (vm.count("version")) {
    std::cout << "elasticrund " << ELASTICRUN_VERSION << "\n";
    return 0;
  }
  if (vm.count("log-level") && !elasticrun::log::configure(vm["log-level"].as<std::string>())) {
    std::cerr << "elasticrund: bad --log-level '" << vm["log-level"].as<std::string>() << "'\n";
    return 2;
  }
  if (!vm.count("stdio")) {
    std::cerr << "elasticrund: choose a mode (--stdio)\n" << kUsage;
    return 2;
  }
  return run_stdio();
}
