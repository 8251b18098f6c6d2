// What the host and the device code of tfhvd's CUDA kernels share: the
// batched copy/scale task list.  The kernels themselves (gpu_kernels.cu) are
// compiled to cubins and PTX on their own and embedded as data; the host
// loads them with the driver API (device_kernels.h).  This header is plain
// C++ that NVRTC, clang, nvcc and g++ all compile.
#ifndef TFHVD_CUDA_GPU_KERNELS_H_
#define TFHVD_CUDA_GPU_KERNELS_H_

#if defined(__CUDACC_RTC__)
// NVRTC has no standard library headers.
typedef long long int64_t;
typedef int int32_t;
#else
#include <cstdint>
#endif

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
  // The task's first tile in the launch (set by the launcher,
  // device_kernels.h LayOutTiles): the tiles of a batch are numbered task
  // after task.
  int32_t first_tile;
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

// The kernel's symbol in the embedded images (extern "C": no mangling).
#define TFHVD_BATCHED_COPY_KERNEL "tfhvd_batched_scaled_copy"
// Threads per block of every launch.
constexpr int kThreadsPerBlock = 256;
// One block copies one tile: kTileBytes of one task (its last tile may be
// shorter), 16 bytes a thread four times over where the pointers allow, so
// every thread has four loads in flight before it stores.  A batch is as
// many blocks as it has tiles, so tasks of any sizes share the GPU in
// proportion to their bytes (a large task no longer ends alone).
constexpr int kUnroll = 4;
constexpr int64_t kTileBytes = int64_t{16} * kThreadsPerBlock * kUnroll;

}  // namespace cuda
}  // namespace tfhvd

#endif  // TFHVD_CUDA_GPU_KERNELS_H_
