// Element-wise helpers on host memory for every tfhvd dtype: scaled copies
// (pre/post scale factors, Average) and the reductions MPI lacks (float16,
// bfloat16).  Integer scaling truncates toward zero, as Horovod does.
#ifndef TFHVD_CORE_CPU_MATH_H_
#define TFHVD_CORE_CPU_MATH_H_

#include <cstdint>

#include "common.h"

namespace tfhvd {

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

// dst[i] = src[i] * factor (a plain copy when factor == 1).  src may be dst.
void ScaledCopy(const void* src, void* dst, int64_t count, DataType dtype, double factor);

// inout[i] = op(in[i], inout[i]) for 16-bit floats; op is Sum/Min/Max/Product.
void Reduce16(const uint16_t* in, uint16_t* inout, int64_t count, bool bfloat, ReduceOp op);

}  // namespace tfhvd

#endif  // TFHVD_CORE_CPU_MATH_H_
