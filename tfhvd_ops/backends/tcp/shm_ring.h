// Shared-memory byte pipes for the control channel between ranks on one host.
//
// A negotiation round trip over sockets costs a send and a receive system
// call on each side, a few microseconds each and more when the caches are
// cold.  Between ranks on one host the control channel (tcp_control.cc)
// instead moves its bytes through a pair of single-producer single-consumer
// rings in a memfd that the coordinator creates and hands to the worker over
// their Unix socket (SCM_RIGHTS).  The socket stays: it tells a reader that
// sleeps in poll() that bytes arrived (a one-byte doorbell, sent only while
// the reader says it sleeps), and its end-of-file tells that the peer died.
//
// Sleeping without losing a wake-up (Dekker): the reader sets its sleeping
// flag and then looks at the ring once more before it sleeps; the writer
// publishes its bytes and then looks at the flag.  Both are sequentially
// consistent, so at least one of them sees the other.
#ifndef TFHVD_BACKENDS_TCP_SHM_RING_H_
#define TFHVD_BACKENDS_TCP_SHM_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "../../core/common.h"

namespace tfhvd {

// One direction: a byte stream (the channel frames its own messages).
class ShmRing {
 public:
  struct Header {
    alignas(64) std::atomic<uint64_t> head;  // bytes ever written
    alignas(64) std::atomic<uint64_t> tail;  // bytes ever read
    alignas(64) std::atomic<uint32_t> reader_sleeping;
  };
  static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                    std::atomic<uint32_t>::is_always_lock_free,
                "rings shared between processes need lock-free atomics");

  ShmRing() = default;
  ShmRing(void* base, uint64_t capacity);
  static size_t Bytes(uint64_t capacity) { return sizeof(Header) + capacity; }

  // Writer: copies up to n bytes in, returns how many fitted.
  size_t Write(const char* p, size_t n);
  // Writer, after Write: whether the reader may be asleep (send a doorbell).
  bool ReaderMaySleep() const;
  // Reader: appends every available byte to `out`; returns the count.
  size_t Read(std::string* out);
  bool HasData() const;
  // Reader: announce sleeping; returns false (and clears it) when bytes
  // arrived meanwhile, so the caller must not sleep.
  bool PrepareToSleep();
  void Awake();

 private:
  Header* h_ = nullptr;
  char* data_ = nullptr;
  uint64_t cap_ = 0;
};

// The two rings between the coordinator and one worker, mapped.
class ShmLink {
 public:
  ~ShmLink();
  // Coordinator: creates the memfd (returned in *fd, to send and close).
  static Status Create(uint64_t capacity, std::unique_ptr<ShmLink>* out, int* fd);
  // Worker: maps the memfd it received.
  static Status Map(int fd, std::unique_ptr<ShmLink>* out);
  ShmRing& to_worker() { return to_worker_; }
  ShmRing& to_coordinator() { return to_coordinator_; }

 private:
  // Takes ownership of a mapping laid out as described in shm_ring.cc.
  static std::unique_ptr<ShmLink> Wrap(void* map, size_t bytes, uint64_t capacity);
  void* map_ = nullptr;
  size_t bytes_ = 0;
  ShmRing to_worker_, to_coordinator_;
};

// Passes a file descriptor with one payload byte over a Unix socket.
bool SendFd(int sock, int fd, char payload);
// Receives the payload byte and, if one came, the descriptor (else -1);
// waits up to timeout_s.  False on timeout or error.
bool RecvFd(int sock, double timeout_s, char* payload, int* fd);

}  // namespace tfhvd

#endif  // TFHVD_BACKENDS_TCP_SHM_RING_H_
