// Autotune's pieces without a job: the Gaussian process, expected
// improvement, the Bayesian optimiser on known functions (deterministic: the
// same samples always give the same next point), the settings, the wire
// format of TunedParams, and the whole sampling loop driven by a simulated
// clock whose step time depends on the setting in force.
//
//   build/tfhvd_autotune_test
//
// Prints "N passed, M failed" and exits non-zero on any failure.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <unistd.h>
#include <sstream>
#include <string>
#include <vector>

#include "../../tfhvd_ops/core/autotune.h"
#include "../../tfhvd_ops/core/bayes_opt.h"
#include "../../tfhvd_ops/core/controller.h"
#include "../../tfhvd_ops/core/message.h"
#include "../../tfhvd_ops/core/response_cache.h"
#include "../../tfhvd_ops/core/settings.h"

#include "check.h"

using namespace tfhvd;

namespace {

bool Near(double a, double b, double tol) { return std::fabs(a - b) <= tol; }

void TestGaussianProcess() {
  // A smooth function sampled at 6 points: the posterior mean interpolates
  // them (little noise), and is uncertain away from them.
  std::vector<Point> x;
  std::vector<double> y;
  for (int i = 0; i <= 5; ++i) {
    x.push_back({i / 5.0});
    y.push_back(std::sin(3 * i / 5.0));
  }
  GaussianProcess gp(1e-6);
  CHECK(gp.Fit(x, y));
  for (size_t i = 0; i < x.size(); ++i) {
    double m, sd;
    gp.Predict(x[i], &m, &sd);
    CHECK(Near(m, y[i], 1e-3));
    CHECK(sd < 1e-2);
  }
  double m, sd_mid, sd_far;
  gp.Predict({0.5}, &m, &sd_mid);
  CHECK(Near(m, std::sin(1.5), 0.05));  // between samples: close to the function
  GaussianProcess wide(1e-6);
  CHECK(wide.Fit({{0.0}, {0.1}}, {1.0, 2.0}));
  double m0, sd0;
  wide.Predict({0.05}, &m0, &sd0);
  wide.Predict({0.9}, &m, &sd_far);
  CHECK(sd_far > sd0);  // far from the data: more uncertain
  // Noise smooths: with much noise the mean at a sample moves towards the mean.
  GaussianProcess noisy(4.0);
  CHECK(noisy.Fit(x, y));
  noisy.Predict(x[5], &m, &sd_mid);
  CHECK(std::fabs(m - y[5]) > 0.05);
  CHECK(!gp.Fit({}, {}));
}

void TestExpectedImprovement() {
  CHECK(ExpectedImprovement(1.0, 0.0, 1.0, 0.0) == 0.0);
  CHECK(Near(ExpectedImprovement(2.0, 0.0, 1.0, 0.0), 1.0, 1e-12));
  // At the best value, EI = sd * pdf(0).
  CHECK(Near(ExpectedImprovement(1.0, 1.0, 1.0, 0.0), 1.0 / std::sqrt(2 * M_PI), 1e-9));
  CHECK(ExpectedImprovement(0.0, 2.0, 1.0, 0.0) > ExpectedImprovement(0.0, 1.0, 1.0, 0.0));
  CHECK(ExpectedImprovement(0.5, 1.0, 1.0, 0.0) > ExpectedImprovement(0.0, 1.0, 1.0, 0.0));
}

// Runs `n` samples of f over `bounds` from `start` points, then BO.
Point Optimise(double (*f)(const Point&), std::vector<std::pair<double, double>> bounds,
               std::vector<Point> start, int n, double noise, double* best) {
  BayesianOptimizer bo(bounds, noise);
  for (int i = 0; i < n; ++i) {
    Point p = i < static_cast<int>(start.size()) ? start[i] : bo.NextSample();
    for (size_t k = 0; k < p.size(); ++k) {
      CHECK(p[k] >= bounds[k].first && p[k] <= bounds[k].second);
    }
    bo.AddSample(p, f(p));
  }
  *best = bo.BestValue();
  return bo.BestPoint();
}

// A peak at (20 MB, 3.5 ms) over autotune's box.
double Bowl(const Point& p) {
  const double a = (p[0] - 20) / 64, b = (p[1] - 3.5) / 5;
  return 10 - 40 * (a * a + b * b);
}

// Two bumps in [0, 10]; the global maximum (about 2.0) is at x = 7.
double TwoBumps(const Point& p) {
  const double x = p[0];
  return std::exp(-(x - 2) * (x - 2)) + 2 * std::exp(-(x - 7) * (x - 7) / 0.5);
}

void TestBayesianOptimizer() {
  BayesianOptimizer empty({{0, 64}, {0, 5}}, 0.1);
  Point centre = empty.NextSample();
  CHECK(Near(centre[0], 32, 1e-9) && Near(centre[1], 2.5, 1e-9));
  CHECK(empty.BestPoint().empty());
  // Unit cube round trip.
  Point u = empty.ToUnit({16, 1.25});
  CHECK(Near(u[0], 0.25, 1e-12) && Near(u[1], 0.25, 1e-12));
  CHECK(Near(empty.FromUnit(u)[0], 16, 1e-9));

  // The 2-D bowl: from autotune's four start points (none near the peak),
  // 16 more samples get within 3 MB and 0.4 ms of it.
  double best;
  Point p = Optimise(Bowl, {{0, 64}, {0, 5}}, {{64, 0}, {4, 0.5}, {32, 2.5}, {16, 1}}, 20,
                     1e-4, &best);
  std::printf("bowl: best (%.2f MB, %.2f ms) -> %.4f (optimum 10)\n", p[0], p[1], best);
  CHECK(Near(p[0], 20, 3) && Near(p[1], 3.5, 0.4));
  CHECK(best > 9.9);
  // Deterministic: the same run gives the same point.
  double again;
  Point q = Optimise(Bowl, {{0, 64}, {0, 5}}, {{64, 0}, {4, 0.5}, {32, 2.5}, {16, 1}}, 20,
                     1e-4, &again);
  CHECK(q == p && again == best);

  // Two bumps: the search must not stop at the local one near x = 2.
  Point r = Optimise(TwoBumps, {{0, 10}}, {{2.0}, {0.5}}, 12, 1e-4, &best);
  std::printf("two bumps: best x = %.3f -> %.4f\n", r[0], best);
  CHECK(Near(r[0], 7, 0.3) && best > 1.9);
}

std::map<std::string, std::string> g_env;

bool Env(const std::string& k, std::string* v) {
  auto it = g_env.find(k);
  if (it == g_env.end()) return false;
  *v = it->second;
  return true;
}

void TestSettings() {
  Settings s;
  g_env = {};
  CHECK(ParseSettings(Env, &s).ok());
  CHECK(!s.autotune.enabled && s.autotune.warmup_samples == 3 &&
        s.autotune.steps_per_sample == 10 && s.autotune.bayes_opt_max_samples == 20 &&
        s.autotune.gaussian_process_noise == 0.8 && s.cache_enabled);
  g_env = {{"HOROVOD_AUTOTUNE", "1"},
           {"HOROVOD_AUTOTUNE_LOG", "/tmp/a.csv"},
           {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "0"},
           {"TFHVD_AUTOTUNE_STEPS_PER_SAMPLE", "4"},
           {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "7"},
           {"TFHVD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.25"},
           {"HOROVOD_CYCLE_TIME", "1"}};
  CHECK(ParseSettings(Env, &s).ok());
  CHECK(s.autotune.enabled && s.autotune.log_path == "/tmp/a.csv" &&
        s.autotune.warmup_samples == 0 && s.autotune.steps_per_sample == 4 &&
        s.autotune.bayes_opt_max_samples == 7 && s.autotune.gaussian_process_noise == 0.25);
  CHECK(s.autotune.cycle_time_fixed && !s.autotune.fusion_threshold_fixed &&
        !s.autotune.cache_fixed);
  g_env["TFHVD_AUTOTUNE"] = "0";  // TFHVD_ wins
  CHECK(ParseSettings(Env, &s).ok() && !s.autotune.enabled);
  for (const char* bad : {"TFHVD_AUTOTUNE=maybe", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=0",
                          "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=0",
                          "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE=-1",
                          "TFHVD_AUTOTUNE_WARMUP_SAMPLES=x"}) {
    std::string kv = bad;
    const std::string name = kv.substr(0, kv.find('='));
    g_env = {{name, kv.substr(kv.find('=') + 1)}};
    Status st = ParseSettings(Env, &s);
    CHECK(!st.ok() && st.message().find(name) != std::string::npos);
  }
  g_env = {{"TFHVD_CACHE_CAPACITY", "0"}};
  CHECK(ParseSettings(Env, &s).ok() && !s.cache_enabled && s.autotune.cache_fixed);
}

void TestWire() {
  ResponseList l;
  Response r;
  r.names = {"a"};
  l.responses.push_back(r);
  ResponseList back;
  CHECK(Parse(Serialize(l), &back) && !back.tuned.present);
  l.tuned = {true, 12345678, 2.5, false, true, 7};
  CHECK(Parse(Serialize(l), &back));
  CHECK(back.tuned.present && back.tuned.fusion_threshold_bytes == 12345678 &&
        back.tuned.cycle_time_ms == 2.5 && !back.tuned.cache_enabled && back.tuned.active &&
        back.tuned.sample == 7);
  std::string bytes = Serialize(l);
  bytes.pop_back();
  CHECK(!Parse(bytes, &back));  // truncated
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);) lines.push_back(line);
  return lines;
}

