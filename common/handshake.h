// The two sides of the challenge-response every control connection opens with (see
// auth.h): message building and checking in one place, for the rendezvous server and
// its workers, and for the listening daemon and its drivers. Transport-free: callers
// read and write the frames.
#pragma once

#include "common/auth.h"
#include "common/messages.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace elasticrun::handshake {

// The largest frame a server takes from a peer that has not proved the secret yet: an
// Auth frame is a role and two 32-byte values. An unproven peer cannot make a server
// buffer more than this per connection (16 MiB otherwise, until the handshake timeout).
// Clients must wait for AuthOk before sending more: a frame sent in the same read as the
// Auth is still held to this limit.
inline constexpr std::uint32_t kMaxPayload = 1024;

class Server {
 public:
  explicit Server(const auth::Secret& secret) : secret_(secret), nonce_(auth::random_nonce()) {}
  msg::Hello hello() const { return {wire::Bytes(nonce_.begin(), nonce_.end())}; }
  // The auth_ok to send if `a` proves the secret in `role`; nothing if it does not.
  // Throws wire::DecodeError on a malformed nonce.
  std::optional<msg::AuthOk> check(const msg::Auth& a, std::string_view role);
  const auth::Nonce& server_nonce() const { return nonce_; }
  const auth::Nonce& client_nonce() const { return client_; }  // after a successful check

 private:
  auth::Secret secret_;
  auth::Nonce nonce_, client_{};
};

class Client {
 public:
  Client(const auth::Secret& secret, std::string role) : secret_(secret), role_(std::move(role)) {}
  // The answer to the server's hello. Throws wire::DecodeError on a malformed nonce.
  msg::Auth answer(const msg::Hello& h);
  // Whether the server proved the secret too.
  bool verify(const msg::AuthOk& ok) const;
  const auth::Nonce& server_nonce() const { return server_; }
  const auth::Nonce& client_nonce() const { return client_; }

 private:
  auth::Secret secret_;
  std::string role_;
  auth::Nonce server_{}, client_{};
};

}  // namespace elasticrun::handshake
