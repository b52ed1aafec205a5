// Durable checkpoints of an elastic State: one file per checkpoint, in the directory of
// ELASTICRUN_CHECKPOINT_DIR (elasticrun --checkpoint-dir).
//
// A file is named commit-<20 digits>.ckpt after the commit it holds and is laid out as
//   "ERCKPT1\n"                 8 bytes, the format
//   u64 manifest length         little-endian, like every number here
//   manifest                    kind, epoch, commit, the items (name, type, bytes), the
//                               payload's size and xxh3-64 checksum, who wrote it and when
//   payload                     the items' bytes in order
//   u64 xxh3-64                 of everything before it (format, length and manifest)
// A reader trusts nothing: a file shorter or longer than its lengths say, a checksum
// that does not match, a manifest that does not decode or whose sizes disagree, is
// rejected with the reason, and the loader goes on to the next older file. Nothing ever
// loads garbage.
//
// A writer writes to a temporary name in the same directory, fsyncs it, renames it to
// its final name and fsyncs the directory; only then are older checkpoints removed, all
// but the newest `keep` (so the previous good one stays until the new one is complete).
#pragma once

#include "common/result.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace elasticrun::collective::checkpoint {

struct Item {
  std::string name;
  std::uint32_t type = 0;  // elasticrun::DataType
  std::uint64_t bytes = 0;
  bool operator==(const Item&) const = default;
};

struct Manifest {
  // "state": a C++ State's items; "python": one pickled Python state (elasticrun.elastic).
  std::string kind = "state";
  std::uint64_t epoch = 0, commit = 0;
  std::vector<Item> items;
  std::uint64_t payload_bytes = 0;
  std::uint64_t payload_xxh3 = 0;
  // For people: where and when it was written.
  std::string host;
  std::uint32_t pid = 0;
  std::uint64_t unix_ms = 0;
};

struct Loaded {
  Manifest manifest;
  std::vector<std::byte> payload;
  std::string path;
};

// "commit-00000000000000000042.ckpt"; the commit of such a name, or nullopt.
std::string file_name(std::uint64_t commit);
std::optional<std::uint64_t> commit_of(const std::string& name);

// The file's bytes for `m` and `payload` (m's payload size and checksum are filled in).
std::vector<std::byte> encode(Manifest m, std::span<const std::byte> payload);
// Checks and decodes a whole file's bytes.
Result<Loaded> decode(std::span<const std::byte> file);

// Writes a checkpoint as described above and removes all but the newest `keep`
// checkpoints. Returns the path, or the step that failed with its errno text.
Result<std::string> write(const std::string& dir, const Manifest& m, std::span<const std::byte> payload,
                          std::size_t keep = 2);
Result<Loaded> read(const std::string& path);

// The checkpoint files in `dir`, newest commit first (temporary files are not listed).
std::vector<std::pair<std::uint64_t, std::string>> list(const std::string& dir);

struct Newest {
  std::optional<Loaded> loaded;                           // the newest intact one, if any
  std::vector<std::pair<std::string, std::string>> skipped;  // newer ones rejected: path, why
};
Newest newest(const std::string& dir);

}  // namespace elasticrun::collective::checkpoint
