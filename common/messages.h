// Control-plane messages. Each has a type tag, encode() and decode(); decode() of
// untrusted bytes throws wire::DecodeError, never asserts.
#pragma once

#include "common/frame.h"
#include "common/wire.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace elasticrun::msg {

enum Type : std::uint8_t {
  // handshake, both connections
  kHello = 1, kAuth, kAuthOk, kError,
  // worker <-> rendezvous server
  kJoin = 10, kJoinOk, kKvSet, kKvGet, kKvValue, kBarrier, kOk, kNotify, kLeave, kRejoin, kReport, kReportReply,
  kCheckpointNote = 28, kSynced,
  // driver <-> daemon
  kConfig = 30, kSpawn, kKill, kShutdown, kReady, kStarted, kOutput, kExited, kSpawnFailed, kHeartbeat,
  kReservePort, kPortReserved, kPreempted,
};

struct Hello {
  static constexpr Type kType = kHello;
  wire::Bytes nonce;
  void encode(wire::Encoder& e) const { e.bytes(nonce); }
  static Hello decode(wire::Decoder& d) { return {d.bytes()}; }
};
struct Auth {
  static constexpr Type kType = kAuth;
  std::string role;
  wire::Bytes nonce, proof;
  void encode(wire::Encoder& e) const { e.str(role).bytes(nonce).bytes(proof); }
  static Auth decode(wire::Decoder& d) { return {d.str(), d.bytes(), d.bytes()}; }
};
struct AuthOk {
  static constexpr Type kType = kAuthOk;
  wire::Bytes proof;
  void encode(wire::Encoder& e) const { e.bytes(proof); }
  static AuthOk decode(wire::Decoder& d) { return {d.bytes()}; }
};
struct Error {
  static constexpr Type kType = kError;
  std::uint64_t req = 0;
  std::string message;
  void encode(wire::Encoder& e) const { e.u64(req).str(message); }
  static Error decode(wire::Decoder& d) { return {d.u64(), d.str()}; }
};

