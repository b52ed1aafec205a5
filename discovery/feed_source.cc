// The host feed (--host-discovery-fd N): the program that started elasticrun writes
// host lists to an inherited pipe or socket whenever they change, instead of the job
// running a discovery script every --discovery-interval. `elasticrun sweep` feeds its
// trials this way: a trial's share of the pool reaches it at once, and no shell starts
// for a poll, at the job's start or ever after.
//
// Wire format: each list is a block of lines in the discovery script's format (see
// script_output.h) ended by an empty line; "\n" alone is an empty list. Blocks that
// arrive faster than they are read are superseded by the newest. A poll answers the
// newest block not answered yet, or waits for the next one: the watcher that polls this
// source with a zero interval thus sees every change as it comes, without a timer.
//
// The end of the feed (EOF, a read error) keeps the last list for good, as a failing
// script keeps the last good set: its first poll answers why, and later polls never
// answer. An overlong line ends the feed the same way; an oversized or malformed block
// is answered as an error and the feed goes on with the next block.
#include "discovery/host_source.h"
#include "discovery/script_output.h"

#include "common/log.h"

#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <fmt/format.h>

#include <fcntl.h>

#include <optional>

namespace elasticrun::discovery {
namespace {

namespace asio = boost::asio;

class FeedSource final : public HostSource {
 public:
  FeedSource(asio::io_context& io, int fd, FeedOptions options)
      : io_(io), fd_(fd), sd_(io), options_(options), in_(options.max_line) {
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // daemons and workers have no use for it
    sd_.assign(fd);
    read_line();
  }
  ~FeedSource() override {
    *alive_ = false;
    boost::system::error_code ignored;
    sd_.close(ignored);
  }

  void poll(Done done) override {
    waiting_ = std::move(done);
    answer();
  }
  void cancel() override { waiting_ = nullptr; }

 private:
  // Hands the newest unanswered block (or the end of the feed, once) to a waiting poll;
  // posted, as a source never answers from inside poll().
  void answer() {
    if (!waiting_) return;
    std::optional<Result<std::vector<Host>>> r;
    if (ready_) {
      r = std::move(*ready_);
      ready_.reset();
    } else if (!end_.empty() && !end_told_) {
      end_told_ = true;
      r = fail(end_);
    }
    if (!r) return;
    asio::post(io_, [alive = alive_, done = std::move(waiting_), r = std::move(*r)]() mutable {
      if (*alive) done(std::move(r));
    });
    waiting_ = nullptr;
  }

  void read_line() {
    asio::async_read_until(sd_, in_, '\n', [this, alive = alive_](boost::system::error_code ec, std::size_t n) {
      if (!*alive) return;
      if (ec) return ended(ec);
      // Every complete line already here, so that lists sent together leave the newest.
      for (; n > 0; n = complete_line()) {
        on_line(std::string_view(static_cast<const char*>(in_.data().data()), n));
        in_.consume(n);
      }
      answer();
      read_line();
    });
  }

  // The length of the first line in the buffer with its '\n', or 0 if it is incomplete.
  std::size_t complete_line() const {
    std::string_view held(static_cast<const char*>(in_.data().data()), in_.size());
    auto nl = held.find('\n');
    return nl == std::string_view::npos ? 0 : nl + 1;
  }

  void on_line(std::string_view line) {
    bool blank = line == "\n" || line == "\r\n";
    if (!blank) {
      if (block_.size() + line.size() > options_.max_block) oversized_ = true;
      else block_.append(line);
      return;
    }
    if (oversized_) ready_ = fail(fmt::format("a host list on --host-discovery-fd {} exceeds {}", fd_,
                                              human_size(options_.max_block)));
    else if (auto h = parse_script_output(block_, options_.default_slots); !h)
      ready_ = fail(fmt::format("host list on --host-discovery-fd {}, {}", fd_, h.error()));
    else
      ready_ = std::move(h->hosts);
    block_.clear();
    oversized_ = false;
  }

  void ended(boost::system::error_code ec) {
    if (ec == asio::error::operation_aborted) return;
    if (ec == asio::error::eof)
      end_ = block_.empty() ? fmt::format("--host-discovery-fd {} was closed", fd_)
                            : fmt::format("--host-discovery-fd {} was closed inside a host list (no empty line after it)", fd_);
    else if (ec == asio::error::not_found)
      end_ = fmt::format("--host-discovery-fd {} sent a line of more than {}", fd_, human_size(options_.max_line));
    else
      end_ = fmt::format("reading --host-discovery-fd {}: {}", fd_, ec.message());
    ER_LOG(discovery, info, "{}; the hosts stay as they are", end_);
    answer();
  }

  asio::io_context& io_;
  int fd_;
  asio::posix::stream_descriptor sd_;
  FeedOptions options_;
  asio::streambuf in_;
  std::string block_;       // the lines of the list being received
  bool oversized_ = false;  // that list went past max_block: it is dropped
  std::optional<Result<std::vector<Host>>> ready_;  // newest complete list, unanswered
  std::string end_;         // why the feed ended; empty while it goes on
  bool end_told_ = false;
  Done waiting_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace

std::unique_ptr<HostSource> make_feed_source(asio::io_context& io, int fd, FeedOptions options) {
  return std::make_unique<FeedSource>(io, fd, options);
}

}  // namespace elasticrun::discovery
