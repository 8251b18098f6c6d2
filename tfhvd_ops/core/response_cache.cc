#include "response_cache.h"

namespace tfhvd {

bool SameParams(const CollectiveParams& a, const CollectiveParams& b) {
  return a.type == b.type && a.dtype == b.dtype && a.shape == b.shape &&
         a.reduce_op == b.reduce_op && a.root_rank == b.root_rank &&
         a.prescale == b.prescale && a.postscale == b.postscale &&
         (a.device < 0) == (b.device < 0) && a.splits == b.splits &&  // kind, not ordinal
         a.process_set_id == b.process_set_id;
}

bool ResponseCache::Cacheable(CollectiveType t) {
  return t == CollectiveType::kAllreduce || t == CollectiveType::kBroadcast ||
         t == CollectiveType::kReducescatter;
}

int32_t ResponseCache::Lookup(const std::string& name, const CollectiveParams& p) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return -1;
  return SameParams(entries_[it->second].params, p) ? it->second : -1;
}

int32_t ResponseCache::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

int32_t ResponseCache::Assign(const std::string& name, const CollectiveParams& p) {
  if (!Cacheable(p.type) || by_name_.count(name) ||
      static_cast<int64_t>(entries_.size()) >= capacity_) {
    return -1;
  }
  int32_t id = static_cast<int32_t>(entries_.size());
  Insert(id, name, p);
  return id;
}

void ResponseCache::Insert(int32_t id, const std::string& name, const CollectiveParams& p) {
  if (id < 0) return;
  if (static_cast<size_t>(id) < entries_.size()) return;  // already known
  entries_.resize(id + 1);
  entries_[id] = Entry{name, p};
  by_name_[name] = id;
}

const ResponseCache::Entry* ResponseCache::Get(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= entries_.size()) return nullptr;
  return &entries_[id];
}

}  // namespace tfhvd
