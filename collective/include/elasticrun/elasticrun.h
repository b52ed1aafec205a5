/* libelasticrun C API: the same collectives as elasticrun.hpp, for other languages.
 *
 * Every function returns ER_OK or an error code; er_last_error() then describes
 * the failure (per thread, valid until the next call on that thread). No C++
 * exception ever crosses this interface. Topology getters return -1 before er_init().
 *
 *   if (er_init() != ER_OK) { fprintf(stderr, "%s\n", er_last_error()); return 1; }
 *   er_allreduce(grad, grad, n, ER_F32, ER_AVG);    // in place
 *   er_shutdown();
 */
#ifndef ELASTICRUN_H
#define ELASTICRUN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes. */
enum {
  ER_OK = 0,
  ER_WORKERS_FAILED = 1, /* a peer died or the epoch was aborted: restore and re-join */
  ER_HOSTS_UPDATED = 2,  /* membership changed without failure: re-join, keep state */
  ER_TIMEOUT = 3,        /* a wait passed its deadline */
  ER_PROTOCOL = 4,       /* a peer or the server sent something malformed */
  ER_ERROR = 5,          /* anything else (transport set-up, internal) */
  ER_INVALID = 6         /* bad argument, or not initialised */
};

/* In C++ the enumerations below have int as their fixed underlying type, so any int a C
 * caller passes is a value of the type (the library rejects the ones it does not know);
 * without it, C++ would treat an out-of-range value as undefined behaviour. */
#ifdef __cplusplus
#define ER_ENUM_BASE : int
#else
#define ER_ENUM_BASE
#endif

/* Element types; values match elasticrun::DataType. */
typedef enum ER_ENUM_BASE { ER_F16 = 0, ER_BF16, ER_F32, ER_F64, ER_I8, ER_U8, ER_I32, ER_I64 } er_datatype;
/* Reduction operators; values match elasticrun::ReduceOp. */
typedef enum ER_ENUM_BASE { ER_SUM = 0, ER_AVG, ER_MIN, ER_MAX, ER_PROD } er_op;

int er_init(void);
int er_shutdown(void);
const char* er_last_error(void);

int er_rank(void);
int er_size(void);
int er_local_rank(void);
int er_local_size(void);
int er_cross_rank(void);
int er_cross_size(void);

/* `count` is in elements. Passing the same pointer as in and out works in place. */
int er_allreduce(const void* in, void* out, size_t count, er_datatype type, er_op op);
int er_broadcast(void* buf, size_t count, er_datatype type, int root);
/* out holds er_size()*count elements. */
int er_allgather(const void* in, void* out, size_t count, er_datatype type);
/* counts has er_size() entries; out holds their sum, packed in rank order. */
int er_allgatherv(const void* in, void* out, const size_t* counts, er_datatype type);
/* in holds er_size()*count elements; out receives this rank's reduced block of count. */
int er_reduce_scatter(const void* in, void* out, size_t count, er_datatype type, er_op op);
/* in and out hold er_size()*count elements; block j of in goes to rank j. */
int er_alltoall(const void* in, void* out, size_t count, er_datatype type);
int er_barrier(void);

/* Progress for the driver, and its answer (elasticrun::report): collective, every rank
 * calls it at the same step; rank 0's `n` metrics (names[i] = values[i], finite) are
 * sent. On ER_OK, *stop (if not NULL) is 1 on every rank when the driver decided the job
 * should stop, else 0. */
int er_report(int64_t step, const char* const* names, const double* values, int n, int* stop);
/* 1 once an er_report answered stop (it stays 1), 0 before, -1 before er_init(). */
int er_should_stop(void);

/* ---- elastic state (elastic.hpp) ----
 *
 * An er_state tracks buffers of the process-wide context (after er_init()). Tracked
 * memory is referenced, not copied: keep it in place for the state's lifetime.
 *
 *   er_state* st = er_state_new();
 *   er_state_track(st, "weights", w, n, ER_F32);
 *   er_state_track(st, "step", &step, sizeof step, ER_U8);   // any struct as bytes
 *   int rc = er_run(st, train, &args);   // train returns ER_OK, or the code of a failed call
 *   er_state_free(st);
 */
typedef struct er_state er_state;

/* NULL on error (not initialised, out of memory); er_last_error() says why. */
er_state* er_state_new(void);
void er_state_free(er_state* st);
/* `count` elements of `type`, in host or device (CUDA) memory; names are unique per
 * state. A device buffer's snapshot is kept in host memory. */
int er_state_track(er_state* st, const char* name, void* ptr, size_t count, er_datatype type);
/* Where a device buffer's snapshot lives: host memory (what er_state_track does), or
 * two device buffers the state allocates (fast device-to-device commit and restore,
 * twice the buffer's size in GPU memory). ER_SNAPSHOT_DEVICE on host memory fails. */
typedef enum ER_ENUM_BASE { ER_SNAPSHOT_HOST = 0, ER_SNAPSHOT_DEVICE = 1 } er_snapshot;
int er_state_track_snapshot(er_state* st, const char* name, void* ptr, size_t count, er_datatype type,
                            er_snapshot snapshot);
/* Snapshot; returns ER_HOSTS_UPDATED on every rank at the same commit when hosts were added. */
int er_state_commit(er_state* st);
int er_state_restore(er_state* st);
/* Every rank takes rank 0's values, then snapshots them. */
int er_state_sync(er_state* st);
/* Called after every re-join, before the sync that follows it. */
int er_state_on_reset(er_state* st, void (*fn)(void* arg), void* arg);
/* Re-joins the job's next epoch; ER_ERROR if this worker was removed from it. */
int er_rejoin(void);
/* The retry loop: syncs, calls fn; when fn returns ER_WORKERS_FAILED, ER_HOSTS_UPDATED or
 * ER_TIMEOUT (passed on from a failed call) it restores as needed, re-joins, runs the
 * on_reset callbacks and calls fn again. Returns fn's other codes (ER_OK included) as they are,
 * or the code of a failed re-join or sync. */
int er_run(er_state* st, int (*fn)(er_state* st, void* arg), void* arg);

#ifdef __cplusplus
}
#endif

#endif /* ELASTICRUN_H */
