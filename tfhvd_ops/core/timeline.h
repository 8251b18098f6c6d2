// A Chrome-trace (Perfetto / chrome://tracing) timeline of what the runtime
// does to each tensor: one row per tensor name, with its negotiation and its
// collective as spans, and optionally the background loop's cycles.
//
// The file is valid JSON after every event: each write replaces the closing
// "]" and writes it again, so a job that dies abruptly still leaves a
// loadable trace (Horovod's is left unterminated).  Disabled, every call is
// one branch.
#ifndef TFHVD_CORE_TIMELINE_H_
#define TFHVD_CORE_TIMELINE_H_

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common.h"

namespace tfhvd {

class Timeline {
 public:
  Timeline() = default;
  ~Timeline() { Stop(); }
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Where rank `rank` writes for a user-given path: "{rank}" in the path is
  // replaced by the rank; without it only rank 0 writes (Horovod's habit)
  // and other ranks get "".
  static std::string PathForRank(const std::string& path, int rank);
  // Opens (truncates) `path` and starts recording for process `rank`.
  Status Start(const std::string& path, int rank, bool mark_cycles);
  void Stop();
  bool enabled() const { return on_.load(std::memory_order_relaxed); }

  // A QUEUE span from `enqueued` until now (time spent in the tensor queue).
  void Queued(const std::string& name, std::chrono::steady_clock::time_point enqueued);
  void NegotiateStart(const std::string& name, const char* op);
  void NegotiateEnd(const std::string& name);
  // A span on the tensor's row; `bytes` >= 0 is recorded as an argument.
  void Start(const std::string& name, const std::string& activity, int64_t bytes = -1);
  void End(const std::string& name);
  void MarkCycle();

 private:
  int Row(const std::string& name);  // requires mu_
  void Write(const std::string& event);  // requires mu_
  int64_t NowMicros() const;
  int64_t Micros(std::chrono::steady_clock::time_point t) const;

  std::mutex mu_;
  std::FILE* file_ = nullptr;
  std::atomic<bool> on_{false};
  bool first_ = true;
  bool mark_cycles_ = false;
  int rank_ = 0;
  std::chrono::steady_clock::time_point start_;
  // Microseconds since the Unix epoch at start_: timestamps are epoch-based
  // so the files of different ranks line up when merged (exactly on one
  // host, to clock-sync precision across hosts), while durations still come
  // from the steady clock.
  int64_t start_epoch_us_ = 0;
  std::unordered_map<std::string, int> rows_;
};

}  // namespace tfhvd

#endif  // TFHVD_CORE_TIMELINE_H_
