// Tests of the core runtime without TensorFlow.
//
// Run alone it checks the pieces that need no peer (settings parsing, message
// round trips, fp16 conversion, the coordinator's negotiation and fusion).
// Run under `mpirun -np N` it also drives the real runtime over MPI with a
// plain-memory Tensor: allreduce, fusion, a mismatch error followed by a
// successful op, and callers that run the runtime on their own thread
// (Runtime::Drive) mixed with callers that leave it to the background thread.
// Prints "N passed, M failed" and exits non-zero on any failure.
#include <atomic>
#include <cmath>
#include <unistd.h>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <thread>
#include <map>
#include <string>
#include <vector>

#include "../../tfhvd_ops/core/c_api.h"
#include "../../tfhvd_ops/core/controller.h"
#include "../../tfhvd_ops/core/cpu_math.h"
#include "../../tfhvd_ops/core/message.h"
#include "../../tfhvd_ops/core/settings.h"
#include "../../tfhvd_ops/core/stall_report.h"
#include "../../tfhvd_ops/backends/tcp/shm_ring.h"

#include "check.h"

using namespace tfhvd;

namespace {


class HostTensor : public Tensor {
 public:
  HostTensor(DataType dt, Shape s) : dt_(dt), shape_(std::move(s)) {
    buf_.resize(NumElements(shape_) * DataTypeSize(dt_));
  }
  DataType dtype() const override { return dt_; }
  const Shape& shape() const override { return shape_; }
  const void* data() const override { return buf_.data(); }
  void* mutable_data() override { return buf_.data(); }
  int64_t size_bytes() const override { return static_cast<int64_t>(buf_.size()); }
  float* f() { return reinterpret_cast<float*>(buf_.data()); }

 private:
  DataType dt_;
  Shape shape_;
  std::vector<char> buf_;
};

class HostContext : public OpContext {
 public:
  Status AllocateOutput(int index, const Shape& shape, std::shared_ptr<Tensor>* out) override {
    auto t = std::make_shared<HostTensor>(DataType::kFloat32, shape);
    outputs[index] = t;
    *out = t;
    return Status::OK();
  }
  std::map<int, std::shared_ptr<HostTensor>> outputs;
};

void TestSettings() {
  std::map<std::string, std::string> env = {{"HOROVOD_FUSION_THRESHOLD", "1024"},
                                            {"TFHVD_CYCLE_TIME", "2.5"},
                                            {"HOROVOD_LOG_LEVEL", "debug"}};
  auto lookup = [&](const std::string& k, std::string* v) {
    auto it = env.find(k);
    if (it == env.end()) return false;
    *v = it->second;
    return true;
  };
  Settings s;
  CHECK(ParseSettings(lookup, &s).ok());
  CHECK(s.fusion_threshold_bytes == 1024);
  CHECK(s.cycle_time_ms == 2.5);
  CHECK(s.log_level == LogLevel::kDebug);
  env["TFHVD_FUSION_THRESHOLD"] = "2048";  // TFHVD_ wins over HOROVOD_
  CHECK(ParseSettings(lookup, &s).ok() && s.fusion_threshold_bytes == 2048);
  // The control channel under Horovod's prefix (the job-level test runs one of
  // these end to end: tests/single/test_mpirun_jobs.py::test_control_transports).
  env["HOROVOD_CONTROL"] = "mpi";
  env["HOROVOD_CONTROL_SHM"] = "0";
  CHECK(ParseSettings(lookup, &s).ok() && s.control == ControlKind::kMpi && !s.control_shm);
  env["HOROVOD_CONTROL"] = "udp";
  Status bad_control = ParseSettings(lookup, &s);
  CHECK(!bad_control.ok() && bad_control.message().find("HOROVOD_CONTROL") != std::string::npos);
  env.erase("HOROVOD_CONTROL");
  env.erase("HOROVOD_CONTROL_SHM");
  env["TFHVD_CACHE_CAPACITY"] = "lots";
  Status st = ParseSettings(lookup, &s);
  CHECK(!st.ok() && st.message().find("TFHVD_CACHE_CAPACITY") != std::string::npos);
}

void TestMessages() {
  RequestList l;
  l.shutdown = true;
  Request r;
  r.rank = 3;
  r.name = "grad/0";
  r.params.shape = {2, 3};
  r.params.splits = {1, 1};
  l.requests.push_back(r);
  l.cached_ids = {4, 5};
  RequestList back;
  CHECK(Parse(Serialize(l), &back));
  CHECK(back.shutdown && back.requests.size() == 1 && back.requests[0].name == "grad/0");
  CHECK(back.requests[0].params.shape == Shape({2, 3}) && back.cached_ids.size() == 2);
  std::string bytes = Serialize(l);
  bytes.pop_back();
  CHECK(!Parse(bytes, &back));
}

void TestHalf() {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f, 3.0e-7f}) {
    CHECK(std::fabs(HalfToFloat(FloatToHalf(f)) - f) <= std::fabs(f) * 1e-3f + 1e-7f);
  }
  CHECK(BFloat16ToFloat(FloatToBFloat16(3.0f)) == 3.0f);
  uint16_t a[2] = {FloatToHalf(1.5f), FloatToHalf(2.0f)};
  uint16_t b[2] = {FloatToHalf(0.5f), FloatToHalf(-4.0f)};
  Reduce16(a, b, 2, false, ReduceOp::kSum);
  CHECK(HalfToFloat(b[0]) == 2.0f && HalfToFloat(b[1]) == -2.0f);
}

