#include "finalizer.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace tfhvd {

struct Finalizer::State {
  struct Item {
    Wait wait;
    Done done;
    Clock::time_point pushed;
    bool delivered = false;  // by FailPending, before its wait returned
  };

  explicit State(Options o) : opt(std::move(o)) {}
  void Work();
  void Watch();

  Options opt;
  mutable std::mutex mu;
  // Held while results are handed out, so that the worker and FailPending
  // deliver in push order.  Taken before `mu`.
  std::mutex deliver_mu;
  std::condition_variable work_cv;   // a push, or stop_work
  std::condition_variable watch_cv;  // a push, or stop_watch
  std::condition_variable idle_cv;   // a delivery
  std::deque<Item> items;            // front: the one being waited for
  size_t undelivered = 0;
  // Bumped by every push and by Stop: what a lingering worker watches
  // without the lock.
  std::atomic<uint64_t> wakes{0};
  bool started = false;
  bool stop_work = false;
  bool stop_watch = false;
  bool abandoned = false;
  bool watch_asleep = false;  // the watchdog waits for a push
  std::thread worker;
  std::thread watchdog;
};

void Finalizer::State::Work() {
  if (opt.on_start) opt.on_start();
  std::unique_lock<std::mutex> l(mu);
  Clock::time_point delivered{};  // the last delivery, while lingering after it
  while (true) {
    if (items.empty() && !stop_work && delivered != Clock::time_point{}) {
      const uint64_t seen = wakes.load();
      l.unlock();
      const Clock::time_point until = delivered + opt.linger;
      while (wakes.load() == seen && Clock::now() < until) std::this_thread::yield();
      l.lock();
    }
    delivered = Clock::time_point{};
    work_cv.wait(l, [this] { return stop_work || !items.empty(); });
    if (items.empty()) return;  // stopped, and everything delivered
    Wait wait = std::move(items.front().wait);
    l.unlock();
    const Status st = wait ? wait() : Status::OK();
    std::lock_guard<std::mutex> d(deliver_mu);
    l.lock();
    Item it = std::move(items.front());
    items.pop_front();
    if (it.delivered) continue;
    l.unlock();
    it.done(st);
    l.lock();
    --undelivered;
    idle_cv.notify_all();
    if (opt.linger.count() > 0) delivered = Clock::now();
  }
}

void Finalizer::State::Watch() {
  std::unique_lock<std::mutex> l(mu);
  auto oldest = [this](Clock::time_point* since) {
    for (const Item& it : items) {
      if (it.delivered) continue;
      *since = it.pushed;
      return true;
    }
    return false;
  };
  bool lingered = false;
  while (!stop_watch) {
    Clock::time_point since;
    if (!oldest(&since)) {
      // Idle: one more period (a busy runtime pushes within it, and Push
      // then needs no wake-up call), then asleep until a push.
      if (!lingered) {
        lingered = true;
        watch_cv.wait_for(l, opt.watch_period);
        continue;
      }
      watch_asleep = true;
      watch_cv.wait(l);
      watch_asleep = false;
      lingered = false;
      continue;
    }
    lingered = false;
    watch_cv.wait_for(l, opt.watch_period);
    if (stop_watch || !oldest(&since) || !opt.watch) continue;
    l.unlock();
    opt.watch(Clock::now() - since);
    l.lock();
  }
}

Finalizer::Finalizer(Options options) : state_(std::make_shared<State>(std::move(options))) {}

Finalizer::~Finalizer() { Stop(); }

void Finalizer::Stop() {
  std::shared_ptr<State> s = state_;
  {
    std::lock_guard<std::mutex> l(s->mu);
    if (!s->started || s->stop_watch) return;
    s->stop_work = true;
    s->wakes.fetch_add(1);
  }
  s->work_cv.notify_all();
  // Normally the worker delivers everything first, while the watchdog still
  // guards its waits.  Abandoned, the worker may never return from its wait:
  // it is left behind (it only skips what was already delivered).
  if (!s->abandoned) s->worker.join();
  {
    std::lock_guard<std::mutex> l(s->mu);
    s->stop_watch = true;
  }
  s->watch_cv.notify_all();
  s->watchdog.join();
  if (s->abandoned) s->worker.detach();
}

void Finalizer::Push(Wait wait, Done done) {
  State* s = state_.get();
  std::lock_guard<std::mutex> l(s->mu);
  if (!s->started) {
    s->started = true;
    std::shared_ptr<State> keep = state_;  // the threads may outlive this object (Abandon)
    s->worker = std::thread([keep] { keep->Work(); });
    s->watchdog = std::thread([keep] { keep->Watch(); });
  }
  s->items.push_back(State::Item{std::move(wait), std::move(done), Clock::now(), false});
  ++s->undelivered;
  s->wakes.fetch_add(1);
  s->work_cv.notify_one();
  if (s->watch_asleep) s->watch_cv.notify_one();
}

void Finalizer::Drain() {
  State* s = state_.get();
  std::unique_lock<std::mutex> l(s->mu);
  s->idle_cv.wait(l, [s] { return s->undelivered == 0; });
}

void Finalizer::FailPending(const Status& st) {
  State* s = state_.get();
  std::lock_guard<std::mutex> d(s->deliver_mu);
  std::vector<Done> todo;
  {
    std::lock_guard<std::mutex> l(s->mu);
    for (State::Item& it : s->items) {
      if (it.delivered) continue;
      it.delivered = true;
      todo.push_back(std::move(it.done));
    }
  }
  for (Done& done : todo) done(st);
  std::lock_guard<std::mutex> l(s->mu);
  s->undelivered -= todo.size();
  s->idle_cv.notify_all();
}

size_t Finalizer::Pending() const {
  std::lock_guard<std::mutex> l(state_->mu);
  return state_->undelivered;
}

void Finalizer::Abandon() {
  std::lock_guard<std::mutex> l(state_->mu);
  state_->abandoned = true;
}

}  // namespace tfhvd
