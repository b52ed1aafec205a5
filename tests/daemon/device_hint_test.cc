// The daemon's per-slot GPU hint: counting GPUs without CUDA, CUDA_VISIBLE_DEVICES as
// CUDA reads it, and never overriding the user's choice.
#include "daemon/device_hint.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace ed = elasticrun::daemon;

TEST(DeviceHint, SlotModuloVisibleGpus) {
  EXPECT_EQ(ed::device_hint(0, 4, false), 0);
  EXPECT_EQ(ed::device_hint(3, 4, false), 3);
  EXPECT_EQ(ed::device_hint(5, 4, false), 1);  // more slots than GPUs: they share
  EXPECT_EQ(ed::device_hint(2, 1, false), 0);
  EXPECT_FALSE(ed::device_hint(1, 0, false));  // no GPU: no hint
  EXPECT_FALSE(ed::device_hint(1, 4, true));   // the user chose
}

TEST(DeviceHint, VisibleDevicesAsCudaReadsThem) {
  EXPECT_EQ(ed::visible_gpus(8, nullptr), 8);
  EXPECT_EQ(ed::visible_gpus(0, nullptr), 0);
  EXPECT_EQ(ed::visible_gpus(8, ""), 0);
  EXPECT_EQ(ed::visible_gpus(8, "2,3"), 2);
  EXPECT_EQ(ed::visible_gpus(8, "5"), 1);
  EXPECT_EQ(ed::visible_gpus(4, "1,7,2"), 1);  // 7 does not exist: the list ends there
  EXPECT_EQ(ed::visible_gpus(4, "-1"), 0);
  EXPECT_EQ(ed::visible_gpus(4, "0,,1"), 1);
  EXPECT_EQ(ed::visible_gpus(2, "GPU-8a1b2c3d-0000-1111-2222-333344445555,MIG-abc"), 2);
  EXPECT_EQ(ed::visible_gpus(8, "NoDevFiles"), 0);
  EXPECT_EQ(ed::visible_gpus(8, "1, 2"), 2);
}

TEST(DeviceHint, CountsDriverEntries) {
  auto dir = std::filesystem::temp_directory_path() / ("er-gpus-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "0000:17:00.0");
  std::filesystem::create_directories(dir / "0000:65:00.0");
  EXPECT_EQ(ed::count_gpus_in(dir.string()), 2);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(ed::count_gpus_in(dir.string()), 0);  // no driver: no GPUs
}

TEST(DeviceHint, NeverOverridesTheUser) {
  ::unsetenv("ELASTICRUN_DEVICE");
  EXPECT_FALSE(ed::worker_device_hint(1, {"ELASTICRUN_DEVICE=0"}));
  EXPECT_FALSE(ed::worker_device_hint(1, {"CUDA_VISIBLE_DEVICES=3"}));
  ::setenv("ELASTICRUN_DEVICE", "2", 1);
  EXPECT_FALSE(ed::worker_device_hint(1, {}));
  ::unsetenv("ELASTICRUN_DEVICE");
  // Otherwise it follows this host's GPUs, honouring the daemon's CUDA_VISIBLE_DEVICES.
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
  EXPECT_FALSE(ed::worker_device_hint(1, {"ELASTICRUN_DEVICE_X=1"}));
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  int gpus = ed::count_gpus_in();
  auto hint = ed::worker_device_hint(5, {});
  if (gpus == 0) EXPECT_FALSE(hint);
  else EXPECT_EQ(hint, 5 % gpus);
  // A stray ELASTICRUN_DEVICE_HINT in the job's environment is no choice of the user's.
  EXPECT_EQ(ed::worker_device_hint(5, {"ELASTICRUN_DEVICE_HINT=0"}), hint);
}
