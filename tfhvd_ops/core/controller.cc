#include "controller.h"

#include "process_set.h"
#include "stall_report.h"

#include <algorithm>
#include <map>
#include <sstream>

namespace tfhvd {
namespace {

// "rank 0 sent X; ranks 1, 2 sent Y" for the values each rank sent.
template <typename F>
std::string PerRank(const std::vector<Request>& by_rank, const std::vector<bool>& present,
                    F describe) {
  std::map<std::string, std::vector<int>> groups;
  std::vector<std::string> order;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    if (!present[r]) continue;
    std::string d = describe(by_rank[r]);
    if (!groups.count(d)) order.push_back(d);
    groups[d].push_back(static_cast<int>(r));
  }
  std::ostringstream o;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& ranks = groups[order[i]];
    o << (i ? "; " : "") << (ranks.size() == 1 ? "rank " : "ranks ");
    for (size_t j = 0; j < ranks.size(); ++j) o << (j ? ", " : "") << ranks[j];
    o << " sent " << order[i];
  }
  return o.str();
}

// Rank `rank`'s request for a cached tensor, as if it had sent it in full.
Request CachedRequest(int rank, const ResponseCache::Entry& e) {
  Request r;
  r.rank = rank;
  r.name = e.name;
  r.params = e.params;
  return r;
}

}  // namespace

Coordinator::Coordinator(int size, const Settings& settings, ResponseCache* cache,
                         const Logger* log)
    : size_(size),
      settings_(settings),
      cache_(cache),
      log_(log),
      joined_(size, false),
      shut_down_(size, false),
      lost_(size, false),
      last_stall_check_(Clock::now()) {
  std::vector<int> all(size);
  for (int r = 0; r < size; ++r) all[r] = r;
  AddSet(0, all);
}

void Coordinator::AddSet(int32_t id, std::vector<int> ranks) {
  SetInfo& info = sets_[id];
  info.member.assign(size_, false);
  for (int r : ranks) info.member[r] = true;
  info.ranks = std::move(ranks);
  if (id == 0) {
    info.cache = cache_;
  } else if (cache_ != nullptr) {
    info.own_cache = std::make_unique<ResponseCache>(settings_.cache_capacity);
    info.cache = info.own_cache.get();
  }
}

const Coordinator::SetInfo* Coordinator::Set(int32_t id) const {
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : &it->second;
}

Coordinator::SetInfo* Coordinator::MutableSet(int32_t id) {
  return const_cast<SetInfo*>(static_cast<const Coordinator*>(this)->Set(id));
}

bool Coordinator::Receives(int rank, int32_t set_id) const {
  const SetInfo* info = Set(set_id);
  return info == nullptr || info->member[rank];
}

bool Coordinator::AllWorkersShutDown() const {
  for (int r = 1; r < size_; ++r) {
    if (!shut_down_[r]) return false;
  }
  return true;
}

void Coordinator::MarkLost(int rank) {
  lost_[rank] = !shut_down_[rank];
  shut_down_[rank] = true;
  any_shut_down_ = true;
  DemoteWaiting(Clock::now(), true);  // FailUnreachable looks only at the table
}

