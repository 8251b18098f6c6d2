#include "runtime.h"

#include <pthread.h>

#include <algorithm>
#include <sstream>

namespace tfhvd {
namespace {

using Clock = std::chrono::steady_clock;
using Micros = std::chrono::microseconds;

// How long an idle runtime sleeps before it looks for control messages (a
// worker's shutdown notice, a stall to report).  Local work wakes it at once.
constexpr Micros kIdleWait{100000};
// With a channel that can block (TCP), a rank with outstanding collectives
// sleeps until a message or new work arrives; it wakes at least this often
// for the stall check.
constexpr Micros kActiveWait{500000};

// While collectives are outstanding the loop polls the transport: it spins
// (yielding the core) for a short while, then sleeps with doubling waits up
// to kMaxWait, so a rank waiting for a straggler does not steal its CPU.
constexpr Micros kSpinFor{100};
// After finishing work the loop stays awake this long before it sleeps: the
// next collective of a training step usually follows within microseconds,
// and waking a sleeping thread costs more than that.
constexpr Micros kLinger{50};
constexpr Micros kFirstWait{20};
// The longest a graph op's executor thread runs the loop without progress
// (Runtime::EnqueueInline).
constexpr Micros kInlineFor{2000};
// A graph op that its thread enqueues this soon after running the loop for
// the last one is part of a burst (a step's ungrouped ops, one after the
// other; a step's next call comes tens of microseconds later at the least).
constexpr Micros kBurstGap{20};
constexpr Micros kMaxWait{1000};
// How long sends may take to leave: at shutdown, and otherwise (a peer that
// dies is noticed at once, through its socket).
constexpr double kShutdownFlushSeconds = 10.0;
constexpr double kForever = 1e9;

}  // namespace

Runtime::Runtime(const Settings& settings, std::unique_ptr<Backend> backend)
    : settings_(settings),
      backend_(std::move(backend)),
      log_(settings.log_level, backend_->topology().rank),
      executor_(backend_.get(), &timeline_) {
  announced_.assign(topology().size, false);
  std::vector<int> all(topology().size);
  for (int r = 0; r < topology().size; ++r) all[r] = r;
  global_set_ = std::make_shared<ProcessSet>(0, all, topology().rank, settings_.cache_capacity);
  sets_.Add(global_set_);
  if (topology().rank == 0) {
    coordinator_ = std::make_unique<Coordinator>(
        topology().size, settings_, settings_.cache_capacity > 0 ? &global_set_->cache : nullptr,
        &log_);
  }
}

Runtime::~Runtime() {
  Shutdown();
  for (auto& set : sets_.TakeAll()) {
    if (set->id != 0) backend_->ReleaseSubset(set->id);
  }
}

std::shared_ptr<ProcessSet> Runtime::FindSet(int32_t id) const { return sets_.Find(id); }

Status Runtime::CheckEntry(const TensorTableEntry& e) const {
  const CollectiveParams& p = e.params;
  if (p.process_set_id == 0) return Status::OK();
  const std::string what =
      "tfhvd: " + std::string(CollectiveName(p.type)) + " of tensor '" + e.name + "': ";
  std::shared_ptr<ProcessSet> set = sets_.Find(p.process_set_id);
  if (!set) {
    return Status::InvalidArgument(what + "process set " + std::to_string(p.process_set_id) +
                                   " does not exist, or has been removed");
  }
  const std::string desc =
      "process set " + std::to_string(set->id) + " " + RanksString(set->ranks);
  if (!set->included()) {
    return Status::InvalidArgument(what + "rank " + std::to_string(topology().rank) +
                                   " is not a member of " + desc);
  }
  if (p.type == CollectiveType::kBroadcast && set->IndexOf(p.root_rank) < 0) {
    return Status::InvalidArgument(what + "root rank " + std::to_string(p.root_rank) +
                                   " is not a member of " + desc +
                                   " (root_rank is a global rank, as in Horovod)");
  }
  if (p.type == CollectiveType::kJoin) {
    return Status::InvalidArgument(what + "join runs on the global process set only");
  }
  return Status::OK();
}

Status Runtime::Start() {
  const std::string path = Timeline::PathForRank(settings_.timeline_path, topology().rank);
  if (!path.empty()) {
    TFHVD_RETURN_IF_ERROR(timeline_.Start(path, topology().rank, settings_.timeline_mark_cycles));
  }
  TFHVD_RETURN_IF_ERROR(autotune_.Start());
  last_round_ = Clock::now();
  blocking_channel_ = backend_->control()->Wait(queue_.wake_fd(), Micros(0));
  // With GPU collectives the loop stays on the background thread: running
  // NCCL work would change a caller's current CUDA device.
  drive_on_callers_ = !backend_->has_device_collectives();
  // With GPU collectives every set's work stays on the loop, in the
  // coordinator's one order: NCCL communicators of one GPU driven from
  // several threads can deadlock across ranks (kernels launched in different
  // orders; cudaFree and communicator creation synchronise the device).
  set_workers_ = backend_->threads_supported() && !backend_->has_device_collectives();
  TFHVD_LOG(log_, kInfo, "control channel: " << backend_->control()->Describe());
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "tfhvd_loop");  // for top -H, perf, gdb
    Loop();
  });
  return Status::OK();
}

