#include "bayes_opt.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tfhvd {
namespace {

constexpr double kPi = 3.14159265358979323846;
// Length scales tried by Fit (unit-cube units).
constexpr double kLengthScales[] = {0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.7, 1.0, 1.5};
constexpr double kJitter = 1e-9;   // keeps a noise-free kernel factorisable
constexpr int kHaltonPoints = 2048;
constexpr double kExploration = 0.01;
// A candidate closer than this to a sample is not worth measuring again.
constexpr double kMinDistance = 1e-3;

// The i-th element of the Halton sequence in base `base` (i >= 1).
double Halton(int i, int base) {
  double f = 1, r = 0;
  while (i > 0) {
    f /= base;
    r += f * (i % base);
    i /= base;
  }
  return r;
}

double Clamp01(double v) { return std::min(1.0, std::max(0.0, v)); }

double SquaredDistance(const Point& a, const Point& b) {
  double d = 0;
  for (size_t k = 0; k < a.size(); ++k) d += (a[k] - b[k]) * (a[k] - b[k]);
  return d;
}

}  // namespace

double GaussianProcess::Kernel(const Point& a, const Point& b, double ls) const {
  return std::exp(-SquaredDistance(a, b) / (2 * ls * ls));
}

double GaussianProcess::Factor(double ls) {
  const size_t n = x_.size();
  lower_.assign(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j <= i; ++j) {
      double s = Kernel(x_[i], x_[j], ls) + (i == j ? noise_ + kJitter : 0.0);
      for (size_t k = 0; k < j; ++k) s -= lower_[i * n + k] * lower_[j * n + k];
      if (i == j) {
        if (!(s > 0)) return -std::numeric_limits<double>::infinity();
        lower_[i * n + i] = std::sqrt(s);
      } else {
        lower_[i * n + j] = s / lower_[j * n + j];
      }
    }
  }
  // alpha = L^T \ (L \ z)
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    double s = z_[i];
    for (size_t k = 0; k < i; ++k) s -= lower_[i * n + k] * v[k];
    v[i] = s / lower_[i * n + i];
  }
  alpha_.assign(n, 0.0);
  for (size_t i = n; i-- > 0;) {
    double s = v[i];
    for (size_t k = i + 1; k < n; ++k) s -= lower_[k * n + i] * alpha_[k];
    alpha_[i] = s / lower_[i * n + i];
  }
  double log_det = 0, fit = 0;
  for (size_t i = 0; i < n; ++i) {
    log_det += std::log(lower_[i * n + i]);
    fit += z_[i] * alpha_[i];
  }
  return -0.5 * fit - log_det - 0.5 * n * std::log(2 * kPi);
}

bool GaussianProcess::Fit(const std::vector<Point>& x, const std::vector<double>& y) {
  if (x.empty() || x.size() != y.size()) return false;
  x_ = x;
  const double n = static_cast<double>(y.size());
  y_mean_ = 0;
  for (double v : y) y_mean_ += v / n;
  double var = 0;
  for (double v : y) var += (v - y_mean_) * (v - y_mean_) / n;
  y_std_ = var > 0 ? std::sqrt(var) : 1.0;
  z_.resize(y.size());
  for (size_t i = 0; i < y.size(); ++i) z_[i] = (y[i] - y_mean_) / y_std_;
  double best = -std::numeric_limits<double>::infinity(), best_ls = -1;
  for (double ls : kLengthScales) {
    const double lml = Factor(ls);
    if (lml > best) {
      best = lml;
      best_ls = ls;
    }
  }
  if (best_ls < 0) return false;
  length_scale_ = best_ls;
  Factor(length_scale_);
  return true;
}

void GaussianProcess::Predict(const Point& x, double* mean, double* stddev) const {
  const size_t n = x_.size();
  std::vector<double> k(n), v(n);
  double m = 0;
  for (size_t i = 0; i < n; ++i) {
    k[i] = Kernel(x, x_[i], length_scale_);
    m += k[i] * alpha_[i];
  }
  // var = k(x,x) - |L \ k|^2
  double var = 1.0;
  for (size_t i = 0; i < n; ++i) {
    double s = k[i];
    for (size_t j = 0; j < i; ++j) s -= lower_[i * n + j] * v[j];
    v[i] = s / lower_[i * n + i];
    var -= v[i] * v[i];
  }
  *mean = y_mean_ + y_std_ * m;
  *stddev = y_std_ * std::sqrt(std::max(var, 0.0));
}

