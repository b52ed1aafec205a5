#include "process_engine.h"

#include <atomic>
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

}  // namespace

void start_process_engine() {
  if (engine_slot()) return;
  elasticrun::init();
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

}  // namespace elasticrun::python