// The runtime this thread submits to in Drive(): it takes its entries itself
// next, so they need no signal.
thread_local const Runtime* t_submitting = nullptr;
// Set while this thread runs the loop in Drive().
thread_local bool t_in_loop = false;
// When this thread last ran the loop for a graph op (EnqueueInline).
thread_local std::chrono::steady_clock::time_point t_inline_end;

Status Runtime::Enqueue(std::vector<TensorTableEntry> entries) {
  for (const TensorTableEntry& e : entries) TFHVD_RETURN_IF_ERROR(CheckEntry(e));
  // The signal also wakes a background thread in its idle park.
  TFHVD_RETURN_IF_ERROR(queue_.Add(std::move(entries), /*signal=*/t_submitting != this));
  // It may still be parked after a Drive() that ended.
  if (drivers_.load() == 0 && parked_.load()) WakeBackground();
  return Status::OK();
}

Status Runtime::EnqueueInline(std::vector<TensorTableEntry> entries,
                              const std::atomic<bool>& done) {
  if (!settings_.graph_inline || !drive_on_callers_ || t_in_loop || t_submitting == this) {
    return Enqueue(std::move(entries));
  }
  for (const TensorTableEntry& e : entries) TFHVD_RETURN_IF_ERROR(CheckEntry(e));
  bool solo = false;
  const bool burst = Clock::now() - t_inline_end < kBurstGap;
  TFHVD_RETURN_IF_ERROR(queue_.AddFromGraph(std::move(entries), burst, &solo));
  if (!solo) {  // signalled, and woken, as Enqueue does
    if (drivers_.load() == 0 && parked_.load()) WakeBackground();
    return Status::OK();
  }
  inline_wanted_.store(true);
  // Not signalled: this thread runs the loop, or wakes whoever holds it (a
  // background thread that took the entries meanwhile is woken for nothing).
  drivers_.fetch_add(1);
  if (TryTakeRole()) {
    inline_runs_.fetch_add(1, std::memory_order_relaxed);
    RunInline(done);
    t_inline_end = Clock::now();
    return Status::OK();
  }
  drivers_.fetch_sub(1);
  queue_.Notify();
  return Status::OK();
}

bool Runtime::MayParkIdle() const { return !coordinator_ || sets_.Size() == 1; }

bool Runtime::TryTakeRole() {
  std::lock_guard<std::mutex> l(role_mu_);
  if (role_held_) return false;
  role_held_ = true;
  return true;
}

// The executor thread waits as the background thread would (it spins for
// kSpinFor, then sleeps on the channel), so the op's completion runs here,
// but never longer than kInlineFor without progress: then the loop goes
// back to the background thread, and TensorFlow gets its thread back for
// other work (which a peer may be waiting for).
void Runtime::RunInline(const std::atomic<bool>& done) {
  t_in_loop = true;
  IdleState st;
  while (!done.load() && !shutdown_requested_.load()) {
    timeline_.MarkCycle();
    if (Step(false, &st) || done.load()) continue;
    const Micros idle = std::chrono::duration_cast<Micros>(Clock::now() - st.idle_since);
    if (idle >= kInlineFor) break;
    if (idle < kSpinFor) {
      std::this_thread::yield();
    } else if (blocking_channel_) {
      backend_->control()->Wait(queue_.wake_fd(), kInlineFor - idle);
    } else {
      queue_.Wait(std::min(st.backoff, kInlineFor - idle));
      st.backoff = std::min(st.backoff * 2, kMaxWait);
    }
  }
  t_in_loop = false;
  LeaveLoop();
}

