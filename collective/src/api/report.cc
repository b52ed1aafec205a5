#include "api/report.h"

#include <cmath>
#include <cstdio>
#include <exception>

namespace elasticrun {
namespace {

// What rank 0 broadcasts: the decision (msg::Decision's values), or the kind of error
// that ended its part.
enum Outcome : std::uint8_t {
  kKeepGoing = 0,
  kStop = 1,
  kError = 2,
  kWorkersFailed = 3,
  kHostsUpdated = 4,
  kTimeout = 5,
  kProtocol = 6,
};

void append_escaped(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// The outcome for an error of rank 0's part, most specific kind first.
Outcome outcome_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const WorkersFailed&) {
    return kWorkersFailed;
  } catch (const HostsUpdated&) {
    return kHostsUpdated;
  } catch (const TimeoutError&) {
    return kTimeout;
  } catch (const ProtocolError&) {
    return kProtocol;
  } catch (...) {
    return kError;
  }
}

[[noreturn]] void throw_outcome(std::uint8_t o) {
  const std::string why = "report: rank 0 could not report";
  switch (o) {
    case kWorkersFailed: throw WorkersFailed(why + " (workers failed)");
    case kHostsUpdated: throw HostsUpdated(why + " (hosts updated)");
    case kTimeout: throw TimeoutError(why + " (timed out waiting for the driver's decision)");
    case kProtocol: throw ProtocolError(why + " (protocol error)");
    case kError: throw Error(why);
    default: throw ProtocolError("report: rank 0 sent an unknown outcome " + std::to_string(o));
  }
}

}  // namespace

std::string metrics_json(const Metrics& metrics) {
  std::string out = "{";
  for (const auto& [name, value] : metrics) {
    if (name.empty()) throw Error("report: a metric has an empty name");
    if (!std::isfinite(value)) throw Error("report: metric '" + name + "' is not finite");
    if (out.size() > 1) out += ',';
    append_escaped(out, name);
    char buf[32];
    std::snprintf(buf, sizeof buf, ":%.17g", value);
    out += buf;
  }
  return out + "}";
}

msg::Decision report_collective(Communicator& comm, const std::function<msg::Decision()>& ask) {
  std::uint8_t outcome = kKeepGoing;
  std::exception_ptr failed;
  if (comm.rank() == 0) {
    try {
      outcome = static_cast<std::uint8_t>(ask());
    } catch (...) {
      failed = std::current_exception();
      outcome = outcome_of(failed);
    }
  }
  try {
    comm.broadcast(&outcome, 1, DataType::u8, 0);
  } catch (...) {
    // The broadcast failed too (a peer lost, the epoch aborted): rank 0's own error
    // says more, if it has one.
    if (failed) std::rethrow_exception(failed);
    throw;
  }
  if (failed) std::rethrow_exception(failed);
  if (outcome == kKeepGoing) return msg::Decision::keep_going;
  if (outcome == kStop) return msg::Decision::stop;
  throw_outcome(outcome);
}

}  // namespace elasticrun
