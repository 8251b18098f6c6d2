#include "nccl_backend.h"

#include "nccl_collectives.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace tfhvd {
namespace {

// The host backend plus NCCL collectives for device tensors.  Declaration
// order matters: the NCCL collectives go first at destruction, while the
// host transport they were built over still exists.
class NcclBackend : public Backend {
 public:
  NcclBackend(const BackendOptions& opts, std::unique_ptr<Backend> host)
      : host_(std::move(host)), timeout_s_(opts.device_timeout_s), elastic_(opts.elastic) {
    NcclPeers peers;
    peers.host = host_->collectives(-1);
    if (opts.hierarchical_allreduce) {
      peers.local = host_->local_collectives();
      peers.cross = host_->cross_collectives();
    }
    gpu_ = std::make_unique<NcclCollectives>(host_->topology(), peers,
                                             opts.hierarchical_allreduce, opts.device_timeout_s,
                                             &kernels_, opts.elastic);
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
  // One NCCL communicator, stream and fusion buffer per process set and GPU,
  // made on the set's first collective on that GPU (its unique id travels
  // over the set's host collectives, so only the set's members take part)
  // and released with the set.  Not shared: each set runs on a worker thread
  // of its own, and ranks may order two sets' collectives differently, which
  // one stream would turn into a deadlock.  The kernel module is shared.
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
      gpu = std::make_unique<NcclCollectives>(topo, peers, /*hierarchical=*/false, timeout_s_,
                                              &kernels_, elastic_);
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
  bool elastic_;      // an elastic job: a device failure is an error (NcclCollectives)
  KernelCache kernels_;  // before the collectives: they use it until they are gone
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

namespace {

std::string CudaVersionString(int v) {  // CUDART_VERSION style: 12050 -> "12.5"
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string NcclVersionString(int v) {  // NCCL_VERSION_CODE, both of its layouts
  if (v <= 0) return "unknown";
  const bool wide = v >= 20900;  // from 2.9: major * 10000 + minor * 100 + patch
  const int major = wide ? v / 10000 : v / 1000;
  const int minor = wide ? (v % 10000) / 100 : (v % 1000) / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100);
}

}  // namespace

const char* NcclVersionsInfo() {
  // In a TensorFlow process these calls may reach TensorFlow's own CUDA
  // stubs, which fail where TensorFlow finds no CUDA libraries: then the
  // version is "unavailable", with the reason.
  static const std::string info = [] {
    int runtime = 0, driver = 0, nccl = 0;
    std::string runtime_s, nccl_s;
    const cudaError_t re = cudaRuntimeGetVersion(&runtime);
    runtime_s = re == cudaSuccess ? CudaVersionString(runtime)
                                  : std::string("unavailable (") + cudaGetErrorName(re) + ")";
    const ncclResult_t nr = ncclGetVersion(&nccl);
    nccl_s = nr == ncclSuccess ? NcclVersionString(nccl)
                               : std::string("unavailable (") + ncclGetErrorString(nr) + ")";
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    return "built with CUDA runtime " + CudaVersionString(CUDART_VERSION) + ", NCCL " +
           NcclVersionString(NCCL_VERSION_CODE) + "; runs with CUDA runtime " + runtime_s +
           ", NCCL " + nccl_s + ", CUDA driver " + CudaVersionString(driver);
  }();
  return info.c_str();
}

}  // namespace tfhvd
