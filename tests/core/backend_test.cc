// The host backend's collectives, called directly (no runtime, no
// TensorFlow): every dtype and reduce op (float16/bfloat16 included), uneven
// allgather/alltoall/reducescatter, broadcast, barrier, the local and cross
// collectives and, where the backend has them, process-set collectives.
//
//   tfhvdrun --gloo -np 3 build/tfhvd_backend_test      (Gloo)
//   mpirun -np 3 build/tfhvd_backend_test               (MPI)
//
// Prints "N passed, M failed" and exits non-zero on any failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../../tfhvd_ops/core/backend.h"
#include "../../tfhvd_ops/core/cpu_math.h"
#include "../../tfhvd_ops/core/settings.h"

#include "check.h"

using namespace tfhvd;

namespace {


// Value of element i on `rank`, for a reduction test.
double Val(int rank, int i) { return (rank + 1) * 0.5 + (i % 3); }

template <typename T>
void TestTyped(Collectives* c, int rank, int size, DataType dt, ReduceOp op) {
  const int n = 7;
  std::vector<T> in(n), out(n);
  for (int i = 0; i < n; ++i) in[i] = static_cast<T>(Val(rank, i));
  CHECK(c->Allreduce(in.data(), out.data(), n, dt, op).ok());
  for (int i = 0; i < n; ++i) {
    T want = static_cast<T>(Val(0, i));
    for (int r = 1; r < size; ++r) {
      T v = static_cast<T>(Val(r, i));
      if (op == ReduceOp::kSum) want = static_cast<T>(want + v);
      if (op == ReduceOp::kMin) want = std::min(want, v);
      if (op == ReduceOp::kMax) want = std::max(want, v);
      if (op == ReduceOp::kProduct) want = static_cast<T>(want * v);
    }
    CHECK(out[i] == want);
  }
}

void Test16(Collectives* c, int rank, int size, bool bf, ReduceOp op) {
  const int n = 5;
  auto to = bf ? FloatToBFloat16 : FloatToHalf;
  auto from = bf ? BFloat16ToFloat : HalfToFloat;
  std::vector<uint16_t> buf(n);
  for (int i = 0; i < n; ++i) buf[i] = to(static_cast<float>(Val(rank, i)));
  // In place (send == nullptr).
  CHECK(c->Allreduce(nullptr, buf.data(), n, bf ? DataType::kBFloat16 : DataType::kFloat16, op)
            .ok());
  for (int i = 0; i < n; ++i) {
    double want = Val(0, i);
    for (int r = 1; r < size; ++r) {
      double v = Val(r, i);
      if (op == ReduceOp::kSum) want += v;
      if (op == ReduceOp::kMin) want = std::min(want, v);
      if (op == ReduceOp::kMax) want = std::max(want, v);
      if (op == ReduceOp::kProduct) want *= v;
    }
    CHECK(std::fabs(from(buf[i]) - want) <= 0.02 * std::fabs(want) + 1e-3);
  }
}

void TestReductions(Collectives* c, int rank, int size) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    TestTyped<uint8_t>(c, rank, size, DataType::kUInt8, op);
    TestTyped<int8_t>(c, rank, size, DataType::kInt8, op);
    TestTyped<uint16_t>(c, rank, size, DataType::kUInt16, op);
    TestTyped<int16_t>(c, rank, size, DataType::kInt16, op);
    TestTyped<int32_t>(c, rank, size, DataType::kInt32, op);
    TestTyped<int64_t>(c, rank, size, DataType::kInt64, op);
    TestTyped<float>(c, rank, size, DataType::kFloat32, op);
    TestTyped<double>(c, rank, size, DataType::kFloat64, op);
    Test16(c, rank, size, false, op);
    Test16(c, rank, size, true, op);
  }
  int32_t x = 1;
  Status st = c->Allreduce(nullptr, &x, 1, DataType::kBool, ReduceOp::kSum);
  CHECK(!st.ok() && st.message().find("bool") != std::string::npos);
}

