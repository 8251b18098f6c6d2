#include "adasum.h"

#include <algorithm>

#include "cpu_math.h"

namespace tfhvd {
namespace {

// Below this squared norm a vector is taken as zero: its coefficient is 1.
constexpr double kTinyNormSq = 1e-8;

// Element access in double precision, per storage type.
struct F32 {
  using T = float;
  static double Get(T v) { return v; }
  static T Put(double d) { return static_cast<float>(d); }
};
struct F64 {
  using T = double;
  static double Get(T v) { return v; }
  static T Put(double d) { return d; }
};
struct F16 {
  using T = uint16_t;
  static double Get(T v) { return HalfToFloat(v); }
  static T Put(double d) { return FloatToHalf(static_cast<float>(d)); }
};
struct BF16 {
  using T = uint16_t;
  static double Get(T v) { return BFloat16ToFloat(v); }
  static T Put(double d) { return FloatToBFloat16(static_cast<float>(d)); }
};

// out[0] += a.b, out[1] += |a|^2, out[2] += |b|^2.
template <typename E>
void DotAndNorms(const void* a, const void* b, int64_t n, double* out) {
  const auto* x = static_cast<const typename E::T*>(a);
  const auto* y = static_cast<const typename E::T*>(b);
  double dot = 0, xx = 0, yy = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double u = E::Get(x[i]), v = E::Get(y[i]);
    dot += u * v;
    xx += u * u;
    yy += v * v;
  }
  out[0] += dot;
  out[1] += xx;
  out[2] += yy;
}

// a = ca * a + cb * b.
template <typename E>
void Combine(void* a, const void* b, int64_t n, double ca, double cb) {
  auto* x = static_cast<typename E::T*>(a);
  const auto* y = static_cast<const typename E::T*>(b);
  for (int64_t i = 0; i < n; ++i) x[i] = E::Put(ca * E::Get(x[i]) + cb * E::Get(y[i]));
}

using DotFn = void (*)(const void*, const void*, int64_t, double*);
using CombineFn = void (*)(void*, const void*, int64_t, double, double);

bool Kernels(DataType dtype, DotFn* dot, CombineFn* combine) {
  switch (dtype) {
    case DataType::kFloat32: *dot = &DotAndNorms<F32>; *combine = &Combine<F32>; return true;
    case DataType::kFloat64: *dot = &DotAndNorms<F64>; *combine = &Combine<F64>; return true;
    case DataType::kFloat16: *dot = &DotAndNorms<F16>; *combine = &Combine<F16>; return true;
    case DataType::kBFloat16: *dot = &DotAndNorms<BF16>; *combine = &Combine<BF16>; return true;
    default: return false;
  }
}

bool IsPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

struct Window {
  int64_t lo, hi;  // elements [lo, hi) of the buffer
  int64_t size() const { return hi - lo; }
};

}  // namespace

Status CheckAdasum(const std::string& name, DataType dtype, int device, int set_size) {
  DotFn dot;
  CombineFn combine;
  if (!Kernels(dtype, &dot, &combine)) {
    return Status::InvalidArgument("tfhvd: tensor '" + name + "' is " + DataTypeName(dtype) +
                                   ": Adasum reduces float16, bfloat16, float32 and float64 "
                                   "tensors only");
  }
  if (device >= 0) {
    return Status::InvalidArgument("tfhvd: tensor '" + name + "' is on GPU " +
                                   std::to_string(device) +
                                   ": Adasum reduces host tensors only; place it on the CPU");
  }
  if (!IsPowerOfTwo(set_size)) {
    return Status::InvalidArgument("tfhvd: tensor '" + name + "': Adasum needs a power-of-two "
                                   "number of ranks, and this reduction has " +
                                   std::to_string(set_size));
  }
  return Status::OK();
}

double AdasumCoefficient(double dot, double own_norm_sq) {
  return own_norm_sq >= kTinyNormSq ? 1.0 - dot / (2.0 * own_norm_sq) : 1.0;
}

