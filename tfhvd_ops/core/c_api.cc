#include "c_api.h"

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "backend.h"
#include "runtime.h"

namespace tfhvd {
namespace {

// The process's one runtime, owned here and nowhere else.
struct Holder {
  std::mutex mu;
  std::shared_ptr<Runtime> runtime;
  int inits = 0;  // successful or not: every rank counts the same attempts
  bool abandoned = false;  // a shutdown gave up on stuck peers (tfhvd_shutdown)
};

Holder& Global() {
  static Holder h;
  return h;
}

int Fail(const Status& st, char* err, int errlen) {
  if (err != nullptr && errlen > 0) {
    std::strncpy(err, st.message().c_str(), errlen - 1);
    err[errlen - 1] = '\0';
  }
  return static_cast<int>(st.code());
}

template <typename F>
int Topo(F f) {
  auto rt = CurrentRuntime();
  return rt ? f(rt->topology()) : -1;
}

// A scalar int32 in host memory: where a process-set change writes the id.
class HostScalar : public Tensor {
 public:
  DataType dtype() const override { return DataType::kInt32; }
  const Shape& shape() const override { return shape_; }
  const void* data() const override { return &value_; }
  void* mutable_data() override { return &value_; }
  int64_t size_bytes() const override { return sizeof(value_); }
  int32_t value() const { return value_; }

 private:
  Shape shape_;
  int32_t value_ = -1;
};

// Submits one process-set change and waits for it (on this thread's loop
// where possible, Runtime::Drive).
Status ChangeProcessSets(CollectiveType type, std::vector<int32_t> ranks, int32_t remove_id,
                         int32_t* id) {
  struct Wait {
    std::mutex mu;
    std::condition_variable cv;
    std::atomic<bool> done{false};
    Status st;
  };
  auto w = std::make_shared<Wait>();
  auto out = std::make_shared<HostScalar>();
  TensorTableEntry e;
  e.name = type == CollectiveType::kAddProcessSet ? "tfhvd.add_process_set"
                                                  : "tfhvd.remove_process_set";
  e.params.type = type;
  e.params.dtype = DataType::kInt32;
  e.params.splits = std::move(ranks);
  e.params.root_rank = remove_id;
  e.output = out;
  e.callback = [w](const Status& st) {
    std::lock_guard<std::mutex> l(w->mu);
    w->st = st;
    w->done.store(true);
    w->cv.notify_all();
  };
  Status enq;
  DriveUntil([&] {
    std::vector<TensorTableEntry> v;
    v.push_back(std::move(e));
    enq = EnqueueEntries(std::move(v));
  }, w->done);
  if (!enq.ok()) return enq;
  std::unique_lock<std::mutex> l(w->mu);
  w->cv.wait(l, [&] { return w->done.load(); });
  if (w->st.ok() && id != nullptr) *id = out->value();
  return w->st;
}

Status NotDynamic(const char* what) {
  return Status::FailedPrecondition(
      std::string("tfhvd: set HOROVOD_DYNAMIC_PROCESS_SETS=1 (or TFHVD_DYNAMIC_PROCESS_SETS=1), or "
                  "call hvd.init(process_sets=\"dynamic\"), to allow ") +
      what + " process sets after initialization");
}

}  // namespace

std::shared_ptr<Runtime> CurrentRuntime() {
  std::lock_guard<std::mutex> l(Global().mu);
  return Global().runtime;
}

Status EnqueueEntries(std::vector<TensorTableEntry> entries) {
  auto rt = CurrentRuntime();
  if (!rt) return Status::FailedPrecondition(kNotInitialized);
  return rt->Enqueue(std::move(entries));
}

Status EnqueueInlineEntries(std::vector<TensorTableEntry> entries, const std::atomic<bool>& done) {
  auto rt = CurrentRuntime();
  if (!rt) return Status::FailedPrecondition(kNotInitialized);
  return rt->EnqueueInline(std::move(entries), done);
}

bool DriveUntil(const std::function<void()>& submit, const std::atomic<bool>& done) {
  auto rt = CurrentRuntime();
  if (!rt) {
    submit();
    return false;
  }
  return rt->Drive(submit, done);
}

}  // namespace tfhvd

using tfhvd::Status;

