// The job's secret and what proves knowledge of it (docs/security.md).
//
// Launchers hand every rank one per-job secret in its environment
// (TFHVD_SECRET_KEY, or Horovod's HOROVOD_SECRET_KEY; LaunchEnv::secret).
// It signs the rank's requests to the rendezvous server (HttpStore,
// mirrored by tfhvd/runner/secret.py) and keys the control channel's
// handshake (tcp_control.h).  HMAC-SHA256 comes from OpenSSL's libcrypto;
// nonces from getrandom(2).
#ifndef TFHVD_CORE_AUTH_H_
#define TFHVD_CORE_AUTH_H_

#include <string>

namespace tfhvd {

// HMAC-SHA256 of `data` under `key`: 32 raw bytes.
std::string HmacSha256(const std::string& key, const std::string& data);
// SHA-256 of `data`: 32 raw bytes.
std::string Sha256(const std::string& data);
// Lower-case hex of `bytes`.
std::string HexEncode(const std::string& bytes);
// `n` random bytes from the kernel (empty only if getrandom fails).
std::string RandomBytes(size_t n);
// Equal contents, in time that depends only on the lengths.
bool ConstantTimeEqual(const std::string& a, const std::string& b);

}  // namespace tfhvd

#endif  // TFHVD_CORE_AUTH_H_