void Coordinator::AddRequests(int rank, RequestList list, Clock::time_point now) {
  // A cached tensor's request that goes to the table marks its slot, so the
  // other ranks' requests for it follow it there.
  auto to_table = [&](Request r, SetInfo* info, int32_t slot) {
    if (info != nullptr && slot >= 0) {
      Demote(r.params.process_set_id, *info, slot);
      info->fast[slot].in_table = true;
    }
    Add(std::move(r), now);
  };
  for (size_t i = 0; i < list.cached_ids.size(); ++i) {
    const int32_t id = list.cached_ids[i];
    const int32_t set = i < list.cached_sets.size() ? list.cached_sets[i] : 0;
    SetInfo* info = MutableSet(set);
    const ResponseCache::Entry* e =
        info != nullptr && info->cache != nullptr ? info->cache->Get(id) : nullptr;
    if (e == nullptr) {
      TFHVD_LOG(*log_, kError, "rank " << rank << " sent unknown cache slot " << id
                                        << " of process set " << set);
      continue;
    }
    if (FastLaneOpen(set, info) && info->member[rank]) {
      AddCached(rank, set, *info, id, now);
      continue;
    }
    to_table(CachedRequest(rank, *e), info, id);
  }
  for (Request& r : list.requests) {
    r.rank = rank;
    const int32_t set = r.params.process_set_id;
    SetInfo* info = MutableSet(set);
    // (Any collective under a cached name: another collective under it is
    // a mismatch the table reports, so the slot's waiting ranks go there.)
    const int32_t slot =
        info != nullptr && info->cache != nullptr ? info->cache->Find(r.name) : -1;
    if (slot >= 0 && FastLaneOpen(set, info) && info->member[rank] && r.error.empty() &&
        SameParams(info->cache->Get(slot)->params, r.params)) {
      AddCached(rank, set, *info, slot, now);  // as if it had sent the slot id
      continue;
    }
    // (A cached tensor with other parameters: the table compares them.)
    to_table(std::move(r), info, slot);
  }
  if (list.shutdown) {
    shut_down_[rank] = true;
    any_shut_down_ = true;
    DemoteWaiting(now, true);  // FailUnreachable looks only at the table
  }
}

bool Coordinator::FastLaneOpen(int32_t set, const SetInfo* info) const {
  // Join concerns the global set only.
  return info != nullptr && info->cache != nullptr && (set != 0 || joined_count_ == 0) &&
         !any_shut_down_ && settings_.cache_enabled;
}

void Coordinator::AddCached(int rank, int32_t set, SetInfo& info, int32_t slot,
                            Clock::time_point now) {
  if (info.fast.size() <= static_cast<size_t>(slot)) info.fast.resize(slot + 1);
  Fast& f = info.fast[slot];
  if (f.in_table) {
    std::string key_buf;
    if (table_.count(TensorKeyRef(set, info.cache->Get(slot)->name, &key_buf))) {
      Add(CachedRequest(rank, *info.cache->Get(slot)), now);
      return;
    }
    f.in_table = false;
  }
  if (f.count == 0) {
    f.present.assign(size_, false);
    f.first_seen = now;
    ++fast_pending_;
  } else if (f.present[rank] || f.ready) {
    // The worker holds back duplicates, so this is a protocol bug (as in Add).
    TFHVD_LOG(*log_, kError, "duplicate request for '" << info.cache->Get(slot)->name
                                                       << "' from rank " << rank);
    return;
  }
  f.present[rank] = true;
  if (++f.count == static_cast<int>(info.ranks.size())) {
    f.ready = true;
    ready_.push_back(Ready{std::string(), set, slot});
  }
}

void Coordinator::Demote(int32_t set, SetInfo& info, int32_t slot) {
  if (info.fast.size() <= static_cast<size_t>(slot)) info.fast.resize(slot + 1);
  Fast& f = info.fast[slot];
  if (f.count == 0 || f.ready) return;  // a ready slot has every rank: it runs as it is
  const ResponseCache::Entry& e = *info.cache->Get(slot);
  const std::vector<bool> present = f.present;
  const Clock::time_point first_seen = f.first_seen;
  f.count = 0;
  f.in_table = true;
  --fast_pending_;
  for (int r = 0; r < size_; ++r) {
    if (present[r]) Add(CachedRequest(r, e), first_seen);  // keeps its age for the stall check
  }
}

void Coordinator::DemoteWaiting(Clock::time_point before, bool all) {
  if (fast_pending_ == 0) return;
  for (auto& kv : sets_) {
    for (size_t slot = 0; slot < kv.second.fast.size(); ++slot) {
      const Fast& f = kv.second.fast[slot];
      if (f.count > 0 && !f.ready && (all || f.first_seen <= before)) {
        Demote(kv.first, kv.second, static_cast<int32_t>(slot));
      }
    }
  }
}