extern "C" {

int tfhvd_init(const int* ranks, int nranks, void* comm, char* err, int errlen) {
  auto& g = tfhvd::Global();
  std::lock_guard<std::mutex> l(g.mu);
  if (g.runtime) return 0;  // init twice is harmless
  tfhvd::Settings settings;
  Status st = tfhvd::ParseSettings(tfhvd::ProcessEnv(), &settings);
  if (!st.ok()) return tfhvd::Fail(st, err, errlen);
  tfhvd::BackendOptions opts;
  if (ranks != nullptr) opts.ranks.assign(ranks, ranks + nranks);
  opts.comm_handle = comm;
  opts.control = settings.control;
  opts.socket_ifname = settings.socket_ifname;
  opts.control_shm = settings.control_shm;
  opts.mpi_yield_when_idle = settings.mpi_yield_when_idle;
  opts.hierarchical_allreduce = settings.hierarchical_allreduce;
  opts.controller = settings.controller;
  opts.cpu_operations = settings.cpu_operations;
  opts.launch = settings.launch;
  opts.generation = g.inits++;
  opts.device_timeout_s = settings.nccl_timeout_s;
  opts.elastic = settings.elastic;
  std::unique_ptr<tfhvd::Backend> backend;
  bool excluded = false;
  st = tfhvd::CreateBackend(opts, &backend, &excluded);
  if (!st.ok()) return tfhvd::Fail(st, err, errlen);
  if (excluded) {
    return tfhvd::Fail(Status::InvalidArgument(
                           "tfhvd: this process is not one of the ranks given to init(comm=...)"),
                       err, errlen);
  }
  auto rt = std::make_shared<tfhvd::Runtime>(settings, std::move(backend));
  st = rt->Start();
  if (!st.ok()) return tfhvd::Fail(st, err, errlen);
  g.runtime = std::move(rt);
  return 0;
}

int tfhvd_shutdown(void) {
  std::shared_ptr<tfhvd::Runtime> rt;
  {
    auto& g = tfhvd::Global();
    std::lock_guard<std::mutex> l(g.mu);
    rt.swap(g.runtime);
  }
  if (rt && !rt->Shutdown()) {
    // The peers are stuck, and the runtime's set workers may still be inside
    // a collective on its communicators: freeing those would crash it.  Keep
    // the runtime alive, and remember: MPI_Finalize would wait for the
    // peers forever, so finalisation aborts instead (tfhvd_finalize).
    new std::shared_ptr<tfhvd::Runtime>(std::move(rt));  // NOLINT: leaked on purpose
    auto& g = tfhvd::Global();
    std::lock_guard<std::mutex> l(g.mu);
    g.abandoned = true;
    return 1;
  }
  return 0;
}

int tfhvd_is_initialized(void) { return tfhvd::CurrentRuntime() ? 1 : 0; }
int tfhvd_rank(void) { return tfhvd::Topo([](const tfhvd::Topology& t) { return t.rank; }); }
int tfhvd_size(void) { return tfhvd::Topo([](const tfhvd::Topology& t) { return t.size; }); }
int tfhvd_local_rank(void) {
  return tfhvd::Topo([](const tfhvd::Topology& t) { return t.local_rank; });
}
int tfhvd_local_size(void) {
  return tfhvd::Topo([](const tfhvd::Topology& t) { return t.local_size; });
}
int tfhvd_cross_rank(void) {
  return tfhvd::Topo([](const tfhvd::Topology& t) { return t.cross_rank; });
}
int tfhvd_cross_size(void) {
  return tfhvd::Topo([](const tfhvd::Topology& t) { return t.cross_size; });
}
int tfhvd_is_homogeneous(void) {
  return tfhvd::Topo([](const tfhvd::Topology& t) { return t.homogeneous ? 1 : 0; });
}
int tfhvd_mpi_threads_supported(void) {
  auto rt = tfhvd::CurrentRuntime();
  return rt ? (rt->backend()->threads_supported() ? 1 : 0) : -1;
}
int tfhvd_mpi_built(void) { return tfhvd::GetBuildInfo().mpi ? 1 : 0; }
int tfhvd_gloo_built(void) { return tfhvd::GetBuildInfo().gloo ? 1 : 0; }
int tfhvd_gloo_enabled(void) {
  auto rt = tfhvd::CurrentRuntime();
  if (!rt) return -1;
  auto* c = rt->backend()->collectives(-1);
  return c != nullptr && std::strcmp(c->name(), "Gloo") == 0 ? 1 : 0;
}
long long tfhvd_graph_inline_runs(void) {
  auto rt = tfhvd::CurrentRuntime();
  return rt ? rt->inline_runs() : -1;
}
int tfhvd_autotune_state(char* buf, int len) {
  auto rt = tfhvd::CurrentRuntime();
  if (!rt) return -1;
  const std::string s = rt->AutotuneState();
  std::snprintf(buf, len, "%s", s.c_str());
  return static_cast<int>(s.size()) < len ? 0 : 1;
}
int tfhvd_nccl_built(void) { return tfhvd::GetBuildInfo().nccl ? 1 : 0; }
int tfhvd_cuda_built(void) { return tfhvd::GetBuildInfo().cuda ? 1 : 0; }
const char* tfhvd_gpu_code_info(void) { return tfhvd::GetBuildInfo().device_code; }
const char* tfhvd_gpu_versions_info(void) { return tfhvd::GetBuildInfo().gpu_versions; }

int tfhvd_parse_settings(char* buf, int len) {
  tfhvd::Settings s;
  Status st = tfhvd::ParseSettings(tfhvd::ProcessEnv(), &s);
  if (!st.ok()) return tfhvd::Fail(st, buf, len);
  std::snprintf(buf, len, "%s", s.ToString().c_str());
  return 0;
}

int tfhvd_start_timeline(const char* path, int mark_cycles, char* err, int errlen) {
  auto rt = tfhvd::CurrentRuntime();
  if (!rt) return tfhvd::Fail(Status::FailedPrecondition(tfhvd::kNotInitialized), err, errlen);
  const std::string resolved = tfhvd::Timeline::PathForRank(path, rt->topology().rank);
  if (resolved.empty()) return 0;  // only rank 0 writes a path without {rank}
  Status st = rt->timeline().Start(resolved, rt->topology().rank, mark_cycles != 0);
  return st.ok() ? 0 : tfhvd::Fail(st, err, errlen);
}

int tfhvd_add_process_set(const int* ranks, int nranks, int require_dynamic, int* id, char* err,
                          int errlen) {
  auto rt = tfhvd::CurrentRuntime();
  if (!rt) return tfhvd::Fail(Status::FailedPrecondition(tfhvd::kNotInitialized), err, errlen);
  if (require_dynamic && !rt->settings().dynamic_process_sets) {
    return tfhvd::Fail(tfhvd::NotDynamic("adding"), err, errlen);
  }
  std::vector<int32_t> v(ranks, ranks + (ranks ? nranks : 0));
  rt.reset();  // the wait must not keep a shut-down runtime alive
  Status st = tfhvd::ChangeProcessSets(tfhvd::CollectiveType::kAddProcessSet, std::move(v), -1, id);
  return st.ok() ? 0 : tfhvd::Fail(st, err, errlen);
}

int tfhvd_remove_process_set(int id, char* err, int errlen) {
  return tfhvd_remove_process_set_ex(id, 1, err, errlen);
}

int tfhvd_remove_process_set_ex(int id, int require_dynamic, char* err, int errlen) {
  auto rt = tfhvd::CurrentRuntime();
  if (!rt) return tfhvd::Fail(Status::FailedPrecondition(tfhvd::kNotInitialized), err, errlen);
  if (require_dynamic && !rt->settings().dynamic_process_sets) {
    return tfhvd::Fail(tfhvd::NotDynamic("removing"), err, errlen);
  }
  rt.reset();
  Status st = tfhvd::ChangeProcessSets(tfhvd::CollectiveType::kRemoveProcessSet, {}, id, nullptr);
  return st.ok() ? 0 : tfhvd::Fail(st, err, errlen);
}

int tfhvd_process_set_info(int id, int* size, int* rank, int* ranks, int cap) {
  auto rt = tfhvd::CurrentRuntime();
  if (!rt) return -1;
  auto set = rt->FindSet(id);
  if (!set) return -3;
  if (size) *size = set->size();
  if (rank) *rank = set->rank;
  for (int i = 0; ranks && i < cap && i < set->size(); ++i) ranks[i] = set->ranks[i];
  return 0;
}

int tfhvd_process_set_ids(int* ids, int cap) {
  auto rt = tfhvd::CurrentRuntime();
  if (!rt) return -1;
  std::vector<int32_t> all = rt->SetIds();
  for (int i = 0; ids && i < cap && i < static_cast<int>(all.size()); ++i) ids[i] = all[i];
  return static_cast<int>(all.size());
}

int tfhvd_stop_timeline(void) {
  auto rt = tfhvd::CurrentRuntime();
  if (rt) rt->timeline().Stop();
  return 0;
}

void tfhvd_finalize(void) {
  const bool stuck = tfhvd_shutdown() != 0;
  bool abandoned;
  {
    auto& g = tfhvd::Global();
    std::lock_guard<std::mutex> l(g.mu);
    abandoned = g.abandoned;  // also by an earlier hvd.shutdown()
  }
  if (stuck || abandoned) {
    // The peers are stuck: MPI_Finalize would wait for them forever.
    std::fflush(stdout);
    std::fflush(stderr);
    tfhvd::AbortTransports(1);
  }
  tfhvd::FinalizeTransports();
}

}  // extern "C"
