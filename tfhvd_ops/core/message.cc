#include "message.h"

#include <cstring>
#include <type_traits>

namespace tfhvd {
namespace {

class Writer {
 public:
  template <typename T>
  void Pod(T v) {
    static_assert(std::is_trivially_copyable<T>::value, "pod");
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void Str(const std::string& s) {
    Pod<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  template <typename T>
  void Vec(const std::vector<T>& v) {
    Pod<uint32_t>(static_cast<uint32_t>(v.size()));
    if (!v.empty()) out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void Params(const CollectiveParams& p) {
    Pod(p.type);
    Pod(p.dtype);
    Vec(p.shape);
    Pod(p.reduce_op);
    Pod(p.root_rank);
    Pod(p.prescale);
    Pod(p.postscale);
    Pod(p.device);
    Vec(p.splits);
    Pod(p.process_set_id);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : p_(s.data()), end_(s.data() + s.size()) {}
  template <typename T>
  bool Pod(T* v) {
    if (end_ - p_ < static_cast<ptrdiff_t>(sizeof(T))) return false;
    std::memcpy(v, p_, sizeof(T));
    p_ += sizeof(T);
    return true;
  }
  bool Str(std::string* s) {
    uint32_t n;
    if (!Pod(&n) || end_ - p_ < static_cast<ptrdiff_t>(n)) return false;
    s->assign(p_, n);
    p_ += n;
    return true;
  }
  template <typename T>
  bool Vec(std::vector<T>* v) {
    uint32_t n;
    if (!Pod(&n) || (end_ - p_) / static_cast<ptrdiff_t>(sizeof(T)) < static_cast<ptrdiff_t>(n)) return false;
    v->resize(n);
    if (n) std::memcpy(v->data(), p_, n * sizeof(T));
    p_ += n * sizeof(T);
    return true;
  }
  bool Params(CollectiveParams* p) {
    return Pod(&p->type) && Pod(&p->dtype) && Vec(&p->shape) && Pod(&p->reduce_op) &&
           Pod(&p->root_rank) && Pod(&p->prescale) && Pod(&p->postscale) &&
           Pod(&p->device) && Vec(&p->splits) && Pod(&p->process_set_id);
  }
  bool Done() const { return p_ == end_; }

 private:
  const char* p_;
  const char* end_;
};

}  // namespace

std::string Serialize(const RequestList& l) {
  Writer w;
  w.Pod<uint8_t>(l.shutdown ? 1 : 0);
  w.Pod<uint32_t>(static_cast<uint32_t>(l.requests.size()));
  for (const Request& r : l.requests) {
    w.Pod(r.rank);
    w.Str(r.name);
    w.Params(r.params);
    w.Str(r.error);
  }
  w.Vec(l.cached_ids);
  w.Vec(l.cached_sets);
  return w.Take();
}

bool Parse(const std::string& bytes, RequestList* l) {
  Reader r(bytes);
  uint8_t shutdown;
  uint32_t n;
  if (!r.Pod(&shutdown) || !r.Pod(&n)) return false;
  l->shutdown = shutdown != 0;
  l->requests.resize(n);
  for (Request& q : l->requests) {
    if (!r.Pod(&q.rank) || !r.Str(&q.name) || !r.Params(&q.params) || !r.Str(&q.error)) {
      return false;
    }
  }
  return r.Vec(&l->cached_ids) && r.Vec(&l->cached_sets) && r.Done();
}

std::string Serialize(const ResponseList& l) {
  Writer w;
  w.Pod<uint8_t>(l.shutdown ? 1 : 0);
  w.Pod<uint32_t>(static_cast<uint32_t>(l.responses.size()));
  for (const Response& r : l.responses) {
    w.Pod(r.kind);
    w.Pod<uint32_t>(static_cast<uint32_t>(r.names.size()));
    for (const auto& n : r.names) w.Str(n);
    w.Params(r.params);
    w.Str(r.error);
    w.Pod(r.error_code);
    w.Vec(r.sizes);
    w.Pod(r.last_joined_rank);
    w.Vec(r.cache_ids);
    w.Vec(r.joined_ranks);
  }
  w.Pod<uint8_t>(l.tuned.present ? 1 : 0);
  if (l.tuned.present) {
    w.Pod(l.tuned.fusion_threshold_bytes);
    w.Pod(l.tuned.cycle_time_ms);
    w.Pod<uint8_t>(l.tuned.cache_enabled ? 1 : 0);
    w.Pod<uint8_t>(l.tuned.active ? 1 : 0);
    w.Pod(l.tuned.sample);
  }
  return w.Take();
}

bool Parse(const std::string& bytes, ResponseList* l) {
  Reader r(bytes);
  uint8_t shutdown;
  uint32_t n;
  if (!r.Pod(&shutdown) || !r.Pod(&n)) return false;
  l->shutdown = shutdown != 0;
  l->responses.resize(n);
  for (Response& q : l->responses) {
    uint32_t names;
    if (!r.Pod(&q.kind) || !r.Pod(&names)) return false;
    q.names.resize(names);
    for (auto& s : q.names) {
      if (!r.Str(&s)) return false;
    }
    if (!r.Params(&q.params) || !r.Str(&q.error) || !r.Pod(&q.error_code) || !r.Vec(&q.sizes) ||
        !r.Pod(&q.last_joined_rank) || !r.Vec(&q.cache_ids) || !r.Vec(&q.joined_ranks)) {
      return false;
    }
  }
  uint8_t present, cache, active;
  if (!r.Pod(&present)) return false;
  l->tuned.present = present != 0;
  if (l->tuned.present) {
    if (!r.Pod(&l->tuned.fusion_threshold_bytes) || !r.Pod(&l->tuned.cycle_time_ms) ||
        !r.Pod(&cache) || !r.Pod(&active) || !r.Pod(&l->tuned.sample)) {
      return false;
    }
    l->tuned.cache_enabled = cache != 0;
    l->tuned.active = active != 0;
  }
  return r.Done();
}

}  // namespace tfhvd
