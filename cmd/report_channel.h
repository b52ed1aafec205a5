// --report-fd N: the driver's side of the report conversation with the program that
// started it (elasticrun sweep). For each report of rank 0, in arrival order, one JSON
// line goes out on the descriptor,
//   {"step":S,"metrics":{...},"epoch":E,"size":N}
// and one comes back,
//   {"step":S,"decision":"continue"|"stop"}
// whose decision goes to the worker. A report that arrives while another awaits its
// answer waits its turn. When the descriptor ends (EOF, a write error) or answers
// something else, that is logged once and every report from then on, the waiting ones
// included, is answered "continue": the other end is gone, and the job runs on (its
// launcher's end takes the job with it anyway).
//
// Everything runs on the driver's io_context; nothing blocks.
#pragma once

#include "common/messages.h"
#include "common/result.h"

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>

namespace elasticrun::cmd {

// The longest answer line accepted.
inline constexpr std::size_t kMaxAnswerLine = 64 * 1024;

// The line that asks about a report (with its newline).
std::string report_line(std::int64_t step, const nlohmann::json& metrics, std::uint64_t epoch, int size);
// Reads one answer line (without its newline) to the report of `step`: the decision, or
// what is wrong with the line.
Result<msg::Decision> parse_answer(std::string_view line, std::int64_t step);

class ReportChannel {
 public:
  using Answer = std::function<void(msg::Decision)>;
  // Takes `fd` over (and makes it close-on-exec); throws boost::system::system_error
  // if the io_context cannot watch it.
  ReportChannel(boost::asio::io_context& io, int fd);
  ReportChannel(const ReportChannel&) = delete;
  ReportChannel& operator=(const ReportChannel&) = delete;

  // Asks about the report of `step` (`line` from report_line); `answer` is called once,
  // from the io_context, never from inside ask().
  void ask(std::int64_t step, std::string line, Answer answer);

 private:
  struct Pending {
    std::int64_t step;
    std::string line;
    Answer answer;
  };
  void next();
  void on_written(const boost::system::error_code& ec);
  void on_read(const boost::system::error_code& ec, std::size_t n);
  void give_up(const std::string& why);

  boost::asio::io_context& io_;
  int fd_;
  boost::asio::posix::stream_descriptor sd_;
  boost::asio::streambuf in_{kMaxAnswerLine};
  std::deque<Pending> queue_;
  bool busy_ = false;  // the front report is out, its answer awaited
  bool gone_ = false;  // given up: everything is answered "continue"
};

}  // namespace elasticrun::cmd
