// Device-memory Collectives over NCCL.
//
// Threading: only the runtime's background thread calls these methods, in
// the same order on every rank (the executor runs the agreed responses), so
// every lazy collective step below happens at the same point on all ranks.
//
// Ordering: everything runs on one CUDA stream owned here (one per process
// set and GPU).  WaitFor() makes the stream wait on a framework's ready event
// before the tensor is touched (once per event: a grouped op's entries share
// one).  Complete() records one event after a response's work and hands the
// wait for it to the finalizer (finalizer.h), which calls the executor back
// once the outputs are complete, in the order of the responses, while the
// loop negotiates and launches the next ones: their work queues behind on
// the same stream.  The finalizer spins on the event for up to kSpinWait
// (a small collective ends within microseconds), then sleeps in
// cudaEventSynchronize (a blocking-sync event): no sleep-polling, and an
// idle runtime has its threads asleep.  Synchronize() still blocks on the
// caller's thread (benchmarks, shutdown).  Copies into and out of the fusion
// buffer are queued and launched as one batched kernel (cuda/gpu_kernels.h)
// just before the next stream operation.
//
// Communicators: the global one is created by the first collective.  Init
// steps (all over the host collectives, so a failure on one rank is reported
// on every rank instead of hanging the others):
//   1. every rank selects its GPU and creates its stream; rank 0 makes the
//      ncclUniqueId; every rank's error message (or none) is allgathered;
//   2. rank 0's id is broadcast;
//   3. ncclCommInitRank, and its result is allgathered again.
// The node-local communicator of the hierarchical allreduce is made the same
// way over the local host collectives, on the first hierarchical allreduce.
//
// Errors: every CUDA and NCCL result is checked and carries the library's
// message, the rank and the GPU.  In an elastic job (TFHVD_ELASTIC, which
// the elastic launchers set) a failure stays a sticky error on every path
// below: what is in flight and every later call fail with it (Python sees
// HorovodInternalError), and the destructor (hvd.elastic.run's reset)
// aborts the communicators with ncclCommAbort, which also ends a stuck NCCL
// kernel, so the next init builds fresh ones; peers still waiting in a
// collective see the abort as NCCL's remote error or reach their deadline.  Every wait for the stream has a deadline
// (TFHVD_NCCL_TIMEOUT, else the stall-shutdown time, else 30 s) and
// watches ncclCommGetAsyncError (the finalizer's watchdog, every 50 ms while
// work is in flight; WaitStream on the loop's own few waits).  A failure that only this rank sees (a lost peer,
// a timeout, a GPU mismatch, out of memory, a launch error) ends the job
// through the host transport's abort (MPI_Abort) with a message naming the
// rank and the error: the peers may be waiting inside a collective this rank
// will never join, and ncclCommAbort/ncclCommDestroy are collective within a
// node, so the communicator is not touched on that path.  A one-rank job
// keeps the error as a sticky value instead (and fails what is in flight
// past the deadline).  Even after an error the stream is drained before
// outputs are handed back, deadline permitting.  A clean shutdown drains the
// stream, then calls ncclCommFinalize and ncclCommDestroy under the deadline.
//
// Hierarchical allreduce (Horovod's NCCLHierarchicalAllreduce): reduce-
// scatter within the node over NCCL, allreduce of each rank's slice across
// nodes over the host (MPI) cross collectives through pinned host memory,
// allgather within the node over NCCL.  Elements that do not divide evenly
// by local_size are reduced with one flat NCCL allreduce.  Needs a
// homogeneous job; otherwise the flat algorithm runs.
#ifndef TFHVD_BACKENDS_NCCL_NCCL_COLLECTIVES_H_
#define TFHVD_BACKENDS_NCCL_NCCL_COLLECTIVES_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../../core/backend.h"
#include "../../cuda/device_kernels.h"
#include "finalizer.h"
#include "kernel_cache.h"

namespace tfhvd {

struct NcclPeers {
  Collectives* host = nullptr;   // all ranks, host memory (MPI)
  Collectives* local = nullptr;  // this node's ranks (hierarchical only)
  Collectives* cross = nullptr;  // same local_rank on every node (hierarchical only)
};

class NcclCollectives : public Collectives {
 public:
  // `timeout_s`: the longest wait for device work (TFHVD_NCCL_TIMEOUT);
  // `elastic`: an elastic job (TFHVD_ELASTIC / HOROVOD_ELASTIC), where a
  // failure is an error of the collectives, not the end of the job.
  // `kernels`: the copy/scale kernels of every GPU, shared with the other
  // process sets' collectives (it must outlive this object).
  NcclCollectives(const Topology& topo, NcclPeers peers, bool hierarchical, double timeout_s,
                  KernelCache* kernels, bool elastic = false);
  ~NcclCollectives() override;
  NcclCollectives(const NcclCollectives&) = delete;
  NcclCollectives& operator=(const NcclCollectives&) = delete;

