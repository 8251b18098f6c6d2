// The fake NCCL's shared memory: meeting in the segment, the duplicate-GPU
// check, and the transfers of a launch over the per-pair rings
// (fake_nccl.h).  Waits sleep on the process-shared condition variable; a
// wait wakes every 200 ms only to notice a peer process that is gone.
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "fake_gpu.h"
#include "fake_nccl.h"

namespace fakegpu {
namespace {

constexpr int kPeerCheckMs = 200;
constexpr int kInitTimeoutS = 120;

size_t DataOffset() { return (sizeof(Shared) + 4095) / 4096 * 4096; }

size_t SegmentBytes(int nranks) {
  return DataOffset() + static_cast<size_t>(nranks) * nranks * kRingBytes;
}

char* RingData(ncclComm* c, int from, int to) {
  return reinterpret_cast<char*>(c->shared) + DataOffset() +
         (static_cast<size_t>(from) * c->nranks + to) * kRingBytes;
}

Ring& RingOf(ncclComm* c, int from, int to) { return c->shared->rings[from * kMaxRanks + to]; }

long Futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* t) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, t, nullptr, 0);
}

void Lock(Shared* s) {
  if (pthread_mutex_lock(&s->mu) == EOWNERDEAD) pthread_mutex_consistent(&s->mu);
}

void Unlock(Shared* s) { pthread_mutex_unlock(&s->mu); }

// Sleeps on the segment's condition variable for at most `ms`.
void WaitLocked(Shared* s, int ms) {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  t.tv_nsec += static_cast<long>(ms) * 1000000L;
  t.tv_sec += t.tv_nsec / 1000000000L;
  t.tv_nsec %= 1000000000L;
  if (pthread_cond_timedwait(&s->cv, &s->mu, &t) == EOWNERDEAD) pthread_mutex_consistent(&s->mu);
}

void Broadcast(Shared* s) {
  Lock(s);
  pthread_cond_broadcast(&s->cv);
  Unlock(s);
}

// One-time setup of a fresh segment by whichever rank gets there first.
void SetUp(Shared* s, int nranks) {
  uint32_t fresh = 0;
  if (s->state.compare_exchange_strong(fresh, 1)) {
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->nranks = nranks;
    s->state.store(2);
    Futex(&s->state, FUTEX_WAKE, INT_MAX, nullptr);
    return;
  }
  while (s->state.load() != 2) {
    const timespec t{0, 100000000};  // (a wake-up lost between load and wait)
    Futex(&s->state, FUTEX_WAIT, s->state.load(), &t);
  }
}

// A peer process that no longer exists, or -1.
int GonePeer(ncclComm* c) {
  for (int r = 0; r < c->nranks; ++r) {
    const pid_t pid = c->shared->seats[r].pid;
    if (r != c->rank && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) return r;
  }
  return -1;
}

std::string Name(const ncclUniqueId& id) {
  return std::string(id.internal, strnlen(id.internal, sizeof(id.internal)));
}

}  // namespace

void SetLastError(ncclComm* comm, const std::string& why);

void SetAsyncError(ncclComm* comm, ncclResult_t r, const std::string& why) {
  int ok = ncclSuccess;
  if (comm->async_error.compare_exchange_strong(ok, r)) SetLastError(comm, why);
}

ncclResult_t Attach(ncclComm* c, const ncclUniqueId& id, std::string* why) {
  const std::string name = Name(id);
  if (name.rfind("/tfhvd-fake-nccl-", 0) != 0) {
    *why = "ncclUniqueId was not made by ncclGetUniqueId";
    return ncclInvalidArgument;
  }
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) {
    *why = "shm_open " + name + ": " + std::strerror(errno);
    return ncclSystemError;
  }
  c->map_bytes = SegmentBytes(c->nranks);
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(c->map_bytes)) == 0) {
    p = mmap(nullptr, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    *why = "mapping " + name + ": " + std::strerror(err);
    return ncclSystemError;
  }
  c->shared = static_cast<Shared*>(p);
  Shared* s = c->shared;
  SetUp(s, c->nranks);
  Lock(s);
  if (s->nranks != c->nranks) {
    Unlock(s);
    *why = "ranks disagree on the communicator's size";
    return ncclInvalidUsage;
  }
  Seat& me = s->seats[c->rank];
  me.pid = getpid();
  me.device = c->device;
  const char* hostid = std::getenv("NCCL_HOSTID");
  if (hostid != nullptr && *hostid != '\0') {
    std::strncpy(me.host, hostid, sizeof(me.host) - 1);
  } else if (gethostname(me.host, sizeof(me.host) - 1) != 0) {
    std::strcpy(me.host, "localhost");
  }
  cudaDeviceGetPCIBusId(me.bus, sizeof(me.bus), c->device);
  // The last rank to arrive removes the name: nothing is left in /dev/shm
  // whatever happens to the processes afterwards.
  if (++s->attached == c->nranks) shm_unlink(name.c_str());
  pthread_cond_broadcast(&s->cv);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(kInitTimeoutS);
  while (s->attached < c->nranks) {
    if (std::chrono::steady_clock::now() > until) {
      Unlock(s);
      shm_unlink(name.c_str());
      *why = "timed out waiting for the other ranks to join the communicator";
      return ncclSystemError;
    }
    WaitLocked(s, kPeerCheckMs);
  }
  Unlock(s);
  // NCCL's check, with NCCL's words.
  for (int a = 0; a < c->nranks; ++a) {
    for (int b = a + 1; b < c->nranks; ++b) {
      if (!std::strcmp(s->seats[a].host, s->seats[b].host) &&
          !std::strcmp(s->seats[a].bus, s->seats[b].bus)) {
        *why = "Duplicate GPU detected : rank " + std::to_string(a) + " and rank " +
               std::to_string(b) + " both on CUDA device " + s->seats[a].bus;
        return ncclInvalidUsage;
      }
    }
  }
  return ncclSuccess;
}