void Runtime::LeaveLoop() {
  // Whatever is left (another thread's collectives) goes back to the
  // background thread; Dekker-style with Park's check of drivers_.
  // A coordinator of other process sets must go on answering their members.
  drivers_.fetch_sub(1);
  const bool left = Active(false) || queue_.HasIncoming() || shutdown_requested_.load() ||
                    !MayParkIdle();
  ReleaseRole();
  if (left) WakeBackground();
}

bool Runtime::Shutdown() {
  if (stopped_) return !abandoned_;
  stopped_ = true;
  shutdown_requested_ = true;
  queue_.Notify();
  WakeBackground();
  if (thread_.joinable()) thread_.join();
  StopWorkers();
  // GPU work still in flight calls back from its finalizer; the callbacks
  // use the timeline.  (Peers given up on: the job is ending anyway.)
  if (!abandoned_) executor_.Drain();
  timeline_.Stop();
  return !abandoned_;
}

// While other sets exist the global set's responses run on a worker too, so
// that rank 0's loop (every set's coordinator) never waits in a global
// collective while another set negotiates.  With the global set alone they
// run on the loop, which saves eager ops a thread hand-off.
void Runtime::UpdateGlobalWorker() {
  const bool want = set_workers_ && sets_.Size() > 1;
  auto it = workers_.find(0);
  if (want && it == workers_.end()) {
    workers_[0] = MakeWorker(global_set_);
  } else if (!want && it != workers_.end()) {
    it->second->Drain();
    workers_.erase(it);
  }
}

std::unique_ptr<SetWorker> Runtime::MakeWorker(std::shared_ptr<ProcessSet> set) {
  return std::make_unique<SetWorker>(backend_.get(), &timeline_, std::move(set), [this] {
    queue_.Notify();  // a caller in Drive() may sleep on the queue's eventfd
    NotifyRoleWaiters();
  });
}

void Runtime::StopWorkers() {
  for (auto& kv : workers_) {
    if (abandoned_) kv.second->Abandon();  // its collective may never end; the job aborts
  }
  if (abandoned_) {
    for (auto& kv : workers_) kv.second.release();  // NOLINT: the thread may still use it
  }
  workers_.clear();
}

bool Runtime::ShutdownStalled(Clock::time_point since, Clock::time_point* last_warned) {
  if (settings_.stall_check_disable) return false;
  using Secs = std::chrono::duration<double>;
  const Clock::time_point now = Clock::now();
  const double waited = Secs(now - since).count();
  std::vector<int> missing;
  if (topology().rank == 0) {
    for (int r = 1; r < topology().size; ++r) {
      if (!coordinator_->IsShutDown(r)) missing.push_back(r);
    }
  } else if (!coordinator_gone_) {
    missing.push_back(0);
  }
  if (missing.empty()) return false;
  std::ostringstream ranks;
  for (size_t i = 0; i < missing.size(); ++i) ranks << (i ? ", " : "") << missing[i];
  if (settings_.stall_shutdown_time_s > 0 && waited >= settings_.stall_shutdown_time_s) {
    TFHVD_LOG(log_, kError, "shutdown: ranks [" << ranks.str() << "] did not shut down within "
                                << settings_.stall_shutdown_time_s
                                << " s (stall shutdown time); aborting the job");
    return true;
  }
  if (waited >= settings_.stall_check_time_s &&
      Secs(now - *last_warned).count() >= settings_.stall_check_time_s) {
    *last_warned = now;
    TFHVD_LOG(log_, kWarning, "shutdown: waited " << static_cast<int>(waited) << " s for ranks ["
                                  << ranks.str() << "] to shut down (stuck, or still busy "
                                  "outside tfhvd)");
  }
  return false;
}

