// Process sets: groups of ranks that run collectives among themselves.
//
// The global set (id 0) holds every rank and always exists.  Others are
// added with init(process_sets=[...]) or, in dynamic mode, add_process_set;
// both are negotiated on the global set like a collective (CollectiveType::
// kAddProcessSet / kRemoveProcessSet), so every rank applies the change at
// the same point of the one response order and ids agree everywhere.  Ids
// are never reused: a stale handle to a removed set fails instead of
// reaching a newer set.
//
// What each set owns:
//  - negotiation state: the coordinator keys its table by (set, name), a set
//    is ready when all its members asked, and fusion never mixes sets;
//  - a response cache (the coordinator's, on rank 0; each member's own);
//  - its data-plane communicators: host collectives made by
//    Backend::CreateSubsetCollectives, device collectives per GPU by
//    Backend::SubsetDeviceCollectives.  The global set uses the backend's.
// Negotiation goes through the one control channel to rank 0 (messages carry
// the set id).  Each rank runs only its sets' responses, each set's in the
// coordinator's order on a worker thread of its own (SetWorker, operations.h;
// the global set's too while other sets exist), so a set never waits behind
// another set's collectives and sets that share ranks cannot deadlock.  A
// transport without thread support runs them all on the loop, in the one
// order the coordinator sent, which cannot deadlock either.
#ifndef TFHVD_CORE_PROCESS_SET_H_
#define TFHVD_CORE_PROCESS_SET_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend.h"
#include "response_cache.h"

namespace tfhvd {

// One process set as this rank sees it.
struct ProcessSet {
  ProcessSet(int32_t set_id, std::vector<int> world_ranks, int world_rank, int64_t cache_capacity);
  int32_t id;
  std::vector<int> ranks;  // world ranks, ascending
  int rank = -1;           // this process's index in `ranks`; -1: not a member
  int size() const { return static_cast<int>(ranks.size()); }
  bool included() const { return rank >= 0; }
  // The index of `world_rank` in the set, or -1.
  int IndexOf(int world_rank) const;
  // Host collectives of a non-global set (members only).
  std::unique_ptr<Collectives> host;
  ResponseCache cache;
};

// "[0, 2, 3]".
std::string RanksString(const std::vector<int>& ranks);
// Checks a list of world ranks for a new set: each in [0, world_size), none
// twice.  `ranks` is sorted on success.
Status CheckSetRanks(std::vector<int>* ranks, int world_size);

// The sets this rank knows, read by any thread (Enqueue, the C API), changed
// only by the loop's holder.
class ProcessSetTable {
 public:
  void Add(std::shared_ptr<ProcessSet> set);
  // The removed set, or null.
  std::shared_ptr<ProcessSet> Remove(int32_t id);
  std::shared_ptr<ProcessSet> Find(int32_t id) const;
  std::vector<int32_t> Ids() const;
  size_t Size() const;
  // Everything, for shutdown.
  std::vector<std::shared_ptr<ProcessSet>> TakeAll();

 private:
  mutable std::mutex mu_;
  std::map<int32_t, std::shared_ptr<ProcessSet>> sets_;
};

// The key of a tensor in the queue and the coordinator's table: two sets may
// use the same tensor name at once.
std::string TensorKey(int32_t set_id, const std::string& name);
// The same without a copy on hot paths: the global set's key is the name
// itself; another set's is built in `*buf`.  Valid while both live.
const std::string& TensorKeyRef(int32_t set_id, const std::string& name, std::string* buf);
// The timeline row of a tensor: its name, and the set when not global.
std::string TimelineName(int32_t set_id, const std::string& name);

}  // namespace tfhvd

#endif  // TFHVD_CORE_PROCESS_SET_H_
