// The transport interfaces the runtime talks to, and the factory that picks
// their implementations.
//
// The core defines what a transport must do; backends/ implement it (MPI for
// host memory and for negotiation; NCCL for device memory when built).  Only
// the factory (backends/factory.cc) and CMake know which backends exist, so
// no algorithm here carries a `#if HAVE_...`.
#ifndef TFHVD_CORE_BACKEND_H_
#define TFHVD_CORE_BACKEND_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "settings.h"

namespace tfhvd {

struct Topology {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  bool homogeneous = true;
};

// Point-to-point negotiation messages between workers and the coordinator
// (rank 0).  All calls are non-blocking; only the thread that holds the
// runtime's loop calls (Runtime::Drive).
class ControlChannel {
 public:
  virtual ~ControlChannel() = default;
  virtual Status SendToCoordinator(std::string bytes) = 0;
  virtual Status SendToWorker(int rank, std::string bytes) = 0;
  // Appends every message that has arrived, without waiting.
  virtual Status PollWorkers(std::vector<std::pair<int, std::string>>* out) = 0;
  virtual Status PollCoordinator(std::vector<std::string>* out) = 0;
  // Waits until every send has been handed to the transport.  A peer that
  // takes no bytes for `timeout_s` is given up on (reported lost by the next
  // poll).
  virtual Status FlushSends(double timeout_s) = 0;
  // Blocks until a message may have arrived, `wake_fd` (the tensor queue's
  // eventfd) is readable, or `timeout` passes, and returns true.  A channel
  // that cannot block returns false at once and the caller polls instead.
  virtual bool Wait(int wake_fd, std::chrono::microseconds timeout) { return false; }
  // What carries the messages, for the log ("MPI messages", ...).
  virtual std::string Describe() const = 0;
};
// A message with empty bytes from PollWorkers/PollCoordinator means that the
// peer's connection closed: the process is gone.

// Data collectives over one memory kind.  Counts are in elements of `dtype`
// unless named *_bytes.  A null `send` means in place.  Reduce ops are Sum,
// Min, Max or Product: Average and scaling are done by the caller.
class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                           ReduceOp op) = 0;
  virtual Status Allgatherv(const void* send, int64_t send_bytes, void* recv,
                            const std::vector<int64_t>& recv_bytes) = 0;
  virtual Status Broadcast(void* buf, int64_t bytes, int root) = 0;
  virtual Status Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                           const std::vector<int64_t>& recv_bytes) = 0;
  virtual Status ReduceScatter(const void* send, void* recv,
                               const std::vector<int64_t>& recv_counts, DataType dtype,
                               ReduceOp op) = 0;
  virtual Status Barrier() = 0;
  // Point to point: sends `send_bytes` to rank `peer` and receives
  // `recv_bytes` from it, both at once (no deadlock when both sides call).
  // The peer makes the mirror call (its send size is our receive size).
  // Messages between two ranks arrive in the order they were sent.  What
  // algorithms built from exchanges use (core/adasum.h); a transport without
  // it says so.
  virtual Status SendRecv(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes,
                          int peer) {
    return Status::FailedPrecondition(std::string("tfhvd: the ") + name() +
                                      " transport has no point-to-point exchange");
  }
  // "MPI", "NCCL": names the transport in the timeline.
  virtual const char* name() const = 0;

  // Memory operations in this transport's memory kind, so the executor can
  // fuse and scale without knowing where tensors live.
  // A buffer of at least `bytes`, owned by the collectives and reused.
  // `framework`: the context of an op of the response (may be null), whose
  // device allocator a device buffer comes from where it has one.
  virtual void* FusionBuffer(int64_t bytes, OpContext* framework) = 0;
  // dst[i] = src[i] * factor for `count` elements (a copy when factor == 1).
  virtual Status ScaledCopy(const void* src, void* dst, int64_t count, DataType dtype,
                            double factor) = 0;
  virtual Status Zero(void* dst, int64_t bytes) = 0;
  // Whether this transport can reduce `dtype` with `op` (else its error): a
  // set of one rank reduces nothing, yet refuses what a larger set would.
  virtual Status CheckReduce(DataType dtype, ReduceOp op) { return Status::OK(); }
  // Allreduce, then recv[i] *= post (Average's 1/size, a postscale).  A
  // transport that can fold the factor into the reduction (NCCL's PreMulSum)
  // saves the separate pass over the output; the others run both steps.
  virtual Status AllreduceScaled(const void* send, void* recv, int64_t count, DataType dtype,
                                 ReduceOp op, double post) {
    TFHVD_RETURN_IF_ERROR(Allreduce(send, recv, count, dtype, op));
    return ScaledCopy(recv, recv, count, dtype, post);
  }

  // Ordering for transports whose work is asynchronous (device streams).
  // Makes later work wait for `event` (a tensor's Tensor::ready_event).
  virtual Status WaitFor(const ReadyEvent& event) { return Status::OK(); }
  // Blocks until everything issued so far has finished, so outputs can be
  // handed back; transports that finish each call before returning have
  // nothing to do.
  virtual Status Synchronize() { return Status::OK(); }
  // Calls `done` with Synchronize()'s result once everything issued so far
  // has finished.  A device transport calls it later, from a thread of its
  // own (backends/nccl/finalizer.h), in the order of the calls, so the
  // runtime's loop goes on negotiating and launching meanwhile; the default
  // waits here.
  virtual void Complete(std::function<void(const Status&)> done) { done(Synchronize()); }
};

