// Completion of device work off the runtime's loop thread (DESIGN: "a
// finalizer in backends/nccl/ waits on device events, so the loop thread
// never blocks on a device"; Horovod hands GPU completion to a finalizer
// thread pool the same way).
//
// The loop launches a response's device work, then pushes two functions
// here: `wait`, which blocks until that work has finished (a CUDA event) and
// says how it went, and `done`, which hands the result to the entries'
// callbacks.  One thread runs the waits in push order and delivers each
// result before the next: the callbacks of one NcclCollectives (one process
// set, one stream) complete in the order their responses were agreed, while
// the loop already negotiates and launches the next ones.
//
// A second thread, the watchdog, runs `watch` every `watch_period` while
// something is pending; idle for a period, it sleeps until a push: it is how a wait that cannot time
// out itself (cudaEventSynchronize) still meets a deadline and notices
// NCCL's asynchronous errors.  It may call FailPending.
//
// Both threads start on the first push: a runtime without device work has
// none, and an idle one has both asleep on a condition variable (the
// waiting thread after at most Options::linger).  Plain C++:
// no CUDA here, so the ordering and error rules are unit-tested on any
// machine (tests/gpu/finalizer_test.cc).
#ifndef TFHVD_BACKENDS_NCCL_FINALIZER_H_
#define TFHVD_BACKENDS_NCCL_FINALIZER_H_

#include <chrono>
#include <functional>
#include <memory>

#include "../../core/common.h"

namespace tfhvd {

class Finalizer {
 public:
  using Wait = std::function<Status()>;
  using Done = std::function<void(const Status&)>;
  using Clock = std::chrono::steady_clock;

  struct Options {
    std::function<void()> on_start;  // first thing on the waiting thread (cudaSetDevice)
    // Called on the watchdog thread with how long the oldest pending wait
    // has run, every `watch_period` while work is pending.
    std::function<void(Clock::duration oldest)> watch;
    std::chrono::milliseconds watch_period{50};
    // After a delivery the waiting thread stays awake this long (yielding
    // the core) for the next push, as the runtime's loop lingers after its
    // work: the next response of a step usually follows within
    // microseconds, and waking a sleeping thread costs several.  Then it
    // sleeps until a push.  Zero: it sleeps at once.
    std::chrono::microseconds linger{0};
  };

  explicit Finalizer(Options options);
  // Stop().
  ~Finalizer();
  Finalizer(const Finalizer&) = delete;
  Finalizer& operator=(const Finalizer&) = delete;

  void Push(Wait wait, Done done);
  // Delivers everything pushed, then stops the threads (their callbacks
  // may still use this object meanwhile).  After Abandon() it leaves the
  // waiting thread behind instead.  Pushes after Stop() are not run.
  void Stop();
  // Returns once every push so far has been delivered.
  void Drain();
  // Delivers `st` now, in push order, to every push not yet delivered (the
  // one being waited for included); their waits' own results are dropped.
  void FailPending(const Status& st);
  // How many pushes are not yet delivered.
  size_t Pending() const;
  // Leaves the waiting thread behind at destruction (its state outlives
  // this object): for a wait stuck on a device that will never finish it.
  // Deliver what is pending first (FailPending): an abandoned thread only
  // finishes its waits, so a wait must not use the object that pushed it.
  void Abandon();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace tfhvd

#endif  // TFHVD_BACKENDS_NCCL_FINALIZER_H_
