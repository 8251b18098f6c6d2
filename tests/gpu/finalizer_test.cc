// The GPU completion path without a GPU: the finalizer (backends/nccl/
// finalizer.h) and the executor's hand-over to it (Collectives::Complete).
//   finalizer_test          (make test-gpu-build builds and runs it)
// What it checks:
//  - results are delivered in push order even when later work ends first;
//  - Push returns while an earlier wait is blocked (the loop is not held);
//  - no thread before the first push; the watchdog runs only while work is
//    pending (an idle finalizer costs nothing);
//  - FailPending delivers an error to everything pending, in order, once;
//    the destructor of an abandoned finalizer returns although a wait is stuck;
//  - Executor::Execute returns before a deferring transport completes, and
//    the callbacks then see the transport's result (its error included),
//    in the order of the responses; Executor::Drain (the runtime's shutdown)
//    waits for them.
// Last line: "N passed, M failed".
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../../tfhvd_ops/backends/nccl/finalizer.h"
#include "../../tfhvd_ops/core/backend.h"
#include "../../tfhvd_ops/core/operations.h"
#include "../../tfhvd_ops/core/process_set.h"
#include "../../tfhvd_ops/core/timeline.h"

namespace {

using tfhvd::Finalizer;
using tfhvd::Status;
using Ms = std::chrono::milliseconds;

int passed = 0, failed = 0;
void Check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  (ok ? passed : failed)++;
}

// A gate a wait blocks on until the test opens it.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void Pass() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

int Threads() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// Voluntary context switches of this process's threads but the main one:
// how often the finalizer's threads woke up.
long OtherThreadsWakeups() {
  long n = 0;
  const std::string self = std::to_string(getpid());
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.' || self == e->d_name) continue;
      std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/status");
      std::string line;
      while (std::getline(in, line)) {
        if (line.rfind("voluntary_ctxt_switches:", 0) == 0) n += std::stol(line.substr(24));
      }
    }
    closedir(d);
  }
  return n;
}

// How many of this process's threads but the main one are running or
// runnable (state R), the most seen in `samples` looks 5 ms apart (the
// first 5 ms from now).
int OtherThreadsRunning(int samples) {
  int most = 0;
  const std::string self = std::to_string(getpid());
  for (int i = 0; i < samples; ++i) {
    std::this_thread::sleep_for(Ms(5));
    int n = 0;
    if (DIR* d = opendir("/proc/self/task")) {
      while (dirent* e = readdir(d)) {
        if (e->d_name[0] == '.' || self == e->d_name) continue;
        std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/stat");
        std::string stat;
        std::getline(in, stat);
        const size_t paren = stat.rfind(')');
        n += paren != std::string::npos && stat.compare(paren + 1, 3, " R ") == 0;
      }
      closedir(d);
    }
    most = std::max(most, n);
  }
  return most;
}

// Everything recorded by the callbacks, in delivery order.
struct Log {
  std::mutex mu;
  std::vector<std::string> lines;
  void Add(const std::string& s) {
    std::lock_guard<std::mutex> l(mu);
    lines.push_back(s);
  }
  std::string Joined() {
    std::lock_guard<std::mutex> l(mu);
    std::string out;
    for (const auto& s : lines) out += (out.empty() ? "" : ",") + s;
    return out;
  }
};

