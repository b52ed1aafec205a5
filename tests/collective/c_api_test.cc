// The C API never throws: before er_init() every call reports ER_INVALID with a reason.
// er_run's loop (capi::run) is driven on a context of the test's own.
#include "api/c_api_run.h"
#include "rank_fixture.h"

#include <elasticrun/elasticrun.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

TEST(CApi, CallsBeforeInitAreInvalidNotFatal) {
  EXPECT_EQ(er_rank(), -1);
  EXPECT_EQ(er_size(), -1);
  float x = 1;
  EXPECT_EQ(er_allreduce(&x, &x, 1, ER_F32, ER_SUM), ER_INVALID);
  EXPECT_NE(std::string(er_last_error()).find("er_init"), std::string::npos);
  EXPECT_EQ(er_barrier(), ER_INVALID);
  const char* names[] = {"loss"};
  double values[] = {0.5};
  int stop = 7;
  EXPECT_EQ(er_report(1, names, values, 1, &stop), ER_INVALID);
  EXPECT_EQ(stop, 7);
  EXPECT_EQ(er_should_stop(), -1);
  // Any int a C caller passes is a value of these types (no undefined behaviour in C++).
  EXPECT_EQ(er_allreduce(&x, &x, 1, static_cast<er_datatype>(42), ER_SUM), ER_INVALID);
  EXPECT_EQ(er_allreduce(&x, &x, 1, static_cast<er_datatype>(-1), static_cast<er_op>(-7)), ER_INVALID);
}

TEST(CApi, StateCallsBeforeInitAreInvalid) {
  EXPECT_EQ(er_state_new(), nullptr);
  float x = 1;
  EXPECT_EQ(er_state_track_snapshot(nullptr, "x", &x, 1, ER_F32, ER_SNAPSHOT_DEVICE), ER_INVALID);
  EXPECT_NE(std::string(er_last_error()).find("er_init"), std::string::npos);
}

namespace {

// er_run's loop on a one-rank context of our own: re-joins are counted, not performed.
struct OneRank {
  OneRank() : world(1) {
    elasticrun::collective::HostCommConfig cfg;
    cfg.size = 1;
    cfg.scope = "c-run/";
    cfg.timeout = std::chrono::seconds(20);
    ctx = std::make_unique<elasticrun::Context>(
        elasticrun::collective::make_host_communicator(cfg, world.store, world.aborts[0]));
  }
  elasticrun::collective::testing::World world;
  std::unique_ptr<elasticrun::Context> ctx;
};

}  // namespace

// Each code run() recovers from is retried after restore and re-join, like its exception.
TEST(CApi, RunRetriesRecoverableCodesAfterRestore) {
  OneRank one;
  for (int code : {ER_TIMEOUT, ER_WORKERS_FAILED}) {
    int rejoins = 0;
    std::int64_t x = 0;
    elasticrun::State st(*one.ctx, {[&] { ++rejoins; }, [] { return false; }});
    st.track_value("x", x);
    int calls = 0;
    int rc = elasticrun::capi::run(st, [&]() -> int {
      if (++calls == 1) {
        x = 7;
        st.commit();
        x = 99;  // half a step: must not survive
        return code;
      }
      EXPECT_EQ(x, 7) << "code " << code << ": not restored to the commit";
      return ER_OK;
    });
    EXPECT_EQ(rc, ER_OK);
    EXPECT_EQ(calls, 2) << "code " << code;
    EXPECT_EQ(rejoins, 1) << "code " << code;
  }
}

TEST(CApi, RunReturnsOtherCodesAsTheyAre) {
  OneRank one;
  int rejoins = 0;
  elasticrun::State st(*one.ctx, {[&] { ++rejoins; }, [] { return false; }});
  int calls = 0;
  auto body = [&]() -> int {
    ++calls;
    return ER_PROTOCOL;
  };
  EXPECT_EQ(elasticrun::capi::run(st, body), ER_PROTOCOL);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(rejoins, 0);
}