void Coordinator::Add(Request r, Clock::time_point now) {
  const int32_t set = r.params.process_set_id;
  const SetInfo* info = Set(set);
  if (info == nullptr || !info->member[r.rank]) {
    // Each rank checks this when it enqueues; a set removed meanwhile gets here.
    immediate_.push_back(ErrorResponse(
        r.name, set,
        "tfhvd: " + std::string(CollectiveName(r.params.type)) + " of tensor '" + r.name +
            "': " + (info == nullptr ? "process set " + std::to_string(set) +
                                           " does not exist, or has been removed"
                                     : "rank " + std::to_string(r.rank) +
                                           " is not a member of process set " +
                                           std::to_string(set))));
    return;
  }
  std::string key_buf;
  const std::string& key = TensorKeyRef(set, r.name, &key_buf);
  auto it = table_.find(key);
  if (it == table_.end()) {
    // A steady-state step negotiates the same tensors again: reuse a node
    // (and its vectors and strings) that Compute gave back.
    Table::node_type node;
    if (!spare_.empty()) {
      node = std::move(spare_.back());
      spare_.pop_back();
      node.key() = key;
    }
    it = node ? table_.insert(std::move(node)).position : table_.emplace(key, Pending()).first;
    Pending& q = it->second;
    q.name = r.name;
    q.set = set;
    q.by_rank.assign(size_, Request());
    q.present.assign(size_, false);
    q.count = 0;
    q.ready = false;
    q.first_seen = now;
    q.last_warned = now;
  }
  Pending& p = it->second;
  if (p.present[r.rank]) {
    // The worker holds back duplicates, so this is a protocol bug; keep the
    // first and say so rather than corrupting the count.
    TFHVD_LOG(*log_, kError, "duplicate request for '" << r.name << "' from rank " << r.rank);
    return;
  }
  const int rank = r.rank;
  const bool join = r.params.type == CollectiveType::kJoin;
  p.present[rank] = true;
  p.by_rank[rank] = std::move(r);
  ++p.count;
  // (Table insertions below may rehash: keep the node's key, not `it`.)
  const std::string& my_key = it->first;
  if (join && !joined_[rank]) {
    joined_[rank] = true;
    ++joined_count_;
    last_joined_ = rank;
    // The fast lane counts members, not joined ranks: the global set's
    // waiting slots move to the table, whose rule counts a joined rank.
    DemoteWaiting(now, true);
    // Joining may complete tensors that were only waiting for this rank.
    std::vector<std::string> names;
    for (const auto& kv : table_) {
      if (kv.first != my_key && kv.second.set == 0) names.push_back(kv.first);
    }
    for (const auto& n : names) MarkReadyIfComplete(n);
  }
  MarkReadyIfComplete(my_key, p);
}

void Coordinator::MarkReadyIfComplete(const std::string& name) {
  auto it = table_.find(name);
  if (it != table_.end()) MarkReadyIfComplete(it->first, it->second);
}

void Coordinator::MarkReadyIfComplete(const std::string& name, Pending& p) {
  if (p.ready) return;
  if (p.set != 0) {
    if (p.count < static_cast<int>(Set(p.set)->ranks.size())) return;
  } else {
    if (p.count + joined_count_ < size_) return;  // fast path: someone is missing
    for (int r = 0; r < size_; ++r) {
      if (!p.present[r] && !joined_[r]) return;
    }
  }
  p.ready = true;
  ready_.push_back(Ready{name, p.set, -1});
}

Response Coordinator::ErrorResponse(const std::string& name, int32_t set, const std::string& msg,
                                    StatusCode code) const {
  Response resp;
  resp.kind = ResponseKind::kError;
  resp.error_code = code;
  resp.names = {name};
  resp.params.process_set_id = set;
  resp.error = msg;
  return resp;
}

