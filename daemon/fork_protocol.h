// What the daemon and its fork server (fork_server.py) say to each other over their
// Unix stream socket: frames of common/frame.h, payloads in common/wire.h's encoding
// (fork_server.py encodes and decodes the same layouts with struct).
//
//   daemon -> server  Spawn    one worker, with its stdout and stderr write ends
//                              attached (SCM_RIGHTS, that order) to the frame's bytes
//   server -> daemon  Ready    the modules are imported: requests are served
//                     Started  forked: the worker's pid, which is its process group
//                     Refused  not forked (why): the daemon starts this worker itself
//                     Exited   a worker's raw wait status, once it was reaped
//                     Failed   the server gives up (why) and exits
//
// The server is a child of the daemon running the job's interpreter and whatever the
// job preloads into it: its frames are decoded as untrusted input (wire::DecodeError),
// and one that does not decode counts as the server failing.
#pragma once

#include "common/frame.h"
#include "common/wire.h"

#include <cstdint>
#include <string>
#include <vector>

namespace elasticrun::daemon::fork {

enum Type : std::uint8_t { kSpawn = 1, kReady, kStarted, kRefused, kExited, kFailed };

// How the worker enters Python (PythonCommand::Mode): a script's path, a module's name,
// or code, in `target`; `args` are sys.argv[1:]; `argv` the whole command line as the
// daemon would exec it (for sys.orig_argv and the process's title).
struct Spawn {
  static constexpr Type kType = kSpawn;
  std::uint64_t id = 0;
  std::uint8_t mode = 0;  // 0 script, 1 module, 2 code
  std::string target;
  std::vector<std::string> args, argv, env;
  std::string cwd;
  void encode(wire::Encoder& e) const { e.u64(id).u8(mode).str(target).strings(args).strings(argv).strings(env).str(cwd); }
};
struct Ready {
  static constexpr Type kType = kReady;
  static Ready decode(wire::Decoder&) { return {}; }
};
struct Started {
  static constexpr Type kType = kStarted;
  std::uint64_t id = 0;
  std::uint32_t pid = 0;
  static Started decode(wire::Decoder& d) { return {d.u64(), d.u32()}; }
};
struct Refused {
  static constexpr Type kType = kRefused;
  std::uint64_t id = 0;
  std::string reason;
  static Refused decode(wire::Decoder& d) { return {d.u64(), d.str()}; }
};
struct Exited {
  static constexpr Type kType = kExited;
  std::uint32_t pid = 0;
  std::int32_t status = 0;
  static Exited decode(wire::Decoder& d) { return {d.u32(), d.i32()}; }
};
struct Failed {
  static constexpr Type kType = kFailed;
  std::string reason;
  static Failed decode(wire::Decoder& d) { return {d.str()}; }
};

// Decodes a whole frame as M; throws wire::DecodeError on a bad payload.
template <class M>
M parse(const Frame& f) {
  wire::Decoder d(f.payload);
  M m = M::decode(d);
  d.finish();
  return m;
}

}  // namespace elasticrun::daemon::fork
