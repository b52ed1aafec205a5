// The static host source (-H / --hostfile): every poll answers the same list.
#include "discovery/host_source.h"

#include <boost/asio/post.hpp>

namespace elasticrun::discovery {
namespace {

class StaticSource final : public HostSource {
 public:
  StaticSource(boost::asio::io_context& io, std::vector<Host> hosts) : io_(io), hosts_(std::move(hosts)) {}

  void poll(Done done) override {
    // Posted, not called: a source never answers from inside poll(). The generation
    // lets cancel() drop an answer that is already queued.
    boost::asio::post(io_, [gen = gen_, mine = *gen_, hosts = hosts_, done = std::move(done)]() mutable {
      if (*gen == mine) done(std::move(hosts));
    });
  }
  void cancel() override { ++*gen_; }
  ~StaticSource() override { cancel(); }

 private:
  boost::asio::io_context& io_;
  std::vector<Host> hosts_;
  std::shared_ptr<std::uint64_t> gen_ = std::make_shared<std::uint64_t>(0);
};

}  // namespace

std::unique_ptr<HostSource> make_static_source(boost::asio::io_context& io, std::vector<Host> hosts) {
  return std::make_unique<StaticSource>(io, std::move(hosts));
}

}  // namespace elasticrun::discovery