RequestList Runtime::MakeRequestList(std::vector<Request> fresh, bool shutdown) {
  RequestList list;
  list.shutdown = shutdown;
  for (Request& r : fresh) {
    const int32_t sid = r.params.process_set_id;
    std::shared_ptr<ProcessSet> set =
        settings_.cache_enabled ? (sid == 0 ? global_set_ : sets_.Find(sid)) : nullptr;
    int32_t id = set ? set->cache.Lookup(r.name, r.params) : -1;
    if (id >= 0) {
      list.cached_ids.push_back(id);
      list.cached_sets.push_back(sid);
    } else {
      list.requests.push_back(std::move(r));
    }
  }
  return list;
}

void Runtime::ExecuteList(const ResponseList& list) {
  const int rank = topology().rank;
  autotune_.Apply(list.tuned, &settings_, coordinator_.get());
  if (settings_.graph_inline && drive_on_callers_) queue_.NoteRound(list);
  for (const Response& r : list.responses) {
    const int32_t sid = r.params.process_set_id;
    std::shared_ptr<ProcessSet> set = sid == 0 ? global_set_ : sets_.Find(sid);
    // Another set's work: rank 0 sees every response.
    if (r.kind == ResponseKind::kCollective && (!set || !set->included())) continue;
    std::vector<std::unique_ptr<TensorTableEntry>> entries(r.names.size());
    bool joined = std::find(r.joined_ranks.begin(), r.joined_ranks.end(), rank) !=
                  r.joined_ranks.end();
    bool missing = false;
    std::string key_buf;
    for (size_t i = 0; i < r.names.size(); ++i) {
      TensorTableEntry e;
      if (queue_.Pop(TensorKeyRef(sid, r.names[i], &key_buf), &e)) {
        if (timeline_.enabled()) timeline_.NegotiateEnd(TimelineName(sid, r.names[i]));
        // Cache what this rank asked for: a fused response carries only
        // names[0]'s shape, and cacheable requests are the same on every rank.
        if (i < r.cache_ids.size() && set) set->cache.Insert(r.cache_ids[i], r.names[i], e.params);
        entries[i] = std::make_unique<TensorTableEntry>(std::move(e));
      } else if (r.kind == ResponseKind::kCollective && !joined) {
        missing = true;
        TFHVD_LOG(log_, kError, "response for '" << r.names[i] << "' but no local tensor");
      }
    }
    if (r.kind == ResponseKind::kCollective && !joined && missing) {
      Response err = r;
      err.kind = ResponseKind::kError;
      err.error_code = StatusCode::kInternal;
      err.error = "tfhvd: internal error: tensor '" + r.names[0] + "' is missing on rank " +
                  std::to_string(rank);
      executor_.Execute(err, entries, set ? *set : *global_set_);
      continue;
    }
    bool any = std::any_of(entries.begin(), entries.end(), [](const auto& e) { return !!e; });
    if (r.kind == ResponseKind::kError && !any) continue;
    if (r.kind == ResponseKind::kCollective &&
        (r.params.type == CollectiveType::kAddProcessSet ||
         r.params.type == CollectiveType::kRemoveProcessSet)) {
      ChangeSet(r, entries[0].get());
      continue;
    }
    if (r.kind == ResponseKind::kCollective) {
      auto w = workers_.find(sid);
      if (w != workers_.end()) {
        w->second->Submit(r, std::move(entries));
        continue;
      }
    }
    executor_.Execute(r, entries, set ? *set : *global_set_);
  }
}