struct Join {
  static constexpr Type kType = kJoin;
  std::string host;
  std::uint32_t slot = 0, pid = 0;
  std::uint64_t epoch = 0;
  void encode(wire::Encoder& e) const { e.str(host).u32(slot).u32(pid).u64(epoch); }
  static Join decode(wire::Decoder& d) { return {d.str(), d.u32(), d.u32(), d.u64()}; }
};
// Reply to join (req 0) and rejoin (its req): where the worker sits in `epoch`, and how
// often it must send a Heartbeat (0: never), so that the server can tell a stopped
// worker from a busy one (rendezvous/liveness.h).
struct JoinOk {
  static constexpr Type kType = kJoinOk;
  std::uint64_t req = 0;
  std::uint64_t epoch = 0;
  std::int32_t rank = 0, size = 0, local_rank = 0, local_size = 0, cross_rank = 0, cross_size = 0;
  std::uint32_t heartbeat_ms = 0;
  // How many times this place has joined this epoch, this join included: 2 and more after
  // a worker's shutdown() and init() again (every rank of the job doing so in step, as
  // Horovod's test suite does). The worker's key-value scope carries it, so that a new
  // incarnation never reads what the previous one published. Sent only when above 1, so
  // that a first join's answer is what a library older than the field reads; absent: 1.
  std::uint32_t join_seq = 1;
  void encode(wire::Encoder& e) const {
    e.u64(req).u64(epoch).i32(rank).i32(size).i32(local_rank).i32(local_size).i32(cross_rank).i32(cross_size);
    e.u32(heartbeat_ms);
    if (join_seq != 1) e.u32(join_seq);
  }
  static JoinOk decode(wire::Decoder& d) {
    JoinOk j;
    j.req = d.u64();
    j.epoch = d.u64();
    j.rank = d.i32(), j.size = d.i32(), j.local_rank = d.i32(), j.local_size = d.i32();
    j.cross_rank = d.i32(), j.cross_size = d.i32();
    j.heartbeat_ms = d.u32();
    if (d.remaining() > 0) j.join_seq = d.u32();
    if (j.join_seq == 0) throw wire::DecodeError("join-ok: join sequence 0 (the first join is 1)");
    return j;
  }
};
// A joined worker asks for its place in the newest epoch >= min_epoch; the server
// answers once such an epoch exists (or with an error if the worker is not in it).
struct Rejoin {
  static constexpr Type kType = kRejoin;
  std::uint64_t req = 0;
  std::uint64_t min_epoch = 0;
  void encode(wire::Encoder& e) const { e.u64(req).u64(min_epoch); }
  static Rejoin decode(wire::Decoder& d) { return {d.u64(), d.u64()}; }
};
struct KvSet {
  static constexpr Type kType = kKvSet;
  std::uint64_t req = 0;
  std::string key;
  wire::Bytes value;
  void encode(wire::Encoder& e) const { e.u64(req).str(key).bytes(value); }
  static KvSet decode(wire::Decoder& d) { return {d.u64(), d.str(), d.bytes()}; }
};
struct KvGet {
  static constexpr Type kType = kKvGet;
  std::uint64_t req = 0;
  std::string key;
  std::uint32_t timeout_ms = 0;
  void encode(wire::Encoder& e) const { e.u64(req).str(key).u32(timeout_ms); }
  static KvGet decode(wire::Decoder& d) { return {d.u64(), d.str(), d.u32()}; }
};
struct KvValue {
  static constexpr Type kType = kKvValue;
  std::uint64_t req = 0;
  wire::Bytes value;
  void encode(wire::Encoder& e) const { e.u64(req).bytes(value); }
  static KvValue decode(wire::Decoder& d) { return {d.u64(), d.bytes()}; }
};
struct Barrier {
  static constexpr Type kType = kBarrier;
  std::uint64_t req = 0;
  std::string name;
  std::uint32_t timeout_ms = 0;
  void encode(wire::Encoder& e) const { e.u64(req).str(name).u32(timeout_ms); }
  static Barrier decode(wire::Decoder& d) { return {d.u64(), d.str(), d.u32()}; }
};
struct Ok {
  static constexpr Type kType = kOk;
  std::uint64_t req = 0;
  void encode(wire::Encoder& e) const { e.u64(req); }
  static Ok decode(wire::Decoder& d) { return {d.u64()}; }
};
// checkpoint: the driver was told the job is being ended from outside (a scheduler's
// SIGTERM): rank 0 writes its next commit to the durable checkpoints, whatever their
// schedule. It concerns no epoch and interrupts nothing.
enum class NotifyKind : std::uint8_t { abort = 1, hosts_updated = 2, shutdown = 3, checkpoint = 4 };
struct Notify {
  static constexpr Type kType = kNotify;
  NotifyKind kind = NotifyKind::abort;
  std::uint64_t epoch = 0;
  std::string reason;
  void encode(wire::Encoder& e) const { e.u8(static_cast<std::uint8_t>(kind)).u64(epoch).str(reason); }
  static Notify decode(wire::Decoder& d);
};
struct Leave {
  static constexpr Type kType = kLeave;
  void encode(wire::Encoder&) const {}
  static Leave decode(wire::Decoder&) { return {}; }
};

// Rank 0's progress report (elasticrun::report): the step and its metrics as a JSON
// object of numbers, as text (the server checks it: rendezvous/metrics.h). Answered by a
// ReportReply with the driver's decision, or an Error.
struct Report {
  static constexpr Type kType = kReport;
  std::uint64_t req = 0;
  std::int64_t step = 0;
  std::string metrics;
  void encode(wire::Encoder& e) const { e.u64(req).u64(static_cast<std::uint64_t>(step)).str(metrics); }
  static Report decode(wire::Decoder& d) {
    Report r;
    r.req = d.u64();
    r.step = static_cast<std::int64_t>(d.u64());
    r.metrics = d.str();
    return r;
  }
};
// What the driver decided about a report: every rank of the job learns it at that step.
enum class Decision : std::uint8_t { keep_going = 0, stop = 1 };
struct ReportReply {
  static constexpr Type kType = kReportReply;
  std::uint64_t req = 0;
  Decision decision = Decision::keep_going;
  void encode(wire::Encoder& e) const { e.u64(req).u8(static_cast<std::uint8_t>(decision)); }
  static ReportReply decode(wire::Decoder& d);
};

