#include "nccl_backend.h"

#include "nccl_collectives.h"

namespace tfhvd {
namespace {

// The host backend plus NCCL collectives for device tensors.  Declaration
// order matters: the NCCL collectives go first at destruction, while the
// host transport they were built over still exists.
class NcclBackend : public Backend {
 public:
  NcclBackend(const BackendOptions& opts, std::unique_ptr<Backend> host) : host_(std::move(host)) {
    NcclPeers peers;
    peers.host = host_->collectives(-1);
    if (opts.hierarchical_allreduce) {
      peers.local = host_->local_collectives();
      peers.cross = host_->cross_collectives();
    }
    gpu_ = std::make_unique<NcclCollectives>(host_->topology(), peers,
                                             opts.hierarchical_allreduce, opts.device_timeout_s);
  }

  const Topology& topology() const override { return host_->topology(); }
  ControlChannel* control() override { return host_->control(); }
  Collectives* collectives(int device) override {
    if (device < 0) return host_->collectives(device);
    gpu_->Select(device);
    return gpu_.get();
  }
  bool has_device_collectives() const override { return true; }
  bool threads_supported() const override { return host_->threads_supported(); }
  Collectives* local_collectives() override { return host_->local_collectives(); }
  Collectives* cross_collectives() override { return host_->cross_collectives(); }

 private:
  std::unique_ptr<Backend> host_;
  std::unique_ptr<NcclCollectives> gpu_;
};

}  // namespace

Status CreateNcclBackend(const BackendOptions& opts, std::unique_ptr<Backend> host,
                         std::unique_ptr<Backend>* out) {
  if (host->collectives(-1) == nullptr) {
    return Status::Internal("tfhvd: the NCCL backend needs host collectives to exchange its id");
  }
  *out = std::make_unique<NcclBackend>(opts, std::move(host));
  return Status::OK();
}

const char* NcclDeviceCodeInfo() { return cuda::kDeviceCodeInfo; }

}  // namespace tfhvd
