#include "process_set.h"

#include <algorithm>
#include <sstream>

namespace tfhvd {

ProcessSet::ProcessSet(int32_t set_id, std::vector<int> world_ranks, int world_rank,
                       int64_t cache_capacity)
    : id(set_id), ranks(std::move(world_ranks)), cache(cache_capacity) {
  rank = IndexOf(world_rank);
}

int ProcessSet::IndexOf(int world_rank) const {
  auto it = std::lower_bound(ranks.begin(), ranks.end(), world_rank);
  return it != ranks.end() && *it == world_rank ? static_cast<int>(it - ranks.begin()) : -1;
}

std::string RanksString(const std::vector<int>& ranks) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < ranks.size(); ++i) o << (i ? ", " : "") << ranks[i];
  o << "]";
  return o.str();
}

Status CheckSetRanks(std::vector<int>* ranks, int world_size) {
  for (int r : *ranks) {
    if (r < 0 || r >= world_size) {
      return Status::InvalidArgument("tfhvd: process set " + RanksString(*ranks) + ": rank " +
                                     std::to_string(r) + " is out of range for " +
                                     std::to_string(world_size) + " processes");
    }
  }
  std::vector<int> sorted = *ranks;
  std::sort(sorted.begin(), sorted.end());
  auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) {
    return Status::InvalidArgument("tfhvd: process set " + RanksString(*ranks) + " lists rank " +
                                   std::to_string(*dup) + " more than once");
  }
  *ranks = std::move(sorted);
  return Status::OK();
}

void ProcessSetTable::Add(std::shared_ptr<ProcessSet> set) {
  std::lock_guard<std::mutex> l(mu_);
  sets_[set->id] = std::move(set);
}

std::shared_ptr<ProcessSet> ProcessSetTable::Remove(int32_t id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return nullptr;
  auto set = std::move(it->second);
  sets_.erase(it);
  return set;
}

std::shared_ptr<ProcessSet> ProcessSetTable::Find(int32_t id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second;
}

std::vector<int32_t> ProcessSetTable::Ids() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<int32_t> ids;
  for (const auto& kv : sets_) ids.push_back(kv.first);
  return ids;
}

size_t ProcessSetTable::Size() const {
  std::lock_guard<std::mutex> l(mu_);
  return sets_.size();
}

std::vector<std::shared_ptr<ProcessSet>> ProcessSetTable::TakeAll() {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<std::shared_ptr<ProcessSet>> out;
  for (auto& kv : sets_) out.push_back(std::move(kv.second));
  sets_.clear();
  return out;
}

std::string TensorKey(int32_t set_id, const std::string& name) {
  return set_id == 0 ? name : std::to_string(set_id) + '\x1f' + name;
}

const std::string& TensorKeyRef(int32_t set_id, const std::string& name, std::string* buf) {
  if (set_id == 0) return name;
  *buf = TensorKey(set_id, name);
  return *buf;
}

std::string TimelineName(int32_t set_id, const std::string& name) {
  return set_id == 0 ? name : name + " (process set " + std::to_string(set_id) + ")";
}

}  // namespace tfhvd
