// Host-callable launchers of tfhvd's CUDA kernels (gpu_kernels.cu).
//
// The header is plain C++ without CUDA headers, so the NCCL backend's .cc
// files and the TF-free test harness include it with any compiler; only the
// .cu file needs nvcc.  Streams are passed as void* (a cudaStream_t) and
// results come back as cudaError_t values (0: success).
#ifndef TFHVD_CUDA_GPU_KERNELS_H_
#define TFHVD_CUDA_GPU_KERNELS_H_

#include <cstdint>

namespace tfhvd {
namespace cuda {

// dst[i] = src[i] * factor for `count` elements of `dtype` (a tfhvd::DataType
// value).  src may equal dst.  Integers truncate toward zero and 16-bit
// floats scale in float, exactly like the host path (core/cpu_math.cc).
struct CopyTask {
  const void* src;
  void* dst;
  int64_t count;
  double factor;
  int32_t dtype;
};

// Up to kMaxBatch copies launched as one kernel: the copies into and out of
// the fusion buffer of one fused response.  Passed by value as the kernel's
// parameter (2.5 KiB, within CUDA's 4 KiB limit), so a launch needs no
// host-to-device upload.
constexpr int kMaxBatch = 64;
struct CopyBatch {
  int32_t n = 0;
  CopyTask tasks[kMaxBatch];
};

int LaunchBatchedScaledCopy(const CopyBatch& batch, void* stream);

}  // namespace cuda
}  // namespace tfhvd

#endif  // TFHVD_CUDA_GPU_KERNELS_H_
