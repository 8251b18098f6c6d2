// Negotiation messages over TCP sockets, with a truly blocking wait.
//
// Why not MPI for the control plane: an MPI receive either spins (stealing a
// core from training) or has to be polled with sleeps (adding latency to every
// collective).  Sockets let the background thread sleep in poll() until a
// message arrives *or* a framework thread enqueues work (the tensor queue's
// eventfd), so an idle or waiting rank uses no CPU and still reacts in
// microseconds.  Data still moves over MPI.
//
// Topology: a star.  The coordinator (rank 0) listens on an ephemeral port;
// its addresses are handed to the workers through the bootstrap (an MPI
// broadcast); each worker connects and says its rank.  A worker on the
// coordinator's host connects through an abstract Unix socket the coordinator
// also listens on (a send costs about half of a TCP loopback send), falling
// back to loopback TCP, then to the advertised addresses.  If any worker cannot connect, every rank learns it through
// the bootstrap and the caller falls back to MPI messages.
//
// Admission: a worker's first bytes prove that it belongs to the job
// (tcp_handshake.h); the coordinator reads no message from a connection that
// has not, and no connection stalls the others.  Rank 0 listens on loopback
// when every rank is on its host, on `ifname`'s address when one is given,
// else on every interface; the listening sockets close once all workers are in.
//
// Framing: each message is a 4-byte little-endian length and the bytes.
// Sockets are non-blocking; unsent bytes wait in a per-peer buffer flushed
// whenever the channel is polled.
#ifndef TFHVD_BACKENDS_TCP_TCP_CONTROL_H_
#define TFHVD_BACKENDS_TCP_TCP_CONTROL_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../../core/backend.h"

namespace tfhvd {

struct TcpBootstrap {
  // Replaces `value` on every rank with rank 0's.
  std::function<Status(std::string* value)> broadcast;
  // Returns the minimum of `value` over all ranks.
  std::function<Status(int value, int* min)> all_min;
};

struct TcpOptions {
  std::string ifname;         // advertise only this interface's address
  double connect_timeout_s = 30.0;
  // Same-host workers exchange bytes through shared memory (shm_ring.h).
  bool shared_memory = true;
  // The job's secret (LaunchEnv::secret; may be empty), mixed into the
  // handshake key with the session key rank 0 broadcasts.
  std::string secret;
  // Every rank runs on rank 0's host: listen on loopback only, unless the
  // user named an interface (ifname), whose addresses are then advertised.
  bool loopback_only = false;
};

// Connects every rank (collective).  On failure returns a non-OK status on
// every rank, with the reason, and leaves `out` empty.
Status CreateTcpControl(int rank, int size, const TcpBootstrap& bootstrap,
                        const TcpOptions& options, std::unique_ptr<ControlChannel>* out);

}  // namespace tfhvd

#endif  // TFHVD_BACKENDS_TCP_TCP_CONTROL_H_
