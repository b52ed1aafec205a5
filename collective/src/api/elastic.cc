// State: snapshots of tracked memory, their broadcast from rank 0, and the retry loop.
//
// Every byte that moves between an item and its snapshot or the sync staging goes
// through move(): memcpy for host items, the MemoryOps seam for device items, so the
// same logic serves both and is tested on CPU with a MemoryOps that fakes a GPU.
#include <elasticrun/elastic.hpp>

#include "api/context_internal.h"
#include "api/durable.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace elasticrun {

namespace {

// Items up to this size travel together in one broadcast in sync(); larger ones are
// broadcast in place, which saves a copy of the bytes that dominate the cost.
constexpr std::size_t kCoalesceBytes = 64 * 1024;

// Device memory a State allocated for a Snapshot::device item, freed through its MemoryOps.
struct DeviceFree {
  MemoryOps* ops;
  void operator()(std::byte* p) const noexcept { ops->free_device(p); }
};
using DeviceBuffer = std::unique_ptr<std::byte, DeviceFree>;

struct Item {
  std::string name;
  std::byte* data;
  std::size_t bytes;
  DataType type;
  bool on_device;            // `data` is device memory
  std::size_t offset;        // in each host snapshot slot (host snapshots only)
  DeviceBuffer dev_slot[2];  // the two snapshot slots of a Snapshot::device item
  bool device_snapshot() const { return dev_slot[0] != nullptr; }
};

std::uint64_t fnv1a(std::uint64_t h, const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ULL;
  return h;
}

}  // namespace

struct State::Impl {
  Impl(Context& c, ElasticHooks h)
      : ctx(c), hooks(std::move(h)), ops(hooks.memory ? hooks.memory : default_memory_ops()),
        durable(Durable::from_settings(c)) {}

  Context& ctx;
  ElasticHooks hooks;
  std::shared_ptr<MemoryOps> ops;  // declared before items: their device slots free through it
  std::vector<Item> items;
  // Two snapshot slots with one layout: a new snapshot is written into the spare slot
  // and becomes current only once complete, so the last good one is never half
  // overwritten, and after the first commit no commit allocates.
  std::vector<std::byte> slots[2];
  int current = 0;
  std::uint64_t commits = 0;
  std::vector<std::function<void()>> callbacks;
  std::vector<std::byte> pack;   // sync() staging for the small items
  std::vector<std::byte> stage;  // sync() staging for one large device item
  bool at_commit = false;
  // Durable checkpoints (api/durable.h), when ELASTICRUN_CHECKPOINT_DIR is set. Declared
  // after the snapshot slots: its writer thread is joined before they go.
  std::unique_ptr<Durable> durable;
  std::vector<std::byte> durable_buffer;
  bool holds_state = false;  // took part in a sync: holds the job's state

  bool hosts_updated() const { return hooks.hosts_updated ? hooks.hosts_updated() : ctx.hosts_updated(); }

  // Copies between an item (or its snapshot) and anything else; `device` says whether
  // either side is device memory.
  void move(void* dst, const void* src, std::size_t bytes, bool device) {
    if (bytes == 0) return;
    if (device)
      ops->copy(dst, src, bytes);
    else
      std::memcpy(dst, src, bytes);
  }

  void* snapshot_of(Item& it, int slot) {
    return it.device_snapshot() ? static_cast<void*>(it.dev_slot[slot].get()) : slots[slot].data() + it.offset;
  }

  void snapshot() {
    int spare = 1 - current;
    for (Item& it : items) move(snapshot_of(it, spare), it.data, it.bytes, it.on_device);
    current = spare;
  }

  // Names, sizes and types in order, so ranks can check they track the same thing.
  // 62 bits, so that it and its negation fit an i64 allreduce.
  std::int64_t fingerprint() const {
    std::uint64_t h = 0xcbf29ce484222325ULL;
    for (const Item& it : items) {
      h = fnv1a(h, it.name.data(), it.name.size() + 1);
      std::uint64_t b = it.bytes;
      int t = static_cast<int>(it.type);
      h = fnv1a(fnv1a(h, &b, sizeof b), &t, sizeof t);
    }
    return static_cast<std::int64_t>(h >> 2);
  }

  std::vector<collective::checkpoint::Item> layout() const {
    std::vector<collective::checkpoint::Item> out;
    for (const Item& it : items) out.push_back({it.name, static_cast<std::uint32_t>(it.type), it.bytes});
    return out;
  }
  void save_durable();
  std::string restore_durable();
  void check_layout(const std::string& restore_error);
  std::uint64_t broadcast_small();
  void broadcast_large();
};

