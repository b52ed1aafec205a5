// --report-fd's conversation (cmd/report_channel.h) over a real socket pair: the
// driver's side on an io_context, the test playing the sweep on the other end.
#include "cmd/report_channel.h"

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

namespace elasticrun::cmd {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

class ReportChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    channel_ = std::make_unique<ReportChannel>(io_, sv[0]);
    sweep_ = sv[1];
  }
  void TearDown() override {
    if (sweep_ >= 0) ::close(sweep_);
  }
  // Runs the io_context until `n` answers came (or 5 s passed).
  void run_until_answers(std::size_t n) {
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (answers_.size() < n && std::chrono::steady_clock::now() < deadline) {
      io_.restart();
      io_.run_for(10ms);
    }
  }
  void ask(std::int64_t step) {
    channel_->ask(step, report_line(step, {{"loss", 1.5}}, 2, 3), [this](msg::Decision d) { answers_.push_back(d); });
  }
  // The next line the driver wrote (runs the io_context meanwhile).
  std::string read_line() {
    std::string line;
    char c;
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < deadline) {
      io_.restart();
      io_.run_for(5ms);
      while (::recv(sweep_, &c, 1, MSG_DONTWAIT) == 1) {
        if (c == '\n') return line;
        line += c;
      }
    }
    return "(nothing)";
  }
  void answer(const std::string& text) { ASSERT_EQ(::write(sweep_, text.data(), text.size()), static_cast<ssize_t>(text.size())); }

  asio::io_context io_;
  std::unique_ptr<ReportChannel> channel_;
  int sweep_ = -1;
  std::vector<msg::Decision> answers_;
};

TEST_F(ReportChannelTest, OneLineOutOneLineBackInOrder) {
  ask(10);
  ask(20);  // waits for the first answer
  EXPECT_EQ(nlohmann::json::parse(read_line()),
            nlohmann::json::parse(R"({"step":10,"metrics":{"loss":1.5},"epoch":2,"size":3})"));
  io_.restart();
  io_.run_for(50ms);
  char c;
  EXPECT_EQ(::recv(sweep_, &c, 1, MSG_DONTWAIT), -1);  // step 20 is not asked yet
  answer("{\"step\":10,\"decision\":\"continue\"}\n");
  EXPECT_EQ(nlohmann::json::parse(read_line())["step"], 20);
  answer("{\"decision\":\"stop\",\"step\":20,\"note\":\"asha rung 1\"}\n");
  run_until_answers(2);
  EXPECT_EQ(answers_, (std::vector<msg::Decision>{msg::Decision::keep_going, msg::Decision::stop}));
}

TEST_F(ReportChannelTest, GarbageMeansContinueForThisAndEveryLaterReport) {
  ask(1);
  ask(2);
  read_line();
  answer("what?\n");
  run_until_answers(2);
  ask(3);
  run_until_answers(3);
  EXPECT_EQ(answers_, std::vector<msg::Decision>(3, msg::Decision::keep_going));
}

TEST_F(ReportChannelTest, AClosedOtherEndMeansContinue) {
  ask(1);
  read_line();
  ::close(sweep_);
  sweep_ = -1;
  run_until_answers(1);
  ask(2);  // the write fails or is never tried: the channel is gone
  run_until_answers(2);
  EXPECT_EQ(answers_, std::vector<msg::Decision>(2, msg::Decision::keep_going));
}

TEST_F(ReportChannelTest, AnOverlongAnswerMeansContinue) {
  ask(1);
  read_line();
  answer(std::string(kMaxAnswerLine + 10, 'x'));
  run_until_answers(1);
  EXPECT_EQ(answers_, std::vector<msg::Decision>(1, msg::Decision::keep_going));
}

TEST(ReportAnswer, OnlyTheStepAskedAndAKnownDecision) {
  EXPECT_EQ(*parse_answer(R"({"step":5,"decision":"stop"})", 5), msg::Decision::stop);
  EXPECT_EQ(*parse_answer(R"( {"step":5,"decision":"continue"} )", 5), msg::Decision::keep_going);
  auto why = [](std::string_view line) {
    auto r = parse_answer(line, 5);
    return r ? std::string("accepted") : r.error();
  };
  EXPECT_EQ(why(R"({"step":4,"decision":"stop"})"), "the answer is for step 4, not 5");
  EXPECT_EQ(why(R"({"step":"5","decision":"stop"})"), "no integer \"step\"");
  EXPECT_EQ(why(R"({"step":5,"decision":"halt"})"), "\"decision\" is neither \"continue\" nor \"stop\"");
  EXPECT_EQ(why(R"({"step":5})"), "\"decision\" is neither \"continue\" nor \"stop\"");
  EXPECT_EQ(why("[5,\"stop\"]"), "not a JSON object");
  EXPECT_EQ(why(""), "not a JSON object");
}

}  // namespace
}  // namespace elasticrun::cmd
