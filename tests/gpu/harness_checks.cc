// The harness's checks: every op on device tensors, through the real runtime.
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <sstream>
#include <thread>

#include "../../tfhvd_ops/core/backend.h"
#include "../../tfhvd_ops/core/c_api.h"
#include "../../tfhvd_ops/core/runtime.h"
#include "harness.h"

namespace harness {
namespace {

using core::CollectiveType;
using core::DataType;

// Small integers: exact in every dtype, sums stay exact for many ranks.
double Value(int rank, int64_t i) { return (rank + 1) + static_cast<double>(i % 5); }

std::shared_ptr<Buffer> Filled(DataType dt, core::Shape shape, int device, int rank) {
  auto b = std::make_shared<Buffer>(dt, shape, device);
  std::vector<double> v(core::NumElements(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = Value(rank, i);
  b->Write(v);
  return b;
}

std::string Compare(const std::vector<double>& got, const std::vector<double>& want,
                    double tol = 1e-3) {
  if (got.size() != want.size()) {
    return "got " + std::to_string(got.size()) + " elements, want " + std::to_string(want.size());
  }
  for (size_t i = 0; i < got.size(); ++i) {
    // (Written so that a NaN, e.g. never-written 0xff bytes, is a mismatch.)
    if (!(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])))) {
      std::ostringstream o;
      o << "element " << i << ": got " << got[i] << ", want " << want[i];
      return o.str();
    }
  }
  return "";
}

std::string Failed(const core::Status& st) { return st.ok() ? "" : st.message(); }

std::string AllreduceCheck(const Env& env, DataType dt, core::ReduceOp op, double pre,
                           double post, int64_t n) {
  auto in = Filled(dt, {n}, env.device, env.rank);
  Op o = MakeOp(std::string("allreduce.") + core::DataTypeName(dt) + "." + core::ReduceOpName(op),
                CollectiveType::kAllreduce, in);
  o.params.reduce_op = op;
  o.params.prescale = pre;
  o.params.postscale = post;
  std::string why = Failed(Run({&o}));
  if (!why.empty()) return why;
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) {
    double acc = op == core::ReduceOp::kProduct ? 1 : (op == core::ReduceOp::kMin ? 1e30 : 0);
    if (op == core::ReduceOp::kMax) acc = -1e30;
    for (int r = 0; r < env.size; ++r) {
      double v = Value(r, i) * pre;
      if (op == core::ReduceOp::kMin) acc = std::min(acc, v);
      else if (op == core::ReduceOp::kMax) acc = std::max(acc, v);
      else if (op == core::ReduceOp::kProduct) acc *= v;
      else acc += v;
    }
    if (op == core::ReduceOp::kAverage) acc /= env.size;
    want[i] = acc * post;
    if (!core::IsFloatingPoint(dt)) want[i] = std::trunc(want[i]);
  }
  return Compare(ReadTensor(*Output(o)), want);
}

// Runs `ops` as one request; each output must be `scale` times the sum of
// the inputs of `ranks` (Filled's values).
std::string RunAndCheckSums(std::vector<Op>* ops, const std::vector<int>& ranks, double scale) {
  std::vector<Op*> ptrs;
  for (Op& o : *ops) ptrs.push_back(&o);
  std::string why = Failed(Run(ptrs));
  for (Op& o : *ops) {
    if (!why.empty()) break;
    std::vector<double> want(core::NumElements(o.params.shape), 0);
    for (size_t i = 0; i < want.size(); ++i) {
      for (int r : ranks) want[i] += scale * Value(r, i);
    }
    why = Compare(ReadTensor(*Output(o)), want);
  }
  return why;
}

std::vector<int> Ranks(int n) {
  std::vector<int> out(n);
  for (int r = 0; r < n; ++r) out[r] = r;
  return out;
}

std::string Fused(const Env& env, int tensors) {
  std::vector<Op> ops;
  for (int t = 0; t < tensors; ++t) {
    int64_t n = 1 + (t * 977) % 5000;
    Op o = MakeOp("fused." + std::to_string(tensors) + "." + std::to_string(t),
                  CollectiveType::kAllreduce,
                  Filled(DataType::kFloat32, {n}, env.device, env.rank));
    o.params.reduce_op = core::ReduceOp::kAverage;
    o.params.prescale = 2.0;
    ops.push_back(std::move(o));
  }
  return RunAndCheckSums(&ops, Ranks(env.size), 2.0 / env.size);
}

