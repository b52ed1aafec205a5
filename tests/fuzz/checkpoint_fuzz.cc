// libFuzzer target: a durable checkpoint file's bytes (collective/src/control/
// checkpoint_file.h), which a worker reads back from disk after a crash, a torn write or
// a corruption: nothing read may be trusted.
//
// The first byte chooses a mode: even, the rest is the file as it is; odd, the rest is a
// file whose trailer (the checksum of the header and manifest) is recomputed first, so
// that the manifest decoder and the size checks behind that checksum are explored too.
//
// Properties checked (any violation aborts):
//  - decode returns or fails with a non-empty reason; nothing escapes;
//  - what it accepts is exactly what encode writes for the decoded manifest and payload
//    (one file, one meaning), with the payload's size and the items' sizes agreeing.
#include "control/checkpoint_file.h"

#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace elasticrun::collective;

namespace {

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "checkpoint_fuzz: property violated: %s\n", what);
  std::abort();
}

// The trailer of a file whose manifest length fits: xxh3 of the 16-byte head and manifest.
void fix_trailer(std::vector<std::byte>& f) {
  if (f.size() < 24) return;
  std::uint64_t mlen = 0;
  std::memcpy(&mlen, f.data() + 8, 8);  // little-endian hosts only, as the fuzzer runs here
  if (mlen > f.size() - 24) return;
  std::uint64_t sum = XXH3_64bits(f.data(), 16 + mlen);
  std::memcpy(f.data() + f.size() - 8, &sum, 8);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::vector<std::byte> file(reinterpret_cast<const std::byte*>(data) + 1, reinterpret_cast<const std::byte*>(data) + size);
  if (data[0] & 1) fix_trailer(file);
  auto l = checkpoint::decode(file);
  if (!l) {
    if (l.error().empty()) violated("a rejection without a reason");
    return 0;
  }
  const auto& m = l->manifest;
  if (l->payload.size() != m.payload_bytes) violated("payload size differs from the manifest's");
  std::uint64_t sum = 0;
  for (const auto& it : m.items) sum += it.bytes;
  if (sum != m.payload_bytes) violated("items do not add up to the payload");
  if (checkpoint::encode(m, l->payload) != file) violated("accepted bytes are not what encode writes for them");
  return 0;
}
