#include "autotune.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

#include "process_set.h"

namespace tfhvd {
namespace {

constexpr double kMb = 1024.0 * 1024.0;

// The Bayesian search runs on log scales, where the knobs' effects are about
// even: s = log2(1 + 16 * MB) (0 MB -> 0, 1 MB -> 4.1, 64 MB -> 10) and
// s = log2(1 + 10 * ms) (0 ms -> 0, 0.1 ms -> 1, 5 ms -> 5.7).  On Horovod's
// linear scale 0..1 MB is 1.5% of the range, yet it is where small and
// medium gradients do best on a fast transport.
constexpr double kFusionScale = 16, kCycleScale = 10;
double ToSearch(double v, double scale) { return std::log2(1 + scale * v); }
double FromSearch(double s, double scale) { return (std::exp2(s) - 1) / scale; }

// Bytes a response moves per rank (what Horovod's score counts).
double ResponseBytes(const Response& r) {
  if (r.kind != ResponseKind::kCollective) return 0;
  const double elem = static_cast<double>(DataTypeSize(r.params.dtype));
  if (r.params.type == CollectiveType::kAllreduce) {
    double n = 0;
    for (int64_t s : r.sizes) n += static_cast<double>(s);
    return n * elem;
  }
  return static_cast<double>(NumElements(r.params.shape)) * elem;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

Autotune::Autotune(const Settings& settings, int rank, const Logger* log)
    : settings_(settings), rank_(rank), log_(log) {
  const AutotuneSettings& a = settings.autotune;
  in_force_.fusion_threshold_bytes = settings.fusion_threshold_bytes;
  in_force_.cycle_time_ms = settings.cycle_time_ms;
  in_force_.cache_enabled = settings.cache_enabled;
  tune_fusion_ = !a.fusion_threshold_fixed;
  tune_cycle_ = !a.cycle_time_fixed;
  if (!a.cache_fixed && settings.cache_capacity > 0) {
    for (int i = 0; i < kCategoricalRounds; ++i) {
      cache_values_.push_back(true);
      cache_values_.push_back(false);
    }
  }
  // Every rank parses the same variables, so every rank knows whether
  // tuning runs (State() says so from the start).
  in_force_.active = a.enabled && (tune_fusion_ || tune_cycle_ || !cache_values_.empty());
  current_ = in_force_;
  if (!in_force_.active || rank != 0) return;
  on_ = true;
  current_.active = true;
  warmup_left_ = a.warmup_samples;
  std::vector<std::pair<double, double>> bounds;
  if (tune_fusion_) bounds.emplace_back(0.0, ToSearch(kMaxFusionMb, kFusionScale));
  if (tune_cycle_) bounds.emplace_back(0.0, ToSearch(kMaxCycleMs, kCycleScale));
  if (!bounds.empty()) {
    bo_ = std::make_unique<BayesianOptimizer>(bounds, a.gaussian_process_noise);
    // The setting the job started with, then three points spread over the
    // search box (MB, ms), as Horovod starts from fixed test points.
    const double start[][2] = {
        {std::min(kMaxFusionMb, settings.fusion_threshold_bytes / kMb),
         std::min(kMaxCycleMs, settings.cycle_time_ms)},
        {1, 0},
        {8, 0.25},
        {0.25, 1}};
    for (const auto& s : start) {
      Point p;
      if (tune_fusion_) p.push_back(ToSearch(s[0], kFusionScale));
      if (tune_cycle_) p.push_back(ToSearch(s[1], kCycleScale));
      initial_.push_back(p);
    }
    phase_ = Phase::kBayes;
    SetPoint(initial_[0]);
  } else {
    phase_ = Phase::kCategorical;
    current_.cache_enabled = cache_values_[0];
  }
}

Status Autotune::Start() {
  if (!on_) {
    if (settings_.autotune.enabled && rank_ == 0) {
      TFHVD_LOG(*log_, kWarning, "autotune: nothing to tune (fusion threshold, cycle time and "
                                 "cache capacity are all set)");
    }
    return Status::OK();
  }
  const std::string& path = settings_.autotune.log_path;
  if (!path.empty()) {
    file_.open(path, std::ios::out | std::ios::trunc);
    if (!file_.good()) {
      return Status::InvalidArgument("tfhvd: cannot write the autotune log '" + path +
                                     "' (TFHVD_AUTOTUNE_LOG / HOROVOD_AUTOTUNE_LOG): " +
                                     std::strerror(errno));
    }
    file_ << kLogHeader << std::endl;
  }
  TFHVD_LOG(*log_, kInfo, "autotune: tuning [" << (tune_fusion_ ? "fusion_threshold " : "")
                                               << (tune_cycle_ ? "cycle_time " : "")
                                               << (cache_values_.empty() ? "" : "cache")
                                               << "], " << settings_.autotune.warmup_samples
                                               << " warm-up samples");
  return Status::OK();
}

Point Autotune::CurrentPoint() const {
  Point p;
  if (tune_fusion_) p.push_back(ToSearch(current_.fusion_threshold_bytes / kMb, kFusionScale));
  if (tune_cycle_) p.push_back(ToSearch(current_.cycle_time_ms, kCycleScale));
  return p;
}

void Autotune::SetPoint(const Point& x) {
  size_t k = 0;
  if (tune_fusion_) {
    current_.fusion_threshold_bytes =
        std::llround(std::min(kMaxFusionMb, FromSearch(x[k++], kFusionScale)) * kMb);
  }
  if (tune_cycle_) current_.cycle_time_ms = std::min(kMaxCycleMs, FromSearch(x[k++], kCycleScale));
}

void Autotune::Observe(ResponseList* list, Clock::time_point now) {
  if (!on_ || phase_ == Phase::kDone || list->responses.empty()) return;
  if (!started_) {
    started_ = true;
    window_start_ = now;
  }
  // A window ends when a tensor comes round once more than the window allows;
  // this round's bytes then count in the next window.
  const int64_t steps = settings_.autotune.steps_per_sample;
  bool ended = false;
  for (const Response& r : list->responses) {
    if (r.kind != ResponseKind::kCollective) continue;
    for (const std::string& name : r.names) {
      const int64_t c = ++counts_[TensorKey(r.params.process_set_id, name)];
      ended |= c > static_cast<int64_t>(windows_.size() + 1) * steps;
    }
  }
  if (ended) {
    const double us = std::chrono::duration<double, std::micro>(now - window_start_).count();
    windows_.push_back(us > 0 ? window_bytes_ / us : 0.0);
    window_bytes_ = 0;
    window_start_ = now;
  }
  for (const Response& r : list->responses) window_bytes_ += ResponseBytes(r);
  if (windows_.size() < static_cast<size_t>(kWindows)) return;
  const double score = Median(windows_);
  windows_.clear();
  counts_.clear();
  const TunedParams before = current_;
  Next(score);
  const bool changed = before.fusion_threshold_bytes != current_.fusion_threshold_bytes ||
                       before.cycle_time_ms != current_.cycle_time_ms ||
                       before.cache_enabled != current_.cache_enabled ||
                       before.active != current_.active;
  if (changed) {
    current_.sample = ++samples_;
    list->tuned = current_;
    list->tuned.present = true;
  }
}

void Autotune::Next(double score) {
  if (warmup_left_ > 0) {
    --warmup_left_;
    TFHVD_LOG(*log_, kInfo, "autotune: warm-up sample (" << warmup_left_ << " left), score "
                                                         << score);
    return;
  }
  WriteRow(current_, score);
  if (phase_ == Phase::kBayes) {
    bo_->AddSample(CurrentPoint(), score);
    ++bayes_done_;
    if (bayes_done_ < settings_.autotune.bayes_opt_max_samples) {
      SetPoint(bayes_done_ < static_cast<int64_t>(initial_.size()) ? initial_[bayes_done_]
                                                                   : bo_->NextSample());
      return;
    }
    SetPoint(bo_->BestPoint());
    if (cache_values_.empty()) {
      Finish();
      return;
    }
    phase_ = Phase::kCategorical;
    current_.cache_enabled = cache_values_[0];
    return;
  }
  cache_scores_.push_back(score);
  if (++cache_index_ < cache_values_.size()) {
    current_.cache_enabled = cache_values_[cache_index_];
    return;
  }
  Finish();
}

void Autotune::Finish() {
  double best = bo_ ? bo_->BestValue() : 0;
  if (!cache_scores_.empty()) {
    // Each value's median over its turns (on, off, on, off, ...).
    double best_median = -1;
    for (bool value : {true, false}) {
      std::vector<double> v;
      for (size_t i = 0; i < cache_scores_.size(); ++i) {
        if (cache_values_[i] == value) v.push_back(cache_scores_[i]);
      }
      if (!v.empty() && Median(v) > best_median) {
        best_median = Median(v);
        current_.cache_enabled = value;
      }
    }
    best = best_median;
  }
  phase_ = Phase::kDone;
  current_.active = false;
  WriteRow(current_, best);
  TFHVD_LOG(*log_, kInfo, "autotune: done; keeping fusion threshold "
                              << current_.fusion_threshold_bytes << " bytes, cycle time "
                              << current_.cycle_time_ms << " ms, cache "
                              << (current_.cache_enabled ? "on" : "off"));
}

void Autotune::WriteRow(const TunedParams& p, double score) {
  std::ostringstream row;
  row << (settings_.hierarchical_allreduce ? 1 : 0) << ",0,0," << (p.cache_enabled ? 1 : 0)
      << "," << p.cycle_time_ms << "," << p.fusion_threshold_bytes / kMb << "," << score;
  TFHVD_LOG(*log_, kInfo, "autotune: " << row.str());
  if (file_.is_open()) file_ << row.str() << std::endl;
}

void Autotune::Apply(const TunedParams& p, Settings* settings, Coordinator* coordinator) {
  if (!p.present) return;
  settings->fusion_threshold_bytes = p.fusion_threshold_bytes;
  settings->cycle_time_ms = p.cycle_time_ms;
  settings->cache_enabled = p.cache_enabled && settings->cache_capacity > 0;
  if (coordinator != nullptr) {
    coordinator->SetTuned(settings->fusion_threshold_bytes, settings->cache_enabled);
  }
  std::lock_guard<std::mutex> l(mu_);
  in_force_ = p;
  in_force_.cache_enabled = settings->cache_enabled;
  applied_.push_back(in_force_);
}

std::string Autotune::State() const {
  std::lock_guard<std::mutex> l(mu_);
  std::ostringstream o;
  o << "tuning=" << (in_force_.active ? 1 : 0) << "\n"
    << "fusion_threshold_bytes=" << in_force_.fusion_threshold_bytes << "\n"
    << "cycle_time_ms=" << in_force_.cycle_time_ms << "\n"
    << "cache_enabled=" << (in_force_.cache_enabled ? 1 : 0) << "\n"
    << "applied=";
  for (size_t i = 0; i < applied_.size(); ++i) {
    const TunedParams& p = applied_[i];
    o << (i ? ";" : "") << p.sample << ":" << p.fusion_threshold_bytes << ":" << p.cycle_time_ms
      << ":" << (p.cache_enabled ? 1 : 0) << ":" << (p.active ? 1 : 0);
  }
  o << "\n";
  return o.str();
}

}  // namespace tfhvd