std::string Allgather(const Env& env) {
  Op o = MakeOp("allgather", CollectiveType::kAllgather,
                Filled(DataType::kFloat32, {env.rank + 1, 3}, env.device, env.rank));
  std::string why = Failed(Run({&o}));
  if (!why.empty()) return why;
  std::vector<double> want;
  for (int r = 0; r < env.size; ++r) {
    for (int64_t i = 0; i < (r + 1) * 3; ++i) want.push_back(Value(r, i));
  }
  return Compare(ReadTensor(*Output(o)), want);
}

std::string Broadcast(const Env& env, DataType dt, int root) {
  Op o = MakeOp(std::string("broadcast.") + core::DataTypeName(dt) + ".root" +
                    std::to_string(root),
                CollectiveType::kBroadcast,
                Filled(dt, {1000}, env.device, env.rank));
  o.params.root_rank = root;
  std::string why = Failed(Run({&o}));
  if (!why.empty()) return why;
  std::vector<double> want(1000);
  for (int64_t i = 0; i < 1000; ++i) want[i] = Value(root, i);
  return Compare(ReadTensor(*Output(o)), want);
}

int Rows(int from, int to) { return (from + to) % 3; }  // alltoall rows from -> to

std::string Alltoall(const Env& env) {
  int64_t rows = 0;
  std::vector<int32_t> splits;
  std::vector<double> values;
  for (int j = 0; j < env.size; ++j) {
    splits.push_back(Rows(env.rank, j));
    for (int k = 0; k < Rows(env.rank, j); ++k, ++rows) {
      values.push_back(env.rank * 1000 + j * 10 + k);
      values.push_back(-values.back());
    }
  }
  auto in = std::make_shared<Buffer>(DataType::kFloat32, core::Shape{rows, 2}, env.device);
  in->Write(values);
  Op o = MakeOp("alltoall", CollectiveType::kAlltoall, in);
  o.params.splits = splits;
  std::string why = Failed(Run({&o}));
  if (!why.empty()) return why;
  std::vector<double> want, want_splits;
  for (int j = 0; j < env.size; ++j) {
    want_splits.push_back(Rows(j, env.rank));
    for (int k = 0; k < Rows(j, env.rank); ++k) {
      want.push_back(j * 1000 + env.rank * 10 + k);
      want.push_back(-want.back());
    }
  }
  why = Compare(ReadTensor(*Output(o, 1)), want_splits);
  return why.empty() ? Compare(ReadTensor(*Output(o, 0)), want) : "splits: " + why;
}

std::string Reducescatter(const Env& env, double pre) {
  const int64_t d0 = env.size * 2 + 1, cols = 3;
  Op o = MakeOp("reducescatter", CollectiveType::kReducescatter,
                Filled(DataType::kFloat32, {d0, cols}, env.device, env.rank));
  o.params.prescale = pre;
  o.name += pre == 1.0 ? "" : ".scaled";
  std::string why = Failed(Run({&o}));
  if (!why.empty()) return why;
  int64_t first = 0;
  for (int r = 0; r < env.rank; ++r) first += d0 / env.size + (r < d0 % env.size ? 1 : 0);
  const int64_t mine = d0 / env.size + (env.rank < d0 % env.size ? 1 : 0);
  std::vector<double> want;
  for (int64_t i = first * cols; i < (first + mine) * cols; ++i) {
    double acc = 0;
    for (int r = 0; r < env.size; ++r) acc += pre * Value(r, i);
    want.push_back(acc);
  }
  return Compare(ReadTensor(*Output(o)), want);
}

std::string Expect(const core::Status& st, const std::string& needle) {
  if (st.ok()) return "succeeded; expected an error containing '" + needle + "'";
  if (st.message().find(needle) == std::string::npos) {
    return "error '" + st.message() + "' lacks '" + needle + "'";
  }
  return "";
}

std::string UnsupportedDtype(const Env& env) {
  Op o = MakeOp("allreduce.int16", CollectiveType::kAllreduce,
                Filled(DataType::kInt16, {10}, env.device, env.rank));
  return Expect(Run({&o}), "NCCL cannot reduce int16");
}

