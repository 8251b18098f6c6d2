// Executes agreed Responses on local tensors: the data path.
//
// Every rank runs the same ResponseList in the same order.  For each Response
// the executor gathers the local entries, moves the bytes with the
// Collectives of the tensors' memory kind, and completes the entries'
// callbacks.  Allreduces of several tensors are laid out alike on every rank
// (each at a kFusionAlign offset) in one buffer: for host tensors whose
// framework can place outputs, a framework buffer whose parts become the
// outputs (OpContext::SetOutputView: no copy out); else the Collectives'
// persistent fusion buffer.  A single tensor is reduced straight from input to
// output.  Copies and scaling go through the Collectives too, so this file
// works unchanged for host and device memory.  Device transports work
// asynchronously: the executor hands them each tensor's ready event before
// they touch it (Collectives::WaitFor) and hand the callbacks to
// Collectives::Complete, which calls back once the work has finished (from
// the transport's finalizer thread), so a completed op's outputs are
// complete and the caller goes on with the next response meanwhile.
#ifndef TFHVD_CORE_OPERATIONS_H_
#define TFHVD_CORE_OPERATIONS_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "adasum.h"
#include "backend.h"
#include "message.h"
#include "process_set.h"
#include "timeline.h"

namespace tfhvd {

class Executor {
 public:
  Executor(Backend* backend, Timeline* timeline) : backend_(backend), timeline_(timeline) {}

  // `entries[i]` is the local entry for `r.names[i]`, or null when this rank
  // has joined (it then contributes zeros).  Calls every entry's callback.
  // `set` is the response's process set, of which this rank is a member; its
  // collectives move the bytes, and ranks are its own (0 .. set.size()-1).
  // The entries' callbacks may come later, from the transport's thread
  // (Collectives::Complete); `entries` is left empty.
  void Execute(const Response& r, std::vector<std::unique_ptr<TensorTableEntry>>& entries,
               ProcessSet& set);
  // Returns once every response handed to a transport has called back.
  void Drain();

  // Responses whose transport has not called back yet.
  struct InFlight {
    std::mutex mu;
    std::condition_variable cv;
    int64_t n = 0;
  };

 private:
  // The transport of `set` for tensors on `device` (-1: host).
  Collectives* CollectivesFor(ProcessSet& set, int device);
  // Gives an allreduce entry left without an output its output (OpContext).
  Status PlaceOutput(TensorTableEntry& e);
  Status Allreduce(const Response& r, std::vector<std::unique_ptr<TensorTableEntry>>& e,
                   Collectives* c, const ProcessSet& set);
  Status Allgather(const Response& r, TensorTableEntry& e, Collectives* c);
  Status Broadcast(const Response& r, TensorTableEntry& e, Collectives* c, const ProcessSet& set);
  Status Alltoall(const Response& r, TensorTableEntry& e, Collectives* c, const ProcessSet& set);
  Status Reducescatter(const Response& r, TensorTableEntry& e, Collectives* c,
                       const ProcessSet& set);
  Status Join(const Response& r, TensorTableEntry& e);
  // Timeline: ends the current fusion phase on every row and starts `next`
  // ("" ends only).
  void Phase(const Response& r, std::vector<std::unique_ptr<TensorTableEntry>>& entries,
             const std::string& next);

  // The reduction of `count` elements of `buf` in place: the transport's
  // Allreduce, or Adasum (per tensor of `r`, whose i-th starts at
  // offsets[i] elements' bytes in `buf`).
  Status ReduceInPlace(const Response& r, const std::vector<int64_t>& offsets, void* buf,
                       int64_t count, Collectives* c, const ProcessSet& set);

  Backend* backend_;
  Timeline* timeline_;
  bool in_phase_ = false;
  AdasumReducer adasum_;
  std::shared_ptr<InFlight> in_flight_ = std::make_shared<InFlight>();
};

// Runs one process set's responses on a thread of its own, in the order they
// were agreed, so that a set's collectives never wait behind another set's
// (the runtime's loop only negotiates and hands them over) and a rank in two
// sets runs both at once, each over its own communicator.  Needs a transport
// that allows concurrent threads (MPI_THREAD_MULTIPLE); without one the
// runtime runs every set's responses on its loop instead.
class SetWorker {
 public:
  // `after_each` runs after every response (wakes whoever waits for an op).
  SetWorker(Backend* backend, Timeline* timeline, std::shared_ptr<ProcessSet> set,
            std::function<void()> after_each);
  // Runs what was submitted, then stops.
  ~SetWorker();
  SetWorker(const SetWorker&) = delete;
  SetWorker& operator=(const SetWorker&) = delete;

  void Submit(Response r, std::vector<std::unique_ptr<TensorTableEntry>> entries);
  // Returns once everything submitted so far has run.
  void Drain();
  // Gives up on the thread (a shutdown whose peers are stuck: the job aborts).
  void Abandon();

 private:
  using Job = std::pair<Response, std::vector<std::unique_ptr<TensorTableEntry>>>;
  void Run();

  Executor executor_;
  std::shared_ptr<ProcessSet> set_;
  std::function<void()> after_each_;
  std::mutex mu_;
  std::condition_variable cv_;       // a job arrived, or stop
  std::condition_variable idle_cv_;  // the queue ran empty
  std::deque<Job> jobs_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tfhvd

#endif  // TFHVD_CORE_OPERATIONS_H_