// A float32 allreduce request of `rank` on process set `set`.
Request Req(int rank, const std::string& name, Shape shape, int32_t set = 0) {
  Request r;
  r.rank = rank;
  r.name = name;
  r.params.shape = std::move(shape);
  r.params.process_set_id = set;
  return r;
}

void TestCoordinator() {
  Settings s;
  s.fusion_threshold_bytes = 64;
  ResponseCache cache(16);
  Logger log(LogLevel::kFatal, 0);
  Coordinator c(2, s, &cache, &log);
  auto now = Coordinator::Clock::now();
  auto req = [](int rank, const std::string& name, Shape shape) { return Req(rank, name, shape); };
  RequestList r0, r1;
  r0.requests = {req(0, "a", {4}), req(0, "b", {4}), req(0, "c", {100}), req(0, "bad", {2})};
  r1.requests = {req(1, "c", {100}), req(1, "b", {4}), req(1, "a", {4}), req(1, "bad", {3})};
  c.AddRequests(0, r0, now);
  CHECK(c.Compute(now).responses.empty());  // nothing is ready on one rank
  c.AddRequests(1, r1, now);
  ResponseList out = c.Compute(now);
  // c (400 bytes) exceeds the 64-byte threshold alone; b and a fuse.
  int fused = 0, errors = 0;
  for (const auto& r : out.responses) {
    if (r.kind == ResponseKind::kError) {
      ++errors;
      CHECK(r.error.find("'bad'") != std::string::npos);
      CHECK(r.error.find("rank 0 sent shape [2]; rank 1 sent shape [3]") != std::string::npos);
    } else if (r.names.size() == 2) {
      ++fused;
    }
  }
  CHECK(fused == 1 && errors == 1 && out.responses.size() == 3);
  CHECK(!c.HasPending());
  // The second step goes through the cache.
  CHECK(cache.Lookup("a", req(0, "a", {4}).params) >= 0);
  CHECK(cache.Lookup("a", req(0, "a", {5}).params) < 0);
}

// A coordinator of three ranks with a response cache, as rank 0 runs it.
struct ThreeRanks {
  Settings s;
  ResponseCache cache{16};
  Logger log{LogLevel::kFatal, 0};
  Coordinator c{3, s, &cache, &log};
  Coordinator::Clock::time_point now = Coordinator::Clock::now();

  // Every rank asks for the same process-set change; the round's responses.
  ResponseList ChangeSet(CollectiveType type, const std::vector<int32_t>& ranks, int32_t id) {
    for (int rank = 0; rank < 3; ++rank) {
      RequestList l;
      Request r;
      r.rank = rank;
      r.name = "tfhvd.set_change";
      r.params.type = type;
      r.params.splits = ranks;
      r.params.root_rank = id;
      l.requests = {r};
      c.AddRequests(rank, l, now);
    }
    return c.Compute(now);
  }
};