  // The GPU of the tensors about to be processed.  The first one binds this
  // process to its GPU; tfhvd runs one GPU per process.  kOwnDevice (a
  // joined rank) keeps the bound GPU, or binds GPU local_rank % count.
  void Select(int device) { requested_ = device; }

  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp op) override;
  Status Allgatherv(const void* send, int64_t send_bytes, void* recv,
                    const std::vector<int64_t>& recv_bytes) override;
  Status Broadcast(void* buf, int64_t bytes, int root) override;
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                   const std::vector<int64_t>& recv_bytes) override;
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op) override;
  Status Barrier() override;
  const char* name() const override { return "NCCL"; }

  // From the framework's allocator on this GPU where `framework` has one
  // (TensorFlow's), else cudaMalloc; grown in 1 MiB steps, after the stream
  // drained (queued work may still use the old one).
  void* FusionBuffer(int64_t bytes, OpContext* framework) override;
  Status ScaledCopy(const void* src, void* dst, int64_t count, DataType dtype,
                    double factor) override;
  Status Zero(void* dst, int64_t bytes) override;
  Status CheckReduce(DataType dtype, ReduceOp op) override;
  // float32/float64 Sum with a factor: one ncclAllReduce with a PreMulSum op;
  // float16/bfloat16 averages: ncclAvg.  No separate
  // scaling pass.  Integers keep Horovod's truncating scale pass.
  Status AllreduceScaled(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op,
                         double post) override;
  Status WaitFor(const ReadyEvent& event) override;
  Status Synchronize() override;
  void Complete(std::function<void(const Status&)> done) override;

  // For tests and benchmarks: the raw stream and communicator.
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }

 private:
  Status EnsureDevice();              // selects the GPU, creates the stream
  Status BeginCollective();           // EnsureDevice + communicator + queued copies
  Status InitComm(Collectives* over, int nranks, int rank, ncclComm_t* comm, const char* what);
  Status Flush();                     // launches queued copies
  // Polls the stream and NCCL's async errors until the stream drained, at
  // most timeout_s_; returns broken_ once drained.
  Status WaitStream(const char* what);
  // ncclCommAbort on every communicator, waited for at most the deadline.
  void AbortCommunicators();
  // Runs `work` (a blocking NCCL call that waits for peers); past the
  // deadline a watchdog ends the job (an elastic job too: its driver then
  // goes on without this process).
  void WithDeadline(const char* what, const std::function<void()>& work);
  Status Nccl(ncclResult_t r, const char* what, ncclComm_t comm);
  Status Cuda(cudaError_t e, const char* what);
  // Any failure but a deterministic argument check (which every rank sees
  // alike): with peers, in a job that is not elastic, ends the job (they may
  // wait for this rank inside a collective); alone, or in an elastic job,
  // makes the failure sticky (the destructor then aborts the communicators).
  Status Broken(const Status& st);
  // The sticky failure, or OK; any thread.
  Status Sticky() const;
  // The finalizer's watchdog: NCCL's asynchronous errors and the deadline.
  void Watch(Finalizer::Clock::duration oldest);
  Status TakeEvent(cudaEvent_t* out);  // a blocking-sync event from events_
  void GiveEvent(cudaEvent_t e);
  Status HierarchicalAllreduce(const void* send, void* recv, int64_t count, DataType dtype,
                               ncclDataType_t t, ncclRedOp_t o);

  Topology topo_;
  NcclPeers peers_;
  bool hierarchical_;
  double timeout_s_;
  bool elastic_;
  int requested_ = -1;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  ncclComm_t local_comm_ = nullptr;
  mutable std::mutex broken_mu_;
  Status broken_;                     // once set, every call fails with it
  std::atomic<bool> is_broken_{false};
  // The communicators the watchdog may read while the loop makes them.
  std::atomic<ncclComm_t> watched_[2] = {{nullptr}, {nullptr}};
  const void* waited_ = nullptr;      // the last event WaitFor queued, this response
  std::mutex events_mu_;
  std::vector<cudaEvent_t> events_;   // completion events, reused
  std::unique_ptr<Finalizer> finalizer_;  // made with the stream
  void* fusion_ = nullptr;
  int64_t fusion_bytes_ = 0;
  std::shared_ptr<Tensor> fusion_owner_;  // set: fusion_ is the framework's memory
  void* host_buf_ = nullptr;          // pinned staging for the cross-node step
  int64_t host_buf_bytes_ = 0;
  void* scratch_ = nullptr;           // barrier
  cuda::CopyBatch batch_;
  KernelCache* kernel_cache_;         // the backend's, one module per GPU
  // This GPU's kernels, taken from the cache at the first queued copy
  // (Flush); where they did not load, plain copies use cudaMemcpyAsync and a
  // scaling copy is an error naming kernels_->error.
  KernelCache::Kernels* kernels_ = nullptr;
};

}  // namespace tfhvd

#endif  // TFHVD_BACKENDS_NCCL_NCCL_COLLECTIVES_H_