// A simulated job: every step allreduces 4 MiB under tensor "g"; the step
// takes longer the further the setting in force is from (20 MB, 1 ms, cache
// on).  The tuner must find a setting within 10% of the best throughput.
void TestTuningLoop() {
  const std::string log_path = "/tmp/tfhvd_autotune_test_" + std::to_string(getpid()) + ".csv";
  Settings s;
  s.log_level = LogLevel::kError;
  s.autotune.enabled = true;
  s.autotune.log_path = log_path;
  s.autotune.warmup_samples = 2;
  s.autotune.steps_per_sample = 2;
  s.autotune.bayes_opt_max_samples = 20;
  s.autotune.gaussian_process_noise = 0.01;
  Logger log(s.log_level, 0);
  Autotune tuner(s, 0, &log);
  Autotune worker(s, 1, &log);  // a worker only applies
  CHECK(tuner.Start().ok());
  CHECK(tuner.State().find("tuning=1") != std::string::npos);  // from the start
  CHECK(worker.State().find("tuning=1") != std::string::npos);
  Settings applied = s, worker_applied = s;
  auto step_us = [](const Settings& in) {
    const double mb = in.fusion_threshold_bytes / (1024.0 * 1024.0);
    return 1000 + 20 * std::fabs(mb - 20) + 300 * std::fabs(in.cycle_time_ms - 1) +
           (in.cache_enabled ? 0 : 400);
  };
  const double best_score = 4.0 * 1024 * 1024 / 1000;
  Autotune::Clock::time_point now{};
  int rounds = 0, changes = 0;
  std::vector<int64_t> thresholds;
  while (tuner.tuning() && rounds < 10000) {
    ResponseList list;
    Response r;
    r.names = {"g"};
    r.params.dtype = DataType::kFloat32;
    r.sizes = {1024 * 1024};
    list.responses.push_back(r);
    now += std::chrono::microseconds(static_cast<int64_t>(step_us(applied)));
    tuner.Observe(&list, now);
    if (list.tuned.present) {
      ++changes;
      thresholds.push_back(list.tuned.fusion_threshold_bytes);
    }
    // Through the wire, as a worker gets it.
    ResponseList got;
    CHECK(Parse(Serialize(list), &got));
    tuner.Apply(list.tuned, &applied, nullptr);
    worker.Apply(got.tuned, &worker_applied, nullptr);
    ++rounds;
  }
  CHECK(!tuner.tuning());
  const double final_score = 4.0 * 1024 * 1024 / step_us(applied);
  std::printf("tuning loop: %d rounds, %d changes; final (%.2f MB, %.3f ms, cache %d): "
              "%.1f%% of the best\n",
              rounds, changes, applied.fusion_threshold_bytes / (1024.0 * 1024.0),
              applied.cycle_time_ms, applied.cache_enabled ? 1 : 0,
              100 * final_score / best_score);
  CHECK(final_score >= 0.95 * best_score);
  // Parameters changed from sample to sample; the worker applied the same.
  CHECK(thresholds.size() >= 3 && thresholds[0] != thresholds[1]);
  CHECK(worker.State() == tuner.State());
  CHECK(worker_applied.fusion_threshold_bytes == applied.fusion_threshold_bytes &&
        worker_applied.cycle_time_ms == applied.cycle_time_ms &&
        worker_applied.cache_enabled == applied.cache_enabled);
  CHECK(tuner.State().find("tuning=0") != std::string::npos);
  // The log: Horovod's header, one row per sample (20 Bayesian + 3 turns of
  // each cache value; the warm-up ones are not written), then the best.
  std::vector<std::string> lines = ReadLines(log_path);
  CHECK(!lines.empty() && lines[0] == Autotune::kLogHeader);
  CHECK(lines.size() == 1 + 20 + 2 * Autotune::kCategoricalRounds + 1);
  std::set<std::string> settings_seen;
  double max_row = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::stringstream row(lines[i]);
    std::vector<std::string> cols;
    for (std::string c; std::getline(row, c, ',');) cols.push_back(c);
    CHECK(cols.size() == 7);
    if (cols.size() != 7) continue;
    settings_seen.insert(cols[3] + "," + cols[4] + "," + cols[5]);
    if (i + 1 < lines.size()) max_row = std::max(max_row, std::stod(cols[6]));
    CHECK(std::stod(cols[6]) > 0);
  }
  CHECK(settings_seen.size() >= 10);  // it explored
  // The last row is the setting kept, with the score it was measured at.
  std::stringstream last(lines.back());
  std::vector<std::string> cols;
  for (std::string c; std::getline(last, c, ',');) cols.push_back(c);
  CHECK(cols.size() == 7 && std::stod(cols[6]) >= 0.9 * max_row);
  std::remove(log_path.c_str());

  // Tuning off, or on a worker: Observe never attaches anything.
  Settings off = s;
  off.autotune.enabled = false;
  Autotune idle(off, 0, &log);
  CHECK(idle.Start().ok() && !idle.tuning());
  ResponseList l;
  l.responses.resize(1);
  for (int i = 0; i < 100; ++i) idle.Observe(&l, now), worker.Observe(&l, now);
  CHECK(!l.tuned.present);
  // An unwritable log is an error naming it.
  Settings bad = s;
  bad.autotune.log_path = "/nonexistent-dir/x.csv";
  Autotune b(bad, 0, &log);
  Status st = b.Start();
  CHECK(!st.ok() && st.message().find("/nonexistent-dir/x.csv") != std::string::npos);
}

