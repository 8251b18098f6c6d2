// Device-memory Collectives over NCCL.
//
// Threading: only the runtime's background thread calls these methods, in
// the same order on every rank (the executor runs the agreed responses), so
// every lazy collective step below happens at the same point on all ranks.
//
// Ordering: everything runs on one CUDA stream owned here.  WaitFor() makes
// the stream wait on a framework's ready event before the tensor is touched;
// Synchronize() blocks until the stream drained, so the executor's callbacks
// hand back complete outputs.  Copies into and out of the fusion buffer are
// queued and launched as one batched kernel (cuda/gpu_kernels.h) just before
// the next stream operation.
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
// message, the rank and the GPU.  While waiting, Synchronize() also polls
// ncclCommGetAsyncError: when NCCL reports a failure (a peer died or lost
// its connection) the communicators are aborted (ncclCommAbort), which ends
// the stuck kernels, the op fails, and every later GPU collective fails at
// once with the original error instead of hanging.
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

#include <string>
#include <vector>

#include "../../core/backend.h"
#include "../../cuda/gpu_kernels.h"

namespace tfhvd {

struct NcclPeers {
  Collectives* host = nullptr;   // all ranks, host memory (MPI)
  Collectives* local = nullptr;  // this node's ranks (hierarchical only)
  Collectives* cross = nullptr;  // same local_rank on every node (hierarchical only)
};

class NcclCollectives : public Collectives {
 public:
  NcclCollectives(const Topology& topo, NcclPeers peers, bool hierarchical);
  ~NcclCollectives() override;
  NcclCollectives(const NcclCollectives&) = delete;
  NcclCollectives& operator=(const NcclCollectives&) = delete;

  // The GPU of the tensors about to be processed.  The first one binds this
  // process to its GPU; tfhvd runs one GPU per process.
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

  void* FusionBuffer(int64_t bytes) override;
  Status ScaledCopy(const void* src, void* dst, int64_t count, DataType dtype,
                    double factor) override;
  Status Zero(void* dst, int64_t bytes) override;
  Status WaitFor(const ReadyEvent& event) override;
  Status Synchronize() override;

  // For tests and benchmarks: the raw stream and communicator.
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }

 private:
  Status EnsureDevice();              // selects the GPU, creates the stream
  Status BeginCollective();           // EnsureDevice + communicator + queued copies
  Status InitComm(Collectives* over, int nranks, int rank, ncclComm_t* comm, const char* what);
  Status Flush();                     // launches queued copies
  Status WaitStream(const char* what);  // polls the stream and NCCL's async errors
  Status Nccl(ncclResult_t r, const char* what, ncclComm_t comm);
  Status Cuda(cudaError_t e, const char* what);
  // Any failure but a deterministic argument check: aborts the
  // communicators and makes the failure sticky.
  Status Broken(const Status& st);
  Status HierarchicalAllreduce(const void* send, void* recv, int64_t count, DataType dtype,
                               ncclDataType_t t, ncclRedOp_t o);

  Topology topo_;
  NcclPeers peers_;
  bool hierarchical_;
  int requested_ = -1;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  ncclComm_t local_comm_ = nullptr;
  Status broken_;                     // once set, every call fails with it
  void* fusion_ = nullptr;
  int64_t fusion_bytes_ = 0;
  void* host_buf_ = nullptr;          // pinned staging for the cross-node step
  int64_t host_buf_bytes_ = 0;
  void* scratch_ = nullptr;           // barrier
  cuda::CopyBatch batch_;
};

}  // namespace tfhvd

#endif  // TFHVD_BACKENDS_NCCL_NCCL_COLLECTIVES_H_
