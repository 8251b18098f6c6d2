#include "nccl_backend.h"

#include "nccl_collectives.h"

#include <map>
#include <mutex>
#include <utility>

namespace tfhvd {
namespace {

// The host backend plus NCCL collectives for device tensors.  Declaration
// order matters: the NCCL collectives go first at destruction, while the
// host transport they were built over still exists.
class NcclBackend : public Backend {
 public:
  NcclBackend(const BackendOptions& opts, std::unique_ptr<Backend> host)
      : host_(std::move(host)), timeout_s_(opts.device_timeout_s) {
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

  Status CreateSubsetCollectives(int set_id, const std::vector<int>& world_ranks,
                                 std::unique_ptr<Collectives>* out) override {
    return host_->CreateSubsetCollectives(set_id, world_ranks, out);
  }
  // One NCCL communicator (and stream) per process set and GPU, made on the
  // set's first collective on that GPU; its unique id travels over the set's
  // host collectives, so only the set's members take part.
  Collectives* SubsetDeviceCollectives(int set_id, Collectives* host, int set_rank, int set_size,
                                       int device) override {
    if (host == nullptr) return nullptr;
    std::lock_guard<std::mutex> l(sets_mu_);  // each set's worker thread calls this
    auto& gpu = sets_[{set_id, device}];
    if (!gpu) {
      Topology topo;  // ranks within the set; flat algorithms only
      topo.rank = set_rank;
      topo.size = set_size;
      topo.local_rank = set_rank;
      topo.local_size = set_size;
      NcclPeers peers;
      peers.host = host;
      gpu = std::make_unique<NcclCollectives>(topo, peers, /*hierarchical=*/false, timeout_s_);
    }
    gpu->Select(device);
    return gpu.get();
  }
  void ReleaseSubset(int set_id) override {
    std::lock_guard<std::mutex> l(sets_mu_);
    for (auto it = sets_.begin(); it != sets_.end();) {
      it = it->first.first == set_id ? sets_.erase(it) : std::next(it);
    }
  }

 private:
  std::unique_ptr<Backend> host_;
  double timeout_s_;  // the longest wait for device work (TFHVD_NCCL_TIMEOUT)
  std::unique_ptr<NcclCollectives> gpu_;
  std::mutex sets_mu_;
  std::map<std::pair<int, int>, std::unique_ptr<NcclCollectives>> sets_;  // (set, device)
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
