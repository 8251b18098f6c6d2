// Just enough of CUDA for tfhvd_ops/cuda/gpu_kernels.cu to compile as host
// C++ (tests/gpu/kernel_emulation_test.cc): qualifiers, the thread index
// variables, uint4, and __half/__nv_bfloat16 with the host conversions of
// core/cpu_math.h.  The test runs every (block, thread) of a launch in turn;
// the kernel's threads never read each other's elements, so that is the
// same computation.
//
// The build chooses this header: the emulation test is compiled with
// -I tests/gpu/emulated_cuda, so the kernel's own <cuda_runtime.h>,
// <cuda_fp16.h> and <cuda_bf16.h> resolve here (the last two are one-line
// headers that include this one).  The shipped source names no test file.
#ifndef TFHVD_TESTS_GPU_EMULATED_CUDA_RUNTIME_H_
#define TFHVD_TESTS_GPU_EMULATED_CUDA_RUNTIME_H_

#include <cstdint>

#include "../../../tfhvd_ops/core/cpu_math.h"

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)

struct EmulatedDim {
  unsigned x = 0, y = 0, z = 0;
};
inline EmulatedDim blockIdx, threadIdx, gridDim, blockDim;

struct uint4 {
  unsigned x, y, z, w;
};

struct __half {
  uint16_t bits;
};
struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __half2float(__half h) { return tfhvd::HalfToFloat(h.bits); }
inline __half __float2half_rn(float f) { return __half{tfhvd::FloatToHalf(f)}; }
inline float __bfloat162float(__nv_bfloat16 b) { return tfhvd::BFloat16ToFloat(b.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return __nv_bfloat16{tfhvd::FloatToBFloat16(f)};
}

#endif  // TFHVD_TESTS_GPU_EMULATED_CUDA_RUNTIME_H_