std::string Mixed(const Env& env) {
  if (env.size < 2) return "";
  Op o = MakeOp("mixed", CollectiveType::kAllreduce,
                Filled(DataType::kFloat32, {10}, env.rank == 0 ? -1 : env.device, env.rank));
  return Expect(Run({&o}), "mixed CPU and GPU tensors");
}

// The GPU fusion buffer comes from the framework's device allocator (the
// op context's; TensorFlow's in the library), not from cudaMalloc beside it:
// a fused response larger than any before grows the buffer through it.  (A
// prescale and a postscale: the fusion buffer's path at one rank too.)
std::string FusionFromFramework(const Env& env) {
  const int before = DeviceBufferAllocations();
  std::vector<Op> ops;
  for (int t = 0; t < 3; ++t) {  // 3 x 1.5M float32: 18 MiB, more than any check before
    ops.push_back(MakeOp("fusion.framework." + std::to_string(t), CollectiveType::kAllreduce,
                         Filled(DataType::kFloat32, {(3 << 19) + t}, env.device, env.rank)));
    ops.back().params.prescale = 0.5;
    ops.back().params.postscale = 2.0;
  }
  std::string why = RunAndCheckSums(&ops, Ranks(env.size), 1.0);
  if (why.empty() && DeviceBufferAllocations() == before) {
    why = "the fusion buffer grew without the framework's allocator";
  }
  return why;
}

// One rank: a fused allreduce copies (and scales) each input straight to its
// output, so even one larger than any before needs no fusion buffer.
std::string OneRankDirect(const Env& env) {
  const int before = DeviceBufferAllocations();
  std::vector<Op> ops;
  for (int t = 0; t < 4; ++t) {  // 4 x 1.5M float32: 24 MiB
    ops.push_back(MakeOp("one.rank." + std::to_string(t), CollectiveType::kAllreduce,
                         Filled(DataType::kFloat32, {(3 << 19) + t}, env.device, env.rank)));
    ops.back().params.reduce_op = core::ReduceOp::kAverage;
    ops.back().params.postscale = 0.5;
  }
  std::string why = RunAndCheckSums(&ops, Ranks(env.size), 0.5 / env.size);
  if (why.empty() && env.size == 1 && DeviceBufferAllocations() != before) {
    why = "a one-rank allreduce used a fusion buffer";
  }
  return why;
}

// Process sets: a set of every rank but the last gets its own communicator
// at its first GPU collective, which alternates with the global set's fused
// ones; the set is removed (its communicator goes) and added again (a fresh
// one), and every result stays right.  Collective over every rank; needs two
// (one rank has no set but the global one).
std::string ProcessSets(const Env& env) {
  if (env.size < 2) return "";
  const std::vector<int> ranks = Ranks(env.size - 1);
  const bool member = env.rank < static_cast<int>(ranks.size());
  char err[512] = {0};
  for (int round = 0; round < 2; ++round) {
    int id = -1;
    if (tfhvd_add_process_set(ranks.data(), static_cast<int>(ranks.size()), 0, &id, err,
                              sizeof(err)) != 0) {
      return "adding process set " + std::to_string(round) + ": " + err;
    }
    for (int i = 0; i < 3; ++i) {
      const std::string tag = std::to_string(round) + "." + std::to_string(i);
      if (member) {  // two tensors: fused, so their copies use the kernels
        std::vector<Op> ops;
        for (int64_t n : {int64_t{1027} + i, int64_t{77}}) {
          ops.push_back(MakeOp("pset." + std::to_string(n) + "." + tag,
                               CollectiveType::kAllreduce,
                               Filled(DataType::kFloat32, {n}, env.device, env.rank)));
          ops.back().params.process_set_id = id;
        }
        std::string why = RunAndCheckSums(&ops, ranks, 1.0);
        if (!why.empty()) return "process set " + std::to_string(id) + ": " + why;
      }
      std::string why = Fused(env, 3);
      if (!why.empty()) return "the global set after process set " + std::to_string(id) +
                               ": " + why;
    }
    if (tfhvd_remove_process_set_ex(id, /*require_dynamic=*/0, err, sizeof(err)) != 0) {
      return "removing process set " + std::to_string(id) + ": " + err;
    }
  }
  return "";
}

