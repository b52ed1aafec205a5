// The C API: forwards to the C++ free functions and turns exceptions into codes.
#include "api/c_api_run.h"

#include <elasticrun/elasticrun.h>
#include <elasticrun/elastic.hpp>
#include <elasticrun/elasticrun.hpp>

#include <exception>
#include <functional>
#include <span>
#include <string>

namespace {

// Per-thread, like errno: the C convention for "why did my last call fail".
thread_local std::string t_last_error;

int fail(int code, const char* what) {
  t_last_error = what;
  return code;
}

// Runs `f`, mapping each typed error of types.hpp to its code.
template <class F>
int guarded(F&& f) {
  try {
    f();
    t_last_error.clear();
    return ER_OK;
  } catch (const elasticrun::WorkersFailed& e) {
    return fail(ER_WORKERS_FAILED, e.what());
  } catch (const elasticrun::HostsUpdated& e) {
    return fail(ER_HOSTS_UPDATED, e.what());
  } catch (const elasticrun::TimeoutError& e) {
    return fail(ER_TIMEOUT, e.what());
  } catch (const elasticrun::ProtocolError& e) {
    return fail(ER_PROTOCOL, e.what());
  } catch (const std::exception& e) {
    return fail(ER_ERROR, e.what());
  } catch (...) {
    return fail(ER_ERROR, "unknown error");
  }
}

bool valid_type(er_datatype t) { return t >= ER_F16 && t <= ER_I64; }
bool valid_op(er_op op) { return op >= ER_SUM && op <= ER_PROD; }

// Common precondition of every collective.
int precheck(er_datatype t) {
  if (!elasticrun::initialized()) return fail(ER_INVALID, "elasticrun is not initialised (call er_init)");
  if (!valid_type(t)) return fail(ER_INVALID, "invalid data type");
  return ER_OK;
}

elasticrun::Communicator& comm() { return elasticrun::context().comm(); }
elasticrun::DataType dt(er_datatype t) { return static_cast<elasticrun::DataType>(t); }
elasticrun::ReduceOp rop(er_op op) { return static_cast<elasticrun::ReduceOp>(op); }

template <class F>
int topo(F&& f) {
  if (!elasticrun::initialized()) {
    fail(ER_INVALID, "elasticrun is not initialised (call er_init)");
    return -1;
  }
  try {
    return f();
  } catch (const std::exception& e) {
    fail(ER_ERROR, e.what());
    return -1;
  }
}

}  // namespace

extern "C" {

int er_init(void) { return guarded([] { elasticrun::init(); }); }
int er_shutdown(void) { return guarded([] { elasticrun::shutdown(); }); }
const char* er_last_error(void) { return t_last_error.c_str(); }

int er_rank(void) { return topo([] { return elasticrun::rank(); }); }
int er_size(void) { return topo([] { return elasticrun::size(); }); }
int er_local_rank(void) { return topo([] { return elasticrun::local_rank(); }); }
int er_local_size(void) { return topo([] { return elasticrun::local_size(); }); }
int er_cross_rank(void) { return topo([] { return elasticrun::cross_rank(); }); }
int er_cross_size(void) { return topo([] { return elasticrun::cross_size(); }); }

int er_allreduce(const void* in, void* out, size_t count, er_datatype type, er_op op) {
  if (int rc = precheck(type)) return rc;
  if (!valid_op(op)) return fail(ER_INVALID, "invalid reduce op");
  return guarded([&] { comm().allreduce(in, out, count, dt(type), rop(op)); });
}

int er_broadcast(void* buf, size_t count, er_datatype type, int root) {
  if (int rc = precheck(type)) return rc;
  return guarded([&] { comm().broadcast(buf, count, dt(type), root); });
}

int er_allgather(const void* in, void* out, size_t count, er_datatype type) {
  if (int rc = precheck(type)) return rc;
  return guarded([&] { comm().allgather(in, out, count, dt(type)); });
}

int er_allgatherv(const void* in, void* out, const size_t* counts, er_datatype type) {
  if (int rc = precheck(type)) return rc;
  if (!counts) return fail(ER_INVALID, "allgatherv: counts is null");
  return guarded([&] {
    std::span<const std::size_t> c(counts, static_cast<std::size_t>(comm().size()));
    comm().allgatherv(in, out, c, dt(type));
  });
}

int er_reduce_scatter(const void* in, void* out, size_t count, er_datatype type, er_op op) {
  if (int rc = precheck(type)) return rc;
  if (!valid_op(op)) return fail(ER_INVALID, "invalid reduce op");
  return guarded([&] { comm().reduce_scatter(in, out, count, dt(type), rop(op)); });
}

int er_alltoall(const void* in, void* out, size_t count, er_datatype type) {
  if (int rc = precheck(type)) return rc;
  return guarded([&] { comm().alltoall(in, out, count, dt(type)); });
}

int er_barrier(void) {
  if (!elasticrun::initialized()) return fail(ER_INVALID, "elasticrun is not initialised (call er_init)");
  return guarded([] { comm().barrier(); });
}

int er_report(int64_t step, const char* const* names, const double* values, int n, int* stop) {
  if (!elasticrun::initialized()) return fail(ER_INVALID, "elasticrun is not initialised (call er_init)");
  if (n < 0 || (n > 0 && (!names || !values))) return fail(ER_INVALID, "er_report: n < 0, or names or values null");
  elasticrun::Metrics metrics;
  for (int i = 0; i < n; ++i) {
    if (!names[i]) return fail(ER_INVALID, "er_report: a metric name is null");
    metrics[names[i]] = values[i];
  }
  bool decided = false;
  int rc = guarded([&] { decided = elasticrun::report(step, metrics); });
  if (rc == ER_OK && stop) *stop = decided ? 1 : 0;
  return rc;
}

int er_should_stop(void) {
  return topo([] { return elasticrun::should_stop() ? 1 : 0; });
}

}  // extern "C"