double ExpectedImprovement(double mean, double stddev, double best, double xi) {
  const double gain = mean - best - xi;
  if (stddev <= 0) return std::max(gain, 0.0);
  const double z = gain / stddev;
  const double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
  const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * kPi);
  return gain * cdf + stddev * pdf;
}

BayesianOptimizer::BayesianOptimizer(std::vector<std::pair<double, double>> bounds, double noise)
    : bounds_(std::move(bounds)), noise_(noise) {}

Point BayesianOptimizer::ToUnit(const Point& x) const {
  Point u(x.size());
  for (size_t k = 0; k < x.size(); ++k) {
    const double span = bounds_[k].second - bounds_[k].first;
    u[k] = span > 0 ? Clamp01((x[k] - bounds_[k].first) / span) : 0.0;
  }
  return u;
}

Point BayesianOptimizer::FromUnit(const Point& u) const {
  Point x(u.size());
  for (size_t k = 0; k < u.size(); ++k) {
    x[k] = bounds_[k].first + Clamp01(u[k]) * (bounds_[k].second - bounds_[k].first);
  }
  return x;
}

void BayesianOptimizer::AddSample(const Point& x, double y) {
  x_.push_back(ToUnit(x));
  y_.push_back(y);
}

Point BayesianOptimizer::BestPoint() const {
  if (y_.empty()) return {};
  const size_t i = std::max_element(y_.begin(), y_.end()) - y_.begin();
  return FromUnit(x_[i]);
}

double BayesianOptimizer::BestValue() const {
  return y_.empty() ? -std::numeric_limits<double>::infinity()
                    : *std::max_element(y_.begin(), y_.end());
}

Point BayesianOptimizer::NextSample() const {
  const size_t d = bounds_.size();
  if (y_.empty()) return FromUnit(Point(d, 0.5));
  GaussianProcess gp(noise_);
  if (!gp.Fit(x_, y_)) return FromUnit(Point(d, 0.5));
  // The exploration margin, in the units of y.
  double spread = 0;
  for (double v : y_) spread = std::max(spread, std::fabs(v - y_[0]));
  const double xi = kExploration * (spread > 0 ? spread : 1.0);
  const double best = BestValue();
  static const int kPrimes[] = {2, 3, 5, 7, 11, 13, 17, 19};
  std::vector<Point> candidates;
  candidates.reserve(kHaltonPoints + 4 * d * y_.size() + 1);
  for (int i = 1; i <= kHaltonPoints; ++i) {
    Point c(d);
    for (size_t k = 0; k < d; ++k) c[k] = Halton(i, kPrimes[k % 8]);
    candidates.push_back(c);
  }
  // Small moves around each sample, and the middles of the box's faces.
  for (const Point& s : x_) {
    for (size_t k = 0; k < d; ++k) {
      for (double step : {-0.05, 0.05, -0.01, 0.01}) {
        Point c = s;
        c[k] = Clamp01(c[k] + step);
        candidates.push_back(c);
      }
    }
  }
  for (size_t k = 0; k < d; ++k) {
    for (double edge : {0.0, 1.0}) {
      Point c(d, 0.5);
      c[k] = edge;
      candidates.push_back(c);
    }
  }
  double best_ei = -1;
  Point pick = candidates[0];
  for (const Point& c : candidates) {
    bool near = false;
    for (const Point& s : x_) near |= SquaredDistance(c, s) < kMinDistance * kMinDistance;
    if (near) continue;
    double m, sd;
    gp.Predict(c, &m, &sd);
    const double ei = ExpectedImprovement(m, sd, best, xi);
    if (ei > best_ei) {
      best_ei = ei;
      pick = c;
    }
  }
  return FromUnit(pick);
}

}  // namespace tfhvd