// Fixed knobs stay as the user set them.
void TestFixedKnobs() {
  Settings s;
  s.log_level = LogLevel::kError;
  s.autotune.enabled = true;
  s.autotune.warmup_samples = 0;
  s.autotune.steps_per_sample = 1;
  s.autotune.bayes_opt_max_samples = 5;
  s.autotune.fusion_threshold_fixed = true;
  s.fusion_threshold_bytes = 1234;
  Logger log(s.log_level, 0);
  Autotune tuner(s, 0, &log);
  CHECK(tuner.Start().ok());
  Settings applied = s;
  Autotune::Clock::time_point now{};
  std::set<double> cycles;
  for (int i = 0; i < 1000 && tuner.tuning(); ++i) {
    ResponseList list;
    list.responses.resize(1);
    list.responses[0].names = {"t"};
    list.responses[0].sizes = {10};
    now += std::chrono::microseconds(100);
    tuner.Observe(&list, now);
    tuner.Apply(list.tuned, &applied, nullptr);
    CHECK(applied.fusion_threshold_bytes == 1234);
    cycles.insert(applied.cycle_time_ms);
  }
  CHECK(!tuner.tuning() && cycles.size() >= 3);
  // Everything fixed: nothing to tune.
  s.autotune.cycle_time_fixed = s.autotune.cache_fixed = true;
  Autotune none(s, 0, &log);
  CHECK(!none.tuning() && none.State().find("tuning=0") != std::string::npos);
}

