// Elastic training state: what survives a membership change.
//
//   elasticrun::init();
//   elasticrun::State state;                      // on elasticrun::context()
//   state.track("weights", std::span(weights));
//   state.track_value("step", step);
//   state.on_reset([&] { lr = base_lr * elasticrun::size(); });
//   elasticrun::run(state, [&](elasticrun::State& st) {
//     for (; step < steps; ++step) {
//       train_one_step();                        // collectives may throw WorkersFailed
//       if (step % 100 == 0) st.commit();        // may throw HostsUpdated
//     }
//   });
//
// The contract (Horovod's elastic State and run_fn):
//   - commit() copies every tracked item into its snapshot, then asks every rank of the
//     epoch whether the server announced new hosts; if any rank saw it, all ranks throw
//     HostsUpdated at this same commit. Cost: one 4-byte allreduce per commit, plus a
//     copy of the tracked bytes. That allreduce can also fail (WorkersFailed,
//     TimeoutError: a peer died at this step); the snapshot was taken before it, so the
//     commit stands either way (commits() has counted it) and restore() returns to it.
//   - restore() puts back the last snapshot. Snapshots are taken by commit(), by sync(),
//     and by track() for the item it registers, so before the first commit restore()
//     returns an item to its value at registration (or at the last sync()).
//   - sync() makes every rank hold rank 0's values and snapshots them. The launcher
//     guarantees rank 0 of every epoch is a survivor that holds committed state.
//   - run(state, fn) syncs, calls fn, and on WorkersFailed or TimeoutError (a peer went
//     silent: a cut link, a hung process) restores, re-joins, runs the on_reset callbacks
//     and tries again; on HostsUpdated raised by commit() it keeps the
//     state (it equals the commit) and re-joins. A HostsUpdated thrown anywhere else (a
//     collective interrupted mid-step) restores too, since the step may be half done.
//
// Device (GPU) memory can be tracked like host memory: track() finds where a pointer
// lives (device::memory_of). Its snapshot is in host memory by default (commit copies
// device to host, restore host to device: it survives a GPU error and costs no GPU
// memory), or, with Snapshot::device, in two device buffers the State allocates next to
// the item (commit and restore are device-to-device copies: fast, but twice the item's
// size in GPU memory, and lost with the GPU). sync() always travels through host memory
// over the host transport: rank 0 copies the item to host, broadcasts it, the others
// copy it to their device. That needs no second NCCL communicator next to the
// application's, and a sync happens once per reset, not per step. Copies go on the
// item's device's legacy default stream, so they follow the caller's earlier work there
// and on every blocking stream; work on a cudaStreamNonBlocking stream must be
// synchronised by the caller before commit(). commit(), restore() and sync() return once
// their copies are complete. A copy is bounded by ELASTICRUN_COLLECTIVE_TIMEOUT but is
// not interrupted by an abort (restore() runs while the epoch's abort is still raised).
//
// Tracked memory is referenced, not owned: it must stay where it is (do not resize a
// tracked vector) for the State's lifetime. Every rank must track the same names, sizes
// and types in the same order; sync() checks this and throws Error if they differ
// (the snapshot placement may differ between ranks).
// A State is used by one thread at a time.
#pragma once

#include <elasticrun/device.hpp>
#include <elasticrun/elasticrun.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

namespace elasticrun {

// Where a tracked item's snapshot lives. Host-memory items always snapshot to host.
enum class Snapshot { host, device };

// The seam between State and memory: where a pointer lives and how bytes move between
// host and device. The library's own (default_memory_ops()) uses CUDA when built with
// the NCCL backend and plain memcpy otherwise; tests pass one that stands in for a GPU.
class MemoryOps {
 public:
  virtual ~MemoryOps() = default;
  virtual device::Memory where(const void* p) = 0;
  // Copies `bytes` from `src` to `dst`, each in host or device memory; returns once the
  // copy is complete. Throws Error (or TimeoutError) on failure.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  // `bytes` of device memory on the device that holds `near` (a device pointer).
  virtual void* allocate_device(std::size_t bytes, const void* near) = 0;
  virtual void free_device(void* p) noexcept = 0;
};

// This build's MemoryOps (shared, stateless from the caller's view).
std::shared_ptr<MemoryOps> default_memory_ops();

// The seam between State and the control plane. Empty members mean the Context's own
// rejoin(), hosts_updated() and abandon(), and default_memory_ops(); tests replace them
// to simulate resets and device memory in one process.
struct ElasticHooks {
  std::function<void()> rejoin;
  std::function<bool()> hosts_updated;
  std::shared_ptr<MemoryOps> memory;
  std::function<void()> abandon;  // run() calls it after a failure, before restore()
};

class State {
 public:
  // On the process-wide context of init().
  State();
  explicit State(Context& ctx, ElasticHooks hooks = {});
  ~State();
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  // Registers `count` elements of type `t` at `data`, in host or device memory. Names
  // are unique (Error otherwise); registration order is the order of sync().
  // Snapshot::device needs `data` in device memory (Error otherwise).
  void track_raw(std::string name, void* data, std::size_t count, DataType t, Snapshot snap = Snapshot::host);

  template <class T>
  void track(std::string name, std::span<T> buf, Snapshot snap = Snapshot::host) {
    if constexpr (std::is_same_v<std::remove_cv_t<T>, std::byte>) {
      track_raw(std::move(name), buf.data(), buf.size(), DataType::u8, snap);
    } else {
      track_raw(std::move(name), buf.data(), buf.size(), dtype_of_v<std::remove_cv_t<T>>, snap);
    }
  }
  // A trivially copyable scalar or struct, kept as raw bytes.
  template <class T>
  void track_value(std::string name, T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "track_value needs a trivially copyable type");
    track_raw(std::move(name), &value, sizeof(T), DataType::u8);
  }

  void commit();
  void restore();
  void sync();
  // Runs after every re-join, before the sync that follows it, in registration order.
  void on_reset(std::function<void()> callback);

  // Commits in this lineage: counted by commit(), carried to new ranks by sync().
  std::uint64_t commits() const;
  Context& context();

  // One step of run(), after a failure: the epoch's transport torn down (the hooks'
  // abandon, else the Context's, unless the hooks simulate re-joins), before restore().
  void abandon();
  // One step of run(): re-join through the hooks, then the on_reset callbacks.
  void reset();
  // Whether the last HostsUpdated came from commit(), so memory equals the snapshot.
  bool interrupted_at_commit() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The retry loop behind run(): calls body until it returns or throws something other
// than WorkersFailed / TimeoutError / HostsUpdated. Errors of reset() (this worker was removed, no
// new epoch in time) propagate.
void run_loop(State& state, const std::function<void()>& body);

template <class F>
auto run(State& state, F&& fn) -> std::invoke_result_t<F&, State&> {
  using R = std::invoke_result_t<F&, State&>;
  if constexpr (std::is_void_v<R>) {
    run_loop(state, [&] { fn(state); });
  } else {
    std::optional<R> result;
    run_loop(state, [&] { result.emplace(fn(state)); });
    return std::move(*result);
  }
}

}  // namespace elasticrun