void Runtime::ChangeSet(const Response& r, TensorTableEntry* e) {
  const int32_t id = r.params.root_rank;
  Status st;
  // The change uses the global set's communicator (MPI_Comm_create): the
  // global collectives agreed before it finish first.
  auto global = workers_.find(0);
  if (global != workers_.end()) global->second->Drain();
  if (r.params.type == CollectiveType::kAddProcessSet) {
    std::vector<int> ranks(r.params.splits.begin(), r.params.splits.end());
    std::unique_ptr<Collectives> host;
    st = backend_->CreateSubsetCollectives(id, ranks, &host);
    if (st.ok()) {
      auto set = std::make_shared<ProcessSet>(id, ranks, topology().rank,
                                              settings_.cache_capacity);
      set->host = std::move(host);
      sets_.Add(set);
      if (set_workers_ && set->included()) workers_[id] = MakeWorker(set);
      TFHVD_LOG(log_, kDebug, "added process set " << id << " " << RanksString(ranks));
    } else {
      TFHVD_LOG(log_, kError, "process set " << id << " " << RanksString(ranks)
                                              << " could not be made: " << st.message());
    }
  } else {
    // Every collective agreed before the removal runs first (on every member:
    // they were handed to the workers in the same order).
    auto w = workers_.find(id);
    if (w != workers_.end()) {
      w->second->Drain();
      workers_.erase(w);
    }
    std::shared_ptr<ProcessSet> set = sets_.Remove(id);
    for (TensorTableEntry& p : queue_.TakeSet(id)) {
      if (p.callback) {
        p.callback(Status::InvalidArgument("tfhvd: " + std::string(CollectiveName(p.params.type)) +
                                           " of tensor '" + p.name + "': process set " +
                                           std::to_string(id) +
                                           " was removed while it was pending"));
      }
    }
    if (set) backend_->ReleaseSubset(id);
    set.reset();  // frees the set's communicators (every member does it here)
    TFHVD_LOG(log_, kDebug, "removed process set " << id);
  }
  UpdateGlobalWorker();
  if (e == nullptr) return;
  if (st.ok() && e->output) *static_cast<int32_t*>(e->output->mutable_data()) = id;
  if (e->callback) e->callback(st);
}

void Runtime::TimelineNegotiateStart(const std::vector<Request>& fresh) {
  if (!timeline_.enabled()) return;
  for (const Request& r : fresh) {
    const int32_t sid = r.params.process_set_id;
    const std::string row = TimelineName(sid, r.name);
    const TensorTableEntry* e = queue_.Peek(TensorKey(sid, r.name));
    if (e != nullptr) timeline_.Queued(row, e->enqueued);
    timeline_.NegotiateStart(row, CollectiveName(r.params.type));
  }
}

void Runtime::FailAll(const Status& st) {
  for (TensorTableEntry& e : queue_.TakeAll()) {
    if (e.callback) e.callback(st);
  }
}