Request Req(int rank, const std::string& name) {
  Request r;
  r.rank = rank;
  r.name = name;
  r.params.dtype = DataType::kFloat32;
  r.params.shape = Shape({4});
  return r;
}

// Both ranks ask for `names` (rank 1 as slot ids where `ids` says so).
ResponseList Round(Coordinator* c, const std::vector<std::string>& names, ResponseCache* cache,
                   bool rank1_ids) {
  auto now = Coordinator::Clock::now();
  for (int rank = 0; rank < 2; ++rank) {
    RequestList l;
    for (const std::string& n : names) {
      const int32_t id = cache->Lookup(n, Req(rank, n).params);
      if (rank == 1 && rank1_ids && id >= 0) {
        l.cached_ids.push_back(id);
        l.cached_sets.push_back(0);
      } else {
        l.requests.push_back(Req(rank, n));
      }
    }
    c->AddRequests(rank, l, now);
  }
  return c->Compute(now);
}

size_t Names(const ResponseList& l) {
  size_t n = 0;
  for (const Response& r : l.responses) n += r.kind == ResponseKind::kCollective ? r.names.size() : 0;
  return n;
}

bool AnyCacheId(const ResponseList& l) {
  for (const Response& r : l.responses) {
    for (int32_t id : r.cache_ids) {
      if (id >= 0) return true;
    }
  }
  return false;
}

