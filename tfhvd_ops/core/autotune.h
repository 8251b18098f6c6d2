// Autotune (HOROVOD_AUTOTUNE / TFHVD_AUTOTUNE): the coordinator measures the
// job's throughput under one setting of the runtime's knobs after another
// and keeps the best.
//
// Knobs tuned (each left alone when the user set its variable):
//  - the fusion threshold, 0..64 MB (FUSION_THRESHOLD): how many allreduces
//    share one fused collective, so fewer, larger transfers;
//  - the cycle time, 0..5 ms (CYCLE_TIME): how long the coordinator waits
//    between rounds, so more tensors are ready to fuse in one round (tfhvd's
//    rounds are event-driven, default 0, hence the smaller range than
//    Horovod's 1..100 ms);
//  - the response cache, on or off (CACHE_CAPACITY): whether steady-state
//    requests travel as slot ids and skip validation.
//
// How (the same scheme as Horovod's parameter manager):
//  1. Rank 0 counts the bytes of every response it sends.  A window ends
//     once some tensor has been negotiated `steps_per_sample` more times (a
//     training step per negotiation); its score is bytes per microsecond
//     over the window's wall time.  A sample is the median of kWindows
//     windows.  The first `warmup_samples` samples are discarded.
//  2. The fusion threshold and cycle time are tuned together by Bayesian
//     optimisation (bayes_opt.h) on log scales (autotune.cc): the current
//     setting and three fixed points first, then the point of largest
//     expected improvement, for `bayes_opt_max_samples` samples in all.
//     Then, at the best point, the cache values take kCategoricalRounds
//     turns each (on, off, on, off, ...), one sample a turn, and the value
//     with the better median wins.  The best combination stays in force,
//     and tuning ends.
//  3. New values travel in the ResponseList (TunedParams): every rank
//     applies them when it executes that list, so all ranks switch at the
//     same round, and the coordinator's fusion and cache follow from then on.
//  4. The log (AUTOTUNE_LOG, rank 0) is a CSV with Horovod's columns:
//     hierarchical_allreduce,hierarchical_allgather,torus_allreduce,
//     cache_enabled,cycle_time_ms,tensor_fusion_threshold,score (threshold in
//     MB, score in bytes per microsecond), one row per sample after the
//     warm-up, and a last row with the best setting and its score.
#ifndef TFHVD_CORE_AUTOTUNE_H_
#define TFHVD_CORE_AUTOTUNE_H_

#include <chrono>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "bayes_opt.h"
#include "controller.h"
#include "logging.h"
#include "message.h"
#include "settings.h"

namespace tfhvd {

class Autotune {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kWindows = 5;
  // Turns of each cache value in the categorical phase (on, off, on, ...).
  static constexpr int kCategoricalRounds = 3;
  static constexpr double kMaxFusionMb = 64;
  static constexpr double kMaxCycleMs = 5;
  static constexpr const char* kLogHeader =
      "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,"
      "cycle_time_ms,tensor_fusion_threshold,score";

  Autotune(const Settings& settings, int rank, const Logger* log);
  // Rank 0 with autotune on: opens the log (when asked for) and writes its
  // header; a log that cannot be written is an error naming its path.
  Status Start();
  // Rank 0, after each Compute: counts the list's bytes; when a sample ends,
  // decides the next setting and puts it in list->tuned.
  void Observe(ResponseList* list, Clock::time_point now);
  // Every rank, when it executes a list: applies list.tuned when present to
  // the runtime's settings and (rank 0) the coordinator.
  void Apply(const TunedParams& p, Settings* settings, Coordinator* coordinator);
  // What this rank applied, as "key=value" lines (diagnostics and tests);
  // safe from any thread.
  std::string State() const;
  bool tuning() const { return phase_ != Phase::kDone; }

 private:
  enum class Phase { kBayes, kCategorical, kDone };
  // Scores a finished sample and moves to the next setting.
  void Next(double score);
  void SetPoint(const Point& x);
  Point CurrentPoint() const;
  void WriteRow(const TunedParams& p, double score);
  void Finish();

  Settings settings_;
  int rank_;
  const Logger* log_;
  bool on_ = false;  // this rank tunes (rank 0, AUTOTUNE set, something to tune)
  Phase phase_ = Phase::kDone;
  std::ofstream file_;
  // The Bayesian phase.
  bool tune_fusion_ = false, tune_cycle_ = false;
  std::unique_ptr<BayesianOptimizer> bo_;
  std::vector<Point> initial_;
  int64_t bayes_done_ = 0;
  // The categorical phase: cache values to try, and their scores.
  std::vector<bool> cache_values_;
  std::vector<double> cache_scores_;
  size_t cache_index_ = 0;
  // Sampling.
  TunedParams current_;
  int64_t warmup_left_ = 0;
  std::unordered_map<std::string, int64_t> counts_;
  std::vector<double> windows_;
  double window_bytes_ = 0;
  Clock::time_point window_start_;
  bool started_ = false;
  int32_t samples_ = 0;
  // What this rank applied (State()).
  mutable std::mutex mu_;
  std::vector<TunedParams> applied_;
  TunedParams in_force_;
};

}  // namespace tfhvd

#endif  // TFHVD_CORE_AUTOTUNE_H_
