// The tensor queue: where framework threads hand collectives to the
// background thread.
//
// Framework threads call Add() (any thread, any time).  Only the thread that
// runs the runtime's loop (the background thread, or a caller in
// Runtime::Drive) calls the other methods.  Add() signals an eventfd, which the
// background thread sleeps on (alone, or together with its sockets, see
// ControlChannel::Wait), so an idle runtime uses no CPU and new work wakes it
// at once: latency is not bound to a polling cycle.
//
// The queue also remembers which entries were negotiated alone in their
// last round (with nothing but the other entries of their own op).  Such an
// op is probably alone again next time, so nothing else of its step is about
// to follow it, and its own thread may run the loop for it at once
// (Runtime::EnqueueInline) instead of waking the background thread.  Ops
// that come in bursts (many ungrouped ops in one step) are left to the
// background thread, which negotiates the burst while it is still being
// enqueued: measured, that beat holding the burst for its last op.
//
// Two submissions under one name may be in flight at once (eager code that
// calls the same op in a loop from two threads).  The second is held back
// until the first completes, then negotiated on its own, so nothing a user
// submitted is dropped or mixed up.
#ifndef TFHVD_CORE_TENSOR_QUEUE_H_
#define TFHVD_CORE_TENSOR_QUEUE_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common.h"
#include "message.h"

namespace tfhvd {

class TensorQueue {
 public:
  TensorQueue();
  ~TensorQueue();
  TensorQueue(const TensorQueue&) = delete;
  TensorQueue& operator=(const TensorQueue&) = delete;

  // Adds a group of entries atomically.  Fails (and calls nobody back) when
  // the queue has been closed.  `signal` false skips the eventfd: for a
  // caller that runs the loop itself next (Runtime::Drive).
  Status Add(std::vector<TensorTableEntry> entries, bool signal = true);
  // A graph kernel's Add: signals unless every entry was alone in its last
  // round and nothing else is outstanding; then it sets `*solo` and the
  // caller runs the loop (or signals).  `burst`: the caller's thread has just
  // run the last round itself and comes straight back with another op, so
  // that round's op was one of a burst (each waiting for its predecessor):
  // it is solo no more, and neither is this one.
  Status AddFromGraph(std::vector<TensorTableEntry> entries, bool burst, bool* solo);
  // Records, before a response list runs, which pending entries it holds:
  // they were alone when they are all of one op.
  void NoteRound(const ResponseList& list);
  // The background thread's idle park (it waits without the loop's role):
  // until an Add that signals, WakeParked(), or `timeout`; not at all when
  // `stop()` holds once it counts as parked.  The signal is left for
  // whoever takes the entries (TakeNew), which may be a caller in the loop.
  void Park(std::chrono::microseconds timeout, const std::function<bool()>& stop);
  // Signals the eventfd if the background thread is in its idle park
  // (Dekker-style with the `stop` condition Park checks once parked).
  void WakeParked();
  // Closes the queue: later Add() calls fail with `reason`.
  void Close(const Status& reason);

  // Moves newly added entries into the pending table; returns their
  // requests in submission order.
  std::vector<Request> TakeNew(int32_t rank);
  // Entries are keyed by TensorKey(set, name) (process_set.h) below.
  // Removes the pending entry for `key`.  Returns false if none.
  bool Pop(const std::string& key, TensorTableEntry* out);
  bool HasPending() const { return !pending_.empty(); }
  // Entries added but not yet taken (any thread).
  bool HasIncoming();
  // The pending entry for `key`, or null.
  const TensorTableEntry* Peek(const std::string& key) const {
    auto it = pending_.find(key);
    return it == pending_.end() ? nullptr : &it->second;
  }
  // Removes the pending and held entries of process set `set_id` (removed).
  std::vector<TensorTableEntry> TakeSet(int32_t set_id);
  // Removes every pending and held entry (for failing them at shutdown).
  std::vector<TensorTableEntry> TakeAll();

  // Blocks until Add() or Notify() is called, or `timeout` passes.
  void Wait(std::chrono::microseconds timeout);
  void Notify();
  // Readable while new work is waiting.
  int wake_fd() const { return efd_; }

 private:
  void SignalLocked();  // requires mu_

  std::mutex mu_;
  int efd_ = -1;
  bool signalled_ = false;
  bool closed_ = false;
  Status close_reason_;
  std::deque<TensorTableEntry> incoming_;
  std::unordered_set<std::string> solo_;  // keys negotiated alone last time
  // Entries added and not yet popped (incoming, pending and held).
  std::atomic<int64_t> outstanding_{0};
  std::vector<std::string> last_keys_;  // the last round's, when it was alone
  bool parked_ = false;
  // Background thread only.
  std::unordered_map<std::string, TensorTableEntry> pending_;
  std::unordered_map<std::string, std::deque<TensorTableEntry>> held_;
};

}  // namespace tfhvd

#endif  // TFHVD_CORE_TENSOR_QUEUE_H_
