// Executes agreed Responses on local tensors: the data path.
//
// Every rank runs the same ResponseList in the same order.  For each Response
// the executor gathers the local entries, moves the bytes with the
// Collectives of the tensors' memory kind, and completes the entries'
// callbacks.  Allreduces of several tensors go through the Collectives'
// persistent fusion buffer; a single tensor is reduced straight from input to
// output.  Copies and scaling go through the Collectives too, so this file
// works unchanged for host and device memory.  Device transports work
// asynchronously: the executor hands them each tensor's ready event before
// they touch it (Collectives::WaitFor) and calls Collectives::Synchronize
// before any callback, so a completed op's outputs are complete.
#ifndef TFHVD_CORE_OPERATIONS_H_
#define TFHVD_CORE_OPERATIONS_H_

#include <memory>
#include <vector>

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
  void Execute(const Response& r, std::vector<std::unique_ptr<TensorTableEntry>>& entries,
               ProcessSet& set);

 private:
  // The transport of `set` for tensors on `device` (-1: host).
  Collectives* CollectivesFor(ProcessSet& set, int device);
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

  Backend* backend_;
  Timeline* timeline_;
  bool in_phase_ = false;
};

}  // namespace tfhvd

#endif  // TFHVD_CORE_OPERATIONS_H_