// The coordinator recycles a negotiated tensor's entry for the next one
// (steady-state steps repeat names): nothing of an earlier round may leak
// into a later one, whatever changed, and many distinct names still work.
void TestCoordinatorReusesEntries() {
  ThreeRanks t;
  Coordinator& c = t.c;
  auto now = t.now;
  auto gather = [&](std::vector<Shape> shapes) {
    for (int rank = 0; rank < 3; ++rank) {
      RequestList l;
      Request r = Req(rank, "g", shapes[rank]);
      r.params.type = CollectiveType::kAllgather;
      l.requests = {r};
      c.AddRequests(rank, l, now);
    }
    return c.Compute(now);
  };
  ResponseList out = gather({{2, 4}, {3, 4}, {1, 4}});
  CHECK(out.responses.size() == 1 && out.responses[0].sizes == std::vector<int64_t>({2, 3, 1}));
  out = gather({{5, 4}, {1, 4}, {2, 4}});
  CHECK(out.responses.size() == 1 && out.responses[0].sizes == std::vector<int64_t>({5, 1, 2}));
  CHECK(out.responses[0].names == std::vector<std::string>({"g"}) &&
        out.responses[0].params.shape == Shape({5, 4}));
  out = gather({{2, 4}, {2, 5}, {2, 4}});
  CHECK(out.responses.size() == 1 && out.responses[0].kind == ResponseKind::kError);
  CHECK(out.responses[0].error.find("ranks 0, 2 sent shape [2, 4]; rank 1 sent shape [2, 5]") !=
        std::string::npos);
  // A recycled entry starts with no rank present: two of three ranks are
  // not enough, and the third completes it with its own shape.
  for (int rank = 0; rank < 2; ++rank) {
    RequestList l;
    l.requests = {Req(rank, "a", {7})};
    c.AddRequests(rank, l, now);
  }
  CHECK(c.Compute(now).responses.empty() && c.HasPending());
  RequestList l2;
  l2.requests = {Req(2, "a", {7})};
  c.AddRequests(2, l2, now);
  out = c.Compute(now);
  CHECK(out.responses.size() == 1 && out.responses[0].sizes == std::vector<int64_t>({7}) &&
        out.responses[0].params.shape == Shape({7}) && !c.HasPending());
  // The same on a process set, whose readiness is a count of its members.
  out = t.ChangeSet(CollectiveType::kAddProcessSet, {0, 2}, -1);
  CHECK(out.responses.size() == 1 && out.responses[0].kind == ResponseKind::kCollective);
  const int32_t id = out.responses[0].params.root_rank;
  for (int round = 0; round < 2; ++round) {
    RequestList l0, l2;
    l0.requests = {Req(0, "s", {3}, id)};
    l2.requests = {Req(2, "s", {3}, id)};
    c.AddRequests(0, l0, now);
    CHECK(c.Compute(now).responses.empty());  // rank 2 has not asked yet
    c.AddRequests(2, l2, now);
    out = c.Compute(now);
    CHECK(out.responses.size() == 1 && out.responses[0].params.process_set_id == id);
  }
  // More distinct names than the coordinator keeps entries for, twice over.
  for (int round = 0; round < 2; ++round) {
    for (int rank = 0; rank < 3; ++rank) {
      RequestList l;
      for (int i = 0; i < 1500; ++i) l.requests.push_back(Req(rank, "t" + std::to_string(i), {1}));
      c.AddRequests(rank, l, now);
    }
    out = c.Compute(now);
    size_t names = 0;
    for (const Response& r : out.responses) {
      CHECK(r.kind == ResponseKind::kCollective);
      names += r.names.size();
    }
    CHECK(names == 1500 && !c.HasPending());
    CHECK(out.responses[0].names[0] == "t0");
  }
}