Status AdasumReducer::Reduce(Collectives* c, int rank, int size, void* buf, DataType dtype,
                             const std::vector<int64_t>& counts) {
  DotFn dot;
  CombineFn combine;
  if (!Kernels(dtype, &dot, &combine) || !IsPowerOfTwo(size)) {
    return Status::InvalidArgument(std::string("tfhvd: internal error: Adasum of ") +
                                   DataTypeName(dtype) + " over " + std::to_string(size) +
                                   " ranks");
  }
  if (size == 1) return Status::OK();
  const int64_t esize = DataTypeSize(dtype);
  char* data = static_cast<char*>(buf);
  const size_t tensors = counts.size();
  std::vector<int64_t> start(tensors + 1, 0);
  for (size_t i = 0; i < tensors; ++i) start[i + 1] = start[i] + counts[i];
  Window w{0, start[tensors]};
  scratch_.resize(static_cast<size_t>((w.size() + 1) / 2 * esize));
  sums_.resize(3 * tensors);
  peer_sums_.resize(3 * tensors);
  const int64_t sums_bytes = static_cast<int64_t>(3 * tensors * sizeof(double));
  std::vector<Window> parents;

  // 1-3: halve the window at each level and combine the halves.
  for (int level = 1; level < size; level <<= 1) {
    const int peer = rank ^ level;
    const bool left = (rank & level) == 0;
    const int64_t mid = w.lo + w.size() / 2;
    const Window keep = left ? Window{w.lo, mid} : Window{mid, w.hi};
    const Window give = left ? Window{mid, w.hi} : Window{w.lo, mid};
    TFHVD_RETURN_IF_ERROR(c->SendRecv(data + give.lo * esize, give.size() * esize,
                                      scratch_.data(), keep.size() * esize, peer));
    parents.push_back(w);
    w = keep;
    // Partial sums over this rank's piece of each tensor, in (left, right)
    // order on both sides so that the group's sums line up.
    std::fill(sums_.begin(), sums_.end(), 0.0);
    for (size_t i = 0; i < tensors; ++i) {
      const int64_t lo = std::max(w.lo, start[i]), hi = std::min(w.hi, start[i + 1]);
      if (lo >= hi) continue;
      double part[3] = {0, 0, 0};
      dot(data + lo * esize, scratch_.data() + (lo - w.lo) * esize, hi - lo, part);
      sums_[3 * i] = part[0];
      sums_[3 * i + 1] = left ? part[1] : part[2];
      sums_[3 * i + 2] = left ? part[2] : part[1];
    }
    // The group of 2 * level ranks under this tree node: recursive doubling.
    for (int d = 1; d <= level; d <<= 1) {
      TFHVD_RETURN_IF_ERROR(
          c->SendRecv(sums_.data(), sums_bytes, peer_sums_.data(), sums_bytes, rank ^ d));
      for (size_t k = 0; k < sums_.size(); ++k) sums_[k] += peer_sums_[k];
    }
    for (size_t i = 0; i < tensors; ++i) {
      const int64_t lo = std::max(w.lo, start[i]), hi = std::min(w.hi, start[i + 1]);
      if (lo >= hi) continue;
      const double d = sums_[3 * i];
      const double c_left = AdasumCoefficient(d, sums_[3 * i + 1]);
      const double c_right = AdasumCoefficient(d, sums_[3 * i + 2]);
      combine(data + lo * esize, scratch_.data() + (lo - w.lo) * esize, hi - lo,
              left ? c_left : c_right, left ? c_right : c_left);
    }
  }
  // 4: put the pieces back together, last level first.
  for (int level = size >> 1; level >= 1; level >>= 1) {
    const Window parent = parents.back();
    parents.pop_back();
    const bool left = (rank & level) == 0;  // this rank kept the first half
    const Window other = left ? Window{w.hi, parent.hi} : Window{parent.lo, w.lo};
    TFHVD_RETURN_IF_ERROR(c->SendRecv(data + w.lo * esize, w.size() * esize,
                                      data + other.lo * esize, other.size() * esize,
                                      rank ^ level));
    w = parent;
  }
  return Status::OK();
}

}  // namespace tfhvd
