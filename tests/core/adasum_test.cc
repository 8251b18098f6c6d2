// Adasum (core/adasum.h) over the host backend's point-to-point exchange,
// called directly (no runtime, no TensorFlow), against a reference tree
// computed here in double precision (rounded to the tensor's type after
// each level, as the reduction stores it):
//   - Collectives::SendRecv: uneven sizes, empty sides, one and several calls;
//   - the coefficient's cases: parallel vectors average, orthogonal ones add,
//     a zero vector leaves the other unchanged;
//   - one and several fused tensors (each with its own coefficients), sizes
//     that do not halve evenly, every float type;
//   - a rank count that is not a power of two is an error; at 3 ranks the
//     reduction also runs over the process set {0, 2}.
//
//   mpirun -np 4 build/tfhvd_adasum_test         (MPI)
//   tfhvdrun --gloo -np 4 build/tfhvd_adasum_test (Gloo)
//
// Prints "N passed, M failed" and exits non-zero on any failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../../tfhvd_ops/core/adasum.h"
#include "../../tfhvd_ops/core/backend.h"
#include "../../tfhvd_ops/core/cpu_math.h"
#include "../../tfhvd_ops/core/settings.h"

#include "check.h"

using namespace tfhvd;

namespace {

bool IsPow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

// Rounds `v` to what `dt` stores.
double Round(double v, DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return static_cast<float>(v);
    case DataType::kFloat16: return HalfToFloat(FloatToHalf(static_cast<float>(v)));
    case DataType::kBFloat16: return BFloat16ToFloat(FloatToBFloat16(static_cast<float>(v)));
    default: return v;
  }
}

void Store(const std::vector<double>& v, DataType dt, std::vector<char>* out) {
  const int64_t es = DataTypeSize(dt);
  out->assign(v.size() * es, 0);
  for (size_t i = 0; i < v.size(); ++i) {
    char* p = out->data() + i * es;
    switch (dt) {
      case DataType::kFloat32: { float f = static_cast<float>(v[i]); std::memcpy(p, &f, 4); break; }
      case DataType::kFloat64: std::memcpy(p, &v[i], 8); break;
      case DataType::kFloat16: { uint16_t h = FloatToHalf(static_cast<float>(v[i])); std::memcpy(p, &h, 2); break; }
      default: { uint16_t h = FloatToBFloat16(static_cast<float>(v[i])); std::memcpy(p, &h, 2); break; }
    }
  }
}

std::vector<double> Load(const std::vector<char>& b, DataType dt) {
  const int64_t es = DataTypeSize(dt);
  std::vector<double> v(b.size() / es);
  for (size_t i = 0; i < v.size(); ++i) {
    const char* p = b.data() + i * es;
    switch (dt) {
      case DataType::kFloat32: { float f; std::memcpy(&f, p, 4); v[i] = f; break; }
      case DataType::kFloat64: std::memcpy(&v[i], p, 8); break;
      case DataType::kFloat16: { uint16_t h; std::memcpy(&h, p, 2); v[i] = HalfToFloat(h); break; }
      default: { uint16_t h; std::memcpy(&h, p, 2); v[i] = BFloat16ToFloat(h); break; }
    }
  }
  return v;
}

// The reference: a and b combined tensor by tensor (`counts`), straight
// from the definition.
std::vector<double> Pair(const std::vector<double>& a, const std::vector<double>& b,
                         const std::vector<int64_t>& counts, DataType dt) {
  std::vector<double> out(a.size());
  int64_t off = 0;
  for (int64_t n : counts) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = off; i < off + n; ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
    const double ca = aa >= 1e-8 ? 1 - ab / (2 * aa) : 1, cb = bb >= 1e-8 ? 1 - ab / (2 * bb) : 1;
    for (int64_t i = off; i < off + n; ++i) out[i] = Round(ca * a[i] + cb * b[i], dt);
    off += n;
  }
  return out;
}

