// The process group's Completer (python/src/c10d/completer.h): completions run off the
// posting thread; one that waits for a later completion gets it (a second thread), as
// PowerSGD's future callbacks need; the destructor waits for what was expected.
#include "c10d/completer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

using elasticrun::python::c10d::Completer;
using namespace std::chrono_literals;

TEST(Completer, RunsCompletionsOffThePostingThread) {
  Completer c;
  std::promise<std::thread::id> ran;
  c.expect();
  c.post([&] { ran.set_value(std::this_thread::get_id()); });
  auto id = ran.get_future();
  ASSERT_EQ(id.wait_for(10s), std::future_status::ready);
  EXPECT_NE(id.get(), std::this_thread::get_id());
  EXPECT_EQ(c.threads(), 1u);
}

TEST(Completer, ACompletionWaitingForALaterOneGetsAThreadForIt) {
  Completer c;
  std::promise<void> first_started, second_ran;
  std::promise<bool> first_saw_second;
  c.expect();
  c.post([&] {
    first_started.set_value();
    // As a PowerSGD callback waits for the allreduce it just issued.
    first_saw_second.set_value(second_ran.get_future().wait_for(10s) == std::future_status::ready);
  });
  first_started.get_future().wait();
  c.expect();
  c.post([&] { second_ran.set_value(); });
  EXPECT_TRUE(first_saw_second.get_future().get());
  EXPECT_EQ(c.threads(), 2u);
}

TEST(Completer, SequentialCompletionsDoNotStartAThreadEach) {
  // A completion posted while the previous one's thread is between its function and
  // its next wait (here: woken by that function) may start one more thread; threads stay
  // and are reused, so their number stays small.
  Completer c;
  for (int i = 0; i < 200; ++i) {
    std::promise<void> done;
    c.expect();
    c.post([&] { done.set_value(); });
    done.get_future().wait();
  }
  EXPECT_LT(c.threads(), 10u);
}

TEST(Completer, QuiesceWaitsForRunningCompletions) {
  Completer c;
  std::promise<void> started, release;
  c.expect();
  c.post([&] {
    started.set_value();
    release.get_future().wait();
  });
  started.get_future().wait();
  EXPECT_FALSE(c.quiesce(std::chrono::milliseconds(0)));
  release.set_value();
  EXPECT_TRUE(c.quiesce(std::chrono::seconds(10)));
}

TEST(Completer, DestructorWaitsForExpectedCompletions) {
  auto c = std::make_unique<Completer>();
  Completer* raw = c.get();
  raw->expect();
  std::atomic<bool> ran{false};
  std::thread destroyer([&] {
    c.reset();  // must not return before the expected completion was taken and run
    EXPECT_TRUE(ran);
  });
  // Not a timing rule: the sleep only gives a destructor that does not wait the time to
  // return first, so that such a mutant fails here every time.
  std::this_thread::sleep_for(100ms);
  raw->post([&] { ran = true; });
  destroyer.join();
}

TEST(Completer, AForgottenCompletionIsNotWaitedFor) {
  auto c = std::make_unique<Completer>();
  c->expect();
  c->forget();  // the collective was never queued
  c.reset();
  SUCCEED();
}

TEST(Completer, DestroyedFromItsOwnCompletion) {
  // A callback dropping the last reference to the process group destroys the Completer
  // on the Completer's own thread: it must neither join itself nor touch freed state.
  auto c = std::make_unique<Completer>();
  std::promise<void> done;
  c->expect();
  Completer* raw = c.get();
  raw->post([&] {
    c.reset();
    done.set_value();
  });
  ASSERT_EQ(done.get_future().wait_for(10s), std::future_status::ready);
}