// The input is written on another ("framework") stream; its ready event
// must order the collective after that write.
std::string Ordering(const Env& env) {
  const int64_t n = 16 << 20;  // 64 MiB of float32: the copy takes a while
  cudaStream_t fw;
  cudaStreamCreateWithFlags(&fw, cudaStreamNonBlocking);
  float* host = nullptr;
  cudaMallocHost(reinterpret_cast<void**>(&host), n * sizeof(float));
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>(Value(env.rank, i));
  auto in = std::make_shared<Buffer>(DataType::kFloat32, core::Shape{n}, env.device);
  // The output first: allocation synchronises the device, which would finish
  // the copy below before the collective is even asked for.
  Op o = MakeOp("ordering", CollectiveType::kAllreduce, in);
  cudaMemcpyAsync(in->mutable_data(), host, n * sizeof(float), cudaMemcpyHostToDevice, fw);
  std::shared_ptr<core::ReadyEvent> ev;
  core::Status st = core::RecordReadyEvent(env.device, fw, &ev);
  std::string why = Failed(st);
  if (why.empty()) {
    in->set_ready_event(ev);
    why = Failed(Run({&o}));
    if (why.empty()) {
      std::vector<double> got = ReadTensor(*Output(o)), want(n);
      for (int64_t i = 0; i < n; ++i) {
        for (int r = 0; r < env.size; ++r) want[i] += Value(r, i);
      }
      why = Compare(got, want);
    }
  }
  cudaStreamSynchronize(fw);
  cudaStreamDestroy(fw);
  cudaFreeHost(host);
  return why;
}

// The loop launches the next response while one is in flight.  GPU
// allreduce A's input is not produced yet: its ready event waits on the
// "framework" stream behind a host function that blocks until released.  A
// GPU allreduce B (float64: a response of its own) and a host allreduce C
// agreed after A must not wait for A on the loop: C completes, B is launched
// behind A on the NCCL stream, A and B stay pending.  Once released, A then
// B complete (a set's GPU callbacks in response order), A with the right
// values.  A loop that waits for the device (the old WaitStream) never
// runs C until A ends: this check fails after its 20 s wait.
std::string InFlight(const Env& env) {
  // (The hierarchical allreduce across nodes stages through host memory:
  // it waits for its stream on the loop by design.)
  if (env.hierarchical && env.size > 1) return "";
  // Everything allocated first: allocation synchronises the device, which
  // would wait for the blocked stream.
  auto a_in = Filled(DataType::kFloat32, {1027}, env.device, env.rank);
  auto b_in = Filled(DataType::kFloat64, {515}, env.device, env.rank);
  auto c_in = Filled(DataType::kFloat32, {33}, -1, env.rank);
  Op a = MakeOp("inflight.a", CollectiveType::kAllreduce, a_in);
  Op b = MakeOp("inflight.b", CollectiveType::kAllreduce, b_in);
  Op c = MakeOp("inflight.c", CollectiveType::kAllreduce, c_in);
  cudaStream_t fw;
  cudaStreamCreateWithFlags(&fw, cudaStreamNonBlocking);
  static std::atomic<int> gate;
  gate = 0;
  cudaLaunchHostFunc(
      fw,
      [](void*) {
        while (gate.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      },
      nullptr);
  std::shared_ptr<core::ReadyEvent> ev;
  std::string why = Failed(core::RecordReadyEvent(env.device, fw, &ev));
  std::mutex mu;
  std::vector<std::string> order;
  Countdown gpu_done, host_done;
  auto note = [&](Op* o) {
    {
      std::lock_guard<std::mutex> l(mu);
      order.push_back(o->name + (o->status.ok() ? "" : ": " + o->status.message()));
    }
    (o == &c ? host_done : gpu_done).Add();
  };
  bool host_ran = false;
  int gpu_early = 0;
  if (why.empty()) {
    a_in->set_ready_event(ev);
    why = Failed(Submit({&a}, note));
    if (why.empty()) why = Failed(Submit({&b}, note));
    // A and B are agreed (and launched) before C is asked for.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (why.empty()) why = Failed(Submit({&c}, note));
    if (why.empty()) {
      host_ran = host_done.Wait(1, 20);
      gpu_early = gpu_done.count();
    }
  }
  gate = 1;
  cudaStreamSynchronize(fw);
  if (why.empty() && !gpu_done.Wait(2, 60)) why = "the GPU allreduces did not complete";
  if (why.empty() && !host_done.Wait(1, 60)) why = "the host allreduce did not complete";
  cudaStreamDestroy(fw);
  if (!why.empty()) return why;
  std::string got;
  for (const std::string& s : order) got += (got.empty() ? "" : ", ") + s;
  if (!host_ran) {
    return "a host allreduce agreed after a GPU allreduce in flight waited for it (the loop "
           "blocks on the device); callbacks: " + got;
  }
  if (gpu_early != 0) return "a GPU allreduce completed before its input was ready: " + got;
  if (got != "inflight.c, inflight.a, inflight.b") return "callback order: " + got;
  std::vector<double> want(1027);
  for (int64_t i = 0; i < 1027; ++i) {
    for (int r = 0; r < env.size; ++r) want[i] += Value(r, i);
  }
  return Compare(ReadTensor(*Output(a)), want);
}

std::string Empty(const Env& env) {
  Op a = MakeOp("allreduce.empty", CollectiveType::kAllreduce,
                Filled(DataType::kFloat32, {0}, env.device, env.rank));
  Op g = MakeOp("allgather.empty", CollectiveType::kAllgather,
                Filled(DataType::kFloat32, {env.rank % 2, 4}, env.device, env.rank));
  std::string why = Failed(Run({&a}));
  if (why.empty()) why = Failed(Run({&g}));
  return why;
}

}  // namespace