bool Runtime::CoordinatorStep(bool shutting_down) {
  ControlChannel* ch = backend_->control();
  Clock::time_point now = Clock::now();
  bool progress = false;
  std::vector<Request> fresh = queue_.TakeNew(0);
  TimelineNegotiateStart(fresh);
  if (!fresh.empty() || (shutting_down && !coordinator_->IsShutDown(0))) {
    RequestList own;
    own.requests = std::move(fresh);
    own.shutdown = shutting_down;
    coordinator_->AddRequests(0, std::move(own), now);
    progress = true;
  }
  std::vector<std::pair<int, std::string>> msgs;
  Status st = ch->PollWorkers(&msgs);
  if (!st.ok()) TFHVD_LOG(log_, kError, st.message());
  for (auto& m : msgs) {
    if (m.second.empty()) {  // the transport lost this worker
      if (!coordinator_->IsShutDown(m.first)) {
        TFHVD_LOG(log_, kError, "rank " << m.first
                                        << " exited or lost its connection to the coordinator; "
                                           "collectives that need it will fail");
        coordinator_->MarkLost(m.first);
      }
      announced_[m.first] = true;
      progress = true;
      continue;
    }
    RequestList list;
    if (!Parse(m.second, &list)) {
      TFHVD_LOG(log_, kError, "corrupt negotiation message from rank " << m.first);
      continue;
    }
    coordinator_->AddRequests(m.first, std::move(list), now);
    progress = true;
  }
  const double since_ms = std::chrono::duration<double, std::milli>(now - last_round_).count();
  if (settings_.cycle_time_ms > 0 && since_ms < settings_.cycle_time_ms) return progress;
  ResponseList list = coordinator_->Compute(now);
  autotune_.Observe(&list, now);
  const int size = topology().size;
  // Send the list to every worker still listening; tell a worker that has
  // shut down (or everyone, when we shut down) that it may leave.
  // Only the global set's responses go to everyone; a set's go to its members.
  const bool all_global =
      std::all_of(list.responses.begin(), list.responses.end(),
                  [](const Response& r) { return r.params.process_set_id == 0; });
  for (int w = 1; w < size; ++w) {
    if (announced_[w]) continue;
    bool tell_leave = shutting_down || coordinator_->IsShutDown(w);
    ResponseList out{false, {}, list.tuned};
    if (all_global) {
      out.responses = list.responses;
    } else {
      for (const Response& r : list.responses) {
        if (coordinator_->Receives(w, r.params.process_set_id)) out.responses.push_back(r);
      }
    }
    if (out.responses.empty() && !tell_leave && !out.tuned.present) continue;
    out.shutdown = tell_leave;
    Status s = ch->SendToWorker(w, Serialize(out));
    if (!s.ok()) TFHVD_LOG(log_, kError, s.message());
    if (tell_leave) announced_[w] = true;
  }
  if (!list.responses.empty()) {
    // Every worker must be able to read the whole list before we block in
    // its collectives: a list larger than the transport's buffer would
    // otherwise wait in ours while we wait for the workers.
    // A worker that is alive reads its channel all the time; only the stall
    // shutdown time, when set, bounds the wait for one that does not.
    Status fs = ch->FlushSends(settings_.stall_shutdown_time_s > 0 ? settings_.stall_shutdown_time_s
                                                                   : kForever);
    if (!fs.ok()) TFHVD_LOG(log_, kError, fs.message());
    auto t0 = Clock::now();
    ExecuteList(list);
    if (log_.Enabled(LogLevel::kDebug)) {
      using Us = std::chrono::duration<double, std::micro>;
      size_t tensors = 0;
      for (const Response& r : list.responses) tensors += r.names.size();
      TFHVD_LOG(log_, kDebug, "round: " << list.responses.size() << " responses for " << tensors
                    << " tensors, executed in " << Us(Clock::now() - t0).count()
                    << " us; negotiation took " << Us(t0 - now).count() << " us");
    }
    last_round_ = now;
    progress = true;
  }
  return progress;
}

bool Runtime::WorkerStep(bool shutting_down) {
  ControlChannel* ch = backend_->control();
  bool progress = false;
  std::vector<Request> fresh = queue_.TakeNew(topology().rank);
  if (coordinator_gone_ && !fresh.empty()) {
    FailAll(Status::Aborted("tfhvd: the coordinator (rank 0) has shut down; "
                            "no more collectives can run in this job"));
    fresh.clear();
    progress = true;
  }
  TimelineNegotiateStart(fresh);
  bool send_shutdown = shutting_down && !shutdown_sent_;
  if (!fresh.empty() || send_shutdown) {
    Status st = ch->SendToCoordinator(Serialize(MakeRequestList(std::move(fresh), send_shutdown)));
    if (!st.ok()) TFHVD_LOG(log_, kError, st.message());
    shutdown_sent_ |= send_shutdown;
    progress = true;
  }
  std::vector<std::string> msgs;
  Status st = ch->PollCoordinator(&msgs);
  if (!st.ok()) TFHVD_LOG(log_, kError, st.message());
  for (const std::string& m : msgs) {
    if (m.empty()) {  // the transport lost the coordinator
      if (!coordinator_gone_) {
        if (!shutting_down) {
          TFHVD_LOG(log_, kError, "the coordinator (rank 0) exited or lost its connection");
        }
        coordinator_gone_ = true;
        Status st = Status::Aborted(
            "tfhvd: the coordinator (rank 0) exited or lost its connection; "
            "no more collectives can run in this job");
        queue_.Close(st);
        FailAll(st);
      }
      progress = true;
      continue;
    }
    ResponseList list;
    if (!Parse(m, &list)) {
      TFHVD_LOG(log_, kError, "corrupt negotiation message from the coordinator");
      continue;
    }
    ExecuteList(list);
    if (list.shutdown) {
      coordinator_gone_ = true;
      queue_.Close(Status::Aborted("tfhvd: the coordinator (rank 0) has shut down; "
                                   "no more collectives can run in this job"));
      FailAll(Status::Aborted(shutting_down
                                  ? "tfhvd: shut down while this collective was pending"
                                  : "tfhvd: the coordinator (rank 0) has shut down; "
                                    "this collective cannot complete"));
    }
    progress = true;
  }
  return progress;
}