// What a worker's durable checkpointing did (elasticrun --checkpoint-dir), for the driver's
// --events and its user; no reply. `path` is the checkpoint file; `detail` the error or
// the reason a file was skipped. `requested`: a save made because the driver asked for it
// (NotifyKind::checkpoint), not by the schedule.
enum class CheckpointEvent : std::uint8_t { saved = 1, restored = 2, skipped = 3, failed = 4 };
struct CheckpointNote {
  static constexpr Type kType = kCheckpointNote;
  CheckpointEvent event = CheckpointEvent::saved;
  std::uint64_t epoch = 0, commit = 0, bytes = 0;
  std::uint32_t millis = 0;
  std::string path, detail;
  bool requested = false;
  void encode(wire::Encoder& e) const {
    e.u8(static_cast<std::uint8_t>(event)).u64(epoch).u64(commit).u64(bytes).u32(millis).str(path).str(detail);
    e.u8(requested ? 1 : 0);
  }
  static CheckpointNote decode(wire::Decoder& d);
};

// A worker's elastic state finished a sync (State::sync, or the Python package's): from
// now on it holds the job's committed state, `commits` of them, and may be rank 0 of a
// later epoch that must carry that state on. No reply. Before this, a worker that joined
// holds only what it started with (cmd/controller.h: the holder rule).
struct Synced {
  static constexpr Type kType = kSynced;
  std::uint64_t commits = 0;
  void encode(wire::Encoder& e) const { e.u64(commits); }
  static Synced decode(wire::Decoder& d) { return {d.u64()}; }
};

// ---- driver <-> daemon ----
// The version of the driver-daemon protocol (Config, Spawn, ... Heartbeat). Ready and
// Config carry it, so that an elasticrun and an elasticrund of different versions refuse
// each other by name rather than as a malformed frame. 1: before it was sent (it ended
// both messages there); 2: heartbeats both ways; 3: torchrun's environment (Spawn's
// local_size, Exited's error file, ReservePort and PortReserved); 4: Config's preload
// (the fork server's modules); 5: torch's store hosted beside the workers (ReservePort's
// host_store, PortReserved's store); 6: preemption (Config's preempt_grace_ms, Preempted).
inline constexpr std::uint32_t kControlProtocol = 6;

// The protocol field has one encoding per version, so that one frame reads one way only
// (both messages are authenticated, and a receiver must not see what the sender did not
// send). Version 1 ended the message before the field: absent means 1, and an explicit
// 0 or 1 is malformed. For a later version than ours, the rest is that version's and is
// skipped: only its number is of use, and re-encoding such a message gives back the
// bytes up to and including the number (encode_protocol writes no field of ours after
// it).
inline std::uint32_t decode_protocol(wire::Decoder& d) {
  if (d.remaining() == 0) return 1;
  std::uint32_t v = d.u32();
  if (v < 2)
    throw wire::DecodeError("control protocol field " + std::to_string(v) + ": version 1 ends the message before it");
  if (v > kControlProtocol) d.skip_rest();
  return v;
}
// Writes the field as decode_protocol reads it; true when the fields of our version follow.
inline bool encode_protocol(wire::Encoder& e, std::uint32_t v) {
  if (v >= 2) e.u32(v);
  return v == kControlProtocol;
}

