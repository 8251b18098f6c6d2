// The runtime: one per process, created by init and owned by the C API.
//
// It owns the settings, the backend, the tensor queue, the response cache,
// the coordinator (on rank 0), the executor and the background thread that
// does all communication (the protocol is described in controller.h).
#ifndef TFHVD_CORE_RUNTIME_H_
#define TFHVD_CORE_RUNTIME_H_

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "backend.h"
#include "controller.h"
#include "logging.h"
#include "operations.h"
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
  // Entries given together are negotiated together (grouped ops).
  Status Enqueue(std::vector<TensorTableEntry> entries);
  // Collective with the other ranks (see controller.h, step 6); blocks until
  // the background thread has left.  Pending entries fail with Aborted.
  // Waiting for the peers is itself stall-checked: after the stall-check time
  // each rank warns which ranks have not shut down, and after the
  // stall-shutdown time (when set) it stops waiting.  Returns false in that
  // case: the peers are stuck, so MPI_Finalize would block too and the job
  // must be aborted (tfhvd_finalize does).
  bool Shutdown();

  const Topology& topology() const { return backend_->topology(); }
  const Settings& settings() const { return settings_; }
  Backend* backend() { return backend_.get(); }
  Timeline& timeline() { return timeline_; }

 private:
  void Loop();
  // One pass of the loop; returns true when something happened.
  bool CoordinatorStep(bool shutting_down);
  bool WorkerStep(bool shutting_down);
  void ExecuteList(const ResponseList& list);
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
  TensorQueue queue_;
  ResponseCache cache_;
  std::unique_ptr<Coordinator> coordinator_;
  Timeline timeline_;
  Executor executor_;
  std::thread thread_;
  std::atomic<bool> shutdown_requested_{false};
  bool stopped_ = false;
  // Background thread state.
  bool shutdown_sent_ = false;       // worker told the coordinator
  bool coordinator_gone_ = false;    // coordinator told us it left
  bool abandoned_ = false;           // gave up waiting for the peers to shut down
  std::vector<bool> announced_;      // rank 0: workers told to leave
  std::chrono::steady_clock::time_point last_round_;
};

}  // namespace tfhvd

#endif  // TFHVD_CORE_RUNTIME_H_