// The fast lane for cached tensors (controller.h, step 3a): steady-state
// steps complete without table entries, and every way out of the lane
// (other parameters, join, stall, a lost rank, a removed set) still gives
// the table's answer instead of a tensor that waits forever.
void TestCoordinatorFastLane() {
  Settings s;
  s.fusion_threshold_bytes = 64;
  s.stall_check_time_s = 1;
  s.stall_shutdown_time_s = 2;
  ResponseCache cache(16);
  Logger log(LogLevel::kFatal, 0);
  Coordinator c(2, s, &cache, &log);
  auto now = Coordinator::Clock::now();
  auto full = [&](int rank, std::vector<Request> reqs) {
    RequestList l;
    l.requests = std::move(reqs);
    c.AddRequests(rank, l, now);
  };
  auto ids = [&](int rank, std::vector<int32_t> slots) {  // a worker's cache hits
    RequestList l;
    l.cached_ids = slots;
    l.cached_sets.assign(slots.size(), 0);
    c.AddRequests(rank, l, now);
  };
  full(0, {Req(0, "a", {4}), Req(0, "b", {4})});
  full(1, {Req(1, "a", {4}), Req(1, "b", {4})});
  ResponseList out = c.Compute(now);  // assigns slots 0 and 1
  CHECK(out.responses.size() == 1 && out.responses[0].cache_ids == std::vector<int32_t>({0, 1}));
  // A steady step: rank 0's own requests and the worker's slot ids.
  full(0, {Req(0, "a", {4}), Req(0, "b", {4})});
  CHECK(c.Compute(now).responses.empty() && c.HasPending());
  ids(1, {1, 0});
  out = c.Compute(now);
  CHECK(out.responses.size() == 1 && !c.HasPending());
  // (In the order they became ready: the worker's last request completed each.)
  CHECK(out.responses[0].names == std::vector<std::string>({"b", "a"}) &&
        out.responses[0].sizes == std::vector<int64_t>({4, 4}) &&
        out.responses[0].params.shape == Shape({4}) && out.responses[0].joined_ranks.empty());
  // Other parameters for a cached name, after and before the slot id.
  for (int order = 0; order < 2; ++order) {
    if (order == 0) ids(1, {0});
    full(0, {Req(0, "a", {5})});
    if (order == 1) ids(1, {0});
    out = c.Compute(now);
    CHECK(out.responses.size() == 1 && out.responses[0].kind == ResponseKind::kError &&
          out.responses[0].error.find("rank 0 sent shape [5]; rank 1 sent shape [4]") !=
              std::string::npos);
    CHECK(!c.HasPending());
  }
  // Another collective under a cached name, after the slot id: the mismatch.
  ids(1, {0});
  Request gather = Req(0, "a", {4});
  gather.params.type = CollectiveType::kAllgather;
  full(0, {gather});
  out = c.Compute(now);
  CHECK(out.responses.size() == 1 && out.responses[0].kind == ResponseKind::kError &&
        out.responses[0].error.find("different collectives under one name") !=
            std::string::npos);
  CHECK(!c.HasPending());
  ids(1, {0});  // and the lane works again
  full(0, {Req(0, "a", {4})});
  out = c.Compute(now);
  CHECK(out.responses.size() == 1 && out.responses[0].kind == ResponseKind::kCollective &&
        !c.HasPending());
  // Join: the waiting slot completes with the joined rank's zeros.
  ids(1, {0});
  Request join = Req(0, "join", {});
  join.params.type = CollectiveType::kJoin;
  full(0, {join});
  out = c.Compute(now);
  CHECK(out.responses.size() == 1 && out.responses[0].names == std::vector<std::string>({"a"}) &&
        out.responses[0].joined_ranks == std::vector<int32_t>({0}));
  join.rank = 1;
  full(1, {join});
  out = c.Compute(now);
  CHECK(out.responses.size() == 1 && out.responses[0].params.type == CollectiveType::kJoin &&
        !c.HasPending());
  // A stall: a slot one rank sent is failed after the stall shutdown time.
  ids(1, {1});
  CHECK(c.Compute(now + std::chrono::milliseconds(1500)).responses.empty());
  out = c.Compute(now + std::chrono::seconds(3));
  CHECK(out.responses.size() == 1 && out.responses[0].error_code == StatusCode::kAborted &&
        out.responses[0].error.find("'b' stalled") != std::string::npos &&
        out.responses[0].error.find("ranks [0] never submitted") != std::string::npos);
  CHECK(!c.HasPending());
  // A lost rank fails what waits for it.
  full(0, {Req(0, "b", {4})});
  c.MarkLost(1);
  out = c.Compute(now + std::chrono::seconds(3));
  CHECK(out.responses.size() == 1 && out.responses[0].kind == ResponseKind::kError &&
        out.responses[0].error.find("'b' cannot complete: ranks [1] have exited") !=
            std::string::npos);
  CHECK(!c.HasPending());
}