void Detach(ncclComm* c) {
  if (c->shared == nullptr) return;
  c->aborted = true;
  Broadcast(c->shared);
  if (c->inflight.load() == 0) {
    munmap(c->shared, c->map_bytes);
    c->shared = nullptr;
  }
}

namespace {

// Moves what the rings allow for the first pending transfer of each pair
// and direction; true when some bytes moved.
bool Progress(ncclComm* c, std::vector<Xfer>* xfers) {
  bool moved = false;
  std::vector<char> busy(2 * kMaxRanks, 0);  // the first pending per (peer, direction)
  for (Xfer& x : *xfers) {
    if (x.done == x.bytes) continue;
    char& b = busy[x.peer * 2 + (x.send ? 1 : 0)];
    if (b) continue;
    b = 1;
    Ring& ring = x.send ? RingOf(c, c->rank, x.peer) : RingOf(c, x.peer, c->rank);
    char* data = x.send ? RingData(c, c->rank, x.peer) : RingData(c, x.peer, c->rank);
    const uint64_t head = ring.head.load(std::memory_order_acquire);
    const uint64_t tail = ring.tail.load(std::memory_order_acquire);
    const size_t avail = x.send ? kRingBytes - (head - tail) : head - tail;
    size_t n = std::min(avail, x.bytes - x.done);
    if (n == 0) continue;
    const uint64_t pos = x.send ? head : tail;
    const size_t off = pos % kRingBytes;
    const size_t first = std::min(n, kRingBytes - off);
    if (x.send) {
      std::memcpy(data + off, x.buf + x.done, first);
      std::memcpy(data, x.buf + x.done + first, n - first);
      ring.head.store(head + n, std::memory_order_release);
    } else {
      std::memcpy(x.buf + x.done, data + off, first);
      std::memcpy(x.buf + x.done + first, data, n - first);
      ring.tail.store(tail + n, std::memory_order_release);
    }
    x.done += n;
    moved = true;
  }
  return moved;
}

bool CanProgress(ncclComm* c, const std::vector<Xfer>& xfers) {
  for (const Xfer& x : xfers) {
    if (x.done == x.bytes) continue;
    Ring& ring = x.send ? RingOf(c, c->rank, x.peer) : RingOf(c, x.peer, c->rank);
    const uint64_t used = ring.head.load() - ring.tail.load();
    if (x.send ? used < kRingBytes : used > 0) return true;
  }
  return false;
}

bool AllDone(const std::vector<Xfer>& xfers) {
  for (const Xfer& x : xfers) {
    if (x.done != x.bytes) return false;
  }
  return true;
}

// Sleeps until the communicator is aborted (a launch that never completes).
void Stall(ncclComm* c) {
  Lock(c->shared);
  while (!c->aborted) WaitLocked(c->shared, 1000);
  Unlock(c->shared);
}

}  // namespace

void Execute(ncclComm* c, Launch* launch) {
  if (launch->hang || launch->fail_async) {
    if (launch->fail_async) {
      SetAsyncError(c, ncclSystemError,
                    "rank " + std::to_string(c->rank) +
                        ": injected asynchronous error (TFHVD_FAKE_NCCL_ASYNC_ERROR_AFTER)");
    }
    Stall(c);
    return;
  }
  auto last_check = std::chrono::steady_clock::now();
  while (!AllDone(launch->xfers)) {
    if (c->aborted || c->async_error.load() != ncclSuccess) {
      Stall(c);  // a failed communicator's collectives never complete
      return;
    }
    if (Progress(c, &launch->xfers)) {
      Broadcast(c->shared);
      continue;
    }
    Lock(c->shared);
    if (!CanProgress(c, launch->xfers) && !c->aborted) WaitLocked(c->shared, kPeerCheckMs);
    Unlock(c->shared);
    const auto now = std::chrono::steady_clock::now();
    if (now - last_check >= std::chrono::milliseconds(kPeerCheckMs)) {
      last_check = now;
      const int gone = GonePeer(c);
      if (gone >= 0) {
        SetAsyncError(c, ncclRemoteError,
                      "rank " + std::to_string(c->rank) + ": peer rank " + std::to_string(gone) +
                          " (pid " + std::to_string(c->shared->seats[gone].pid) + ") exited");
      }
    }
  }
  for (auto& step : launch->steps) step();
}

}  // namespace fakegpu
