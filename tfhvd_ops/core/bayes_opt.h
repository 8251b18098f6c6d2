// Bayesian optimisation for autotune (autotune.h): a Gaussian process over a
// few continuous knobs, and expected improvement to pick the next point.
//
// Small and dependency-free on purpose: the tuner sees a few dozen samples
// in at most a handful of dimensions, so a dense Cholesky factorisation
// (O(n^3) with n the number of samples) and a fixed candidate set are cheap.
//
// The GaussianProcess works in the unit cube [0,1]^d with standardised
// targets (zero mean, unit variance): one squared-exponential kernel of unit
// signal variance, `noise` added to its diagonal (a variance, in units of the
// standardised score), and the length scale picked from a short grid by the
// log marginal likelihood.  The BayesianOptimizer maps the knobs' bounds to
// that cube and back.  Everything is deterministic: the candidates are a
// Halton sequence plus small moves around the best samples, so the same
// samples always give the same next point.
#ifndef TFHVD_CORE_BAYES_OPT_H_
#define TFHVD_CORE_BAYES_OPT_H_

#include <cstddef>
#include <utility>
#include <vector>

namespace tfhvd {

using Point = std::vector<double>;

class GaussianProcess {
 public:
  explicit GaussianProcess(double noise) : noise_(noise) {}
  // Fits the process to `x` (points of [0,1]^d) and `y`.  Returns false when
  // there is nothing to fit or no length scale gives a factorisable kernel.
  bool Fit(const std::vector<Point>& x, const std::vector<double>& y);
  // Posterior mean and standard deviation at `x`, in the units of y.
  void Predict(const Point& x, double* mean, double* stddev) const;
  double length_scale() const { return length_scale_; }

 private:
  double Kernel(const Point& a, const Point& b, double ls) const;
  // Factorises K + noise*I for length scale `ls` into lower_; returns the log
  // marginal likelihood, or -inf when the matrix is not positive definite.
  double Factor(double ls);

  double noise_;
  double length_scale_ = 0.3;
  std::vector<Point> x_;
  std::vector<double> z_;      // standardised y
  double y_mean_ = 0, y_std_ = 1;
  std::vector<double> lower_;  // Cholesky factor L (row-major n x n)
  std::vector<double> alpha_;  // (K + noise I)^-1 z
};

// Expected improvement of a point whose prediction is (mean, stddev) over
// the best value so far, when maximising; `xi` >= 0 favours exploration.
double ExpectedImprovement(double mean, double stddev, double best, double xi);

class BayesianOptimizer {
 public:
  // One (low, high) pair per dimension, in the knobs' own units.
  BayesianOptimizer(std::vector<std::pair<double, double>> bounds, double noise);
  void AddSample(const Point& x, double y);
  // The point (in the knobs' units) with the largest expected improvement.
  // With no samples yet: the centre of the box.
  Point NextSample() const;
  size_t dims() const { return bounds_.size(); }
  size_t samples() const { return y_.size(); }
  // The best sample so far (empty when none).
  Point BestPoint() const;
  double BestValue() const;
  // Unit cube <-> knob units.
  Point ToUnit(const Point& x) const;
  Point FromUnit(const Point& u) const;

 private:
  std::vector<std::pair<double, double>> bounds_;
  double noise_;
  std::vector<Point> x_;  // in the unit cube
  std::vector<double> y_;
};

}  // namespace tfhvd

#endif  // TFHVD_CORE_BAYES_OPT_H_