// Process sets in the coordinator: an add agreed by every rank gets an id;
// a set's tensor is ready once its members asked, goes only to its members,
// and never fuses with another set's; a removed set's requests fail.
void TestCoordinatorProcessSets() {
  ThreeRanks t;
  Coordinator& c = t.c;
  auto now = t.now;
  auto req = [](int rank, const std::string& name, int32_t set) {
    return Req(rank, name, {4}, set);
  };
  auto change = [&](CollectiveType type, std::vector<int32_t> ranks, int32_t id) {
    return t.ChangeSet(type, ranks, id);
  };
  ResponseList added = change(CollectiveType::kAddProcessSet, {2, 0}, -1);
  CHECK(added.responses.size() == 1 && added.responses[0].kind == ResponseKind::kCollective);
  const int32_t id = added.responses[0].params.root_rank;
  CHECK(id == 1 && added.responses[0].params.splits == std::vector<int32_t>({0, 2}));
  CHECK(c.Receives(0, id) && !c.Receives(1, id) && c.Receives(2, id) && c.Receives(1, 0));
  ResponseList dup = change(CollectiveType::kAddProcessSet, {0, 2}, -1);
  CHECK(dup.responses.size() == 1 && dup.responses[0].kind == ResponseKind::kError &&
        dup.responses[0].error.find("exists already") != std::string::npos);
  // The same name on the set and on the global set: two tensors, never fused.
  RequestList r0, r1, r2;
  r0.requests = {req(0, "x", id), req(0, "x", 0)};
  r2.requests = {req(2, "x", id)};
  c.AddRequests(0, r0, now);
  c.AddRequests(2, r2, now);
  ResponseList out = c.Compute(now);  // the set's "x" is complete without rank 1
  CHECK(out.responses.size() == 1 && out.responses[0].params.process_set_id == id);
  r1.requests = {req(1, "x", 0)};
  r2.requests = {req(2, "x", 0), req(2, "y", id)};
  r0.requests = {req(0, "y", id)};
  c.AddRequests(1, r1, now);
  c.AddRequests(2, r2, now);
  c.AddRequests(0, r0, now);
  out = c.Compute(now);
  CHECK(out.responses.size() == 2);
  for (const Response& r : out.responses) CHECK(r.names.size() == 1);
  // A member outside the set cannot submit to it.
  r1.requests = {req(1, "z", id)};
  c.AddRequests(1, r1, now);
  out = c.Compute(now);
  CHECK(out.responses.size() == 1 && out.responses[0].kind == ResponseKind::kError);
  // Removal: then the id is unknown, and the global set cannot be removed.
  CHECK(change(CollectiveType::kRemoveProcessSet, {}, id).responses[0].kind ==
        ResponseKind::kCollective);
  CHECK(change(CollectiveType::kRemoveProcessSet, {}, id).responses[0].error.find(
            "does not exist") != std::string::npos);
  CHECK(change(CollectiveType::kRemoveProcessSet, {}, 0).responses[0].error.find(
            "cannot be removed") != std::string::npos);
  r0.requests = {req(0, "late", id)};
  c.AddRequests(0, r0, now);
  out = c.Compute(now);
  CHECK(out.responses.size() == 1 && out.responses[0].kind == ResponseKind::kError &&
        out.responses[0].error.find("does not exist") != std::string::npos);
  CHECK(!c.HasPending());
  // A set removed while one of its cached tensors waits leaves nothing pending.
  added = change(CollectiveType::kAddProcessSet, {0, 1}, -1);
  const int32_t id2 = added.responses[0].params.root_rank;
  for (int step = 0; step < 2; ++step) {
    r0.requests = {req(0, "w", id2)};
    r1.requests = {req(1, "w", id2)};
    c.AddRequests(0, r0, now);
    c.AddRequests(1, r1, now);
    CHECK(c.Compute(now).responses.size() == 1);
  }
  r0.requests = {req(0, "w", id2)};  // in the set's cache now: the fast lane
  c.AddRequests(0, r0, now);
  CHECK(c.HasPending());
  CHECK(change(CollectiveType::kRemoveProcessSet, {}, id2).responses[0].kind ==
        ResponseKind::kCollective);
  CHECK(!c.HasPending());
}