// The committed state (the current snapshot) to the durable writer, in item order.
void State::Impl::save_durable() {
  std::size_t total = 0;
  for (const Item& it : items) total += it.bytes;
  durable_buffer.resize(total);
  std::size_t at = 0;
  for (Item& it : items) {
    move(durable_buffer.data() + at, snapshot_of(it, current), it.bytes, it.device_snapshot());
    at += it.bytes;
  }
  durable->save(commits, "state", layout(), durable_buffer);
}

// Rank 0 holding no state loads the newest durable checkpoint into the items (see
// api/durable.h). Returns the error that stops it, or "" (restored, or nothing there).
std::string State::Impl::restore_durable() {
  try {
    auto loaded = durable->load("state", layout());
    if (!loaded) return "";
    std::size_t at = 0;
    for (Item& it : items) {
      move(it.data, loaded->payload.data() + at, it.bytes, it.on_device);
      at += it.bytes;
    }
    commits = loaded->manifest.commit;
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

// One allreduce(max) of (fp, -fp, restore failed): every rank learns both the largest
// and the smallest fingerprint, and whether rank 0 could not restore, so all ranks
// agree on whether to go on and throw together instead of leaving some ranks blocked
// in a broadcast of another size.
void State::Impl::check_layout(const std::string& restore_error) {
  std::int64_t fp = fingerprint();
  std::int64_t v[3] = {fp, -fp, restore_error.empty() ? 0 : 1};
  ctx.comm().allreduce(v, v, 3, DataType::i64, ReduceOp::max);
  if (v[2] != 0)
    throw Error("elastic state: cannot restore from the durable checkpoints: " +
                (restore_error.empty() ? std::string("see rank 0's output") : restore_error));
  if (v[0] != fp || v[1] != -fp)
    throw Error("elastic state: ranks track different items (names, sizes or types differ); every rank "
                "must track the same items in the same order");
}

// The commit counter and every small item, packed in registration order into one
// buffer that rank 0 fills and the others unpack after a single broadcast. Returns rank
// 0's commit count, which sync() takes only once every item has arrived (restore()
// after a failed sync puts the items back, and the count must go with them).
std::uint64_t State::Impl::broadcast_small() {
  std::size_t total = sizeof commits;
  for (const Item& it : items)
    if (it.bytes <= kCoalesceBytes) total += it.bytes;
  pack.resize(total);
  bool root = ctx.comm().rank() == 0;
  if (root) {
    std::memcpy(pack.data(), &commits, sizeof commits);
    std::size_t at = sizeof commits;
    for (const Item& it : items) {
      if (it.bytes > kCoalesceBytes) continue;
      move(pack.data() + at, it.data, it.bytes, it.on_device);
      at += it.bytes;
    }
  }
  ctx.comm().broadcast(pack.data(), pack.size(), DataType::u8, 0);
  if (root) return commits;
  std::uint64_t received = 0;
  std::memcpy(&received, pack.data(), sizeof received);
  std::size_t at = sizeof commits;
  for (const Item& it : items) {
    if (it.bytes > kCoalesceBytes) continue;
    move(it.data, pack.data() + at, it.bytes, it.on_device);
    at += it.bytes;
  }
  return received;
}

// Host items are broadcast in place. Device items travel through host staging (see
// elastic.hpp): rank 0 copies out, the host transport broadcasts, the others copy in.
void State::Impl::broadcast_large() {
  bool root = ctx.comm().rank() == 0;
  for (const Item& it : items) {
    if (it.bytes <= kCoalesceBytes) continue;
    if (!it.on_device) {
      ctx.comm().broadcast(it.data, it.bytes, DataType::u8, 0);
      continue;
    }
    stage.resize(it.bytes);
    if (root) ops->copy(stage.data(), it.data, it.bytes);
    ctx.comm().broadcast(stage.data(), it.bytes, DataType::u8, 0);
    if (!root) ops->copy(it.data, stage.data(), it.bytes);
  }
}

State::State() : State(elasticrun::context()) {}

State::State(Context& ctx, ElasticHooks hooks) : impl_(std::make_unique<Impl>(ctx, std::move(hooks))) {}

State::~State() = default;

void State::track_raw(std::string name, void* data, std::size_t count, DataType t, Snapshot snap) {
  if (name.empty()) throw Error("elastic state: an item needs a name");
  if (static_cast<int>(t) < 0 || static_cast<int>(t) > static_cast<int>(DataType::i64))
    throw Error("elastic state: item '" + name + "' has an invalid data type");
  if (!data && count > 0) throw Error("elastic state: item '" + name + "' has no memory");
  auto& items = impl_->items;
  if (std::any_of(items.begin(), items.end(), [&](const Item& it) { return it.name == name; }))
    throw Error("elastic state: item '" + name + "' is already tracked");
  std::size_t bytes = count * size_of(t);
  MemoryOps& ops = *impl_->ops;
  bool on_device = bytes > 0 && ops.where(data) == device::Memory::device;
  if (snap == Snapshot::device && !on_device && bytes > 0)
    throw Error("elastic state: item '" + name + "' asks for a device snapshot but is not in device memory");
  Item it{std::move(name), static_cast<std::byte*>(data), bytes, t, on_device, 0, {}};
  if (snap == Snapshot::device && bytes > 0) {
    for (auto& slot : it.dev_slot)
      slot = DeviceBuffer(static_cast<std::byte*>(ops.allocate_device(bytes, data)), DeviceFree{&ops});
  } else {
    it.offset = impl_->slots[0].size();
    for (auto& slot : impl_->slots) slot.resize(it.offset + bytes);
  }
  // Its snapshot starts as its value now, so restore() before any commit is defined.
  impl_->move(impl_->snapshot_of(it, impl_->current), data, bytes, on_device);
  items.push_back(std::move(it));
}

void State::commit() {
  impl_->at_commit = false;
  impl_->snapshot();
  ++impl_->commits;
  if (impl_->durable && impl_->durable->due(impl_->commits)) impl_->save_durable();
  // Horovod's check_host_updates: all ranks must leave at the same commit, so one
  // rank's notice is shared with all through a 4-byte allreduce(max).
  std::int32_t flag = impl_->hosts_updated() ? 1 : 0;
  try {
    impl_->ctx.comm().allreduce(&flag, &flag, 1, DataType::i32, ReduceOp::max);
  } catch (const HostsUpdated&) {
    impl_->at_commit = true;
    throw;
  }
  if (flag) {
    impl_->at_commit = true;
    throw HostsUpdated("hosts updated: re-joining at commit " + std::to_string(impl_->commits));
  }
}

void State::restore() {
  impl_->at_commit = false;
  for (Item& it : impl_->items) impl_->move(it.data, impl_->snapshot_of(it, impl_->current), it.bytes, it.on_device);
}

void State::sync() {
  impl_->at_commit = false;
  std::string restore_error;
  if (impl_->durable && !impl_->holds_state && impl_->ctx.comm().rank() == 0) restore_error = impl_->restore_durable();
  impl_->check_layout(restore_error);
  std::uint64_t commits = impl_->broadcast_small();
  impl_->broadcast_large();
  impl_->commits = commits;
  impl_->snapshot();
  impl_->holds_state = true;
  // Only now, with the snapshot taken, does this worker hold the job's state: the driver
  // may make it rank 0 of a later epoch (cmd/controller.h, the holder rule).
  ContextInternals::state_synced(impl_->ctx, commits);
}

void State::on_reset(std::function<void()> callback) {
  if (!callback) throw Error("elastic state: on_reset needs a callable");
  impl_->callbacks.push_back(std::move(callback));
}

std::uint64_t State::commits() const { return impl_->commits; }
Context& State::context() { return impl_->ctx; }
bool State::interrupted_at_commit() const { return impl_->at_commit; }

void State::abandon() {
  if (impl_->hooks.abandon)
    impl_->hooks.abandon();
  else if (!impl_->hooks.rejoin)  // a simulated reset keeps its communicator
    impl_->ctx.abandon();
}

void State::reset() {
  if (impl_->hooks.rejoin)
    impl_->hooks.rejoin();
  else
    impl_->ctx.rejoin();
  for (auto& cb : impl_->callbacks) cb();
}

// Each pass syncs from rank 0 and runs the body. A failure of a peer rolls this
// rank back to its last commit; a host update raised by commit() leaves memory as
// it is (it equals the commit), while one that interrupted a collective mid-step
// rolls back like a failure. Either way the worker re-joins and the pass repeats;
// the sync at its start overwrites everyone with rank 0's committed state.
//
// The epoch's transport goes first (State::abandon): a receive that was under way when
// a collective failed cannot be cancelled, and would otherwise land in a tracked buffer
// at the transport's next progress, after the restore.
void run_loop(State& state, const std::function<void()>& body) {
  for (;;) {
    try {
      state.sync();
      body();
      return;
    } catch (const WorkersFailed&) {
      state.abandon();
      state.restore();
    } catch (const TimeoutError&) {
      // A peer went silent (a cut link, a hung process): treat it as a failure. The
      // re-join tells the server this epoch is broken; the driver forms the next one.
      state.abandon();
      state.restore();
    } catch (const HostsUpdated&) {
      state.abandon();
      if (!state.interrupted_at_commit()) state.restore();
    }
    state.reset();
  }
}

}  // namespace elasticrun