std::string Coordinator::Validate(const std::string& name, const Pending& p,
                                  StatusCode* code) const {
  int first = -1;
  for (int r = 0; r < size_; ++r) {
    if (p.present[r]) {
      first = r;
      break;
    }
  }
  const CollectiveParams& ref = p.by_rank[first].params;
  const SetInfo& set = *Set(p.set);
  const int n = static_cast<int>(set.ranks.size());  // ranks in the set
  auto differs = [&](auto get) {
    for (int r = 0; r < size_; ++r) {
      if (p.present[r] && !(get(p.by_rank[r].params) == get(ref))) return true;
    }
    return false;
  };
  // Built only when a check fails: this runs for every tensor of every round.
  auto prefix = [&] {
    return "tfhvd: " + std::string(CollectiveName(ref.type)) + " of tensor '" + name + "': ";
  };
  // Problems a rank found locally come first: they explain the rest.
  for (int r = 0; r < size_; ++r) {
    if (p.present[r] && !p.by_rank[r].error.empty()) {
      return prefix() + "rank " + std::to_string(r) + ": " + p.by_rank[r].error;
    }
  }
  if (differs([](const CollectiveParams& c) { return c.type; })) {
    return prefix() + "ranks submitted different collectives under one name: " +
           PerRank(p.by_rank, p.present,
                   [](const Request& q) { return std::string(CollectiveName(q.params.type)); });
  }
  if (differs([](const CollectiveParams& c) { return c.dtype; })) {
    return prefix() + "mismatched dtypes: " +
           PerRank(p.by_rank, p.present,
                   [](const Request& q) { return std::string(DataTypeName(q.params.dtype)); });
  }
  // Ranks may use different GPU ordinals (one GPU per process): only the
  // memory kind must agree.
  if (differs([](const CollectiveParams& c) { return c.device < 0; })) {
    return prefix() + "mixed CPU and GPU tensors: " +
           PerRank(p.by_rank, p.present, [](const Request& q) {
             return q.params.device < 0 ? std::string("a CPU tensor")
                                        : "a tensor on GPU " + std::to_string(q.params.device);
           });
  }
  auto shape_desc = [](const Request& q) { return "shape " + ShapeString(q.params.shape); };
  switch (ref.type) {
    case CollectiveType::kAllreduce:
    case CollectiveType::kBroadcast:
    case CollectiveType::kReducescatter:
      if (differs([](const CollectiveParams& c) -> const Shape& { return c.shape; })) {
        return prefix() + "mismatched shapes: " + PerRank(p.by_rank, p.present, shape_desc);
      }
      break;
    case CollectiveType::kAllgather:
    case CollectiveType::kAlltoall: {
      auto trailing = [](const CollectiveParams& c) {
        return c.shape.empty() ? Shape{} : Shape(c.shape.begin() + 1, c.shape.end());
      };
      if (differs([](const CollectiveParams& c) { return c.shape.size(); }) ||
          differs(trailing)) {
        return prefix() + "all dimensions but the first must match: " +
               PerRank(p.by_rank, p.present, shape_desc);
      }
      break;
    }
    default:
      break;
  }
  if (ref.type == CollectiveType::kAllreduce || ref.type == CollectiveType::kReducescatter) {
    if (differs([](const CollectiveParams& c) { return c.reduce_op; })) {
      return prefix() + "mismatched reduce ops: " +
             PerRank(p.by_rank, p.present,
                     [](const Request& q) { return std::string(ReduceOpName(q.params.reduce_op)); });
    }
    if (differs([](const CollectiveParams& c) { return c.prescale; }) ||
        differs([](const CollectiveParams& c) { return c.postscale; })) {
      return prefix() + "mismatched scale factors: " +
             PerRank(p.by_rank, p.present, [](const Request& q) {
               std::ostringstream o;
               o << "prescale " << q.params.prescale << ", postscale " << q.params.postscale;
               return o.str();
             });
    }
  }
  if (ref.type == CollectiveType::kBroadcast) {
    if (differs([](const CollectiveParams& c) { return c.root_rank; })) {
      return prefix() + "mismatched root ranks: " +
             PerRank(p.by_rank, p.present,
                     [](const Request& q) { return "root " + std::to_string(q.params.root_rank); });
    }
    if (ref.root_rank < 0 || ref.root_rank >= size_) {
      return prefix() + "root rank " + std::to_string(ref.root_rank) + " is out of range for " +
             std::to_string(size_) + " ranks";
    }
    if (!set.member[ref.root_rank]) {
      return prefix() + "root rank " + std::to_string(ref.root_rank) +
             " is not a member of process set " + std::to_string(p.set) + " " +
             RanksString(set.ranks);
    }
  }
  if (ref.type == CollectiveType::kAddProcessSet &&
      differs([](const CollectiveParams& c) -> const std::vector<int32_t>& { return c.splits; })) {
    return prefix() + "ranks asked for different process sets: " +
           PerRank(p.by_rank, p.present,
                   [](const Request& q) { return RanksString(q.params.splits); });
  }
  if (ref.type == CollectiveType::kRemoveProcessSet &&
      differs([](const CollectiveParams& c) { return c.root_rank; })) {
    return prefix() + "ranks asked to remove different process sets: " +
           PerRank(p.by_rank, p.present,
                   [](const Request& q) { return "id " + std::to_string(q.params.root_rank); });
  }
  if (ref.type == CollectiveType::kReducescatter && ref.shape.empty()) {
    return prefix() + "a scalar cannot be scattered; give a tensor of rank >= 1";
  }
  if (ref.type == CollectiveType::kAlltoall) {
    for (int r = 0; r < size_; ++r) {
      if (!p.present[r]) continue;
      const CollectiveParams& c = p.by_rank[r].params;
      int64_t dim0 = c.shape.empty() ? 1 : c.shape[0];
      if (c.splits.empty() && dim0 % n == 0) continue;
      if (c.splits.empty()) {  // bad input, as Horovod's enqueue check: InvalidArgument
        *code = StatusCode::kInvalidArgument;
        return prefix() + "rank " + std::to_string(r) + " gave no splits and its first dimension " +
               std::to_string(dim0) + " is not divisible by " + std::to_string(n) + " ranks";
      }
      if (static_cast<int>(c.splits.size()) != n) {
        return prefix() + "rank " + std::to_string(r) + " gave " + std::to_string(c.splits.size()) +
               " splits " + RanksString(c.splits) + ", expected one per rank (" +
               std::to_string(n) + ")";
      }
      int64_t sum = 0;
      for (int32_t s : c.splits) {
        if (s < 0) {
          return prefix() + "rank " + std::to_string(r) + " gave a negative split " +
                 RanksString(c.splits);
        }
        sum += s;
      }
      if (sum != dim0) {
        return prefix() + "rank " + std::to_string(r) + " gave splits " + RanksString(c.splits) +
               " that sum to " + std::to_string(sum) + ", but its first dimension is " +
               std::to_string(dim0);
      }
    }
  }
  return "";
}