void OrderAndHandOff() {
  const int before = Threads();
  Log log;
  std::atomic<int> watched{0};
  Finalizer::Options o;
  o.watch = [&](Finalizer::Clock::duration) { watched++; };
  o.watch_period = Ms(10);
  Finalizer f(o);
  Check(Threads() == before, "no finalizer thread before the first push");
  Gate first, second;
  const auto t0 = std::chrono::steady_clock::now();
  f.Push([&] { first.Pass(); return Status::OK(); }, [&](const Status&) { log.Add("a"); });
  f.Push([&] { second.Pass(); return Status::Internal("b failed"); },
         [&](const Status& st) { log.Add(st.ok() ? "b:ok" : "b:" + st.message()); });
  f.Push([] { return Status::OK(); }, [&](const Status&) { log.Add("c"); });
  const double push_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  Check(push_ms < 50, "Push returns while an earlier wait is blocked (" +
                          std::to_string(push_ms) + " ms)");
  second.Open();  // the later work ends first ...
  std::this_thread::sleep_for(Ms(60));
  Check(log.Joined().empty(), "nothing is delivered before the first wait returns");
  Check(f.Pending() == 3, "three pending");
  Check(watched > 0, "the watchdog runs while work is pending");
  first.Open();
  f.Drain();
  Check(log.Joined() == "a,b:b failed,c", "delivered in push order with each result: " +
                                               log.Joined());
  const int idle_from = watched;
  std::this_thread::sleep_for(Ms(20));
  const long woke = OtherThreadsWakeups();
  std::this_thread::sleep_for(Ms(200));
  const long woke_idle = OtherThreadsWakeups() - woke;
  Check(watched == idle_from && woke_idle <= 1,
        "an idle finalizer's threads sleep (" + std::to_string(woke_idle) +
            " wake-ups in 200 ms)");
}

// Options::linger: after a delivery the waiting thread stays awake (it is
// seen running) and takes a push made meanwhile; then it sleeps.
void LingerThenSleep() {
  Log log;
  Finalizer::Options o;
  o.linger = std::chrono::milliseconds(400);
  Finalizer f(o);
  f.Push([] { return Status::OK(); }, [&](const Status&) { log.Add("a"); });
  f.Drain();
  Check(OtherThreadsRunning(10) >= 1, "the waiting thread stays awake after a delivery");
  f.Push([] { return Status::OK(); }, [&](const Status&) { log.Add("b"); });
  f.Drain();
  Check(log.Joined() == "a,b", "a push while it lingers is delivered: " + log.Joined());
  std::this_thread::sleep_for(Ms(600));
  Check(OtherThreadsRunning(10) == 0, "then both threads sleep");
}

void FailPendingAndAbandon() {
  Log log;
  auto stuck = std::make_shared<Gate>();  // outlives the abandoned finalizer
  auto f = std::make_unique<Finalizer>(Finalizer::Options{});
  f->Push([stuck] { stuck->Pass(); return Status::OK(); },
          [&](const Status& st) { log.Add(st.ok() ? "a:ok" : "a:" + st.message()); });
  f->Push([] { return Status::OK(); },
          [&](const Status& st) { log.Add(st.ok() ? "b:ok" : "b:" + st.message()); });
  std::this_thread::sleep_for(Ms(20));
  f->FailPending(Status::Aborted("timeout"));
  Check(log.Joined() == "a:timeout,b:timeout", "FailPending delivers in order: " + log.Joined());
  Check(f->Pending() == 0, "nothing pending after FailPending");
  f->Abandon();
  const auto t0 = std::chrono::steady_clock::now();
  f.reset();
  Check(std::chrono::steady_clock::now() - t0 < Ms(500),
        "an abandoned finalizer's destructor does not wait for a stuck wait");
  stuck->Open();  // the thread left behind ends; it must not deliver again
  std::this_thread::sleep_for(Ms(50));
  Check(log.Joined() == "a:timeout,b:timeout", "a failed push is delivered once");
}

// A transport that completes later, through a finalizer, as the NCCL
// collectives do; host memory otherwise.
class DeferringCollectives : public tfhvd::HostMemoryOps {
 public:
  explicit DeferringCollectives(Gate* gate) : gate_(gate), finalizer_(Finalizer::Options{}) {}
  Status Allreduce(const void* send, void* recv, int64_t count, tfhvd::DataType dtype,
                   tfhvd::ReduceOp) override {
    if (send != nullptr && send != recv) {
      std::memcpy(recv, send, count * tfhvd::DataTypeSize(dtype));
    }
    return Status::OK();
  }
  Status Allgatherv(const void*, int64_t, void*, const std::vector<int64_t>&) override {
    return Status::OK();
  }
  Status Broadcast(void*, int64_t, int) override { return Status::OK(); }
  Status Alltoallv(const void*, const std::vector<int64_t>&, void*,
                   const std::vector<int64_t>&) override {
    return Status::OK();
  }
  Status ReduceScatter(const void*, void*, const std::vector<int64_t>&, tfhvd::DataType,
                       tfhvd::ReduceOp) override {
    return Status::OK();
  }
  Status Barrier() override { return Status::OK(); }
  const char* name() const override { return "deferring"; }
  void Complete(std::function<void(const Status&)> done) override {
    Gate* g = gate_;
    const int n = ++completes_;
    finalizer_.Push(
        [g, n] {
          if (n == 1) g->Pass();  // the first response's work is "in flight"
          return n == 2 ? Status::Internal("device fault") : Status::OK();
        },
        std::move(done));
  }

