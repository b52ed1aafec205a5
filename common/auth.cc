#include "common/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace elasticrun::auth {
namespace {

template <std::size_t N>
std::array<std::uint8_t, N> random_bytes() {
  std::array<std::uint8_t, N> out{};
  if (RAND_bytes(out.data(), static_cast<int>(N)) != 1)
    throw std::runtime_error("RAND_bytes failed: no entropy");
  return out;
}

Digest proof(const Secret& s, std::string_view label, std::string_view role, const Nonce& a,
             const Nonce& b) {
  std::vector<std::uint8_t> msg(label.begin(), label.end());
  msg.push_back(0);
  msg.insert(msg.end(), role.begin(), role.end());
  msg.push_back(0);
  msg.insert(msg.end(), a.begin(), a.end());
  msg.insert(msg.end(), b.begin(), b.end());
  return hmac_sha256(s, msg);
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Secret random_secret() { return random_bytes<32>(); }
Nonce random_nonce() { return random_bytes<32>(); }

std::string to_hex(std::span<const std::uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (auto b : bytes) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 15]);
  }
  return s;
}

Result<Secret> secret_from_hex(std::string_view hex) {
  while (!hex.empty() && (hex.back() == '\n' || hex.back() == '\r' || hex.back() == ' '))
    hex.remove_suffix(1);
  Secret s{};
  if (hex.size() != s.size() * 2) return fail("secret must be 64 hexadecimal digits");
  for (std::size_t i = 0; i < s.size(); ++i) {
    int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return fail("secret must be 64 hexadecimal digits");
    s[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return s;
}

Digest hmac_sha256(const Secret& key, std::span<const std::uint8_t> message) {
  Digest d{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), message.data(), message.size(),
            d.data(), &len) ||
      len != d.size())
    throw std::runtime_error("HMAC-SHA256 failed");
  return d;
}

Digest client_proof(const Secret& s, std::string_view role, const Nonce& server, const Nonce& client) {
  return proof(s, "er-client", role, server, client);
}

Digest server_proof(const Secret& s, std::string_view role, const Nonce& server, const Nonce& client) {
  return proof(s, "er-server", role, client, server);
}

Secret wrap_pad(const Secret& cluster, std::string_view role, const Nonce& server, const Nonce& client) {
  return proof(cluster, "er-wrap", role, server, client);
}

Result<Secret> read_secret_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return fail("cannot read secret file '" + path + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail("secret file '" + path + "' is not a regular file");
  if (st.st_mode & (S_IROTH | S_IWOTH))
    return fail("secret file '" + path + "' is accessible by other users; chmod 600 (or 640 for a group) it");
  std::ifstream in(path);
  if (!in) return fail("cannot read secret file '" + path + "': " + std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), {});
  if (text.size() > 4096) return fail("secret file '" + path + "': too large for a secret");
  auto s = secret_from_hex(text);
  if (!s) return fail("secret file '" + path + "': " + s.error() + " (make one: openssl rand -hex 32)");
  return s;
}

bool digest_equal(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace elasticrun::auth
