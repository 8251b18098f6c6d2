#include "cpu_math.h"

#include "backend.h"

#include <cmath>
#include <cstring>

namespace tfhvd {

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan
    return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0);
  }
  if (absx >= 0x477ff000u) return sign | 0x7c00u;  // overflow -> inf
  if (absx < 0x38800000u) {                          // subnormal or zero
    if (absx < 0x33000000u) return sign;
    uint32_t exp = absx >> 23;
    uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;
    // round to nearest even on the dropped bits
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    uint32_t half = mant >> shift;
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t base = absx - 0x38000000u;  // rebias exponent
  uint32_t half = base >> 13;
  uint32_t rem = base & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;
  return sign | static_cast<uint16_t>(half);
}

float BFloat16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // nan
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

namespace {

template <typename T>
void ScaleTyped(const void* src, void* dst, int64_t n, double factor) {
  const T* s = static_cast<const T*>(src);
  T* d = static_cast<T*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(s[i] * factor);
}

template <>
void ScaleTyped<float>(const void* src, void* dst, int64_t n, double factor) {
  const float* s = static_cast<const float*>(src);
  float* d = static_cast<float*>(dst);
  float f = static_cast<float>(factor);
  for (int64_t i = 0; i < n; ++i) d[i] = s[i] * f;
}

template <uint16_t (*To)(float), float (*From)(uint16_t)>
void Scale16(const void* src, void* dst, int64_t n, double factor) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  uint16_t* d = static_cast<uint16_t*>(dst);
  float f = static_cast<float>(factor);
  for (int64_t i = 0; i < n; ++i) d[i] = To(From(s[i]) * f);
}

template <float (*From)(uint16_t), uint16_t (*To)(float)>
void Reduce16Typed(const uint16_t* in, uint16_t* inout, int64_t n, ReduceOp op) {
  for (int64_t i = 0; i < n; ++i) {
    float a = From(in[i]), b = From(inout[i]), r;
    switch (op) {
      case ReduceOp::kMin: r = std::fmin(a, b); break;
      case ReduceOp::kMax: r = std::fmax(a, b); break;
      case ReduceOp::kProduct: r = a * b; break;
      default: r = a + b; break;
    }
    inout[i] = To(r);
  }
}

}  // namespace

void ScaledCopy(const void* src, void* dst, int64_t count, DataType dtype, double factor) {
  if (factor == 1.0) {
    if (src != dst) std::memcpy(dst, src, count * DataTypeSize(dtype));
    return;
  }
  switch (dtype) {
    case DataType::kUInt8: ScaleTyped<uint8_t>(src, dst, count, factor); break;
    case DataType::kInt8: ScaleTyped<int8_t>(src, dst, count, factor); break;
    case DataType::kUInt16: ScaleTyped<uint16_t>(src, dst, count, factor); break;
    case DataType::kInt16: ScaleTyped<int16_t>(src, dst, count, factor); break;
    case DataType::kInt32: ScaleTyped<int32_t>(src, dst, count, factor); break;
    case DataType::kInt64: ScaleTyped<int64_t>(src, dst, count, factor); break;
    case DataType::kFloat16: Scale16<FloatToHalf, HalfToFloat>(src, dst, count, factor); break;
    case DataType::kBFloat16:
      Scale16<FloatToBFloat16, BFloat16ToFloat>(src, dst, count, factor);
      break;
    case DataType::kFloat32: ScaleTyped<float>(src, dst, count, factor); break;
    case DataType::kFloat64: ScaleTyped<double>(src, dst, count, factor); break;
    case DataType::kBool:
      if (src != dst) std::memcpy(dst, src, count);
      break;
  }
}

void Reduce16(const uint16_t* in, uint16_t* inout, int64_t count, bool bfloat, ReduceOp op) {
  if (bfloat) {
    Reduce16Typed<BFloat16ToFloat, FloatToBFloat16>(in, inout, count, op);
  } else {
    Reduce16Typed<HalfToFloat, FloatToHalf>(in, inout, count, op);
  }
}

void* HostMemoryOps::FusionBuffer(int64_t bytes, OpContext* /*framework: host memory*/) {
  if (static_cast<int64_t>(fusion_.size()) < bytes) fusion_.resize(bytes);
  return fusion_.data();
}

Status HostMemoryOps::ScaledCopy(const void* src, void* dst, int64_t count, DataType dtype,
                                 double factor) {
  ::tfhvd::ScaledCopy(src, dst, count, dtype, factor);
  return Status::OK();
}

Status HostMemoryOps::Zero(void* dst, int64_t bytes) {
  std::memset(dst, 0, bytes);
  return Status::OK();
}

}  // namespace tfhvd