// Level by level: (0,1), (2,3) ..., then the pairs' results, ...
std::vector<double> Tree(std::vector<std::vector<double>> v, const std::vector<int64_t>& counts,
                         DataType dt) {
  for (size_t step = 1; step < v.size(); step <<= 1) {
    for (size_t i = 0; i + step < v.size(); i += 2 * step) v[i] = Pair(v[i], v[i + step], counts, dt);
  }
  return v[0];
}

// Rank r's input: tensors of `counts` elements, correlated across ranks
// (so the coefficients are far from 1), each tensor at its own scale (so
// that coefficients over the whole buffer would differ from per-tensor
// ones).  Tensor 1 is zero on rank 1 (a joined rank, a zero gradient).
std::vector<double> Input(int r, const std::vector<int64_t>& counts, DataType dt) {
  std::vector<double> v;
  for (size_t t = 0; t < counts.size(); ++t) {
    const double scale = t % 2 ? 0.05 : 3.0;
    for (int64_t i = 0; i < counts[t]; ++i) {
      const double common = std::sin(0.7 * i + t), own = std::cos(1.3 * i * (r + 1) + 0.4 * r);
      v.push_back(t == 1 && r == 1 ? 0.0 : Round(scale * (common + 0.6 * own), dt));
    }
  }
  return v;
}

double Tolerance(DataType dt) {
  switch (dt) {
    case DataType::kFloat64: return 1e-12;
    case DataType::kFloat32: return 2e-6;
    case DataType::kFloat16: return 4e-3;
    default: return 3e-2;
  }
}

bool Close(const std::vector<double>& got, const std::vector<double>& want, DataType dt) {
  if (got.size() != want.size()) return false;
  bool ok = true;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = Tolerance(dt) * (1 + std::fabs(want[i]));
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      if (ok) {
        std::fprintf(stderr, "rank %d: %s element %zu: got %.9g, want %.9g\n", g_rank,
                     DataTypeName(dt), i, got[i], want[i]);
      }
      ok = false;
    }
  }
  return ok;
}

// Runs Adasum over `c` (this rank is `rank` of `size`) and checks it.
void TestReduce(AdasumReducer* red, Collectives* c, int rank, int size, DataType dt,
                const std::vector<int64_t>& counts) {
  std::vector<std::vector<double>> all;
  for (int r = 0; r < size; ++r) all.push_back(Input(r, counts, dt));
  std::vector<char> buf;
  Store(all[rank], dt, &buf);
  CHECK(red->Reduce(c, rank, size, buf.data(), dt, counts).ok());
  CHECK(Close(Load(buf, dt), Tree(all, counts, dt), dt));
}

void TestSendRecv(Collectives* c, int rank, int size) {
  const int peer = rank ^ 1;
  if (peer >= size) return;
  // Rank r sends 3 + r int32 of value 100 r + i; then an empty send one way.
  std::vector<int32_t> out(3 + rank), in(3 + peer, -1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = 100 * rank + static_cast<int32_t>(i);
  CHECK(c->SendRecv(out.data(), out.size() * 4, in.data(), in.size() * 4, peer).ok());
  bool ok = true;
  for (size_t i = 0; i < in.size(); ++i) ok &= in[i] == 100 * peer + static_cast<int32_t>(i);
  CHECK(ok);
  int32_t one = rank, got = -1;
  const bool sender = rank < peer;
  CHECK(c->SendRecv(&one, sender ? 4 : 0, &got, sender ? 0 : 4, peer).ok());
  CHECK(sender ? got == -1 : got == peer);
  // Several in a row arrive in order.
  for (int k = 0; k < 3; ++k) {
    int32_t v = 10 * k + rank, w = -1;
    CHECK(c->SendRecv(&v, 4, &w, 4, peer).ok());
    CHECK(w == 10 * k + peer);
  }
}

void TestCoefficientCases(AdasumReducer* red, Collectives* c, int rank, int size) {
  // Parallel (the same vector everywhere): the result is that vector.
  std::vector<double> g = {1.5, -2.0, 0.25, 4.0, 3.0};
  std::vector<double> buf = g;
  CHECK(red->Reduce(c, rank, size, buf.data(), DataType::kFloat64, {5}).ok());
  CHECK(Close(buf, g, DataType::kFloat64));
  // Orthogonal (a different unit axis per rank): the sum.
  std::vector<double> axis(size, 0.0), ones(size, 1.0);
  axis[rank] = 2.0;
  CHECK(red->Reduce(c, rank, size, axis.data(), DataType::kFloat64, {size}).ok());
  for (double& v : ones) v = 2.0;
  CHECK(Close(axis, ones, DataType::kFloat64));
  // Zero everywhere but rank 0: rank 0's vector.
  std::vector<double> z(4, 0.0), want = {1, 2, 3, 4};
  if (rank == 0) z = want;
  CHECK(red->Reduce(c, rank, size, z.data(), DataType::kFloat64, {4}).ok());
  CHECK(Close(z, want, DataType::kFloat64));
  CHECK(AdasumCoefficient(2.0, 4.0) == 0.75);
  CHECK(AdasumCoefficient(5.0, 1e-9) == 1.0);
}

void TestAll(Collectives* c, int rank, int size) {
  AdasumReducer red;
  TestSendRecv(c, rank, size);
  TestCoefficientCases(&red, c, rank, size);
  const std::vector<std::vector<int64_t>> layouts = {{1}, {2}, {37}, {1, 3, 7, 10}, {5, 0, 64, 3}};
  for (DataType dt : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                      DataType::kBFloat16}) {
    for (const auto& counts : layouts) TestReduce(&red, c, rank, size, dt, counts);
  }
  // A larger buffer than the scratch held before (the scratch grows).
  TestReduce(&red, c, rank, size, DataType::kFloat32, {1000, 3001});
}

}  // namespace

