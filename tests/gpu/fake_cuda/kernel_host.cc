// The batched copy kernel's real source (cuda/gpu_kernels.cu), compiled as
// host C++ through tests/gpu/emulated_cuda (this file's build puts that
// folder first on the include path and no real CUDA header), run for every
// (block, thread) of a launch in turn, as kernel_emulation_test.cc does.
// The emulation's thread indices are globals: one launch at a time.
#include "../../../tfhvd_ops/cuda/gpu_kernels.cu"

#include "../../../tfhvd_ops/cuda/device_kernels.h"

#include <cstddef>
#include <mutex>

namespace fakegpu {

size_t CopyKernelParamBytes() { return sizeof(tfhvd::cuda::CopyBatch); }

void RunCopyKernel(const void* params, unsigned gx, unsigned gy, unsigned bx) {
  static std::mutex mu;
  std::lock_guard<std::mutex> l(mu);
  const auto& batch = *static_cast<const tfhvd::cuda::CopyBatch*>(params);
  gridDim = {gx, gy, 1};
  blockDim = {bx, 1, 1};
  for (unsigned y = 0; y < gy; ++y) {
    for (unsigned x = 0; x < gx; ++x) {
      for (unsigned t = 0; t < bx; ++t) {
        blockIdx = {x, y, 0};
        threadIdx = {t, 0, 0};
        tfhvd_batched_scaled_copy(batch);
      }
    }
  }
}

// The launch's grid against its batch: one block of kThreadsPerBlock per
// tile, the tiles numbered as LayOutTiles does.
bool CopyKernelGridFits(const void* params, unsigned gx, unsigned gy, unsigned bx) {
  const auto& batch = *static_cast<const tfhvd::cuda::CopyBatch*>(params);
  if (batch.n < 1 || batch.n > tfhvd::cuda::kMaxBatch || gy != 1 ||
      bx != static_cast<unsigned>(tfhvd::cuda::kThreadsPerBlock)) {
    return false;
  }
  tfhvd::cuda::CopyBatch laid = batch;
  if (tfhvd::cuda::LayOutTiles(&laid) != static_cast<int64_t>(gx)) return false;
  for (int i = 0; i < batch.n; ++i) {
    if (laid.tasks[i].first_tile != batch.tasks[i].first_tile) return false;
  }
  return true;
}

}  // namespace fakegpu