Response Coordinator::Build(Pending& p) {
  const std::string& name = p.name;
  StatusCode code = StatusCode::kFailedPrecondition;  // ranks that disagree
  std::string err = Validate(name, p, &code);
  if (!err.empty()) return ErrorResponse(name, p.set, err, code);
  int first = 0;
  while (!p.present[first]) ++first;
  const CollectiveParams& ref = p.by_rank[first].params;
  const SetInfo& set = *Set(p.set);
  const int n = static_cast<int>(set.ranks.size());
  std::vector<int32_t> joined;
  for (int r = 0; r < size_ && p.set == 0; ++r) {
    if (joined_[r] && !p.present[r]) joined.push_back(r);
  }
  const bool set_change = ref.type == CollectiveType::kAddProcessSet ||
                          ref.type == CollectiveType::kRemoveProcessSet;
  auto joined_ranks = [&] { return RanksString(std::vector<int>(joined.begin(), joined.end())); };
  if (!joined.empty() && set_change) {
    return ErrorResponse(name, p.set, "tfhvd: " + std::string(CollectiveName(ref.type)) +
                                          " cannot run while ranks " + joined_ranks() +
                                          " have joined");
  }
  if (set_change) return ChangeSets(p, ref);
  if (!joined.empty() && ref.type != CollectiveType::kAllreduce &&
      ref.type != CollectiveType::kJoin) {
    return ErrorResponse(name, p.set,
                         "tfhvd: " + std::string(CollectiveName(ref.type)) + " of tensor '" + name +
                             "' cannot run while ranks " + joined_ranks() +
                             " have joined; only allreduce supports join");
  }
  Response resp;
  const bool cacheable = set.cache != nullptr && joined.empty() && settings_.cache_enabled;
  resp.joined_ranks = std::move(joined);
  switch (ref.type) {
    case CollectiveType::kAllreduce:
      resp.sizes = {NumElements(ref.shape)};
      break;
    case CollectiveType::kAllgather:
      for (int r : set.ranks) {
        const Shape& s = p.by_rank[r].params.shape;
        resp.sizes.push_back(s.empty() ? 1 : s[0]);
      }
      break;
    case CollectiveType::kAlltoall:
      for (int r : set.ranks) {
        const CollectiveParams& c = p.by_rank[r].params;
        int64_t dim0 = c.shape.empty() ? 1 : c.shape[0];
        for (int j = 0; j < n; ++j) {
          resp.sizes.push_back(c.splits.empty() ? dim0 / n : c.splits[j]);
        }
      }
      break;
    case CollectiveType::kJoin:
      resp.last_joined_rank = last_joined_;
      resp.joined_ranks.clear();
      break;
    default:
      break;
  }
  if (cacheable) resp.cache_ids = {set.cache->Assign(name, ref)};
  // Compute recycles the pending entry after this: move its name and
  // parameters rather than copy them (`name` and `ref` refer to them).
  resp.names.push_back(std::move(p.name));
  resp.params = std::move(p.by_rank[first].params);
  return resp;
}

