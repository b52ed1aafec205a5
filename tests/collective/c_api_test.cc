// The C API never throws: before er_init() every call reports ER_INVALID with a reason.
#include <elasticrun/elasticrun.h>

#include <gtest/gtest.h>

#include <string>

TEST(CApi, CallsBeforeInitAreInvalidNotFatal) {
  EXPECT_EQ(er_rank(), -1);
  EXPECT_EQ(er_size(), -1);
  float x = 1;
  EXPECT_EQ(er_allreduce(&x, &x, 1, ER_F32, ER_SUM), ER_INVALID);
  EXPECT_NE(std::string(er_last_error()).find("er_init"), std::string::npos);
  EXPECT_EQ(er_barrier(), ER_INVALID);
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
