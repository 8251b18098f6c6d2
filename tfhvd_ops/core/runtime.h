// The runtime: one per process, created by init and owned by the C API.
//
// It owns the settings, the backend, the tensor queue, the response cache,
// the coordinator (on rank 0), the executor and the background thread that
// does all communication (the protocol is described in controller.h).
#ifndef TFHVD_CORE_RUNTIME_H_
#define TFHVD_CORE_RUNTIME_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "autotune.h"
#include "backend.h"
#include "controller.h"
#include "logging.h"
#include "operations.h"
#include "process_set.h"
#include "response_cache.h"
#include "settings.h"
#include "tensor_queue.h"
#include "timeline.h"

namespace tfhvd {

class Runtime {
 public:
  Runtime(const Settings& settings, std::unique_ptr<Backend> backend);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Starts the background thread.
  Status Start();
  // Hands entries to the background thread; their callbacks run there.
  // Entries given together are negotiated together (grouped ops).  Fails at
  // once for a process set that does not exist or that this rank is not in,
  // and for a broadcast root outside the set.
  Status Enqueue(std::vector<TensorTableEntry> entries);
  // The process set `id` (0: global), or null when it does not exist.
  std::shared_ptr<ProcessSet> FindSet(int32_t id) const;
  std::vector<int32_t> SetIds() const { return sets_.Ids(); }
  // Collective with the other ranks (see controller.h, step 6); blocks until
  // the background thread has left.  Pending entries fail with Aborted.
  // Waiting for the peers is itself stall-checked: after the stall-check time
  // each rank warns which ranks have not shut down, and after the
  // stall-shutdown time (when set) it stops waiting.  Returns false in that
  // case: the peers are stuck, so MPI_Finalize would block too and the job
  // must be aborted (tfhvd_finalize does).
  bool Shutdown();
  // Calls submit() (which enqueues the caller's entries), then runs the
  // runtime's loop on the calling thread until `done` is set: for a caller
  // that would otherwise block waiting for its collective (an eager op), this
  // saves the hand-off to the background thread and the wake-up back.  The background thread parks meanwhile; one thread at a time
  // holds the loop (others wait for it).  Everything pending progresses, not
  // only the caller's own entries, so this can never deadlock where waiting
  // would not.  Returns false, having done nothing more, once shutdown has
  // begun, or in a build with GPU collectives (whose work must stay on the
  // background thread): the caller then waits for the background thread.
  // A caller that finds another thread holding the loop waits for the role
  // or for its own op to be done (by that thread), whichever comes first:
  // it never waits on another caller's op.  `done` must be set with a
  // sequentially consistent store.
  bool Drive(const std::function<void()>& submit, const std::atomic<bool>& done);
  // A graph kernel's Enqueue (it must not block).  Entries that were
  // negotiated alone in their last round (TensorQueue::NoteRound) are run
  // on the calling thread when no thread holds the loop: until `done` is
  // set, or kInlineFor passes without progress, and what is left goes to the
  // background thread.  That saves the background thread's wake-up, and the
  // op's completion (TensorFlow's continuation) runs on the executor thread
  // that is already awake.  It never waits for the loop, and gives the
  // thread back within kInlineFor, so it cannot deadlock where Enqueue would
  // not.  With TFHVD_GRAPH_INLINE=0 or GPU collectives it is Enqueue.
  Status EnqueueInline(std::vector<TensorTableEntry> entries, const std::atomic<bool>& done);

  // Graph ops that ran the loop on their own thread (EnqueueInline).
  int64_t inline_runs() const { return inline_runs_.load(); }
  // The autotune setting this rank applies now, and each change (autotune.h).
  std::string AutotuneState() const { return autotune_.State(); }
  const Topology& topology() const { return backend_->topology(); }
  const Settings& settings() const { return settings_; }
  Backend* backend() { return backend_.get(); }
  Timeline& timeline() { return timeline_; }