// Host-memory implementation of the memory operations, shared by every
// backend that moves host tensors.
class HostMemoryOps : public Collectives {
 public:
  void* FusionBuffer(int64_t bytes, OpContext* framework) override;
  Status ScaledCopy(const void* src, void* dst, int64_t count, DataType dtype,
                    double factor) override;
  Status Zero(void* dst, int64_t bytes) override;

 private:
  std::vector<char> fusion_;
};

// What init() was given: a list of world ranks, an existing communicator
// handle (from mpi4py), or neither (the whole world).
struct BackendOptions {
  std::vector<int> ranks;
  void* comm_handle = nullptr;
  ControlKind control = ControlKind::kTcp;
  std::string socket_ifname;  // restrict the coordinator's advertised addresses
  bool control_shm = true;    // same-host control bytes through shared memory
  bool mpi_yield_when_idle = true;  // MPI waits yield the core (when tfhvd initialises MPI)
  bool hierarchical_allreduce = false;  // device allreduce: within node, then across
  // Which CPU backend (the factory resolves kAuto), and what a launcher
  // without mpirun said (rank, size, rendezvous address).
  BackendChoice controller = BackendChoice::kAuto;
  BackendChoice cpu_operations = BackendChoice::kAuto;
  LaunchEnv launch;
  int generation = 0;  // how many inits this process has done before this one
  double device_timeout_s = 30.0;       // longest wait for device work (NCCL_TIMEOUT)
  bool elastic = false;  // an elastic job: a device failure is an error, not the job's end
};

// Everything a runtime needs from its transports.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const Topology& topology() const = 0;
  virtual ControlChannel* control() = 0;
  // Collectives for tensors on `device` (-1: host).  Null when no backend
  // for that memory kind was built.
  virtual Collectives* collectives(int device) = 0;
  // Whether collectives(device >= 0) exists (a GPU build).
  virtual bool has_device_collectives() const { return false; }
  // Whether the transport allows other threads to use it concurrently.
  virtual bool threads_supported() const = 0;
  // Host collectives over the ranks of this node (in local_rank order), or
  // over the ranks that share this local_rank (in cross_rank order), for
  // hierarchical algorithms.  Null when the transport has none.
  virtual Collectives* local_collectives() { return nullptr; }
  virtual Collectives* cross_collectives() { return nullptr; }

  // Process sets (core/process_set.h).  The core keeps the table of sets;
  // a backend only makes communicators for a list of ranks.
  // Host collectives over `world_ranks` (sorted, distinct), for process set `set_id`.
  // Called by every rank of the world at the same point with the same arguments;
  // a rank not in `world_ranks` gets *out == nullptr.
  virtual Status CreateSubsetCollectives(int set_id, const std::vector<int>& world_ranks,
                                         std::unique_ptr<Collectives>* out) {
    out->reset();
    return Status::FailedPrecondition("tfhvd: this transport does not support process sets");
  }
  // Device collectives of process set `set_id` for tensors on `device`, made
  // on first use (which every member reaches at the same point of the set's
  // response order) over `host`, the set's host collectives, where this rank
  // is `set_rank` of `set_size`.  Null when the build has none.
  virtual Collectives* SubsetDeviceCollectives(int set_id, Collectives* host, int set_rank,
                                               int set_size, int device) {
    return nullptr;
  }
  // Frees what SubsetDeviceCollectives made for `set_id`; called by every
  // member at the same point, before the set's host collectives go.
  virtual void ReleaseSubset(int set_id) {}
};

// The device of a device collective on a rank that has no tensor in it (a
// joined rank): the backend uses this process's own GPU, never another
// rank's ordinal.
constexpr int kOwnDevice = 1 << 30;

// Implemented by backends/factory.cc.  `excluded` is set (and OK returned)
// when this process is not one of `opts.ranks`.
Status CreateBackend(const BackendOptions& opts, std::unique_ptr<Backend>* out, bool* excluded);
// Finalises the transport library if tfhvd initialised it.  Called once at
// process exit.
void FinalizeTransports();
// Ends the whole job (MPI_Abort): for a process whose peers are stuck, where
// a finalize would block forever.
void AbortTransports(int code);

// What this build contains, for check-build and `mpi_built()` style queries.
struct BuildInfo {
  bool mpi = false;
  bool gloo = false;
  bool nccl = false;
  bool cuda = false;
  // Which tool built the GPU device code, for which architectures ("" in a
  // CPU build); cuda/device_kernels.h.
  const char* device_code = "";
  // The CUDA runtime and NCCL this library was built with and the ones it
  // runs with, and the CUDA driver ("" in a CPU build).
  const char* gpu_versions = "";
};
BuildInfo GetBuildInfo();

}  // namespace tfhvd

#endif  // TFHVD_CORE_BACKEND_H_
