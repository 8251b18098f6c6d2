#include "tensor_queue.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

#include "process_set.h"

namespace tfhvd {

TensorQueue::TensorQueue() : efd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

TensorQueue::~TensorQueue() {
  if (efd_ >= 0) close(efd_);
}

void TensorQueue::SignalLocked() {
  if (signalled_) return;
  signalled_ = true;
  uint64_t one = 1;
  ssize_t rc = write(efd_, &one, sizeof(one));
  (void)rc;
}

namespace {
// Beyond this many remembered keys (a job that makes fresh names all the
// time) the memory starts over.
constexpr size_t kMaxSolo = 4096;
}  // namespace

Status TensorQueue::Add(std::vector<TensorTableEntry> entries, bool signal) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return close_reason_;
    const auto now = std::chrono::steady_clock::now();
    const int32_t group = static_cast<int32_t>(entries.size());
    for (auto& e : entries) {
      e.enqueued = now;
      e.group_size = group;
      incoming_.push_back(std::move(e));
    }
    outstanding_ += group;
    if (signal) SignalLocked();
  }
  return Status::OK();
}

Status TensorQueue::AddFromGraph(std::vector<TensorTableEntry> entries, bool burst, bool* solo) {
  std::lock_guard<std::mutex> l(mu_);
  if (closed_) return close_reason_;
  const auto now = std::chrono::steady_clock::now();
  const int32_t group = static_cast<int32_t>(entries.size());
  // Only with nothing else outstanding: an op that runs the loop holds its
  // thread, and the ops after it in the same step wait for that thread.
  *solo = !entries.empty() && outstanding_ == 0;
  if (burst) {
    for (const std::string& k : last_keys_) solo_.erase(k);
    last_keys_.clear();
    *solo = false;
  }
  outstanding_ += group;
  for (auto& e : entries) {
    if (*solo) *solo = solo_.count(TensorKey(e.params.process_set_id, e.name)) > 0;
    e.enqueued = now;
    e.group_size = group;
    incoming_.push_back(std::move(e));
  }
  if (!*solo) SignalLocked();
  return Status::OK();
}

void TensorQueue::NoteRound(const ResponseList& list) {
  // This rank's entries, and how many entries the first one's op had (keys
  // are looked up without copies: this runs for every round).
  std::string buf;
  size_t local = 0;
  int32_t first_group = 0;
  for (const Response& r : list.responses) {
    for (const std::string& name : r.names) {
      const TensorTableEntry* e = Peek(TensorKeyRef(r.params.process_set_id, name, &buf));
      if (e != nullptr && local++ == 0) first_group = e->group_size;
    }
  }
  if (local == 0) return;
  // One op's entries are negotiated together, so a list that holds as many
  // entries as its first one's op had holds that op alone.
  const bool alone = first_group == static_cast<int32_t>(local);
  std::lock_guard<std::mutex> l(mu_);
  last_keys_.clear();
  if (!alone && solo_.empty()) return;  // nothing to mark, nothing to clear
  if (alone && solo_.size() + local > kMaxSolo) solo_.clear();
  for (const Response& r : list.responses) {
    for (const std::string& name : r.names) {
      const std::string& key = TensorKeyRef(r.params.process_set_id, name, &buf);
      if (Peek(key) == nullptr) continue;
      if (alone) {
        solo_.insert(key);
        last_keys_.push_back(key);
      } else {
        solo_.erase(key);
      }
    }
  }
}

void TensorQueue::Park(std::chrono::microseconds timeout, const std::function<bool()>& stop) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!signalled_) parked_ = true;
  }
  if (parked_ && !stop()) Wait(timeout);
  std::lock_guard<std::mutex> l(mu_);
  parked_ = false;
}

void TensorQueue::WakeParked() {
  std::lock_guard<std::mutex> l(mu_);
  if (parked_) SignalLocked();
}

bool TensorQueue::HasIncoming() {
  std::lock_guard<std::mutex> l(mu_);
  return !incoming_.empty();
}

void TensorQueue::Close(const Status& reason) {
  std::lock_guard<std::mutex> l(mu_);
  closed_ = true;
  close_reason_ = reason;
}

std::vector<Request> TensorQueue::TakeNew(int32_t rank) {
  std::deque<TensorTableEntry> fresh;
  {
    std::lock_guard<std::mutex> l(mu_);
    fresh.swap(incoming_);
    if (signalled_) {
      signalled_ = false;
      uint64_t n;
      ssize_t rc = read(efd_, &n, sizeof(n));
      (void)rc;
    }
  }
  std::vector<Request> out;
  for (auto& e : fresh) {
    std::string key = TensorKey(e.params.process_set_id, e.name);
    if (pending_.count(key)) {
      held_[key].push_back(std::move(e));
      continue;
    }
    Request r;
    r.rank = rank;
    r.name = e.name;
    r.params = e.params;
    out.push_back(std::move(r));
    pending_.emplace(std::move(key), std::move(e));
  }
  return out;
}

bool TensorQueue::Pop(const std::string& name, TensorTableEntry* out) {
  auto it = pending_.find(name);
  if (it == pending_.end()) return false;
  *out = std::move(it->second);
  pending_.erase(it);
  --outstanding_;
  auto h = held_.find(name);
  if (h != held_.end()) {
    // Release the next submission under this name.
    std::lock_guard<std::mutex> l(mu_);
    incoming_.push_front(std::move(h->second.front()));
    h->second.pop_front();
    if (h->second.empty()) held_.erase(h);
    SignalLocked();
  }
  return true;
}

std::vector<TensorTableEntry> TensorQueue::TakeSet(int32_t set_id) {
  std::vector<TensorTableEntry> out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.params.process_set_id != set_id) {
      ++it;
      continue;
    }
    out.push_back(std::move(it->second));
    auto h = held_.find(it->first);
    if (h != held_.end()) {
      for (auto& e : h->second) out.push_back(std::move(e));
      held_.erase(h);
    }
    it = pending_.erase(it);
  }
  outstanding_ -= static_cast<int64_t>(out.size());
  return out;
}

std::vector<TensorTableEntry> TensorQueue::TakeAll() {
  std::vector<TensorTableEntry> out;
  for (auto& kv : pending_) out.push_back(std::move(kv.second));
  pending_.clear();
  for (auto& kv : held_) {
    for (auto& e : kv.second) out.push_back(std::move(e));
  }
  held_.clear();
  std::lock_guard<std::mutex> l(mu_);
  for (auto& e : incoming_) out.push_back(std::move(e));
  incoming_.clear();
  outstanding_ = 0;
  return out;
}

void TensorQueue::Wait(std::chrono::microseconds timeout) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (signalled_) return;
  }
  struct pollfd p = {efd_, POLLIN, 0};
  struct timespec ts;
  ts.tv_sec = timeout.count() / 1000000;
  ts.tv_nsec = (timeout.count() % 1000000) * 1000;
  ppoll(&p, 1, &ts, nullptr);
}

void TensorQueue::Notify() {
  std::lock_guard<std::mutex> l(mu_);
  SignalLocked();
}

}  // namespace tfhvd
