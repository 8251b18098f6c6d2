// The response cache: lets steady-state steps skip full negotiation.
//
// Every rank holds an identical cache.  Slots are assigned only by the
// coordinator, inside a Response (`cache_ids`), and every rank inserts them
// while executing that Response, so all copies change in the same order.  A
// worker whose request equals a cached entry (same name and parameters) sends
// the 4-byte slot id instead of the request.  Slots are never reassigned, so a
// slot id in flight can never be misread; when the cache is full new tensors
// are simply negotiated in full.  Only collectives whose requests are the same
// on every rank (allreduce, broadcast, reducescatter) are cached.
#ifndef TFHVD_CORE_RESPONSE_CACHE_H_
#define TFHVD_CORE_RESPONSE_CACHE_H_

#include <string>
#include <unordered_map>
#include <vector>

#include "common.h"

namespace tfhvd {

bool SameParams(const CollectiveParams& a, const CollectiveParams& b);

class ResponseCache {
 public:
  explicit ResponseCache(int64_t capacity) : capacity_(capacity) {}

  struct Entry {
    std::string name;
    CollectiveParams params;
  };

  static bool Cacheable(CollectiveType t);
  // Slot holding exactly (name, params), or -1.
  int32_t Lookup(const std::string& name, const CollectiveParams& p) const;
  // Slot holding `name` with any parameters, or -1.
  int32_t Find(const std::string& name) const;
  // Coordinator only: a fresh slot for (name, params), or -1 when full or
  // when the name already holds other parameters.
  int32_t Assign(const std::string& name, const CollectiveParams& p);
  // Every rank: records slot `id` (idempotent).
  void Insert(int32_t id, const std::string& name, const CollectiveParams& p);
  const Entry* Get(int32_t id) const;

 private:
  int64_t capacity_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, int32_t> by_name_;
};

}  // namespace tfhvd

#endif  // TFHVD_CORE_RESPONSE_CACHE_H_