struct Config {
  static constexpr Type kType = kConfig;
  wire::Bytes secret;
  std::string rendezvous_addr, host, cwd;
  // Both ends send a heartbeat every heartbeat_ms; each takes the other for gone after
  // host_timeout_ms without a frame (elasticrun --host-timeout).
  std::uint32_t heartbeat_ms = 0, host_timeout_ms = 0;
  std::uint32_t protocol = kControlProtocol;  // sent right after cwd
  // Modules the daemon's fork server imports once, so that Python workers start as
  // forks of it (elasticrun --preload; daemon/fork_server.h); none: workers are exec'd.
  // Each a dotted module name (is_dotted_module_name), checked by the daemon.
  std::vector<std::string> preload;
  // How long the daemon keeps its workers after a SIGTERM of its own (a scheduler ending
  // the job or its node), having told the driver with Preempted, so that the job can
  // write a last checkpoint (elasticrun --preempt-grace); 0: it stops them at once.
  std::uint32_t preempt_grace_ms = 0;
  // Versions 2 and 3 end after the heartbeat settings, 4 and 5 after the preload: they
  // decode whole, so that the daemon refuses such a driver by its version's number, as
  // it does version 1.
  void encode(wire::Encoder& e) const {
    e.bytes(secret).str(rendezvous_addr).str(host).str(cwd);
    encode_protocol(e, protocol);
    if (protocol >= 2 && protocol <= kControlProtocol) e.u32(heartbeat_ms).u32(host_timeout_ms);
    if (protocol >= 4 && protocol <= kControlProtocol) e.strings(preload);
    if (protocol >= 6 && protocol <= kControlProtocol) e.u32(preempt_grace_ms);
  }
  static Config decode(wire::Decoder& d) {
    Config c{d.bytes(), d.str(), d.str(), d.str()};
    c.protocol = decode_protocol(d);
    if (c.protocol >= 2 && c.protocol <= kControlProtocol) c.heartbeat_ms = d.u32(), c.host_timeout_ms = d.u32();
    if (c.protocol >= 4 && c.protocol <= kControlProtocol) c.preload = d.strings();
    if (c.protocol >= 6 && c.protocol <= kControlProtocol) c.preempt_grace_ms = d.u32();
    return c;
  }
};
struct Spawn {
  static constexpr Type kType = kSpawn;
  std::uint32_t slot = 0;
  std::uint64_t epoch = 0;
  std::int32_t rank = 0, size = 0;
  std::vector<std::string> argv, env;  // env entries are KEY=VALUE
  // How many workers of this epoch run on the host (torchrun's LOCAL_WORLD_SIZE): the
  // daemon divides the host's cores by it for the default OMP_NUM_THREADS.
  std::int32_t local_size = 1;
  void encode(wire::Encoder& e) const {
    e.u32(slot).u64(epoch).i32(rank).i32(size).strings(argv).strings(env).i32(local_size);
  }
  static Spawn decode(wire::Decoder& d) {
    Spawn s;
    s.slot = d.u32(), s.epoch = d.u64(), s.rank = d.i32(), s.size = d.i32();
    s.argv = d.strings(), s.env = d.strings();
    s.local_size = d.i32();
    return s;
  }
};
inline constexpr std::uint32_t kAllSlots = 0xffffffffu;
struct Kill {
  static constexpr Type kType = kKill;
  std::uint32_t slot = kAllSlots;
  std::int32_t signal = 15;
  void encode(wire::Encoder& e) const { e.u32(slot).i32(signal); }
  static Kill decode(wire::Decoder& d) { return {d.u32(), d.i32()}; }
};
struct Shutdown {
  static constexpr Type kType = kShutdown;
  std::uint32_t grace_ms = 2000;
  void encode(wire::Encoder& e) const { e.u32(grace_ms); }
  static Shutdown decode(wire::Decoder& d) { return {d.u32()}; }
};
struct Ready {
  static constexpr Type kType = kReady;
  std::uint32_t pid = 0;
  std::string hostname;
  std::uint32_t protocol = kControlProtocol;
  void encode(wire::Encoder& e) const {
    e.u32(pid).str(hostname);
    encode_protocol(e, protocol);
  }
  static Ready decode(wire::Decoder& d) {
    Ready r{d.u32(), d.str()};
    r.protocol = decode_protocol(d);
    return r;
  }
};
struct Started {
  static constexpr Type kType = kStarted;
  std::uint32_t slot = 0, pid = 0;
  void encode(wire::Encoder& e) const { e.u32(slot).u32(pid); }
  static Started decode(wire::Decoder& d) { return {d.u32(), d.u32()}; }
};
struct Output {
  static constexpr Type kType = kOutput;
  std::uint32_t slot = 0;
  std::uint8_t stream = 1;  // 1 stdout, 2 stderr
  wire::Bytes data;
  void encode(wire::Encoder& e) const { e.u32(slot).u8(stream).bytes(data); }
  static Output decode(wire::Decoder& d) { return {d.u32(), d.u8(), d.bytes()}; }
};
// A worker's end. `error_file` is what it wrote to its TORCHELASTIC_ERROR_FILE (torch's
// @record: JSON with the exception and traceback), when it failed and the file held at
// most kMaxErrorFile bytes; `error_file_size` is the file's size (0: none), so that a
// larger one is reported without being sent.
struct Exited {
  static constexpr Type kType = kExited;
  std::uint32_t slot = 0, pid = 0;
  std::int32_t code = 0, signal = 0;  // signal != 0: killed by it
  std::string error_file;
  std::uint64_t error_file_size = 0;
  void encode(wire::Encoder& e) const { e.u32(slot).u32(pid).i32(code).i32(signal).str(error_file).u64(error_file_size); }
  static Exited decode(wire::Decoder& d) {
    Exited x{d.u32(), d.u32(), d.i32(), d.i32()};
    x.error_file = d.str();
    x.error_file_size = d.u64();
    return x;
  }
};
inline constexpr std::size_t kMaxErrorFile = 64 * 1024;
struct SpawnFailed {
  static constexpr Type kType = kSpawnFailed;
  std::uint32_t slot = 0;
  std::string message;
  void encode(wire::Encoder& e) const { e.u32(slot).str(message); }
  static SpawnFailed decode(wire::Decoder& d) { return {d.u32(), d.str()}; }
};

