// libFuzzer target: the control-connection byte stream, as a peer (authenticated or
// not) can send it. FrameParser::feed() with arbitrary chunking, then msg::parse<M> on
// each whole frame, for every message type of common/messages.h.
//
// Input layout:  byte 0  flags: bit 7 = small payload limit (64 bytes) instead of 16 MiB,
//                               bits 0..5 = largest chunk size - 1 (1..64 bytes)
//                byte 1  seed for the chunk sizes; also a frame type (see the end)
//                rest    the stream
//
// Properties checked (any violation aborts, which libFuzzer reports as a crash):
//  - feeding in chunks yields the same frames and the same verdict as feeding it whole;
//  - the frames, re-encoded, are exactly the bytes they were parsed from;
//  - msg::parse<M> for the frame's type either returns or throws wire::DecodeError
//    (anything else escapes and is reported); when it returns, to_frame(m) reproduces
//    the frame byte for byte (one frame reads one way only); parse<M> of another type
//    always throws DecodeError. The one exception by design: a message of a later
//    control protocol than ours (Config, Ready) reads as its number, the rest skipped;
//    its re-encoding is then the frame's bytes up to and including that number, and
//    decodes to the same number.
#include "common/frame.h"
#include "common/messages.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

using namespace elasticrun;

namespace {

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "frame_fuzz: property violated: %s\n", what);
  std::abort();
}

struct Outcome {
  std::vector<Frame> frames;
  bool failed = false;
};

Outcome run_parser(std::span<const std::uint8_t> stream, std::uint32_t max_payload, std::size_t max_chunk,
                   std::uint8_t seed) {
  Outcome out;
  FrameParser p(max_payload);
  std::size_t off = 0;
  std::uint32_t rng = seed * 2654435761u + 1;
  while (off < stream.size()) {
    std::size_t n = stream.size() - off;
    if (max_chunk > 0) {
      rng = rng * 1103515245u + 12345u;
      n = std::min(n, static_cast<std::size_t>((rng >> 16) % max_chunk) + 1);
    }
    auto ok = p.feed(stream.subspan(off, n));
    off += n;
    while (p.has_frame()) out.frames.push_back(p.pop());
    if (!ok) {
      if (ok.error().empty()) violated("empty error message");
      out.failed = true;
      break;  // the connection closes
    }
  }
  // feed() of nothing must be harmless at any point.
  if (!out.failed) {
    if (!p.feed({})) violated("empty feed failed");
    if (p.has_frame()) violated("empty feed produced a frame");
  }
  return out;
}

template <class M>
void try_parse(const Frame& f) {
  M m;
  try {
    m = msg::parse<M>(f);
  } catch (const wire::DecodeError&) {
    return;
  }
  if (f.type != M::kType) violated("parse accepted a frame of another type");
  Frame again = msg::to_frame(m);
  if (again.type != f.type) violated("encode(decode(x)) changed the type");
  if constexpr (requires { m.protocol; }) {
    if (m.protocol > msg::kControlProtocol) {
      if (again.payload.size() > f.payload.size() ||
          !std::equal(again.payload.begin(), again.payload.end(), f.payload.begin()))
        violated("a later protocol's message does not re-encode to a prefix of itself");
      if (msg::parse<M>(again).protocol != m.protocol) violated("a later protocol's number changed on re-encoding");
      return;
    }
  }
  if (again.payload != f.payload) violated("encode(decode(x)) != x");
}