Response Coordinator::ChangeSets(const Pending& p, const CollectiveParams& ref) {
  const std::string prefix = "tfhvd: " + std::string(CollectiveName(ref.type)) + ": ";
  Response resp;
  resp.names = {p.name};
  resp.params = ref;
  if (ref.type == CollectiveType::kAddProcessSet) {
    std::vector<int> ranks(ref.splits.begin(), ref.splits.end());
    if (ranks.empty()) {
      for (int r = 0; r < size_; ++r) ranks.push_back(r);  // Horovod: [] is every rank
    }
    Status st = CheckSetRanks(&ranks, size_);
    if (!st.ok()) return ErrorResponse(p.name, 0, st.message());
    for (const auto& kv : sets_) {
      if (kv.second.ranks == ranks) {
        return ErrorResponse(p.name, 0, prefix + "a process set with ranks " +
                                            RanksString(ranks) + " exists already (id " +
                                            std::to_string(kv.first) + ")");
      }
    }
    const int32_t id = next_set_id_++;
    AddSet(id, ranks);
    resp.params.root_rank = id;
    resp.params.splits.assign(ranks.begin(), ranks.end());
    return resp;
  }
  const int32_t id = ref.root_rank;
  if (id == 0) return ErrorResponse(p.name, 0, prefix + "the global process set cannot be removed");
  if (Set(id) == nullptr) {
    return ErrorResponse(p.name, 0, prefix + "process set " + std::to_string(id) +
                                        " does not exist, or has been removed");
  }
  for (const Fast& f : sets_[id].fast) fast_pending_ -= f.count > 0 ? 1 : 0;
  sets_.erase(id);
  // Its pending tensors: each member fails its own when it runs this response.
  for (auto it = table_.begin(); it != table_.end();) {
    it = it->second.set == id ? table_.erase(it) : std::next(it);
  }
  ready_.erase(std::remove_if(ready_.begin(), ready_.end(),
                              [this, id](const Ready& k) {
                                return k.slot < 0 ? !table_.count(k.key) : k.set == id;
                              }),
               ready_.end());
  return resp;
}

