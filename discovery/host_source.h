// Host sources: where the current host list comes from (static -H / --hostfile, or the
// user's discovery script), and the watcher that polls a source and reports changes.
//
// Everything here runs on one io_context thread; callbacks run on it too. A source
// produces one answer per poll; the watcher owns the schedule and the "last good set".
#pragma once

#include "common/result.h"
#include "discovery/hosts.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace elasticrun::discovery {

// One poll of the host list. Implementations: static (-H / --hostfile), script, feed.
class HostSource {
 public:
  using Done = std::function<void(Result<std::vector<Host>>)>;
  virtual ~HostSource() = default;
  // Produces the current host list asynchronously; `done` runs on the io_context thread,
  // never inside poll() itself. An error names its cause ("discovery script exited with
  // code 3: <stderr tail>", "discovery script timed out after 5.0 s", "discovery script
  // output, line 4: slots 'x' is not a number", "discovery script output exceeds 1 MiB").
  // One poll at a time: polling while one runs answers an error.
  virtual void poll(Done done) = 0;
  // Kills a running poll (its whole process group) and drops its callback.
  virtual void cancel() = 0;
};

std::unique_ptr<HostSource> make_static_source(boost::asio::io_context& io, std::vector<Host> hosts);

struct ScriptOptions {
  std::string path;                          // run as-is (no shell), argv[0] = path
  std::chrono::milliseconds timeout{10000};  // --discovery-timeout
  int default_slots = 1;                     // --slots-per-host, for "host" lines
  std::size_t max_output = 1 << 20;          // stdout cap; beyond it: error, script killed
  std::vector<std::string> args;             // after argv[0]
  std::string what = "discovery script";     // how messages name it
  bool hosts_output = true;                  // false: stdout is not read as hosts (answer: none)
};
std::unique_ptr<HostSource> make_script_source(boost::asio::io_context& io, ScriptOptions options);

struct FeedOptions {
  int default_slots = 1;              // --slots-per-host, for "host" lines
  std::size_t max_line = 64 << 10;    // a longer line ends the feed
  std::size_t max_block = 1 << 20;    // a longer list is answered as an error
};
// Host lists pushed by whoever started us on descriptor `fd` (--host-discovery-fd):
// blocks of discovery-script lines, each ended by an empty line (feed_source.cc). Takes
// the descriptor over. Poll it with a zero interval: a poll waits for the next list.
std::unique_ptr<HostSource> make_feed_source(boost::asio::io_context& io, int fd, FeedOptions options);

// Polls a source every `interval` (measured from the end of one poll to the start of the
// next, so a slow script never overlaps itself), keeps the last good host set, and
// reports changes. A failing, hanging or malformed poll keeps the last good set and is
// reported through on_error with its reason; a failure of the FIRST poll is fatal
// (on_fatal, and polling stops). Consecutive identical errors are rate-limited in the
// log, but on_error is called every time.
class HostWatcher {
 public:
  struct Callbacks {
    // The first good set, then every change (hosts in the order the source listed them).
    std::function<void(const std::vector<Host>& hosts)> on_change;
    std::function<void(const std::string& why)> on_error;
    std::function<void(const std::string& why)> on_fatal;
  };
  HostWatcher(boost::asio::io_context& io, std::unique_ptr<HostSource> source,
              std::chrono::milliseconds interval, Callbacks callbacks);
  ~HostWatcher();
  HostWatcher(const HostWatcher&) = delete;
  HostWatcher& operator=(const HostWatcher&) = delete;

  void start();     // first poll at once
  void stop();      // cancels a running poll and the schedule; callbacks stop
  void poll_now();  // an immediate extra poll (coalesced with one already running)
  const std::vector<Host>& current() const { return current_; }

 private:
  void poll_once();
  void on_result(Result<std::vector<Host>> r);
  void report_error(const std::string& why);
  void schedule_next();

  boost::asio::io_context& io_;
  std::unique_ptr<HostSource> source_;
  std::chrono::milliseconds interval_;
  Callbacks cb_;
  boost::asio::steady_timer timer_;
  std::vector<Host> current_;
  bool have_good_ = false;
  bool running_ = false;  // between start() and stop() (or a fatal first poll)
  bool polling_ = false;  // a poll is in flight
  bool again_ = false;    // poll_now() arrived during a poll: poll again when it ends
  std::uint64_t timer_gen_ = 0;  // tells a stale timer handler from the current one
  std::string last_error_;
  std::uint64_t repeats_ = 0;  // how many times in a row last_error_ happened
  // Handlers hold a weak reference: once it has expired the watcher is gone.
  std::shared_ptr<char> alive_ = std::make_shared<char>();
};

}  // namespace elasticrun::discovery
