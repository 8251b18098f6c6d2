// Batched scaled copies for the device fusion buffer and pre/post scaling.
// One launch covers a whole batch: block row y works on task y; the x blocks
// of a row stride over its elements.  Compiled device-only (NVRTC by
// default; nvcc or clang where asked) to cubins and PTX that the library
// embeds and loads with the driver API (device_kernels.cc), so no host code
// lives here and no NVIDIA fatbinary tool is needed.
//
// Speed: 16-byte loads and stores when both pointers are 16-byte aligned
// (every fusion-buffer slot and TensorFlow allocation is), __restrict__
// pointers when source and destination differ, and grids sized from the SM
// count by the launcher.
//
// tests/gpu/kernel_emulation_test.cc also runs this file on the host: its
// build puts host versions of the three CUDA headers below first on the
// include path, so nothing here knows about the test.
#if !defined(__CUDACC_RTC__)
#include <cuda_runtime.h>
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu_kernels.h"

namespace tfhvd {
namespace cuda {
namespace {

// Must match tfhvd::DataType (core/common.h), which this file cannot include
// (it is compiled without the host standard library).
enum Dtype : int32_t {
  kUInt8 = 0, kInt8 = 1, kUInt16 = 2, kInt16 = 3, kInt32 = 4, kInt64 = 5,
  kFloat16 = 6, kBFloat16 = 7, kFloat32 = 8, kFloat64 = 9, kBool = 10,
};

typedef unsigned char Byte;

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

__device__ __forceinline__ bool Aligned16(const void* a, const void* b) {
  return ((reinterpret_cast<unsigned long long>(a) | reinterpret_cast<unsigned long long>(b)) &
          15ull) == 0;
}

__device__ __forceinline__ long long Tid() {
  return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long Stride() {
  return static_cast<long long>(gridDim.x) * blockDim.x;
}

// A plain copy of `bytes` raw bytes.  When source and destination share
// their offset within 16 bytes (always for TensorFlow's buffers, and for the
// fusion buffer's first tensor): head bytes up to the alignment, then 16
// bytes per thread and step, then the tail.  Otherwise 4-byte words where
// both allow it (a float32 tensor at an odd offset of the fusion buffer),
// else bytes.
__device__ void Copy(const Byte* __restrict__ s, Byte* __restrict__ d, long long bytes) {
  const unsigned long long sa = reinterpret_cast<unsigned long long>(s);
  const unsigned long long da = reinterpret_cast<unsigned long long>(d);
  if ((sa & 15ull) == (da & 15ull)) {
    long long head = static_cast<long long>((16ull - (sa & 15ull)) & 15ull);
    if (head > bytes) head = bytes;
    for (long long i = Tid(); i < head; i += Stride()) d[i] = s[i];
    const long long nvec = (bytes - head) / 16;
    const uint4* __restrict__ vs = reinterpret_cast<const uint4*>(s + head);
    uint4* __restrict__ vd = reinterpret_cast<uint4*>(d + head);
    for (long long i = Tid(); i < nvec; i += Stride()) vd[i] = vs[i];
    for (long long i = head + nvec * 16 + Tid(); i < bytes; i += Stride()) d[i] = s[i];
    return;
  }
  long long done = 0;
  if (((sa | da) & 3ull) == 0) {
    const long long nw = bytes / 4;
    const unsigned* __restrict__ ws = reinterpret_cast<const unsigned*>(s);
    unsigned* __restrict__ wd = reinterpret_cast<unsigned*>(d);
    for (long long i = Tid(); i < nw; i += Stride()) wd[i] = ws[i];
    done = nw * 4;
  }
  for (long long i = done + Tid(); i < bytes; i += Stride()) d[i] = s[i];
}

// 16 bytes of T, loaded and stored as one vector.
template <typename T>
union Vec {
  uint4 raw;
  T v[16 / sizeof(T)];
};

// dst = src * f, element-wise.  kAliased: src == dst (in-place scaling), so
// the pointers must not be declared __restrict__.
template <typename T, bool kAliased>
__device__ void ScaleBody(const T* s, T* d, long long n, double f) {
  constexpr int kPer = 16 / sizeof(T);
  long long done = 0;
  if (Aligned16(s, d)) {
    const long long nvec = n / kPer;
    const uint4* vs = reinterpret_cast<const uint4*>(s);
    uint4* vd = reinterpret_cast<uint4*>(d);
    for (long long i = Tid(); i < nvec; i += Stride()) {
      Vec<T> x;
      x.raw = vs[i];
#pragma unroll
      for (int k = 0; k < kPer; ++k) x.v[k] = Scale<T>(x.v[k], f);
      vd[i] = x.raw;
    }
    done = nvec * kPer;
  }
  for (long long i = done + Tid(); i < n; i += Stride()) d[i] = Scale<T>(s[i], f);
}

template <typename T>
__device__ void Scaled(const CopyTask& t) {
  const T* s = static_cast<const T*>(t.src);
  T* d = static_cast<T*>(t.dst);
  if (t.src == t.dst) {
    ScaleBody<T, true>(s, d, t.count, t.factor);
  } else {
    const T* __restrict__ rs = s;
    T* __restrict__ rd = d;
    ScaleBody<T, false>(rs, rd, t.count, t.factor);
  }
}

__device__ int ElementSize(int32_t dtype) {
  switch (dtype) {
    case kUInt8: case kInt8: case kBool: return 1;
    case kUInt16: case kInt16: case kFloat16: case kBFloat16: return 2;
    case kInt32: case kFloat32: return 4;
    default: return 8;
  }
}

}  // namespace
}  // namespace cuda
}  // namespace tfhvd

extern "C" __global__ void __launch_bounds__(tfhvd::cuda::kThreadsPerBlock)
    tfhvd_batched_scaled_copy(const tfhvd::cuda::CopyBatch batch) {
  using namespace tfhvd::cuda;  // NOLINT
  const CopyTask& t = batch.tasks[blockIdx.y];
  if (t.factor == 1.0 || t.dtype == kBool) {
    if (t.src != t.dst) {
      Copy(static_cast<const Byte*>(t.src), static_cast<Byte*>(t.dst),
           t.count * ElementSize(t.dtype));
    }
    return;
  }
  switch (t.dtype) {
    case kUInt8: Scaled<unsigned char>(t); break;
    case kInt8: Scaled<signed char>(t); break;
    case kUInt16: Scaled<unsigned short>(t); break;
    case kInt16: Scaled<short>(t); break;
    case kInt32: Scaled<int>(t); break;
    case kInt64: Scaled<long long>(t); break;
    case kFloat16: Scaled<__half>(t); break;
    case kBFloat16: Scaled<__nv_bfloat16>(t); break;
    case kFloat32: Scaled<float>(t); break;
    case kFloat64: Scaled<double>(t); break;
    default: break;
  }
}