// The shared-memory rings of the control channel: a byte stream that wraps,
// partial writes when full, and the sleep/doorbell handshake.
void TestShmRing() {
  std::unique_ptr<ShmLink> coord, worker;
  int fd = -1;
  CHECK(ShmLink::Create(64, &coord, &fd).ok());
  CHECK(fd >= 0 && ShmLink::Map(fd, &worker).ok());
  if (fd >= 0) close(fd);
  if (!coord || !worker) return;
  ShmRing& tx = coord->to_worker();
  ShmRing& rx = worker->to_worker();
  std::string sent, got;
  for (int i = 0; i < 50; ++i) {
    std::string chunk(17 + i % 23, static_cast<char>('a' + i % 26));
    size_t off = 0;
    while (off < chunk.size()) {
      off += tx.Write(chunk.data() + off, chunk.size() - off);
      rx.Read(&got);
    }
    sent += chunk;
  }
  rx.Read(&got);
  CHECK(got == sent && !rx.HasData());
  char big[100] = {0};
  CHECK(tx.Write(big, sizeof(big)) == 64);  // full: only the capacity fits
  CHECK(tx.Write(big, 1) == 0);
  // A reader with bytes waiting must not sleep; an empty one may, and then
  // the writer sees it and rings.
  CHECK(!rx.PrepareToSleep() && !tx.ReaderMaySleep());
  got.clear();
  CHECK(rx.Read(&got) == 64);
  CHECK(rx.PrepareToSleep() && tx.ReaderMaySleep());
  rx.Awake();
  CHECK(!tx.ReaderMaySleep());
  // The other direction is independent.
  CHECK(worker->to_coordinator().Write("xy", 2) == 2);
  got.clear();
  CHECK(coord->to_coordinator().Read(&got) == 2 && got == "xy");
}

// A float32 allreduce of `in` into `out` whose completion calls `callback`.
TensorTableEntry AllreduceEntry(const std::string& name, std::shared_ptr<HostTensor> in,
                                std::shared_ptr<HostTensor> out, ReduceOp op,
                                std::function<void(const Status&)> callback) {
  TensorTableEntry e;
  e.name = name;
  e.params.type = CollectiveType::kAllreduce;
  e.params.dtype = DataType::kFloat32;
  e.params.shape = in->shape();
  e.params.reduce_op = op;
  e.input = std::move(in);
  e.output = std::move(out);
  e.context = std::make_shared<HostContext>();
  e.callback = std::move(callback);
  return e;
}

// `drive`: the calling thread runs the runtime until its op is done, as an
// eager TensorFlow op does (Runtime::Drive); else the background thread does.
Status Allreduce(const std::string& name, std::shared_ptr<HostTensor> in,
                 std::shared_ptr<HostTensor> out, ReduceOp op, bool drive = false) {
  std::promise<Status> p;
  std::atomic<bool> done{false};
  TensorTableEntry e = AllreduceEntry(name, in, out, op, [&p, &done](const Status& s) {
    done.store(true);
    p.set_value(s);
  });
  std::vector<TensorTableEntry> v;
  v.push_back(std::move(e));
  Status st;
  if (drive) {
    DriveUntil([&] { st = EnqueueEntries(std::move(v)); }, done);
  } else {
    st = EnqueueEntries(std::move(v));
  }
  if (!st.ok()) return st;
  return p.get_future().get();
}

