#include "common/handshake.h"

#include <algorithm>

namespace elasticrun::handshake {
namespace {

auth::Nonce nonce_of(const wire::Bytes& b) {
  auth::Nonce n{};
  if (b.size() != n.size()) throw wire::DecodeError("bad nonce size");
  std::copy(b.begin(), b.end(), n.begin());
  return n;
}

}  // namespace

std::optional<msg::AuthOk> Server::check(const msg::Auth& a, std::string_view role) {
  auth::Nonce client = nonce_of(a.nonce);
  if (a.role != role || !auth::digest_equal(auth::client_proof(secret_, a.role, nonce_, client), a.proof))
    return std::nullopt;
  client_ = client;
  auto proof = auth::server_proof(secret_, a.role, nonce_, client_);
  return msg::AuthOk{wire::Bytes(proof.begin(), proof.end())};
}

msg::Auth Client::answer(const msg::Hello& h) {
  server_ = nonce_of(h.nonce);
  client_ = auth::random_nonce();
  auto proof = auth::client_proof(secret_, role_, server_, client_);
  return {role_, wire::Bytes(client_.begin(), client_.end()), wire::Bytes(proof.begin(), proof.end())};
}

bool Client::verify(const msg::AuthOk& ok) const {
  return auth::digest_equal(auth::server_proof(secret_, role_, server_, client_), ok.proof);
}

}  // namespace elasticrun::handshake
