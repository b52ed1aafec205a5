#include "host/ucx_address.h"

#include <elasticrun/types.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string_view>

namespace elasticrun::collective {
namespace {

// Fixed-width integers go little-endian, whatever the machine: peers on other machines
// decode them too.
void put(Bytes& out, std::uint64_t v, int width) {
  for (int i = 0; i < width; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

void put_bytes(Bytes& out, const Bytes& b) {
  put(out, b.size(), 4);
  out.insert(out.end(), b.begin(), b.end());
}

// Reads from a published value, or says which rank published something malformed.
class Reader {
 public:
  Reader(const Bytes& b, int rank) : b_(b), rank_(rank) {}

  std::uint64_t get(int width) {
    need(static_cast<std::size_t>(width));
    std::uint64_t v = 0;
    for (int i = 0; i < width; ++i) v |= std::uint64_t{b_[pos_ + i]} << (8 * i);
    pos_ += static_cast<std::size_t>(width);
    return v;
  }
  Bytes get_bytes() {
    std::size_t n = get(4);
    need(n);
    Bytes out(b_.begin() + static_cast<std::ptrdiff_t>(pos_), b_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
    pos_ += n;
    return out;
  }
  void end() const {
    if (pos_ != b_.size()) bad("bytes after the end");
  }

 private:
  void need(std::size_t n) const {
    if (b_.size() - pos_ < n) bad("truncated");
  }
  [[noreturn]] void bad(const char* why) const {
    throw ProtocolError("rank " + std::to_string(rank_) + " published a malformed UCX address (" + why + ", " +
                        std::to_string(b_.size()) + " bytes)");
  }
  const Bytes& b_;
  int rank_;
  std::size_t pos_ = 0;
};

constexpr std::uint64_t kVersion = 1;

}  // namespace

bool network_is_tcp_only(const char* tls, bool rdma_devices) {
  if (!rdma_devices) return true;
  if (tls == nullptr || *tls == '\0' || *tls == '^') return false;
  // The transports that stay within a machine, and tcp.
  static const std::set<std::string_view> kNotRdma = {
      "tcp",  "self",      "sm",       "shm",      "posix", "sysv",      "cma",      "knem",     "xpmem",
      "cuda", "cuda_copy", "cuda_ipc", "gdr_copy", "rocm",  "rocm_copy", "rocm_ipc", "rocm_gdr"};
  std::string_view rest(tls);
  for (;;) {
    const std::size_t comma = rest.find(',');
    if (!kNotRdma.contains(rest.substr(0, comma))) return false;
    if (comma == std::string_view::npos) return true;
    rest.remove_prefix(comma + 1);
  }
}

bool has_rdma_devices() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator{};
}

Locality this_locality() {
  Locality l;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::getline(boot, l.machine);
  struct stat st {};
  if (::stat("/proc/thread-self/ns/net", &st) == 0 || ::stat("/proc/self/ns/net", &st) == 0) l.netns = st.st_ino;
  if (!l.known()) l = {};
  return l;
}

bool needs_network_only(const Locality& mine, const Locality& peer) {
  return mine.known() && peer.known() && mine.machine == peer.machine && mine.netns != peer.netns;
}

Bytes encode(const PublishedAddress& a) {
  Bytes out;
  out.reserve(32 + a.where.machine.size() + a.full.size() + a.net_only.size());
  put(out, kVersion, 1);
  put_bytes(out, Bytes(a.where.machine.begin(), a.where.machine.end()));
  put(out, a.where.netns, 8);
  put_bytes(out, a.full);
  put_bytes(out, a.net_only);
  return out;
}

PublishedAddress decode_address(const Bytes& bytes, int rank) {
  Reader r(bytes, rank);
  if (std::uint64_t v = r.get(1); v != kVersion)
    throw ProtocolError("rank " + std::to_string(rank) + " published a UCX address of version " + std::to_string(v) +
                        ", this library reads version " + std::to_string(kVersion));
  PublishedAddress a;
  Bytes machine = r.get_bytes();
  a.where.machine.assign(machine.begin(), machine.end());
  a.where.netns = r.get(8);
  a.full = r.get_bytes();
  a.net_only = r.get_bytes();
  r.end();
  if (a.full.empty()) throw ProtocolError("rank " + std::to_string(rank) + " published an empty UCX address");
  return a;
}

}  // namespace elasticrun::collective
