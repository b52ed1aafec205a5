#include "control/checkpoint_file.h"

#include "common/wire.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>

namespace elasticrun::collective::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'E', 'R', 'C', 'K', 'P', 'T', '1', '\n'};
constexpr std::size_t kHead = 16;                   // magic + manifest length
constexpr std::size_t kTrailer = 8;                 // xxh3 of the head and manifest
constexpr std::uint64_t kMaxManifest = 64 << 20;    // far more than any item list
constexpr std::uint32_t kMaxItems = 1 << 20;
// A temporary file not touched for this long belongs to a writer that died.
constexpr auto kStaleTemporary = std::chrono::minutes(10);

std::string errno_text(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

void put_u64(std::vector<std::byte>& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
}
std::uint64_t get_u64(std::span<const std::byte> b) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(b[i]) << (8 * i);
  return v;
}

std::uint64_t xxh3(std::span<const std::byte> b) { return XXH3_64bits(b.data(), b.size()); }

// The format, the manifest's length and the manifest; the trailer is xxh3 of these.
std::vector<std::byte> head_of(const Manifest& m) {
  wire::Encoder e;
  e.str(m.kind).u64(m.epoch).u64(m.commit).u32(static_cast<std::uint32_t>(m.items.size()));
  for (const Item& it : m.items) e.str(it.name).u32(it.type).u64(it.bytes);
  e.u64(m.payload_bytes).u64(m.payload_xxh3).str(m.host).u32(m.pid).u64(m.unix_ms);
  const auto& man = e.buffer();
  std::vector<std::byte> out;
  out.reserve(kHead + man.size() + kTrailer);
  for (char c : kMagic) out.push_back(static_cast<std::byte>(c));
  put_u64(out, man.size());
  for (auto c : man) out.push_back(static_cast<std::byte>(c));
  return out;
}

Manifest decode_manifest(std::span<const std::byte> b) {
  wire::Decoder d({reinterpret_cast<const std::uint8_t*>(b.data()), b.size()});
  Manifest m;
  m.kind = d.str();
  m.epoch = d.u64();
  m.commit = d.u64();
  std::uint32_t n = d.u32();
  if (n > kMaxItems) throw wire::DecodeError(std::to_string(n) + " items");
  for (std::uint32_t i = 0; i < n; ++i) {
    Item it;
    it.name = d.str();
    it.type = d.u32();
    it.bytes = d.u64();
    m.items.push_back(std::move(it));
  }
  m.payload_bytes = d.u64();
  m.payload_xxh3 = d.u64();
  m.host = d.str();
  m.pid = d.u32();
  m.unix_ms = d.u64();
  d.finish();
  return m;
}

bool write_all(int fd, std::span<const std::byte> b) {
  while (!b.empty()) {
    ssize_t n = ::write(fd, b.data(), b.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    b = b.subspan(static_cast<std::size_t>(n));
  }
  return true;
}

Result<void> fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fail(errno_text("cannot open the directory", dir));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  errno = err;
  if (rc != 0) return fail(errno_text("cannot fsync the directory", dir));
  return {};
}

std::string temporary_name(std::uint64_t commit) {
  std::random_device rd;
  char buf[96];
  std::snprintf(buf, sizeof buf, ".%s.tmp-%d-%u", file_name(commit).c_str(), static_cast<int>(::getpid()),
                static_cast<unsigned>(rd() % 1000000));
  return buf;
}

// Removes every checkpoint but the newest `keep`, and temporary files of dead writers.
void prune(const std::string& dir, std::size_t keep) {
  auto files = list(dir);
  std::error_code ec;
  for (std::size_t i = keep; i < files.size(); ++i) fs::remove(files[i].second, ec);
  auto now = fs::file_time_type::clock::now();
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(".commit-", 0) != 0 || name.find(".tmp-") == std::string::npos) continue;
    auto t = fs::last_write_time(e.path(), ec);
    if (!ec && now - t > kStaleTemporary) fs::remove(e.path(), ec);
  }
}

}  // namespace

std::string file_name(std::uint64_t commit) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "commit-%020llu.ckpt", static_cast<unsigned long long>(commit));
  return buf;
}

