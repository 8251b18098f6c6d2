// The control channel's handshake: a worker proves it belongs to the job
// before the coordinator reads a single negotiation message from it.
//
// Rank 0 draws a fresh 32-byte session key for every init and hands it to
// the workers through the bootstrap (an MPI or Gloo broadcast, which no
// outsider can join), with its listening addresses.  The handshake key is
// HMAC-SHA256(job secret, "tfhvd-control-1|" + session key): it needs the
// session key, and also the job's secret (TFHVD_SECRET_KEY) when the
// launcher gave one; a rank started by hand under plain mpirun has no secret
// and relies on the session key alone.
//
// A worker's first bytes on its connection are its hello (kHelloBytes):
//   "TFHC" | rank (int32, little-endian) | HMAC-SHA256(key, "hello|" + rank)
// The coordinator accepts connections without blocking on any one of them:
// each must deliver its hello within kHelloTimeoutS; a wrong magic, MAC or
// rank, a rank already connected, or a slow client is closed; at most
// kMaxPending connections wait for their hello at once (the oldest goes).
// The first refusal is reported on stderr, the rest counted.
#ifndef TFHVD_BACKENDS_TCP_TCP_HANDSHAKE_H_
#define TFHVD_BACKENDS_TCP_TCP_HANDSHAKE_H_

#include <string>
#include <vector>

namespace tfhvd {

constexpr size_t kHelloBytes = 4 + 4 + 32;
constexpr double kHelloTimeoutS = 5.0;
constexpr size_t kMaxPending = 64;

// The handshake key from the job's secret and the session key.
std::string ControlKey(const std::string& secret, const std::string& session_key);
// A worker's hello.
std::string MakeHello(const std::string& key, int rank);

struct AcceptedPeer {
  int fd = -1;
  int rank = -1;
  bool via_unix = false;
};

// Accepts `size - 1` authenticated workers on `listen_fd` (TCP) and
// `unix_fd` (-1: none) within `timeout_s`, without blocking on any one
// client.  Returns false (closing what it accepted) when they do not all
// come in time; `why` then says which ranks are missing.
bool AcceptWorkers(int listen_fd, int unix_fd, int size, const std::string& key,
                   double timeout_s, std::vector<AcceptedPeer>* out, std::string* why);

}  // namespace tfhvd

#endif  // TFHVD_BACKENDS_TCP_TCP_HANDSHAKE_H_