Response* Coordinator::Fuser::OpenFor(const CollectiveParams& p,
                                      const std::vector<int32_t>& joined, int64_t bytes) {
  // Allreduces fuse when they agree on everything but name and shape.
  for (auto& o : open) {
    Response& f = (*out)[o.first];
    if (o.second + bytes <= threshold && f.params.dtype == p.dtype &&
        f.params.reduce_op == p.reduce_op && f.params.prescale == p.prescale &&
        f.params.postscale == p.postscale && f.params.device == p.device &&
        f.params.process_set_id == p.process_set_id && f.joined_ranks == joined) {
      o.second += bytes;
      return &f;
    }
  }
  return nullptr;
}

void Coordinator::Fuser::Push(Response r) {
  if (r.kind != ResponseKind::kCollective || r.params.type != CollectiveType::kAllreduce) {
    out->push_back(std::move(r));
    return;
  }
  if (r.cache_ids.empty()) r.cache_ids = {-1};
  const int64_t b = r.sizes[0] * DataTypeSize(r.params.dtype);
  if (Response* f = OpenFor(r.params, r.joined_ranks, b)) {
    f->names.push_back(std::move(r.names[0]));
    f->sizes.push_back(r.sizes[0]);
    f->cache_ids.push_back(r.cache_ids[0]);
    return;
  }
  open.emplace_back(out->size(), b);
  out->push_back(std::move(r));
}

void Coordinator::Fuser::PushCached(const ResponseCache::Entry& e, int32_t slot) {
  // A steady-state step's tensors join an open response without a Response
  // of their own.
  if (e.params.type == CollectiveType::kAllreduce) {
    const int64_t n = NumElements(e.params.shape);
    if (Response* f = OpenFor(e.params, {}, n * DataTypeSize(e.params.dtype))) {
      f->names.push_back(e.name);
      f->sizes.push_back(n);
      f->cache_ids.push_back(slot);
      return;
    }
  }
  Response resp;
  resp.names.push_back(e.name);
  resp.params = e.params;
  if (e.params.type == CollectiveType::kAllreduce) resp.sizes = {NumElements(e.params.shape)};
  resp.cache_ids = {slot};
  Push(std::move(resp));
}

std::string Coordinator::MissingRanks(const Pending& p) const {
  std::vector<int> missing;
  for (int r : Set(p.set)->ranks) {
    if (!p.present[r] && !(p.set == 0 && joined_[r])) missing.push_back(r);
  }
  return RanksString(missing);
}

void Coordinator::CheckStalls(Clock::time_point now, std::vector<Response>* out) {
  if (settings_.stall_check_disable) return;
  using Secs = std::chrono::duration<double>;
  // Slots that waited long enough to be reported are checked in the table.
  double limit = settings_.stall_check_time_s;
  if (settings_.stall_shutdown_time_s > 0) limit = std::min(limit, settings_.stall_shutdown_time_s);
  DemoteWaiting(now - std::chrono::duration_cast<Clock::duration>(Secs(limit)), false);
  std::ostringstream warn;
  std::vector<StalledCollective> stalled;
  std::vector<std::string> failed;
  for (auto& kv : table_) {
    Pending& p = kv.second;
    double age = Secs(now - p.first_seen).count();
    if (settings_.stall_shutdown_time_s > 0 && age >= settings_.stall_shutdown_time_s) {
      failed.push_back(kv.first);
      continue;
    }
    if (age >= settings_.stall_check_time_s &&
        (p.last_warned == p.first_seen ||
         Secs(now - p.last_warned).count() >= settings_.stall_check_time_s)) {
      p.last_warned = now;
      warn << "\n  '" << TimelineName(kv.second.set, kv.second.name) << "' waited "
           << static_cast<int>(age)
           << " s; missing ranks " << MissingRanks(p);
    }
    if (age >= settings_.stall_check_time_s) {  // all stalled ones, warned now or before
      stalled.push_back({TimelineName(p.set, p.name), {}});
      for (int r : Set(p.set)->ranks) {
        if (p.present[r]) stalled.back().submitted.push_back(r);
      }
    }
  }
  if (!warn.str().empty()) {
    std::string diverged = DivergenceSummary(stalled);
    TFHVD_LOG(*log_, kWarning,
              "stall: some ranks submitted these collectives and others did not "
              "(a rank may be stuck, crashed or running different code):"
                  << warn.str() << (diverged.empty() ? "" : "\n" + diverged));
  }
  for (const auto& name : failed) {
    const Pending& p = table_[name];
    std::ostringstream m;
    m << "tfhvd: '" << TimelineName(p.set, p.name) << "' stalled for over "
      << settings_.stall_shutdown_time_s
      << " s: ranks " << MissingRanks(p)
      << " never submitted it (stall shutdown time reached)";
    TFHVD_LOG(*log_, kError, m.str());
    Response err = ErrorResponse(p.name, p.set, m.str());
    err.error_code = StatusCode::kAborted;  // a stuck peer, as Horovod's stall shutdown
    out->push_back(std::move(err));
    table_.erase(name);
  }
}

