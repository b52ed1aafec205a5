// libFuzzer target: elasticrun's command line (cmd::parse_options).
//
// Input: the arguments after argv[0], separated by NUL bytes (at most 64 of them).
// parse_options may read a file (--hostfile), make a directory and write in it
// (--checkpoint-dir) and getenv (-x VAR, ELASTICRUN_SSH_*); inputs that mention "hostfile"
// or "checkpoint-dir" anywhere are skipped so the fuzzer never touches files. A command line is
// local input rather than a peer's, but a crash or an escaping exception on any of
// them is still a bug: errors must come back as Result failures.
//
// Properties: no exception escapes; an accepted command line has a command, valid hosts,
// sane counts; a refused one has a message.
#include "cmd/options.h"

#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

using namespace elasticrun;

namespace {

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "options_fuzz: property violated: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  if (in.find("hostfile") != std::string_view::npos || in.find("checkpoint-dir") != std::string_view::npos) return 0;
  std::vector<std::string> args{"elasticrun"};
  while (!in.empty()) {
    std::size_t nul = in.find('\0');
    args.emplace_back(in.substr(0, nul));
    if (nul == std::string_view::npos) break;
    in.remove_prefix(nul + 1);
    if (args.size() > 64) return 0;
  }
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);

  auto r = cmd::parse_options(static_cast<int>(args.size()), argv.data());
  if (!r) {
    if (r.error().empty()) violated("empty error");
    return 0;
  }
  if (!r->options) {
    if (r->print.empty()) violated("neither options nor text to print");
    return 0;
  }
  const cmd::Options& o = *r->options;
  if (o.command.empty()) violated("accepted without a command");
  if (o.slots_per_host < 1 || o.slots_per_host > discovery::kMaxSlotsPerHost) violated("slots-per-host out of range");
  for (const auto& h : o.hosts) {
    if (!discovery::valid_host_name(h.name)) violated("invalid host accepted");
    // Without -H the job runs on "localhost" with -np slots, which kMaxSlotsPerHost does
    // not bound (it bounds what hosts offer, not -np).
    bool implicit_local = o.hosts.size() == 1 && h.name == "localhost" && h.slots == o.np;
    if (h.slots < 1 || (h.slots > discovery::kMaxSlotsPerHost && !implicit_local)) violated("host slots out of range");
  }
  if (o.np < 0 || o.min_np < 0 || o.max_np < 0 || o.reset_limit < 0) violated("negative count");
  if (o.max_restarts && (*o.max_restarts < 0 || o.reset_limit != 0)) violated("bad max-restarts");
  for (char c : o.run_id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && !std::strchr("._:-", c)) violated("bad run id");
  if (o.elastic && o.min_np < 1) violated("elastic without min-np");
  if (o.discovered() && (!o.elastic || !o.hosts.empty())) violated("discovered hosts outside elastic mode or beside -H");
  if (o.discovery_fd >= 0 && (o.discovery_fd <= 2 || o.discovery_fd == o.report_fd)) violated("bad host feed descriptor");
  if (o.elastic && o.max_np > 0 && o.max_np < o.min_np) violated("max-np below min-np");
  if (o.start_timeout.count() <= 0) violated("non-positive start timeout");
  if (o.ssh.port != 0 && (o.ssh.port < 1 || o.ssh.port > 65535)) violated("ssh port out of range");
  if (o.ssh.connect_timeout.count() <= 0) violated("non-positive ssh connect timeout");
  if (o.host_timeout < std::chrono::seconds(1) || o.host_timeout > std::chrono::hours(24))
    violated("host timeout out of range");
  if (o.worker_timeout.count() != 0 &&
      (o.worker_timeout < std::chrono::seconds(1) || o.worker_timeout > std::chrono::hours(24)))
    violated("worker timeout out of range");
  for (const auto& e : o.env)
    if (e.empty() || e[0] == '=' || e.find('=') == std::string::npos) violated("bad env entry");
  return 0;
}