// Rank r contributes r+1 bytes of value r (uneven).
void TestMovement(Collectives* c, int rank, int size) {
  std::vector<char> mine(rank + 1, static_cast<char>(rank));
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (int r = 0; r < size; ++r) sizes.push_back(r + 1), total += r + 1;
  std::vector<char> all(total, -1);
  CHECK(c->Allgatherv(mine.data(), rank + 1, all.data(), sizes).ok());
  int64_t off = 0;
  bool ok = true;
  for (int r = 0; r < size; ++r) {
    for (int k = 0; k <= r; ++k) ok &= all[off++] == static_cast<char>(r);
  }
  CHECK(ok);
  // Broadcast from the last rank.
  std::vector<int32_t> b(4, rank);
  CHECK(c->Broadcast(b.data(), 16, size - 1).ok());
  CHECK(b[3] == size - 1);
  // Alltoallv: to rank d, rank s sends s+d+1 bytes of value 10*s+d (some
  // empty when sizes are 0).
  std::vector<int64_t> sb, rb;
  std::vector<char> send, recv;
  for (int d = 0; d < size; ++d) {
    const int64_t n = (rank + d) % 2 == 0 ? 0 : rank + d + 1;
    sb.push_back(n);
    for (int64_t k = 0; k < n; ++k) send.push_back(static_cast<char>(10 * rank + d));
  }
  for (int s = 0; s < size; ++s) rb.push_back((s + rank) % 2 == 0 ? 0 : s + rank + 1);
  int64_t rtotal = 0;
  for (int64_t n : rb) rtotal += n;
  recv.assign(rtotal, -1);
  CHECK(c->Alltoallv(send.data(), sb, recv.data(), rb).ok());
  off = 0;
  ok = true;
  for (int s = 0; s < size; ++s) {
    for (int64_t k = 0; k < rb[s]; ++k) ok &= recv[off++] == static_cast<char>(10 * s + rank);
  }
  CHECK(ok);
  // Reduce-scatter, uneven: rank r gets r+1 floats.
  std::vector<float> in(total);
  for (int64_t i = 0; i < total; ++i) in[i] = static_cast<float>(i + rank);
  std::vector<float> out(rank + 1, -1);
  CHECK(c->ReduceScatter(in.data(), out.data(), sizes, DataType::kFloat32, ReduceOp::kSum).ok());
  const int64_t first = rank * (rank + 1) / 2;
  ok = true;
  for (int k = 0; k <= rank; ++k) {
    ok &= out[k] == static_cast<float>(size * (first + k) + size * (size - 1) / 2);
  }
  CHECK(ok);
  CHECK(c->Barrier().ok());
}

// Sum of world ranks over `c`, which must equal `want`.
void CheckSum(Collectives* c, int world_rank, int want) {
  int32_t v = world_rank;
  CHECK(c != nullptr && c->Allreduce(nullptr, &v, 1, DataType::kInt32, ReduceOp::kSum).ok());
  CHECK(v == want);
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
  const Topology t = backend->topology();  // a copy: printed after the backend is gone
  g_rank = t.rank;
  Collectives* c = backend->collectives(-1);
  TestReductions(c, t.rank, t.size);
  TestMovement(c, t.rank, t.size);
  // Local collectives: this host's ranks (all of them here); cross: the
  // ranks with this local rank (only this one on one host).
  CheckSum(backend->local_collectives(), t.rank, t.size * (t.size - 1) / 2);
  CheckSum(backend->cross_collectives(), t.rank, t.rank);
  const bool gloo = std::strcmp(c->name(), "Gloo") == 0;
  if (gloo && t.size >= 2) {
    // Process set {0, last}; a middle rank is outside it.  Twice with the
    // same id: each call is a fresh context.
    for (int round = 0; round < 2; ++round) {
      std::unique_ptr<Collectives> set;
      CHECK(backend->CreateSubsetCollectives(1, {0, t.size - 1}, &set).ok());
      const bool member = t.rank == 0 || t.rank == t.size - 1;
      CHECK((set != nullptr) == member);
      if (member) {
        CheckSum(set.get(), t.rank, t.size - 1);
        TestMovement(set.get(), t.rank == 0 ? 0 : 1, 2);
      }
    }
    std::unique_ptr<Collectives> bad;
    CHECK(!backend->CreateSubsetCollectives(2, {1, 0}, &bad).ok());
  }
  CHECK(c->Barrier().ok());
  backend.reset();
  FinalizeTransports();
  std::printf("%s backend, rank %d of %d: %d passed, %d failed\n", gloo ? "Gloo" : "MPI", t.rank,
              t.size, g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