 private:
  using Micros = std::chrono::microseconds;
  class SubmitScope;
  // When the running thread last made progress, and its next poll interval.
  struct IdleState {
    IdleState();
    std::chrono::steady_clock::time_point idle_since;
    Micros backoff;
  };
  void Loop();
  // One pass of the loop (the caller holds the role); true when something
  // happened, which also resets `st` and lets role waiters look again.
  bool Step(bool shutting_down, IdleState* st);
  // The wait after a pass that did nothing (see runtime.cc).
  void IdleWait(IdleState* st, bool active);
  // Collectives outstanding on this rank (or, on rank 0, anywhere).
  bool Active(bool shutting_down) const;
  void WakeBackground();
  // The role (see role_mu_).  TakeRoleUnless gives up, returning false, once
  // `done` is set while another thread holds the role.
  void TakeRole();
  bool TryTakeRole();
  bool TakeRoleUnless(const std::atomic<bool>& done);
  // EnqueueInline's loop, and the end of a caller's turn in the loop.
  void RunInline(const std::atomic<bool>& done);
  void LeaveLoop();
  void Park(bool idle);
  // Whether the background thread may sleep without watching the channel:
  // not a coordinator of other process sets, which must answer their
  // members while it has nothing of its own.  The loop's holder only.
  bool MayParkIdle() const;
  void ReleaseRole();
  // After a pass that made progress: lets waiters re-check their `done`.
  void NotifyRoleWaiters();
  bool CoordinatorStep(bool shutting_down);
  bool WorkerStep(bool shutting_down);
  void ExecuteList(const ResponseList& list);
  // Runs an agreed add or remove of a process set on this rank.
  void ChangeSet(const Response& r, TensorTableEntry* e);
  // Stops the sets' workers (after the loop ended).
  void StopWorkers();
  std::unique_ptr<SetWorker> MakeWorker(std::shared_ptr<ProcessSet> set);
  void UpdateGlobalWorker();
  Status CheckEntry(const TensorTableEntry& e) const;
  void FailAll(const Status& st);
  // While shutting down: warns about, and after the stall-shutdown time gives
  // up on, peers that have not shut down.  Returns true to give up.
  bool ShutdownStalled(std::chrono::steady_clock::time_point since,
                       std::chrono::steady_clock::time_point* last_warned);
  void TimelineNegotiateStart(const std::vector<Request>& fresh);
  RequestList MakeRequestList(std::vector<Request> fresh, bool shutdown);

  Settings settings_;
  std::unique_ptr<Backend> backend_;
  Logger log_;
  // Decides on rank 0; every rank applies.  (Initialised from the members above.)
  Autotune autotune_{settings_, backend_->topology().rank, &log_};
  TensorQueue queue_;
  // Declared after backend_: the sets' communicators go first.
  ProcessSetTable sets_;
  std::shared_ptr<ProcessSet> global_set_;  // id 0; its cache is the coordinator's
  std::unique_ptr<Coordinator> coordinator_;
  Timeline timeline_;
  Executor executor_;
  std::thread thread_;
  // Process sets other than the global one run their responses on a worker
  // each (SetWorker) when the transport allows threads; touched by the loop's
  // holder only.
  bool set_workers_ = false;
  std::map<int32_t, std::unique_ptr<SetWorker>> workers_;
  bool blocking_channel_ = false;    // the channel can Wait() (TCP)
  bool drive_on_callers_ = true;     // Drive() may run the loop (no GPU backend)
  // The loop's role: held by whichever thread runs the loop (the background
  // thread, or a caller in Drive()), its waits included.  The loop state
  // below is only touched by the holder.
  std::mutex role_mu_;                // guards role_held_
  std::condition_variable role_cv_;   // role released, or a waiter's op done
  bool role_held_ = false;
  std::atomic<int> role_waiters_{0};
  std::atomic<int> drivers_{0};      // callers in Drive()
  std::atomic<bool> parked_{false};  // the background thread waits on park_cv_
  std::atomic<bool> inline_wanted_{false};  // a graph op ran, or wanted to run, the loop
  std::atomic<int64_t> inline_runs_{0};
  std::mutex park_mu_;
  std::condition_variable park_cv_;
  std::atomic<bool> shutdown_requested_{false};
  bool stopped_ = false;
  // Loop state (touched only by the role's holder).
  bool shutdown_sent_ = false;       // worker told the coordinator
  bool coordinator_gone_ = false;    // coordinator told us it left
  bool abandoned_ = false;           // gave up waiting for the peers to shut down
  std::vector<bool> announced_;      // rank 0: workers told to leave
  std::chrono::steady_clock::time_point last_round_;
};

}  // namespace tfhvd

#endif  // TFHVD_CORE_RUNTIME_H_
