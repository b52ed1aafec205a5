// Which GPU each worker should use, decided by the daemon without CUDA.
//
// Slots are stable across elastic epochs (a worker keeps its slot for its life, and a
// replacement takes a free one), local ranks are not: a survivor's local_rank can change
// when an earlier slot on its host goes away. So the daemon gives each worker
// ELASTICRUN_DEVICE_HINT = slot % (GPUs it can see), and the library prefers that hint
// over local_rank % device_count: a worker stays on its GPU for its whole life, and two
// live workers of one host never pick the same GPU while slots <= GPUs. It is a hint, not
// ELASTICRUN_DEVICE: the library takes it modulo the devices the worker sees, which may
// be fewer than the daemon counted (a wrapper setting CUDA_VISIBLE_DEVICES, MIG, cgroups).
//
// GPUs are counted from /proc/driver/nvidia/gpus (one entry per GPU the driver bound),
// so the daemon links no CUDA. If the daemon's own environment has CUDA_VISIBLE_DEVICES,
// workers inherit it and the hint indexes that list. The daemon sets nothing when the
// user chose already: ELASTICRUN_DEVICE or CUDA_VISIBLE_DEVICES in the job's environment
// (elasticrun -x), or ELASTICRUN_DEVICE in the daemon's.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace elasticrun::daemon {

// Entries of `dir` (the NVIDIA driver's per-GPU directory); 0 if it is missing.
int count_gpus_in(const std::string& dir = "/proc/driver/nvidia/gpus");

// How many of `physical` GPUs a CUDA_VISIBLE_DEVICES value leaves visible, as CUDA
// reads it: comma-separated indices (< physical), GPU-/MIG- UUIDs; the list ends at the
// first invalid or empty entry. Null (unset) means all `physical`.
int visible_gpus(int physical, const char* cuda_visible_devices);

// The hint for `slot` among `visible` GPUs: slot % visible, or nothing without a GPU or
// when the user chose a device already.
std::optional<int> device_hint(int slot, int visible, bool user_chose);

// device_hint for a worker whose job environment is `job_env` (KEY=VALUE entries from
// the driver), with this daemon's environment and GPUs.
std::optional<int> worker_device_hint(int slot, const std::vector<std::string>& job_env);

}  // namespace elasticrun::daemon
