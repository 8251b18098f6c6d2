// Batched scaled copies for the device fusion buffer and pre/post scaling.
// One launch covers a whole batch: the tasks are cut into tiles of
// kTileBytes (gpu_kernels.h), numbered task after task by the launcher, and
// block b copies tile b, so the GPU's blocks are shared among the tasks in
// proportion to their bytes.  Compiled device-only (NVRTC by default; nvcc
// or clang where asked) to cubins and PTX that the library embeds and loads
// with the driver API (device_kernels.cc), so no host code lives here and no
// NVIDIA fatbinary tool is needed.
//
// Speed: 16-byte loads and stores when both pointers share their alignment
// (TensorFlow's allocations do), four of them in flight per thread in a
// whole tile before any store, and __restrict__ pointers when source and
// destination differ.
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

// A plain copy of the bytes [begin, end) of a task.  When source and
// destination share their offset within 16 bytes (always for TensorFlow's
// buffers, and for the fusion buffer's first tensor): head bytes up to the
// alignment, then 16 bytes per thread (a whole tile: four loads in flight
// per thread, then four stores), then the tail.  Otherwise 4-byte words
// where both allow it (a float32 tensor at an odd offset of the fusion
// buffer), else bytes.
__device__ void CopyTile(const Byte* __restrict__ s, Byte* __restrict__ d, long long begin,
                         long long end) {
  const int t = threadIdx.x;
  const unsigned long long sa = reinterpret_cast<unsigned long long>(s + begin);
  const unsigned long long da = reinterpret_cast<unsigned long long>(d + begin);
  if ((sa & 15ull) == (da & 15ull)) {
    long long head = static_cast<long long>((16ull - (sa & 15ull)) & 15ull);
    if (head > end - begin) head = end - begin;
    for (long long i = begin + t; i < begin + head; i += kThreadsPerBlock) d[i] = s[i];
    begin += head;
    const long long nvec = (end - begin) / 16;
    const uint4* __restrict__ vs = reinterpret_cast<const uint4*>(s + begin);
    uint4* __restrict__ vd = reinterpret_cast<uint4*>(d + begin);
    if (nvec == kTileBytes / 16) {
      uint4 r[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) r[k] = vs[t + k * kThreadsPerBlock];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) vd[t + k * kThreadsPerBlock] = r[k];
    } else {
      for (long long i = t; i < nvec; i += kThreadsPerBlock) vd[i] = vs[i];
    }
    begin += nvec * 16;
  } else if (((sa | da) & 3ull) == 0) {
    const long long nw = (end - begin) / 4;
    const unsigned* __restrict__ ws = reinterpret_cast<const unsigned*>(s + begin);
    unsigned* __restrict__ wd = reinterpret_cast<unsigned*>(d + begin);
    for (long long i = t; i < nw; i += kThreadsPerBlock) wd[i] = ws[i];
    begin += nw * 4;
  }
  for (long long i = begin + t; i < end; i += kThreadsPerBlock) d[i] = s[i];
}

// 16 bytes of T, loaded and stored as one vector.
template <typename T>
union Vec {
  uint4 raw;
  T v[16 / sizeof(T)];
};

// dst[i] = src[i] * f for the elements [first, last) of a task (a tile).
// kAliased: src == dst (in-place scaling), so the pointers must not be
// declared __restrict__; each thread still reads only what it writes.
template <typename T, bool kAliased>
__device__ void ScaleTile(const T* s, T* d, long long first, long long last, double f) {
  constexpr int kPer = 16 / sizeof(T);
  const int t = threadIdx.x;
  long long done = first;
  if (Aligned16(s, d)) {  // then so is every tile: it starts kTileBytes apart
    const long long nvec = (last - first) / kPer;
    const uint4* vs = reinterpret_cast<const uint4*>(s + first);
    uint4* vd = reinterpret_cast<uint4*>(d + first);
    if (nvec == kTileBytes / 16) {
      Vec<T> x[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) x[k].raw = vs[t + k * kThreadsPerBlock];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
#pragma unroll
        for (int j = 0; j < kPer; ++j) x[k].v[j] = Scale<T>(x[k].v[j], f);
        vd[t + k * kThreadsPerBlock] = x[k].raw;
      }
    } else {
      for (long long i = t; i < nvec; i += kThreadsPerBlock) {
        Vec<T> x;
        x.raw = vs[i];
#pragma unroll
        for (int j = 0; j < kPer; ++j) x.v[j] = Scale<T>(x.v[j], f);
        vd[i] = x.raw;
      }
    }
    done = first + nvec * kPer;
  }
  for (long long i = done + t; i < last; i += kThreadsPerBlock) d[i] = Scale<T>(s[i], f);
}

template <typename T>
__device__ void Scaled(const CopyTask& task, long long begin, long long end) {
  const T* s = static_cast<const T*>(task.src);
  T* d = static_cast<T*>(task.dst);
  const long long first = begin / static_cast<long long>(sizeof(T));
  const long long last = end / static_cast<long long>(sizeof(T));
  if (task.src == task.dst) {
    ScaleTile<T, true>(s, d, first, last, task.factor);
  } else {
    const T* __restrict__ rs = s;
    T* __restrict__ rd = d;
    ScaleTile<T, false>(rs, rd, first, last, task.factor);
  }
}

// The task of tile `b`: the last one whose first tile is at most b (a task
// with nothing to do has no tile and shares its first_tile with the next).
__device__ __forceinline__ int TaskOf(const CopyBatch& batch, long long b) {
  int lo = 0, hi = batch.n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (batch.tasks[mid].first_tile <= b) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
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
  const long long tile = blockIdx.x;
  const CopyTask& t = batch.tasks[TaskOf(batch, tile)];
  const long long bytes = t.count * ElementSize(t.dtype);
  const long long begin = (tile - t.first_tile) * kTileBytes;
  if (begin >= bytes) return;  // (not with the launcher's grid)
  const long long end = bytes - begin < kTileBytes ? bytes : begin + kTileBytes;
  if (t.factor == 1.0 || t.dtype == kBool) {
    if (t.src != t.dst) {
      CopyTile(static_cast<const Byte*>(t.src), static_cast<Byte*>(t.dst), begin, end);
    }
    return;
  }
  switch (t.dtype) {
    case kUInt8: Scaled<unsigned char>(t, begin, end); break;
    case kInt8: Scaled<signed char>(t, begin, end); break;
    case kUInt16: Scaled<unsigned short>(t, begin, end); break;
    case kInt16: Scaled<short>(t, begin, end); break;
    case kInt32: Scaled<int>(t, begin, end); break;
    case kInt64: Scaled<long long>(t, begin, end); break;
    case kFloat16: Scaled<__half>(t, begin, end); break;
    case kBFloat16: Scaled<__nv_bfloat16>(t, begin, end); break;
    case kFloat32: Scaled<float>(t, begin, end); break;
    case kFloat64: Scaled<double>(t, begin, end); break;
    default: break;
  }
}