// Fails tensors that can never complete: a rank they need has shut down.
void Coordinator::FailUnreachable(std::vector<Response>* out) {
  std::vector<std::string> dead;
  for (const auto& kv : table_) {
    const Pending& p = kv.second;
    const SetInfo& set = *Set(p.set);
    std::vector<int> gone;
    bool lost = false;
    for (int r = 0; r < size_; ++r) {
      if (shut_down_[r] && (r == 0 || (set.member[r] && !p.present[r])) &&
          !(p.set == 0 && joined_[r])) {
        gone.push_back(r);
        lost |= lost_[r];
      }
    }
    if (!gone.empty()) {
      int first = 0;
      while (first < size_ - 1 && !p.present[first]) ++first;
      Response err = ErrorResponse(
          p.name, p.set,
          "tfhvd: " + std::string(CollectiveName(p.by_rank[first].params.type)) +
                        " of tensor '" + p.name + "' cannot complete: ranks " + RanksString(gone) +
                        (lost ? " have exited or lost their connection" : " have shut down"));
      err.error_code = StatusCode::kAborted;
      out->push_back(std::move(err));
      dead.push_back(kv.first);
    }
  }
  for (const auto& n : dead) table_.erase(n);
}

ResponseList Coordinator::Compute(Clock::time_point now) {
  ResponseList list;
  std::vector<Response>& responses = list.responses;
  // Errors found on arrival come first; none of them fuses.
  responses.swap(immediate_);
  std::vector<Ready> ready;
  ready.swap(ready_);
  responses.reserve(responses.size() + ready.size());
  Fuser fuser{&responses, {}, settings_.fusion_threshold_bytes};
  bool join_done = false;
  for (const Ready& k : ready) {
    if (k.slot >= 0) {
      SetInfo* info = MutableSet(k.set);
      if (info == nullptr) continue;
      Fast& f = info->fast[k.slot];
      if (!f.ready) continue;
      // Validated when the slot was assigned; every rank sent these parameters.
      fuser.PushCached(*info->cache->Get(k.slot), k.slot);
      f.ready = false;
      f.count = 0;
      --fast_pending_;
      continue;
    }
    auto it = table_.find(k.key);
    if (it == table_.end()) continue;
    Response r = Build(it->second);
    join_done |= r.kind == ResponseKind::kCollective && r.params.type == CollectiveType::kJoin;
    fuser.Push(std::move(r));
    if (spare_.size() < kSpareNodes) {
      spare_.push_back(table_.extract(it));
    } else {
      table_.erase(it);
    }
  }
  if (any_shut_down_) FailUnreachable(&responses);
  if (now - last_stall_check_ >= std::chrono::seconds(1)) {
    last_stall_check_ = now;
    CheckStalls(now, &responses);
  }
  if (join_done) {
    std::fill(joined_.begin(), joined_.end(), false);
    joined_count_ = 0;
    last_joined_ = -1;
  }
  return list;
}

}  // namespace tfhvd