std::optional<std::uint64_t> commit_of(const std::string& name) {
  constexpr std::string_view prefix = "commit-", suffix = ".ckpt";
  if (name.size() != prefix.size() + 20 + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  std::string digits = name.substr(prefix.size(), 20);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  errno = 0;
  unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
  if (errno == ERANGE) return std::nullopt;
  return static_cast<std::uint64_t>(v);
}

std::vector<std::byte> encode(Manifest m, std::span<const std::byte> payload) {
  m.payload_bytes = payload.size();
  m.payload_xxh3 = xxh3(payload);
  auto out = head_of(m);
  std::uint64_t sum = xxh3(out);
  out.insert(out.end(), payload.begin(), payload.end());
  put_u64(out, sum);
  return out;
}

Result<Loaded> decode(std::span<const std::byte> file) {
  if (file.size() < kHead + kTrailer) return fail("truncated: " + std::to_string(file.size()) + " bytes");
  if (std::memcmp(file.data(), kMagic, sizeof kMagic) != 0) return fail("not a checkpoint file (no ERCKPT1 header)");
  std::uint64_t mlen = get_u64(file.subspan(8));
  if (mlen > kMaxManifest || mlen > file.size() - kHead - kTrailer)
    return fail("truncated or corrupted: its manifest length " + std::to_string(mlen) + " does not fit its " +
                std::to_string(file.size()) + " bytes");
  Loaded l;
  try {
    l.manifest = decode_manifest(file.subspan(kHead, mlen));
  } catch (const wire::DecodeError& e) {
    return fail(std::string("corrupted: malformed manifest (") + e.what() + ")");
  }
  const Manifest& m = l.manifest;
  std::uint64_t room = file.size() - kHead - mlen - kTrailer;
  if (m.payload_bytes != room)
    return fail("truncated or corrupted: " + std::to_string(room) + " payload bytes, its manifest says " +
                std::to_string(m.payload_bytes));
  if (xxh3(file.first(kHead + mlen)) != get_u64(file.subspan(file.size() - kTrailer)))
    return fail("corrupted: the manifest's checksum does not match");
  std::uint64_t sum = 0;
  for (const Item& it : m.items) {
    if (it.bytes > m.payload_bytes - sum) return fail("corrupted: its items are larger than its payload");
    sum += it.bytes;
  }
  if (sum != m.payload_bytes) return fail("corrupted: its items do not add up to its payload");
  auto payload = file.subspan(kHead + mlen, m.payload_bytes);
  if (xxh3(payload) != m.payload_xxh3) return fail("corrupted: the payload's checksum does not match");
  l.payload.assign(payload.begin(), payload.end());
  return l;
}

Result<std::string> write(const std::string& dir, const Manifest& man, std::span<const std::byte> payload,
                          std::size_t keep) {
  Manifest m = man;
  m.payload_bytes = payload.size();
  m.payload_xxh3 = xxh3(payload);
  auto head = head_of(m);
  std::vector<std::byte> trailer;
  put_u64(trailer, xxh3(head));
  std::string tmp = dir + "/" + temporary_name(m.commit);
  std::string path = dir + "/" + file_name(m.commit);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return fail(errno_text("cannot create", tmp));
  bool ok = write_all(fd, head) && write_all(fd, payload) && write_all(fd, trailer);
  std::string err = ok ? "" : errno_text("cannot write", tmp);
  if (ok && ::fsync(fd) != 0) err = errno_text("cannot fsync", tmp), ok = false;
  ::close(fd);
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno_text("cannot rename to", path), ok = false;
  if (!ok) {
    ::unlink(tmp.c_str());
    return fail(err);
  }
  if (auto r = fsync_dir(dir); !r) return fail(r.error());
  prune(dir, std::max<std::size_t>(keep, 1));
  return path;
}

Result<Loaded> read(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(errno_text("cannot open", path));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return fail(errno_text("cannot stat", path));
  }
  std::vector<std::byte> file(static_cast<std::size_t>(st.st_size));
  std::size_t at = 0;
  while (at < file.size()) {
    ssize_t n = ::read(fd, file.data() + at, file.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    at += static_cast<std::size_t>(n);
  }
  ::close(fd);
  file.resize(at);  // shorter than stat said: it is checked as the bytes there are
  auto l = decode(file);
  if (!l) return std::move(l).context(path);
  l->path = path;
  return l;
}

std::vector<std::pair<std::uint64_t, std::string>> list(const std::string& dir) {
  std::vector<std::pair<std::uint64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (auto c = commit_of(e.path().filename().string())) out.emplace_back(*c, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

Newest newest(const std::string& dir) {
  Newest n;
  for (const auto& [commit, path] : list(dir)) {
    auto l = read(path);
    if (l) {
      n.loaded = std::move(*l);
      break;
    }
    std::string why = l.error();
    if (why.rfind(path + ": ", 0) == 0) why.erase(0, path.size() + 2);  // the path is said once, beside it
    n.skipped.emplace_back(path, why);
  }
  return n;
}

}  // namespace elasticrun::collective::checkpoint