// ---- elastic state ----

struct er_state {
  elasticrun::State state;  // on the process-wide context
};

namespace {

int check_state(const er_state* st) {
  if (!elasticrun::initialized()) return fail(ER_INVALID, "elasticrun is not initialised (call er_init)");
  if (!st) return fail(ER_INVALID, "er_state is null");
  return ER_OK;
}

// A C body reports failures as codes; the retry loop reacts to exceptions. Each code
// run_loop recovers from maps back to its exception.
void rethrow_code(int rc) {
  auto why = [](const char* fallback) { return t_last_error.empty() ? std::string(fallback) : t_last_error; };
  if (rc == ER_WORKERS_FAILED) throw elasticrun::WorkersFailed(why("workers failed"));
  if (rc == ER_HOSTS_UPDATED) throw elasticrun::HostsUpdated(why("hosts updated"));
  if (rc == ER_TIMEOUT) throw elasticrun::TimeoutError(why("timed out"));
}

}  // namespace

namespace elasticrun::capi {

int run(State& state, const std::function<int()>& body) {
  int result = ER_OK;
  std::string why;  // the body's own failure message, which guarded() would clear
  int rc = guarded([&] {
    run_loop(state, [&] {
      result = body();
      why = t_last_error;
      rethrow_code(result);
    });
  });
  if (rc != ER_OK) return rc;
  if (result != ER_OK) t_last_error = why;
  return result;
}

}  // namespace elasticrun::capi

extern "C" {

er_state* er_state_new(void) {
  if (!elasticrun::initialized()) {
    fail(ER_INVALID, "elasticrun is not initialised (call er_init)");
    return nullptr;
  }
  er_state* st = nullptr;
  guarded([&] { st = new er_state; });
  return st;
}

void er_state_free(er_state* st) { delete st; }

int er_state_track(er_state* st, const char* name, void* ptr, size_t count, er_datatype type) {
  if (int rc = check_state(st)) return rc;
  if (!name) return fail(ER_INVALID, "er_state_track: name is null");
  if (!valid_type(type)) return fail(ER_INVALID, "invalid data type");
  return guarded([&] { st->state.track_raw(name, ptr, count, dt(type)); });
}

int er_state_track_snapshot(er_state* st, const char* name, void* ptr, size_t count, er_datatype type,
                            er_snapshot snapshot) {
  if (int rc = check_state(st)) return rc;
  if (!name) return fail(ER_INVALID, "er_state_track_snapshot: name is null");
  if (!valid_type(type)) return fail(ER_INVALID, "invalid data type");
  if (snapshot != ER_SNAPSHOT_HOST && snapshot != ER_SNAPSHOT_DEVICE)
    return fail(ER_INVALID, "er_state_track_snapshot: invalid snapshot placement");
  auto snap = snapshot == ER_SNAPSHOT_DEVICE ? elasticrun::Snapshot::device : elasticrun::Snapshot::host;
  return guarded([&] { st->state.track_raw(name, ptr, count, dt(type), snap); });
}

int er_state_commit(er_state* st) {
  if (int rc = check_state(st)) return rc;
  return guarded([&] { st->state.commit(); });
}

int er_state_restore(er_state* st) {
  if (int rc = check_state(st)) return rc;
  return guarded([&] { st->state.restore(); });
}

int er_state_sync(er_state* st) {
  if (int rc = check_state(st)) return rc;
  return guarded([&] { st->state.sync(); });
}

int er_state_on_reset(er_state* st, void (*fn)(void*), void* arg) {
  if (int rc = check_state(st)) return rc;
  if (!fn) return fail(ER_INVALID, "er_state_on_reset: fn is null");
  return guarded([&] { st->state.on_reset([fn, arg] { fn(arg); }); });
}

int er_rejoin(void) {
  if (!elasticrun::initialized()) return fail(ER_INVALID, "elasticrun is not initialised (call er_init)");
  return guarded([] { elasticrun::context().rejoin(); });
}

int er_run(er_state* st, int (*fn)(er_state*, void*), void* arg) {
  if (int rc = check_state(st)) return rc;
  if (!fn) return fail(ER_INVALID, "er_run: fn is null");
  return elasticrun::capi::run(st->state, [&] { return fn(st, arg); });
}

}  // extern "C"
