// The fake NCCL's communicator (fake_gpu.h has the picture): a segment of
// POSIX shared memory per communicator, named from the ncclUniqueId, holding
// a process-shared robust mutex and condition variable, each rank's seat,
// and a byte ring per ordered pair of ranks.  A launch (one call, or a
// group's calls) is a list of transfers plus local steps; the transfers
// progress together, so a group's sends and receives cannot deadlock.
#ifndef TFHVD_TESTS_GPU_FAKE_CUDA_FAKE_NCCL_H_
#define TFHVD_TESTS_GPU_FAKE_CUDA_FAKE_NCCL_H_

#include <nccl.h>
#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

struct ncclComm;  // nccl.h's opaque type, defined here

namespace fakegpu {

constexpr int kMaxRanks = 8;
constexpr size_t kRingBytes = size_t{1} << 20;

struct Seat {
  pid_t pid;
  int device;
  char host[128];
  char bus[64];
};

struct Ring {
  std::atomic<uint64_t> head;  // bytes written by the sender
  std::atomic<uint64_t> tail;  // bytes read by the receiver
};

// The segment's header; the ring data follows at DataOffset().
struct Shared {
  std::atomic<uint32_t> state;  // futex word: 0 new, 1 being set up, 2 ready
  int nranks;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int attached;
  Seat seats[kMaxRanks];
  Ring rings[kMaxRanks * kMaxRanks];  // [from * kMaxRanks + to]
};

// One transfer of a launch: bytes to or from a peer, in call order per pair.
struct Xfer {
  int peer;
  bool send;
  char* buf;
  size_t bytes;
  size_t done = 0;
};

// One launch: its transfers, then its local steps (reductions, own copies).
struct Launch {
  std::vector<Xfer> xfers;
  std::vector<std::function<void()>> steps;
  std::vector<std::vector<char>> scratch;  // what the transfers receive into
  bool fail_async = false;  // the injected asynchronous error
  bool hang = false;        // the injected hang
};

}  // namespace fakegpu

struct ncclComm {
  fakegpu::Shared* shared = nullptr;
  size_t map_bytes = 0;
  int rank = 0;
  int nranks = 1;
  int device = 0;
  std::atomic<bool> aborted{false};
  std::atomic<int> async_error{ncclSuccess};
  std::atomic<int> inflight{0};
  std::mutex mu;               // last_error, custom ops
  std::string last_error;
  std::vector<double> premul;  // custom op k: ncclNumOps + k; NaN when free
};

namespace fakegpu {

// ncclCommInitRank's work; `why` gets NCCL's detail on failure.
ncclResult_t Attach(ncclComm* comm, const ncclUniqueId& id, std::string* why);
// Marks the communicator aborted and wakes its waiters; unmaps it once no
// launch uses it (else leaves the mapping: its name is gone already).
void Detach(ncclComm* comm);
// Runs a launch on the calling (stream) thread; returns once its transfers
// and steps are done, or never returns normally for a hang or a failure
// until the communicator is aborted (then its outputs are left alone).
void Execute(ncclComm* comm, Launch* launch);
// Sets the communicator's asynchronous error once, with its detail.
void SetAsyncError(ncclComm* comm, ncclResult_t r, const std::string& why);
// The process-wide last error (ncclGetLastError(nullptr)).
void SetLastError(ncclComm* comm, const std::string& why);

}  // namespace fakegpu

#endif  // TFHVD_TESTS_GPU_FAKE_CUDA_FAKE_NCCL_H_