// Waits for the next event after a pass that did nothing.  While collectives
// are outstanding it first spins (yielding the core) for kSpinFor, since a
// peer usually answers within microseconds and waking from sleep costs tens
// of them; after finishing work it lingers kLinger the same way.  Then it
// sleeps: on the channel and the queue together where the channel can block
// (TCP), else on the queue with doubling waits up to kMaxWait.
Runtime::IdleState::IdleState() : idle_since(Clock::now()), backoff(kFirstWait) {}

void Runtime::IdleWait(IdleState* st, bool active) {
  if (Clock::now() - st->idle_since < (active ? kSpinFor : kLinger)) {
    std::this_thread::yield();
    return;
  }
  ControlChannel* channel = backend_->control();
  if (blocking_channel_) {
    Micros timeout = active ? kActiveWait : kIdleWait;
    if (coordinator_ && settings_.cycle_time_ms > 0 && coordinator_->HasPending()) {
      timeout = std::min(timeout, Micros(static_cast<int64_t>(settings_.cycle_time_ms * 1000)));
    }
    channel->Wait(queue_.wake_fd(), timeout);
    return;
  }
  if (!active) {
    queue_.Wait(kIdleWait);
    return;
  }
  queue_.Wait(st->backoff);
  st->backoff = std::min(st->backoff * 2, kMaxWait);
}

bool Runtime::Active(bool shutting_down) const {
  return queue_.HasPending() || shutting_down || (coordinator_ && coordinator_->HasPending());
}

// Restores the thread's submission mark, and undoes a driver's registration
// unless dismissed, even if submit() throws.
class Runtime::SubmitScope {
 public:
  SubmitScope(Runtime* rt) : rt_(rt) {
    rt_->drivers_.fetch_add(1);
    t_submitting = rt;
  }
  ~SubmitScope() {
    t_submitting = nullptr;
    if (!dismissed_) {
      rt_->drivers_.fetch_sub(1);
      rt_->WakeBackground();
    }
  }
  void Dismiss() { dismissed_ = true; }

 private:
  Runtime* rt_;
  bool dismissed_ = false;
};

bool Runtime::Drive(const std::function<void()>& submit, const std::atomic<bool>& done) {
  // A thread already running the loop (a callback that runs an eager op)
  // cannot take the role again.
  if (!drive_on_callers_ || t_in_loop) {
    submit();
    return false;
  }
  {
    // Registered before submitting, so that the submission does not wake
    // the parked background thread (Enqueue).
    SubmitScope scope(this);
    submit();
    if (!shutdown_requested_.load() && TakeRoleUnless(done)) {
      scope.Dismiss();
    } else {
      return done.load();  // the scope unregisters and wakes the background thread
    }
  }
  t_in_loop = true;
  IdleState st;
  while (!done.load() && !shutdown_requested_.load()) {
    timeline_.MarkCycle();
    if (!Step(false, &st) && !done.load()) IdleWait(&st, true);
  }
  t_in_loop = false;
  LeaveLoop();
  return done.load();
}

void Runtime::TakeRole() {
  std::unique_lock<std::mutex> l(role_mu_);
  role_waiters_.fetch_add(1);
  role_cv_.wait(l, [this] { return !role_held_; });
  role_waiters_.fetch_sub(1);
  role_held_ = true;
}

bool Runtime::TakeRoleUnless(const std::atomic<bool>& done) {
  std::unique_lock<std::mutex> l(role_mu_);
  if (!role_held_) {
    role_held_ = true;
    return true;
  }
  role_waiters_.fetch_add(1);
  // The holder may sleep in its wait: the eventfd wakes it, and it parks
  // (the background thread) or takes our entries (another caller).
  queue_.Notify();
  role_cv_.wait(l, [this, &done] { return !role_held_ || done.load(); });
  role_waiters_.fetch_sub(1);
  if (role_held_) return false;
  role_held_ = true;
  return true;
}

void Runtime::ReleaseRole() {
  {
    std::lock_guard<std::mutex> l(role_mu_);
    role_held_ = false;
  }
  if (role_waiters_.load() > 0) role_cv_.notify_all();
}

