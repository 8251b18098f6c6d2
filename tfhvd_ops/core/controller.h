// The coordinator: decides, for all ranks, which collectives run and in what
// order.
//
// Protocol (rank 0 is the coordinator; every rank, rank 0 included, runs the
// background loop in runtime.cc):
//
//  1. A framework thread enqueues a tensor (TensorQueue::Add) and returns.
//  2. The background thread of each rank takes the new tensors and sends
//     their Requests to the coordinator; a request the response cache knows
//     travels as its 4-byte slot id.  Rank 0 hands its own directly to
//     Coordinator::AddRequests.
//  3. The coordinator counts, per tensor name, which ranks have asked.  A
//     name is ready once every rank that has not joined has asked.  Ready
//     names are kept in the order they became ready.
//  4. Coordinator::Compute turns ready names into Responses: it compares what
//     each rank sent (collective, dtype, shape, reduce op, root, scale
//     factors; trailing dims for allgather/alltoall) and turns any mismatch
//     into an error Response that names the tensor and what each rank sent.
//     Compatible allreduces are fused into one Response up to the fusion
//     threshold.  New cacheable tensors get cache slots.
//  5. The coordinator sends the ResponseList to every worker and all ranks
//     execute it in the same order, so data collectives never deadlock.
//  6. Shutdown: a rank that shuts down says so in its RequestList.  The
//     coordinator answers it with a shutdown ResponseList and fails every
//     tensor that still needs it.  When the coordinator itself shuts down it
//     tells every worker, fails what is pending, and leaves once every worker
//     has said it is shutting down, so no message is left unmatched.
//  7. Join: a rank that joins is counted as present for every later tensor
//     and contributes zeros to allreduces; when all ranks have joined, the
//     join Response carries the last rank that joined.
//  8. Stalls: a name some ranks submitted and others did not is reported
//     after the stall-check time, listing the missing ranks; with a stall
//     shutdown time it is failed on every rank.
//  3a. Cached tensors take a fast lane.  A request that equals a cache slot
//     (a worker's slot id, or rank 0's own request found in the cache) is
//     counted in an array indexed by slot, with no table entry, no copy of
//     its name and no validation: its parameters were validated when the
//     slot was assigned, and every rank sent the same ones.  A request that
//     names a cached tensor with other parameters moves the slot's pending
//     ranks into the table, so the mismatch is reported as in step 4.  So do
//     a join, a rank that shuts down, and the stall check for slots that
//     have waited: the table's rules then apply unchanged.
//  9. Process sets (process_set.h): every request names its set; the table
//     is keyed by (set, name), a set's tensor is ready once all the set's
//     members asked, and its Response goes only to the members.  Adding and
//     removing a set are requests on the global set: the coordinator checks
//     that every rank asked for the same change, assigns the id, and from
//     then on knows the set.  Join concerns the global set only.
//
// Nothing here touches a transport or a framework: the class is driven by
// runtime.cc and unit-tested on its own.
#ifndef TFHVD_CORE_CONTROLLER_H_
#define TFHVD_CORE_CONTROLLER_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "logging.h"
#include "message.h"
#include "response_cache.h"
#include "settings.h"

namespace tfhvd {

class Coordinator {
 public:
  using Clock = std::chrono::steady_clock;

  Coordinator(int size, const Settings& settings, ResponseCache* cache,
              const Logger* log);

  // Records what rank `rank` sent (its cached ids are expanded here).
  void AddRequests(int rank, RequestList list, Clock::time_point now);
  // Builds the responses that are ready, in execution order.  Also fails
  // tensors that can never complete (a needed rank has shut down) and runs
  // the stall check.
  ResponseList Compute(Clock::time_point now);

  bool HasPending() const { return !table_.empty() || fast_pending_ > 0; }
  // Whether `rank` gets the responses of set `set_id` (every rank for the
  // global set and for sets that no longer exist).
  bool Receives(int rank, int32_t set_id) const;
  bool IsShutDown(int rank) const { return shut_down_[rank]; }
  // The transport lost `rank` (its process exited or was killed).
  void MarkLost(int rank);
  bool AllWorkersShutDown() const;
  // Autotune (autotune.h) sets these from the round it decided them on.
  // The cache switch closes or opens the fast lane and the assignment of
  // new slots; slots already assigned stay valid either way.
  void SetTuned(int64_t fusion_threshold_bytes, bool cache_enabled) {
    settings_.fusion_threshold_bytes = fusion_threshold_bytes;
    settings_.cache_enabled = cache_enabled;
  }

