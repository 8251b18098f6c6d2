// A one-process host backend for the NCCL harness on machines without MPI
// (tests/gpu/device_check.sh uses it when it finds no MPI).  It stands in
// for backends/factory.cc: the NCCL backend runs on top of it exactly as it
// runs on top of MPI, with a world of one rank.
#include <cstdlib>
#include <cstring>

#include "../../tfhvd_ops/backends/nccl/nccl_backend.h"
#include "../../tfhvd_ops/core/backend.h"

namespace tfhvd {
namespace {

class LoopbackControl : public ControlChannel {
 public:
  Status SendToCoordinator(std::string) override { return NoPeers(); }
  Status SendToWorker(int, std::string) override { return NoPeers(); }
  Status PollWorkers(std::vector<std::pair<int, std::string>>*) override { return Status::OK(); }
  Status PollCoordinator(std::vector<std::string>*) override { return Status::OK(); }
  Status FlushSends(double) override { return Status::OK(); }
  std::string Describe() const override { return "none (one rank)"; }

 private:
  static Status NoPeers() { return Status::Internal("loopback backend: there are no peers"); }
};

// Collectives over one rank: copies.
class LoopbackCollectives : public HostMemoryOps {
 public:
  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp) override {
    if (send != nullptr && send != recv) std::memcpy(recv, send, count * DataTypeSize(dtype));
    return Status::OK();
  }
  Status Allgatherv(const void* send, int64_t send_bytes, void* recv,
                    const std::vector<int64_t>&) override {
    if (send_bytes > 0) std::memcpy(recv, send, send_bytes);
    return Status::OK();
  }
  Status Broadcast(void*, int64_t, int) override { return Status::OK(); }
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                   const std::vector<int64_t>&) override {
    if (send_bytes[0] > 0) std::memcpy(recv, send, send_bytes[0]);
    return Status::OK();
  }
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                       DataType dtype, ReduceOp) override {
    if (counts[0] > 0) std::memcpy(recv, send, counts[0] * DataTypeSize(dtype));
    return Status::OK();
  }
  Status Barrier() override { return Status::OK(); }
  const char* name() const override { return "LOOPBACK"; }
};

class LoopbackBackend : public Backend {
 public:
  const Topology& topology() const override { return topo_; }
  ControlChannel* control() override { return &control_; }
  Collectives* collectives(int device) override { return device < 0 ? &host_ : nullptr; }
  bool threads_supported() const override { return true; }
  Collectives* local_collectives() override { return &host_; }
  Collectives* cross_collectives() override { return &host_; }

 private:
  Topology topo_;
  LoopbackControl control_;
  LoopbackCollectives host_;
};

}  // namespace

Status CreateBackend(const BackendOptions& opts, std::unique_ptr<Backend>* out, bool* excluded) {
  *excluded = false;
  return CreateNcclBackend(opts, std::make_unique<LoopbackBackend>(), out);
}

void FinalizeTransports() {}

void AbortTransports(int code) { std::_Exit(code); }

BuildInfo GetBuildInfo() {
  BuildInfo info;
  info.nccl = true;
  info.cuda = true;
  return info;
}

}  // namespace tfhvd
