// Host name lookups off the driver's I/O thread.
//
// Whether a host is this machine, and which of our addresses its daemon reaches us at,
// both need the name resolved; getaddrinfo blocks for as long as the resolver takes (a
// DNS server that answers slowly or not at all: seconds, per try). On the driver's one
// I/O thread that would stall every heartbeat, deadline and collective wait of the job,
// so HostLookups resolves on a few threads of its own and hands the answers back on the
// io_context's thread.
#pragma once

#include "discovery/local_host.h"

#include <boost/asio/io_context.hpp>

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace elasticrun::discovery {


class HostLookups {
 public:
  using Resolve = std::function<HostPlace(const std::string& key)>;
  // At most `threads` lookups run at once; the rest wait their turn.
  explicit HostLookups(boost::asio::io_context& io, int threads = 4, Resolve resolve = look_up_host);
  // Lookups still running are abandoned: their answers are dropped, and their threads end
  // when the resolver returns (they hold nothing of ours).
  ~HostLookups();
  HostLookups(const HostLookups&) = delete;
  HostLookups& operator=(const HostLookups&) = delete;

  // The answer for `host`, if one was found and kept.
  const HostPlace* find(const std::string& host) const;
  // Runs `then` with `host`'s place: at once when it is known, otherwise on the
  // io_context's thread once the lookup ends, after the callbacks asked before it for
  // the same host. A name that does not resolve is not kept: the next ask looks it up
  // again (its record may appear, as a new machine's does).
  void when_known(const std::string& host, std::function<void(const HostPlace&)> then);
  // Keeps an answer found elsewhere (the static hosts, looked up before the job starts).
  void remember(const std::string& host, HostPlace place);
  // Hosts whose lookup has not ended.
  std::size_t pending() const { return waiting_.size(); }

 private:
  struct Shared;
  static void work(const std::shared_ptr<Shared>& s);
  void arrived(const std::string& key, const HostPlace& place);
  std::shared_ptr<Shared> shared_;
  std::map<std::string, HostPlace> known_;
  std::map<std::string, std::deque<std::function<void(const HostPlace&)>>> waiting_;
};

}  // namespace elasticrun::discovery
