// The copy/scale kernels, loaded once per GPU and shared by every
// NcclCollectives on it (the global set's and each process set's).  A loaded
// module is read-only and cuLaunchKernel may be called from any thread, so
// the process sets' worker threads launch from one module instead of each
// loading its own.  Owned by the NCCL backend, which outlives every
// NcclCollectives it makes.
#ifndef TFHVD_BACKENDS_NCCL_KERNEL_CACHE_H_
#define TFHVD_BACKENDS_NCCL_KERNEL_CACHE_H_

#include <map>
#include <memory>
#include <mutex>

#include "../../core/common.h"
#include "../../cuda/device_kernels.h"

namespace tfhvd {

class KernelCache {
 public:
  struct Kernels {
    cuda::DeviceKernels kernels;
    // OK: loaded.  Otherwise why they cannot load (no image for the GPU, a
    // driver too old for the PTX): plain copies then use cudaMemcpyAsync and
    // only a copy that scales fails, with this message.
    Status error;
  };

  // The kernels of `device`, loaded at the first call for it (the calling
  // thread's current device must be `device`); the same object afterwards.
  Kernels* Get(int device) {
    std::lock_guard<std::mutex> l(mu_);
    std::unique_ptr<Kernels>& k = loaded_[device];
    if (!k) {
      k = std::make_unique<Kernels>();
      k->error = k->kernels.Load(device);
    }
    return k.get();
  }

 private:
  std::mutex mu_;
  std::map<int, std::unique_ptr<Kernels>> loaded_;
};

}  // namespace tfhvd

#endif  // TFHVD_BACKENDS_NCCL_KERNEL_CACHE_H_