 private:
  // A cache slot's requests in the fast lane (step 3a).
  struct Fast {
    std::vector<bool> present;  // indexed by world rank; valid while count > 0
    int count = 0;
    bool ready = false;     // queued in ready_
    bool in_table = false;  // the table may hold this name: look there first
    Clock::time_point first_seen;
  };
  struct SetInfo {
    std::vector<int> ranks;      // world ranks, ascending
    std::vector<bool> member;    // indexed by world rank
    std::unique_ptr<ResponseCache> own_cache;  // for sets other than the global one
    ResponseCache* cache = nullptr;            // null: caching disabled
    std::vector<Fast> fast;                    // indexed by cache slot
  };
  // A tensor ready to run: a table entry (slot < 0) or a fast-lane slot.
  struct Ready {
    std::string key;
    int32_t set = 0;
    int32_t slot = -1;
  };
  struct Pending {
    std::string name;
    int32_t set = 0;
    std::vector<Request> by_rank;  // indexed by world rank; name empty if missing
    std::vector<bool> present;
    int count = 0;
    bool ready = false;  // queued in ready_
    Clock::time_point first_seen;
    Clock::time_point last_warned;
  };

  void Add(Request r, Clock::time_point now);
  // Whether a request of `set` may take the fast lane at all now.
  bool FastLaneOpen(int32_t set, const SetInfo* info) const;
  // Counts rank `rank`'s request for slot `slot` of set `set` (step 3a).
  void AddCached(int rank, int32_t set, SetInfo& info, int32_t slot, Clock::time_point now);
  // Moves a slot's pending requests into the table; `all` does so for every
  // waiting slot of every set (join, shutdown), else for those older than `before`.
  void Demote(int32_t set, SetInfo& info, int32_t slot);
  void DemoteWaiting(Clock::time_point before, bool all);
  // Fuses responses as they are built, in order: allreduces that agree on
  // everything but name and shape join the first open response with room.
  struct Fuser {
    std::vector<Response>* out;
    std::vector<std::pair<size_t, int64_t>> open;  // (index in out, bytes so far)
    int64_t threshold;
    void Push(Response r);
    void PushCached(const ResponseCache::Entry& e, int32_t slot);
    // The open response `p` may join with `bytes` more, or null.
    Response* OpenFor(const CollectiveParams& p, const std::vector<int32_t>& joined,
                      int64_t bytes);
  };
  void MarkReadyIfComplete(const std::string& name);
  void MarkReadyIfComplete(const std::string& name, Pending& p);
  Response Build(Pending& p);
  // Why `p` cannot run ("" if it can); `*code` is the error's class when the
  // default (FailedPrecondition: ranks that disagree) does not fit.
  std::string Validate(const std::string& name, const Pending& p, StatusCode* code) const;
  // Applies an agreed add or remove of a process set (kAddProcessSet,
  // kRemoveProcessSet), or says why it cannot be.
  Response ChangeSets(const Pending& p, const CollectiveParams& ref);
  void AddSet(int32_t id, std::vector<int> ranks);
  void CheckStalls(Clock::time_point now, std::vector<Response>* out);
  void FailUnreachable(std::vector<Response>* out);
  std::string MissingRanks(const Pending& p) const;
  Response ErrorResponse(const std::string& name, int32_t set, const std::string& msg,
                         StatusCode code = StatusCode::kFailedPrecondition) const;
  const SetInfo* Set(int32_t id) const;
  SetInfo* MutableSet(int32_t id);

  int size_;
  Settings settings_;
  ResponseCache* cache_;
  const Logger* log_;
  using Table = std::unordered_map<std::string, Pending>;
  Table table_;  // by TensorKey(set, name)
  // Nodes of negotiated tensors, kept for the next step's (Add).
  static constexpr size_t kSpareNodes = 1024;
  std::vector<Table::node_type> spare_;
  std::vector<Ready> ready_;
  int fast_pending_ = 0;  // fast-lane slots with requests, ready ones included
  std::map<int32_t, SetInfo> sets_;
  int32_t next_set_id_ = 1;
  std::vector<Response> immediate_;  // errors found when a request arrived
  std::vector<bool> joined_;
  int joined_count_ = 0;
  int last_joined_ = -1;
  std::vector<bool> shut_down_;
  bool any_shut_down_ = false;
  std::vector<bool> lost_;
  Clock::time_point last_stall_check_;
};

}  // namespace tfhvd

#endif  // TFHVD_CORE_CONTROLLER_H_