void AddChecks(bool gpu, std::vector<std::pair<std::string, Check>>* checks) {
  using core::ReduceOp;
  for (DataType dt : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                      DataType::kFloat64, DataType::kInt32, DataType::kInt64, DataType::kUInt8}) {
    checks->emplace_back(std::string("allreduce sum ") + core::DataTypeName(dt),
                         [dt](const Env& e) {
                           return AllreduceCheck(e, dt, ReduceOp::kSum, 1, 1, 1027);
                         });
  }
  for (ReduceOp op : {ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    checks->emplace_back(std::string("allreduce ") + core::ReduceOpName(op), [op](const Env& e) {
      return AllreduceCheck(e, DataType::kFloat32, op, 1, 1, 1027);
    });
  }
  checks->emplace_back("allreduce prescale/postscale float32", [](const Env& e) {
    return AllreduceCheck(e, DataType::kFloat32, ReduceOp::kSum, 0.5, 3, 4099);
  });
  checks->emplace_back("allreduce prescale/postscale float16", [](const Env& e) {
    return AllreduceCheck(e, DataType::kFloat16, ReduceOp::kSum, 0.5, 2, 513);
  });
  checks->emplace_back("fused allreduce, 5 tensors", [](const Env& e) { return Fused(e, 5); });
  checks->emplace_back("fused allreduce, 70 tensors (two copy batches)",
                       [](const Env& e) { return Fused(e, 70); });
  checks->emplace_back("allgather, uneven rows", Allgather);
  checks->emplace_back("broadcast float32 from the first and the last rank", [](const Env& e) {
    std::string why = Broadcast(e, DataType::kFloat32, 0);
    return why.empty() ? Broadcast(e, DataType::kFloat32, e.size - 1) : why;
  });
  checks->emplace_back("broadcast int64 from the last rank",
                       [](const Env& e) { return Broadcast(e, DataType::kInt64, e.size - 1); });
  checks->emplace_back("alltoall, uneven splits", Alltoall);
  checks->emplace_back("reducescatter, uneven rows",
                       [](const Env& e) { return Reducescatter(e, 1); });
  checks->emplace_back("reducescatter, prescaled",
                       [](const Env& e) { return Reducescatter(e, 0.25); });
  checks->emplace_back("empty tensors", Empty);
  if (!gpu) return;  // the rest is about device tensors only
  checks->emplace_back("ready event orders the collective after the producer", Ordering);
  checks->emplace_back("the loop launches the next response while one is in flight", InFlight);
  checks->emplace_back("int16 allreduce is a clear error", UnsupportedDtype);
  checks->emplace_back("mixed CPU and GPU tensors across ranks is a clear error", Mixed);
  checks->emplace_back("the fusion buffer comes from the framework's allocator",
                       FusionFromFramework);
  checks->emplace_back("process sets: own communicators, removed and added again",
                       ProcessSets);
  checks->emplace_back("one rank: each tensor copied straight to its output", OneRankDirect);
}

}  // namespace harness