// The decoder of the frame's own type (what a receiver would call), and one of another
// type, which must refuse it. Calling every decoder on every frame would spend most of the time
// unwinding type-mismatch exceptions.
void parse_all(const Frame& f) {
  switch (f.type) {
    case msg::kHello: try_parse<msg::Hello>(f); break;
    case msg::kAuth: try_parse<msg::Auth>(f); break;
    case msg::kAuthOk: try_parse<msg::AuthOk>(f); break;
    case msg::kError: try_parse<msg::Error>(f); break;
    case msg::kJoin: try_parse<msg::Join>(f); break;
    case msg::kJoinOk: try_parse<msg::JoinOk>(f); break;
    case msg::kKvSet: try_parse<msg::KvSet>(f); break;
    case msg::kKvGet: try_parse<msg::KvGet>(f); break;
    case msg::kKvValue: try_parse<msg::KvValue>(f); break;
    case msg::kBarrier: try_parse<msg::Barrier>(f); break;
    case msg::kOk: try_parse<msg::Ok>(f); break;
    case msg::kNotify: try_parse<msg::Notify>(f); break;
    case msg::kLeave: try_parse<msg::Leave>(f); break;
    case msg::kRejoin: try_parse<msg::Rejoin>(f); break;
    case msg::kReport: try_parse<msg::Report>(f); break;
    case msg::kReportReply: try_parse<msg::ReportReply>(f); break;
    case msg::kCheckpointNote: try_parse<msg::CheckpointNote>(f); break;
    case msg::kSynced: try_parse<msg::Synced>(f); break;
    case msg::kConfig: try_parse<msg::Config>(f); break;
    case msg::kSpawn: try_parse<msg::Spawn>(f); break;
    case msg::kKill: try_parse<msg::Kill>(f); break;
    case msg::kShutdown: try_parse<msg::Shutdown>(f); break;
    case msg::kReady: try_parse<msg::Ready>(f); break;
    case msg::kStarted: try_parse<msg::Started>(f); break;
    case msg::kOutput: try_parse<msg::Output>(f); break;
    case msg::kExited: try_parse<msg::Exited>(f); break;
    case msg::kSpawnFailed: try_parse<msg::SpawnFailed>(f); break;
    case msg::kHeartbeat: try_parse<msg::Heartbeat>(f); break;
    case msg::kReservePort: try_parse<msg::ReservePort>(f); break;
    case msg::kPortReserved: try_parse<msg::PortReserved>(f); break;
    case msg::kPreempted: try_parse<msg::Preempted>(f); break;
    default: break;
  }
  if (f.type == msg::kLeave) try_parse<msg::Ok>(f);
  else try_parse<msg::Leave>(f);  // accepts an empty payload, so the type check must refuse
  // The name used in logs must be total.
  if (msg::type_name(f.type) == nullptr) violated("type_name returned null");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::uint8_t flags = data[0], seed = data[1];
  const std::uint32_t max_payload = (flags & 0x80) ? 64 : kMaxFramePayload;
  const std::size_t max_chunk = (flags & 0x3f) + 1;
  std::span<const std::uint8_t> stream(data + 2, size - 2);

  Outcome whole = run_parser(stream, max_payload, 0, seed);
  Outcome chunked = run_parser(stream, max_payload, max_chunk, seed);
  if (whole.failed != chunked.failed) violated("chunking changed the verdict");
  if (whole.frames.size() != chunked.frames.size()) violated("chunking changed the frame count");
  for (std::size_t i = 0; i < whole.frames.size(); ++i)
    if (whole.frames[i].type != chunked.frames[i].type || whole.frames[i].payload != chunked.frames[i].payload)
      violated("chunking changed a frame");

  // The frames are a prefix of the stream, byte for byte.
  std::size_t off = 0;
  for (const Frame& f : whole.frames) {
    if (f.payload.size() > max_payload) violated("frame over the payload limit");
    wire::Bytes enc = encode_frame(f);
    if (enc.size() > stream.size() - off || std::memcmp(enc.data(), stream.data() + off, enc.size()) != 0)
      violated("frame does not re-encode to its bytes");
    off += enc.size();
  }
  if (whole.failed) {
    // The verdict is about the header right after the last whole frame.
    if (stream.size() - off < kFrameHeader) violated("failed without a whole bad header");
    std::span<const std::uint8_t, kFrameHeader> h(stream.data() + off, kFrameHeader);
    if (decode_header(h, max_payload)) violated("failed on a good header");
  }

  for (const Frame& f : whole.frames) parse_all(f);
  // The message decoders once more, straight on the stream as a payload of type byte 1,
  // so that they see inputs without first having to grow a valid header.
  parse_all(Frame{seed, wire::Bytes(stream.begin(), stream.end())});
  return 0;
}