// Both ways between driver and daemon, every Config::heartbeat_ms. A side that hears
// nothing from the other for Config::host_timeout_ms takes it for gone: a cut link that
// never comes back shows no error anywhere, and a stopped process still has its
// kernel answer TCP keep-alives. The daemon then stops its workers; the driver fails
// the host's workers. Before the config arrives, a daemon waits kConfigTimeout.
// Also from a joined worker to the rendezvous server, every JoinOk::heartbeat_ms.
struct Heartbeat {
  static constexpr Type kType = kHeartbeat;
  void encode(wire::Encoder&) const {}
  static Heartbeat decode(wire::Decoder&) { return {}; }
};
inline constexpr std::chrono::seconds kConfigTimeout{30};

// Driver to the daemon of rank 0's host, before the workers of `epoch` start: reserve a
// TCP port free on this host for the epoch's MASTER_PORT. The daemon binds one (port 0,
// SO_REUSEADDR, not listening, so that nothing else is given it while torch's TCPStore
// of rank 0 can still listen on it), keeps it bound until the next reservation or its
// end, and answers with PortReserved: the port, or why there is none (port 0).
// With host_store (restart mode), the daemon also starts torch's TCPStore server on the
// port if it can (its fork server runs: elasticrun --preload), as torchrun's agent
// does, and answers once the store listens, so that no worker finds it not listening
// yet; PortReserved's store says whether it did (the workers then get
// TORCHELASTIC_USE_AGENT_STORE=True).
struct ReservePort {
  static constexpr Type kType = kReservePort;
  std::uint64_t epoch = 0;
  bool host_store = false;
  void encode(wire::Encoder& e) const { e.u64(epoch).u8(host_store ? 1 : 0); }
  static ReservePort decode(wire::Decoder& d);
};
struct PortReserved {
  static constexpr Type kType = kPortReserved;
  std::uint64_t epoch = 0;
  std::uint32_t port = 0;
  std::string error;
  bool store = false;  // torch's store listens on the port (only with a port)
  void encode(wire::Encoder& e) const { e.u64(epoch).u32(port).str(error).u8(store ? 1 : 0); }
  static PortReserved decode(wire::Decoder& d);
};
// Daemon to driver: the daemon got `signal` (SIGTERM: a scheduler ending the job, the
// node or the pod) and keeps its workers for Config::preempt_grace_ms, unless the
// driver stops them sooner. The driver asks for a last checkpoint.
struct Preempted {
  static constexpr Type kType = kPreempted;
  std::int32_t signal = 15;
  void encode(wire::Encoder& e) const { e.i32(signal); }
  static Preempted decode(wire::Decoder& d) { return {d.i32()}; }
};
// The longest Config::preempt_grace_ms a daemon accepts.
inline constexpr std::uint32_t kMaxPreemptGraceMs = 3600u * 1000u;

// The accepted range of Config's two settings.
inline constexpr std::uint32_t kMinHeartbeatMs = 50, kMaxHostTimeoutMs = 86400u * 1000u;

template <class M>
Frame to_frame(const M& m) {
  wire::Encoder e;
  m.encode(e);
  return Frame{M::kType, e.take()};
}

// Decodes a whole frame as M; throws wire::DecodeError on a wrong type or bad payload.
template <class M>
M parse(const Frame& f) {
  if (f.type != M::kType) throw wire::DecodeError(type_mismatch(M::kType, f.type));
  wire::Decoder d(f.payload);
  M m = M::decode(d);
  d.finish();
  return m;
}

std::string type_mismatch(std::uint8_t want, std::uint8_t got);
const char* type_name(std::uint8_t type);

}  // namespace elasticrun::msg