// Apply() reaches the coordinator: the fusion threshold and the cache switch
// take effect from the next round, and requests sent under the old setting
// (slot ids in flight) still complete.
void TestCoordinatorFollows() {
  Settings s;
  s.log_level = LogLevel::kFatal;
  ResponseCache cache(16);
  Logger log(s.log_level, 0);
  Coordinator c(2, s, &cache, &log);
  Autotune worker(s, 1, &log);
  ResponseList l = Round(&c, {"a", "b"}, &cache, false);
  CHECK(l.responses.size() == 1 && Names(l) == 2 && AnyCacheId(l));  // fused, cached
  for (size_t i = 0; i < l.responses[0].names.size(); ++i) {
    cache.Insert(l.responses[0].cache_ids[i], l.responses[0].names[i], Req(0, "a").params);
  }
  CHECK(Round(&c, {"a", "b"}, &cache, true).responses.size() == 1);
  TunedParams p{true, 0, 0, true, true, 1};  // no fusion
  worker.Apply(p, &s, &c);
  l = Round(&c, {"a", "b"}, &cache, true);
  CHECK(l.responses.size() == 2 && Names(l) == 2);
  p = {true, 1 << 20, 0, false, true, 2};  // fusion again, cache off
  worker.Apply(p, &s, &c);
  CHECK(!s.cache_enabled && s.fusion_threshold_bytes == 1 << 20);
  l = Round(&c, {"a", "b"}, &cache, true);  // rank 1 still sends slot ids
  CHECK(l.responses.size() == 1 && Names(l) == 2 && !c.HasPending());
  l = Round(&c, {"fresh"}, &cache, false);
  CHECK(Names(l) == 1 && !AnyCacheId(l));  // no new slots while off
  p.cache_enabled = true;
  worker.Apply(p, &s, &c);
  l = Round(&c, {"newer"}, &cache, false);
  CHECK(Names(l) == 1 && AnyCacheId(l));
  l = Round(&c, {"a", "b"}, &cache, true);
  CHECK(l.responses.size() == 1 && Names(l) == 2 && !c.HasPending());
  // A rank with the cache capacity at 0 never turns it on.
  Settings none = s;
  none.cache_capacity = 0;
  worker.Apply(p, &none, nullptr);
  CHECK(!none.cache_enabled);
}

}  // namespace

int main() {
  TestGaussianProcess();
  TestExpectedImprovement();
  TestBayesianOptimizer();
  TestSettings();
  TestWire();
  TestTuningLoop();
  TestFixedKnobs();
  TestCoordinatorFollows();
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
