// The process's one collective engine, shared by the package's extension modules:
// elasticrun._core (elasticrun and elasticrun.torch's Horovod-style collectives) and
// elasticrun._c10d (the torch.distributed backend). One engine over one communicator is
// what keeps one order: a process-group allreduce issued after an hvd-style one runs
// after it, on every rank. Both modules link this library (libelasticrun-python), so
// they see the same engine, which lives from elasticrun.init() to elasticrun.shutdown().
//
// The callers hold the GIL or not as they like: nothing here touches Python.
#pragma once

#include "engine.h"

#include <elasticrun/device.hpp>

#include <chrono>
#include <string>

namespace elasticrun::python {

// Joins the job (elasticrun::init()) and starts the engine; nothing when already done.
void start_process_engine();
// Finishes what the engine has queued, stops it, and leaves the job (elasticrun::shutdown()).
// Collectives issued after it throw Error; issuing one while it runs is the caller's bug.
void stop_process_engine();
bool process_engine_started();
// Makes what runs or is queued on this epoch fail at once (the epoch's abort signal),
// with `why`, instead of waiting for peers: at exit, and when shutdown() gave up waiting.
void abandon_collectives(const std::string& why);
// The engine; throws Error ("not initialised") before start_process_engine().
Engine& process_engine();

// The process's device collectives (NCCL), made by the first device request, with the
// first communicator on `device` (that request's buffers' CUDA device); it rebuilds its
// communicator itself when the epoch changes. Only the engine's tasks call it, one at a
// time. Throws Error before start_process_engine(). stop_process_engine() destroys it
// before leaving the job.
device::Collectives& process_device_collectives(int device);

// Whether collectives first check that every rank passes the same element count and
// type (Request::check): elasticrun.set_shape_check, ELASTICRUN_CHECK_SHAPES=0.
bool shape_check();
void set_shape_check(bool on);

// How long a named handle's name stays in flight after its issue (Engine, kNameHold by
// default; HOROVOD_CYCLE_TIME, read by the Python package), for names issued from now on.
// Negative holds are taken as zero.
std::chrono::microseconds name_hold();
void set_name_hold(std::chrono::microseconds hold);

}  // namespace elasticrun::python