void Runtime::NotifyRoleWaiters() {
  // Pairs with TakeRoleUnless: `done` is stored before this load, the
  // waiter's count before its load of `done` (both sequentially consistent).
  if (role_waiters_.load() == 0) return;
  std::lock_guard<std::mutex> l(role_mu_);
  role_cv_.notify_all();
}

void Runtime::WakeBackground() {
  {
    std::lock_guard<std::mutex> l(park_mu_);
    park_cv_.notify_one();
  }
  queue_.WakeParked();
}

// The background thread's two parks, both without the loop's role, and both
// ending after kIdleWait at the latest, to read the control channel.
// While a caller runs the loop (Drive, EnqueueInline) it waits on park_cv_
// until no caller is left: not on the queue's eventfd, whose signals are the
// caller's.  Once idle after graph ops ran, or wanted to run, the loop
// themselves (EnqueueInline), it leaves the loop free for the next one and
// sleeps on the eventfd (TensorQueue::Park): new work, a caller leaving work
// behind or shutdown wake it.
void Runtime::Park(bool idle) {
  ReleaseRole();
  if (idle) {
    queue_.Park(kIdleWait, [this] { return shutdown_requested_.load(); });
  } else {
    std::unique_lock<std::mutex> l(park_mu_);
    parked_.store(true);
    park_cv_.wait_for(l, kIdleWait, [this] {
      return drivers_.load() == 0 || shutdown_requested_.load();
    });
    parked_.store(false);
  }
  TakeRole();
}

bool Runtime::Step(bool shutting_down, IdleState* st) {
  const bool progress =
      topology().rank == 0 ? CoordinatorStep(shutting_down) : WorkerStep(shutting_down);
  if (progress) {
    NotifyRoleWaiters();
    st->idle_since = Clock::now();
    st->backoff = kFirstWait;
  }
  return progress;
}

void Runtime::Loop() {
  const bool coordinator = topology().rank == 0;
  IdleState st;
  Clock::time_point shutdown_since{}, shutdown_warned{};
  // The role is held through the waits too: the channel is only ever used by
  // one thread.  A caller that wants to drive kicks the wait (Drive).
  TakeRole();
  while (true) {
    // A caller is driving (Drive): stay out of its way until it is done.
    if (drivers_.load() > 0 && !shutdown_requested_.load()) {
      Park(/*idle=*/false);
      st.idle_since = Clock::now();
      continue;
    }
    timeline_.MarkCycle();
    const bool shutting_down = shutdown_requested_.load();
    if (shutting_down) {
      queue_.Close(Status::Aborted("tfhvd has been shut down; call hvd.init() again"));
      if (shutdown_since == Clock::time_point{}) shutdown_since = shutdown_warned = Clock::now();
      if (ShutdownStalled(shutdown_since, &shutdown_warned)) {
        abandoned_ = true;
        break;
      }
    }
    const bool progress = Step(shutting_down, &st);
    if (coordinator ? (shutting_down && coordinator_->AllWorkersShutDown() &&
                       !coordinator_->HasPending())
                    : (shutting_down && shutdown_sent_ && coordinator_gone_)) {
      break;
    }
    if (progress) continue;
    const bool active = Active(shutting_down);
    // Graph ops ran (or wanted to run) the loop themselves since the last
    // park: once idle, leave the loop free for the next one at once (no
    // lingering: the next one runs the loop itself).  Other ranks' requests
    // pending at the coordinator wait for this rank's own op anyway (every
    // rank is in the global set, the only one here).
    const bool own_work = queue_.HasPending() || (active && settings_.cycle_time_ms > 0);
    if (!own_work && !shutting_down && MayParkIdle() && inline_wanted_.exchange(false)) {
      Park(/*idle=*/true);
      st.idle_since = Clock::now();
      continue;
    }
    IdleWait(&st, active);
  }
  // Sends to stuck peers may never complete: flush only after a clean exit.
  if (!abandoned_) backend_->control()->FlushSends(kShutdownFlushSeconds);
  FailAll(Status::Aborted("tfhvd: shut down while this collective was pending"));
  ReleaseRole();
}

}  // namespace tfhvd
