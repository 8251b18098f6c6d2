// Batched scaled copies for the device fusion buffer and pre/post scaling.
// One launch covers a whole batch: block row y works on task y.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "gpu_kernels.h"

namespace tfhvd {
namespace cuda {
namespace {

// Must match tfhvd::DataType (core/common.h), which this file cannot include
// without dragging host-only headers through nvcc.
enum Dtype : int32_t {
  kUInt8 = 0, kInt8 = 1, kUInt16 = 2, kInt16 = 3, kInt32 = 4, kInt64 = 5,
  kFloat16 = 6, kBFloat16 = 7, kFloat32 = 8, kFloat64 = 9, kBool = 10,
};

constexpr int kThreads = 256;
constexpr int kMaxBlocksPerTask = 512;

template <typename T>
__device__ __forceinline__ T Scale(T v, double f) {
  return static_cast<T>(static_cast<double>(v) * f);  // integers truncate
}
template <>
__device__ __forceinline__ float Scale(float v, double f) {
  return v * static_cast<float>(f);
}
template <>
__device__ __forceinline__ __half Scale(__half v, double f) {
  return __float2half_rn(__half2float(v) * static_cast<float>(f));
}
template <>
__device__ __forceinline__ __nv_bfloat16 Scale(__nv_bfloat16 v, double f) {
  return __float2bfloat16_rn(__bfloat162float(v) * static_cast<float>(f));
}

template <typename T>
__device__ void Run(const CopyTask& t) {
  const T* s = static_cast<const T*>(t.src);
  T* d = static_cast<T*>(t.dst);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t.factor == 1.0) {
    for (; i < t.count; i += stride) d[i] = s[i];
  } else {
    for (; i < t.count; i += stride) d[i] = Scale<T>(s[i], t.factor);
  }
}

// A plain copy moves raw bits of the element's width.
template <typename Bits>
__device__ void Copy(const CopyTask& t) {
  const Bits* s = static_cast<const Bits*>(t.src);
  Bits* d = static_cast<Bits*>(t.dst);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < t.count;
       i += stride) {
    d[i] = s[i];
  }
}

__global__ void BatchedScaledCopy(const CopyBatch batch) {
  const CopyTask& t = batch.tasks[blockIdx.y];
  if (t.factor == 1.0 || t.dtype == kBool) {
    switch (t.dtype) {
      case kUInt8: case kInt8: case kBool: Copy<uint8_t>(t); break;
      case kUInt16: case kInt16: case kFloat16: case kBFloat16: Copy<uint16_t>(t); break;
      case kInt32: case kFloat32: Copy<uint32_t>(t); break;
      default: Copy<uint64_t>(t); break;
    }
    return;
  }
  switch (t.dtype) {
    case kUInt8: Run<uint8_t>(t); break;
    case kInt8: Run<int8_t>(t); break;
    case kUInt16: Run<uint16_t>(t); break;
    case kInt16: Run<int16_t>(t); break;
    case kInt32: Run<int32_t>(t); break;
    case kInt64: Run<int64_t>(t); break;
    case kFloat16: Run<__half>(t); break;
    case kBFloat16: Run<__nv_bfloat16>(t); break;
    case kFloat32: Run<float>(t); break;
    case kFloat64: Run<double>(t); break;
    default: break;
  }
}

}  // namespace

int LaunchBatchedScaledCopy(const CopyBatch& batch, void* stream) {
  if (batch.n <= 0) return 0;
  int64_t most = 0;
  for (int i = 0; i < batch.n; ++i) {
    if (batch.tasks[i].count > most) most = batch.tasks[i].count;
  }
  if (most == 0) return 0;
  int64_t blocks = (most + kThreads - 1) / kThreads;
  dim3 grid(static_cast<unsigned>(blocks < kMaxBlocksPerTask ? blocks : kMaxBlocksPerTask),
            static_cast<unsigned>(batch.n));
  BatchedScaledCopy<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(batch);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cuda
}  // namespace tfhvd