int main() {
  Settings settings;
  Status st = ParseSettings(ProcessEnv(), &settings);
  if (!st.ok()) {
    std::fprintf(stderr, "settings: %s\n", st.message().c_str());
    return 1;
  }
  BackendOptions opts;
  opts.controller = settings.controller;
  opts.cpu_operations = settings.cpu_operations;
  opts.launch = settings.launch;
  std::unique_ptr<Backend> backend;
  bool excluded = false;
  st = CreateBackend(opts, &backend, &excluded);
  if (!st.ok() || excluded) {
    std::fprintf(stderr, "backend: %s\n", st.message().c_str());
    return 1;
  }
  const Topology t = backend->topology();
  g_rank = t.rank;
  Collectives* c = backend->collectives(-1);
  const bool gloo = std::strcmp(c->name(), "Gloo") == 0;
  // Errors every rank finds alone, before moving any bytes.
  CHECK(CheckAdasum("x", DataType::kFloat32, -1, 4).ok());
  CHECK(CheckAdasum("x", DataType::kFloat16, -1, 1).ok());
  Status bad = CheckAdasum("grad_3", DataType::kFloat32, -1, 3);
  CHECK(!bad.ok() && bad.message().find("grad_3") != std::string::npos &&
        bad.message().find("power-of-two") != std::string::npos &&
        bad.message().find(" 3") != std::string::npos);
  bad = CheckAdasum("ints", DataType::kInt32, -1, 2);
  CHECK(!bad.ok() && bad.message().find("int32") != std::string::npos);
  CHECK(!CheckAdasum("g", DataType::kFloat32, 0, 2).ok());
  AdasumReducer red;
  std::vector<float> v(4, 1.0f);
  if (IsPow2(t.size)) {
    TestAll(c, t.rank, t.size);
  } else {
    CHECK(!red.Reduce(c, t.rank, t.size, v.data(), DataType::kFloat32, {4}).ok());
    // The power-of-two process set {0, 2} of the first three ranks.
    std::unique_ptr<Collectives> set;
    CHECK(backend->CreateSubsetCollectives(1, {0, 2}, &set).ok());
    CHECK((set != nullptr) == (t.rank == 0 || t.rank == 2));
    if (set) TestAll(set.get(), t.rank / 2, 2);
  }
  CHECK(c->Barrier().ok());
  backend.reset();
  FinalizeTransports();
  std::printf("Adasum over %s, rank %d of %d: %d passed, %d failed\n", gloo ? "Gloo" : "MPI",
              t.rank, t.size, g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
