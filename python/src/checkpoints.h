// The Python states' durable checkpoints (elasticrun.elastic.State): the bindings of
// libelasticrun's Durable (collective/src/api/durable.h) for one pickled state, kind
// "python". One Durable per process, on the process-wide context, made at first use.
#pragma once

#include <elasticrun/elasticrun.hpp>

#include <pybind11/pybind11.h>

#include <functional>

namespace elasticrun::python {

// Defines checkpoint_enabled, checkpoint_due, checkpoint_save, checkpoint_load and
// checkpoint_flush on `m`. `context` returns the initialised context (or throws).
void define_checkpoints(pybind11::module_& m, std::function<Context&()> context);
// Waits for the writes in progress and forgets the Durable: before the context goes.
void flush_checkpoints();

}  // namespace elasticrun::python
