#include "common/messages.h"

#include <fmt/format.h>

namespace elasticrun::msg {

namespace {

// One byte naming a value of enum E, which must lie in [lo, hi].
template <class E>
E enum_in(wire::Decoder& d, unsigned lo, unsigned hi, const char* what) {
  std::uint8_t v = d.u8();
  if (v < lo || v > hi) throw wire::DecodeError(fmt::format("unknown {} {}", what, v));
  return static_cast<E>(v);
}

bool flag(wire::Decoder& d, const char* what) {
  std::uint8_t v = d.u8();
  if (v > 1) throw wire::DecodeError(fmt::format("{}: flag {} is neither 0 nor 1", what, v));
  return v == 1;
}

}  // namespace

Notify Notify::decode(wire::Decoder& d) {
  Notify n;
  n.kind = enum_in<NotifyKind>(d, 1, 4, "notification kind");
  n.epoch = d.u64();
  n.reason = d.str();
  return n;
}

ReportReply ReportReply::decode(wire::Decoder& d) {
  ReportReply r;
  r.req = d.u64();
  r.decision = enum_in<Decision>(d, 0, 1, "report decision");
  return r;
}

CheckpointNote CheckpointNote::decode(wire::Decoder& d) {
  CheckpointNote n;
  n.event = enum_in<CheckpointEvent>(d, 1, 4, "checkpoint event");
  n.epoch = d.u64();
  n.commit = d.u64();
  n.bytes = d.u64();
  n.millis = d.u32();
  n.path = d.str();
  n.detail = d.str();
  n.requested = flag(d, "checkpoint note");
  return n;
}

ReservePort ReservePort::decode(wire::Decoder& d) {
  ReservePort r;
  r.epoch = d.u64();
  r.host_store = flag(d, "reserve port");
  return r;
}

PortReserved PortReserved::decode(wire::Decoder& d) {
  PortReserved r;
  r.epoch = d.u64();
  r.port = d.u32();
  r.error = d.str();
  r.store = flag(d, "port reserved");
  if (r.port > 65535) throw wire::DecodeError(fmt::format("port {} out of range", r.port));
  if ((r.port == 0) == r.error.empty()) throw wire::DecodeError("a port reservation has a port or an error, one of them");
  if (r.store && r.port == 0) throw wire::DecodeError("a store without a port");
  return r;
}

const char* type_name(std::uint8_t type) {
  switch (type) {
    case kHello: return "hello";
    case kAuth: return "auth";
    case kAuthOk: return "auth-ok";
    case kError: return "error";
    case kJoin: return "join";
    case kJoinOk: return "join-ok";
    case kKvSet: return "kv-set";
    case kKvGet: return "kv-get";
    case kKvValue: return "kv-value";
    case kBarrier: return "barrier";
    case kOk: return "ok";
    case kNotify: return "notify";
    case kLeave: return "leave";
    case kRejoin: return "rejoin";
    case kReport: return "report";
    case kReportReply: return "report-reply";
    case kCheckpointNote: return "checkpoint-note";
    case kSynced: return "synced";
    case kConfig: return "config";
    case kSpawn: return "spawn";
    case kKill: return "kill";
    case kShutdown: return "shutdown";
    case kReady: return "ready";
    case kStarted: return "started";
    case kOutput: return "output";
    case kExited: return "exited";
    case kSpawnFailed: return "spawn-failed";
    case kHeartbeat: return "heartbeat";
    case kReservePort: return "reserve-port";
    case kPortReserved: return "port-reserved";
    case kPreempted: return "preempted";
    default: return "unknown";
  }
}

std::string type_mismatch(std::uint8_t want, std::uint8_t got) {
  return fmt::format("expected a {} frame, got {} (type {})", type_name(want), type_name(got), got);
}

}  // namespace elasticrun::msg