 private:
  Gate* gate_;
  int completes_ = 0;
  Finalizer finalizer_;
};

class OneBackend : public tfhvd::Backend {
 public:
  explicit OneBackend(tfhvd::Collectives* c) : c_(c) {}
  const tfhvd::Topology& topology() const override { return topo_; }
  tfhvd::ControlChannel* control() override { return nullptr; }
  tfhvd::Collectives* collectives(int) override { return c_; }
  bool threads_supported() const override { return true; }

 private:
  tfhvd::Topology topo_;
  tfhvd::Collectives* c_;
};

class HostTensor : public tfhvd::Tensor {
 public:
  explicit HostTensor(int64_t n) : shape_{n}, data_(n, 1.0f) {}
  tfhvd::DataType dtype() const override { return tfhvd::DataType::kFloat32; }
  const tfhvd::Shape& shape() const override { return shape_; }
  const void* data() const override { return data_.data(); }
  void* mutable_data() override { return data_.data(); }
  int64_t size_bytes() const override { return data_.size() * 4; }

 private:
  tfhvd::Shape shape_;
  std::vector<float> data_;
};

void ExecutorHandsOver() {
  Gate gate;
  DeferringCollectives c(&gate);
  OneBackend backend(&c);
  tfhvd::Timeline timeline;
  tfhvd::Executor ex(&backend, &timeline);
  tfhvd::ProcessSet set(0, {0}, 0, 0);
  Log log;
  auto run = [&](const std::string& name) {
    tfhvd::Response r;
    r.names = {name};
    r.params.type = tfhvd::CollectiveType::kAllreduce;
    r.params.dtype = tfhvd::DataType::kFloat32;
    r.params.shape = {4};
    r.params.device = 0;  // a "device" tensor: the transport's Complete decides
    r.sizes = {4};
    std::vector<std::unique_ptr<tfhvd::TensorTableEntry>> entries;
    auto e = std::make_unique<tfhvd::TensorTableEntry>();
    e->name = name;
    e->params = r.params;
    e->input = std::make_shared<HostTensor>(4);
    e->output = std::make_shared<HostTensor>(4);
    e->callback = [&log, name](const Status& st) {
      log.Add(st.ok() ? name : name + ":" + st.message());
    };
    entries.push_back(std::move(e));
    ex.Execute(r, entries, set);
  };
  run("first");   // its completion waits at the gate
  run("second");  // launched while the first is in flight
  run("third");
  Check(log.Joined().empty(),
        "Execute returns before the transport completes (the loop launches the next response "
        "while one is in flight): " + log.Joined());
  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    ex.Drain();  // (what a shutdown does before the timeline goes)
    drained = true;
  });
  std::this_thread::sleep_for(Ms(50));
  Check(!drained, "Executor::Drain waits for the responses in flight");
  gate.Open();
  drainer.join();
  const std::string got = log.Joined();
  Check(got.size() > 0 && log.lines.size() == 3, "Executor::Drain returns once all called back");
  Check(got.find("first,second:") == 0 && got.find("device fault") != std::string::npos &&
            got.size() > 6 && got.substr(got.size() - 6) == ",third",
        "callbacks in response order with the transport's result (its error named): " + got);
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  OrderAndHandOff();
  LingerThenSleep();
  FailPendingAndAbandon();
  ExecutorHandsOver();
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
