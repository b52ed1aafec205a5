#include "cmd/report_channel.h"

#include "common/log.h"

#include <fmt/format.h>
#include <fcntl.h>

namespace elasticrun::cmd {

namespace asio = boost::asio;

std::string report_line(std::int64_t step, const nlohmann::json& metrics, std::uint64_t epoch, int size) {
  nlohmann::json j = {{"step", step}, {"metrics", metrics}, {"epoch", epoch}, {"size", size}};
  return j.dump() + "\n";
}

Result<msg::Decision> parse_answer(std::string_view line, std::int64_t step) {
  auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return fail("not a JSON object");
  auto s = j.find("step");
  if (s == j.end() || !s->is_number_integer()) return fail("no integer \"step\"");
  if (s->get<std::int64_t>() != step) return fail(fmt::format("the answer is for step {}, not {}", s->dump(), step));
  auto d = j.find("decision");
  if (d != j.end() && *d == "continue") return msg::Decision::keep_going;
  if (d != j.end() && *d == "stop") return msg::Decision::stop;
  return fail("\"decision\" is neither \"continue\" nor \"stop\"");
}

ReportChannel::ReportChannel(asio::io_context& io, int fd) : io_(io), fd_(fd), sd_(io) {
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // the daemons and discovery scripts have no use for it
  sd_.assign(fd);
}

void ReportChannel::ask(std::int64_t step, std::string line, Answer answer) {
  queue_.push_back(Pending{step, std::move(line), std::move(answer)});
  if (!busy_) asio::post(io_, [this] { next(); });
}

// Sends the front report, unless one is out already; without the channel, answers all.
void ReportChannel::next() {
  if (busy_) return;
  if (gone_) {
    auto all = std::move(queue_);
    queue_.clear();
    for (auto& p : all) p.answer(msg::Decision::keep_going);
    return;
  }
  if (queue_.empty()) return;
  busy_ = true;
  asio::async_write(sd_, asio::buffer(queue_.front().line),
                    [this](const boost::system::error_code& ec, std::size_t) { on_written(ec); });
}

void ReportChannel::on_written(const boost::system::error_code& ec) {
  if (ec == asio::error::operation_aborted) return;
  if (ec) return give_up(fmt::format("writing a report to --report-fd {}: {}", fd_, ec.message()));
  asio::async_read_until(sd_, in_, '\n',
                         [this](const boost::system::error_code& e, std::size_t n) { on_read(e, n); });
}

void ReportChannel::on_read(const boost::system::error_code& ec, std::size_t n) {
  if (ec == asio::error::operation_aborted) return;
  if (ec == asio::error::eof) return give_up(fmt::format("--report-fd {} was closed", fd_));
  if (ec == asio::error::not_found)
    return give_up(fmt::format("--report-fd {} answered a line of more than {} bytes", fd_, kMaxAnswerLine));
  if (ec) return give_up(fmt::format("reading --report-fd {}: {}", fd_, ec.message()));
  std::string line(asio::buffers_begin(in_.data()), asio::buffers_begin(in_.data()) + static_cast<long>(n) - 1);
  in_.consume(n);
  std::int64_t step = queue_.front().step;
  auto decision = parse_answer(line, step);
  if (!decision)
    return give_up(fmt::format("--report-fd {} answered '{}' to the report of step {}: {}", fd_, line.substr(0, 200),
                               step, decision.error()));
  Pending p = std::move(queue_.front());
  queue_.pop_front();
  busy_ = false;
  ER_LOG(driver, debug, "report of step {}: {}", p.step, *decision == msg::Decision::stop ? "stop" : "continue");
  p.answer(*decision);
  next();
}

void ReportChannel::give_up(const std::string& why) {
  ER_LOG(driver, warn, "{}; every report is answered \"continue\" from now on", why);
  gone_ = true;
  busy_ = false;
  boost::system::error_code ignored;
  sd_.close(ignored);
  next();
}

}  // namespace elasticrun::cmd
