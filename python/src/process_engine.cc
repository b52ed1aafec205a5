#include "process_engine.h"

#include "api/context_internal.h"
#include "control/abort_signal.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>

namespace elasticrun::python {
namespace {

// The one process-wide piece of state of the Python layer, as the library's own
// context is: made by start_process_engine(), destroyed by stop_process_engine().
std::unique_ptr<Engine>& engine_slot() {
  static std::unique_ptr<Engine> e;
  return e;
}

std::unique_ptr<device::Collectives>& device_slot() {
  static std::unique_ptr<device::Collectives> d;
  return d;
}

std::atomic<bool>& shape_check_flag() {
  static std::atomic<bool> on{true};
  return on;
}

std::atomic<std::chrono::microseconds::rep>& name_hold_us() {
  static std::atomic<std::chrono::microseconds::rep> us{std::chrono::microseconds(kNameHold).count()};
  return us;
}

}  // namespace

// At exit(), for a program that ended without shutdown(), maybe with a collective still
// running or queued (an exception that ended the interpreter while others waited):
// registered after the library's default context was made, so it runs before that
// context is destroyed. It raises the epoch's abort signal, so that what runs or is
// queued fails at once instead of waiting for peers (or running on a context being
// torn down, which crashed the process), lets the engine's thread end, and leaves the
// job as shutdown() does.
void at_exit() {
  auto& e = engine_slot();
  if (!e) return;
  abandon_collectives("the process is exiting");
  e.reset();
  device_slot().reset();
  elasticrun::shutdown();
}

void abandon_collectives(const std::string& why) {
  try {
    if (auto client = ContextInternals::client(elasticrun::context()))
      client->abort_signal()->raise(collective::AbortSignal::Kind::shutdown, why);
  } catch (...) {
    // No context: nothing can be running.
  }
}

void start_process_engine() {
  if (engine_slot()) return;
  elasticrun::init();
  static const bool registered = std::atexit(at_exit) == 0;
  (void)registered;
  engine_slot() = std::make_unique<Engine>(elasticrun::context());
}

void stop_process_engine() {
  engine_slot().reset();  // its last task has run: nothing uses the device collectives now
  device_slot().reset();
  elasticrun::shutdown();
}

bool process_engine_started() { return static_cast<bool>(engine_slot()); }

Engine& process_engine() {
  auto& e = engine_slot();
  if (!e) throw Error("elasticrun is not initialised: call elasticrun.init() first");
  return *e;
}

device::Collectives& process_device_collectives(int device) {
  process_engine();  // "not initialised" before init()
  auto& d = device_slot();
  if (!d) d = std::make_unique<device::Collectives>(elasticrun::context(), device);
  return *d;
}

bool shape_check() { return shape_check_flag().load(std::memory_order_relaxed); }
void set_shape_check(bool on) { shape_check_flag().store(on, std::memory_order_relaxed); }

std::chrono::microseconds name_hold() { return std::chrono::microseconds(name_hold_us().load(std::memory_order_relaxed)); }
void set_name_hold(std::chrono::microseconds hold) {
  name_hold_us().store(std::max<std::chrono::microseconds::rep>(hold.count(), 0), std::memory_order_relaxed);
}

}  // namespace elasticrun::python
