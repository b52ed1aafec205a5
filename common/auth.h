// Job secrets and the HMAC-SHA256 challenge-response every control connection opens with.
//
//   server -> client  hello   {server_nonce}
//   client -> server  auth    {role, client_nonce, HMAC(secret, "er-client" role sn cn)}
//   server -> client  auth_ok {HMAC(secret, "er-server" role cn sn)}
//
// Both sides prove the secret without sending it; fresh nonces on both sides make a
// recorded exchange useless on another connection (replay-safe).
#pragma once

#include "common/result.h"

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace elasticrun::auth {

using Secret = std::array<std::uint8_t, 32>;
using Nonce = std::array<std::uint8_t, 32>;
using Digest = std::array<std::uint8_t, 32>;

Secret random_secret();
Nonce random_nonce();
std::string to_hex(std::span<const std::uint8_t> bytes);
Result<Secret> secret_from_hex(std::string_view hex);

Digest hmac_sha256(const Secret& key, std::span<const std::uint8_t> message);
Digest client_proof(const Secret& s, std::string_view role, const Nonce& server, const Nonce& client);
Digest server_proof(const Secret& s, std::string_view role, const Nonce& server, const Nonce& client);
// One-time pad that hides a job secret inside an authenticated connection to a
// systemd daemon: HMAC(cluster secret, "er-wrap" role server-nonce client-nonce).
// Fresh nonces on both sides make every pad unique; XOR the job secret with it.
Secret wrap_pad(const Secret& cluster, std::string_view role, const Nonce& server, const Nonce& client);

// Reads a secret file (64 hexadecimal digits, optional trailing newline). Refuses a
// file other users may read or write, as ssh refuses such a private key.
Result<Secret> read_secret_file(const std::string& path);

// Constant-time comparison; false when sizes differ.
bool digest_equal(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b);

}  // namespace elasticrun::auth