// Callers that drive and callers that leave the work to the background
// thread, at once, submitting in a different order on each rank: everything
// completes with the right values (no deadlock, nothing lost).
void TestDrive(int rank, int size) {
  auto in = std::make_shared<HostTensor>(DataType::kFloat32, Shape{4});
  auto out = std::make_shared<HostTensor>(DataType::kFloat32, Shape{4});
  for (int i = 0; i < 4; ++i) in->f()[i] = static_cast<float>(rank + 1);
  for (int round = 0; round < 50; ++round) {
    CHECK(Allreduce("driven", in, out, ReduceOp::kSum, /*drive=*/true).ok());
  }
  CHECK(out->f()[3] == static_cast<float>(size * (size + 1) / 2));
  // Only some ranks drive a given tensor.
  CHECK(Allreduce("half", in, out, ReduceOp::kMax, /*drive=*/rank % 2 == 0).ok());
  CHECK(out->f()[0] == static_cast<float>(size));
  const int n = 16;
  std::vector<std::future<Status>> futs;
  std::vector<std::shared_ptr<HostTensor>> outs(n);
  for (int k = 0; k < n; ++k) {
    const int t = rank % 2 ? n - 1 - k : k;  // reversed on odd ranks
    auto i2 = std::make_shared<HostTensor>(DataType::kFloat32, Shape{2});
    outs[t] = std::make_shared<HostTensor>(DataType::kFloat32, Shape{2});
    for (int j = 0; j < 2; ++j) i2->f()[j] = static_cast<float>(t);
    auto o2 = outs[t];
    const bool drive = (t + rank) % 3 != 0;
    futs.push_back(std::async(std::launch::async, [t, i2, o2, drive] {
      return Allreduce("mixed" + std::to_string(t), i2, o2, ReduceOp::kSum, drive);
    }));
  }
  for (auto& f : futs) CHECK(f.get().ok());
  for (int t = 0; t < n; ++t) CHECK(outs[t]->f()[1] == static_cast<float>(t * size));
  // Two callers drive at once on rank 0: A waits for "x", which the other
  // ranks submit last; B submits "y" then "z".  B must get past "y" (done by
  // A's loop) while A still holds the loop, or "z", and so "x", never come.
  auto run = [&](const char* name) {
    auto o = std::make_shared<HostTensor>(DataType::kFloat32, Shape{4});
    Status st = Allreduce(name, in, o, ReduceOp::kSum, /*drive=*/true);
    return st.ok() && o->f()[0] == static_cast<float>(size * (size + 1) / 2);
  };
  if (rank == 0) {
    auto a = std::async(std::launch::async, [&] { return run("x"); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto b = std::async(std::launch::async, [&] { return run("y") && run("z"); });
    CHECK(b.get());
    CHECK(a.get());
  } else {
    CHECK(run("y") && run("z") && run("x"));
  }
}

// Negotiation messages larger than the control channel's buffers (1 MiB
// shared-memory rings, socket buffers) stream through: 400 tensors with
// 3000-character names in one group make a request and a response of ~1.2 MB.
void TestLargeMessages(int size) {
  const int n = 400;
  std::vector<std::promise<Status>> promises(n);
  std::vector<std::shared_ptr<HostTensor>> outs;
  std::vector<TensorTableEntry> group;
  for (int i = 0; i < n; ++i) {
    auto in = std::make_shared<HostTensor>(DataType::kFloat32, Shape{1});
    in->f()[0] = static_cast<float>(i);
    outs.push_back(std::make_shared<HostTensor>(DataType::kFloat32, Shape{1}));
    std::promise<Status>* p = &promises[i];
    group.push_back(AllreduceEntry(std::string(3000, 'n') + std::to_string(i), in, outs.back(),
                                   ReduceOp::kSum, [p](const Status& s) { p->set_value(s); }));
  }
  CHECK(EnqueueEntries(std::move(group)).ok());
  int ok = 0, right = 0;
  for (int i = 0; i < n; ++i) {
    ok += promises[i].get_future().get().ok();
    right += outs[i]->f()[0] == static_cast<float>(i * size);
  }
  CHECK(ok == n && right == n);
}

// An allreduce on the set of even ranks, through the C API's add.
void TestRuntimeProcessSet(int rank, int size) {
  std::vector<int> even;
  for (int r = 0; r < size; r += 2) even.push_back(r);
  int id = -1;
  char err[512] = {0};
  int rc = tfhvd_add_process_set(even.data(), static_cast<int>(even.size()), 0, &id, err,
                                 sizeof(err));
  if (size == 1) {  // [0] is the global set
    CHECK(rc != 0 && std::string(err).find("exists already") != std::string::npos);
    return;
  }
  CHECK(rc == 0 && id > 0);
  int set_size = 0, set_rank = -2;
  CHECK(tfhvd_process_set_info(id, &set_size, &set_rank, nullptr, 0) == 0);
  CHECK(set_size == static_cast<int>(even.size()) && set_rank == (rank % 2 ? -1 : rank / 2));
  if (rank % 2 == 0) {
    auto in = std::make_shared<HostTensor>(DataType::kFloat32, Shape{2});
    auto out = std::make_shared<HostTensor>(DataType::kFloat32, Shape{2});
    in->f()[0] = static_cast<float>(rank);
    in->f()[1] = 1.0f;
    std::promise<Status> p;
    TensorTableEntry e = AllreduceEntry("on_set", in, out, ReduceOp::kSum,
                                        [&p](const Status& s) { p.set_value(s); });
    e.params.process_set_id = id;
    std::vector<TensorTableEntry> v;
    v.push_back(std::move(e));
    CHECK(EnqueueEntries(std::move(v)).ok() && p.get_future().get().ok());
    float sum = 0;
    for (int r : even) sum += static_cast<float>(r);
    CHECK(out->f()[0] == sum && out->f()[1] == static_cast<float>(even.size()));
  }
  // Removing needs dynamic mode, which this test does not turn on.
  rc = tfhvd_remove_process_set(id, err, sizeof(err));
  CHECK(rc == static_cast<int>(StatusCode::kFailedPrecondition) &&
        std::string(err).find("DYNAMIC_PROCESS_SETS") != std::string::npos);
}

void TestRuntime() {
  char err[512];
  if (tfhvd_init(nullptr, 0, nullptr, err, sizeof(err)) != 0) {
    std::fprintf(stderr, "init failed: %s\n", err);
    ++g_failed;
    return;
  }
  const int rank = tfhvd_rank(), size = tfhvd_size();
  g_rank = rank;
  // Plain allreduce (Average).
  auto in = std::make_shared<HostTensor>(DataType::kFloat32, Shape{5});
  auto out = std::make_shared<HostTensor>(DataType::kFloat32, Shape{5});
  for (int i = 0; i < 5; ++i) in->f()[i] = static_cast<float>(rank + i);
  CHECK(Allreduce("x", in, out, ReduceOp::kAverage).ok());
  CHECK(std::fabs(out->f()[0] - (size - 1) / 2.0f) < 1e-6f);
  // Many tensors at once: fused.
  std::vector<std::future<Status>> futs;
  std::vector<std::shared_ptr<HostTensor>> outs;
  for (int t = 0; t < 20; ++t) {
    auto i2 = std::make_shared<HostTensor>(DataType::kFloat32, Shape{3});
    auto o2 = std::make_shared<HostTensor>(DataType::kFloat32, Shape{3});
    for (int k = 0; k < 3; ++k) i2->f()[k] = static_cast<float>(t);
    outs.push_back(o2);
    futs.push_back(std::async(std::launch::async, [t, i2, o2] {
      return Allreduce("many" + std::to_string(t), i2, o2, ReduceOp::kSum);
    }));
  }
  for (int t = 0; t < 20; ++t) {
    CHECK(futs[t].get().ok());
    CHECK(outs[t]->f()[2] == static_cast<float>(t * size));
  }
  // A mismatch fails on every rank, then the runtime keeps working.
  if (size > 1) {
    auto bad = std::make_shared<HostTensor>(DataType::kFloat32, Shape{rank + 1});
    auto bad_out = std::make_shared<HostTensor>(DataType::kFloat32, Shape{rank + 1});
    Status st = Allreduce("mismatch", bad, bad_out, ReduceOp::kSum);
    CHECK(!st.ok() && st.message().find("mismatch") != std::string::npos);
  }
  CHECK(Allreduce("after", in, out, ReduceOp::kMax).ok());
  CHECK(out->f()[4] == static_cast<float>(size - 1 + 4));
  TestDrive(rank, size);
  TestLargeMessages(size);
  TestRuntimeProcessSet(rank, size);
  tfhvd_finalize();
  // Driving without a runtime still runs the submission, which fails.
  std::atomic<bool> never{false};
  bool ran = false;
  CHECK(!DriveUntil([&] { ran = true; }, never) && ran);
}

// Complementary rank groups waiting in different collectives are named
// together; overlapping groups or one group alone are not a divergence.
void TestDivergenceSummary() {
  std::vector<StalledCollective> split = {{"bcast_b", {0}}, {"bcast_a", {0}},
                                          {"allreduce_x", {1, 2}}};
  std::string s = DivergenceSummary(split);
  CHECK(s.find("different collectives") != std::string::npos);
  CHECK(s.find("ranks [0] wait in 'bcast_a' (and 1 more)") != std::string::npos);
  CHECK(s.find("ranks [1, 2] wait in 'allreduce_x'") != std::string::npos);
  CHECK(s.find("allreduce_x' (and") == std::string::npos);
  CHECK(DivergenceSummary({{"a", {0}}, {"b", {0}}}).empty());
  CHECK(DivergenceSummary({{"a", {0, 1}}, {"b", {1, 2}}}).empty());
  CHECK(DivergenceSummary({}).empty());
}

}  // namespace

int main() {
  TestSettings();
  TestMessages();
  TestHalf();
  TestCoordinator();
  TestCoordinatorReusesEntries();
  TestCoordinatorFastLane();
  TestCoordinatorProcessSets();
  TestShmRing();
  TestDivergenceSummary();
  TestRuntime();
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
