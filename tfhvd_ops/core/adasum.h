// Adasum: adaptive summation of gradients (Maleki et al., "Scaling
// Distributed Training with Adaptive Summation", MLSys 2021), the reduce op
// hvd.Adasum, over any host transport's point-to-point exchange
// (Collectives::SendRecv).
//
// Two vectors a and b combine as
//     adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
// which is a + b when they are orthogonal and their mean when they are
// parallel (a coefficient is 1 when its vector's squared norm is below 1e-8).
// N = 2^k ranks combine along a binary tree: at level 1 ranks (0,1), (2,3)
// ... combine, at level 2 the pairs' results combine, and so on.  A fused
// response is several tensors: each gets coefficients of its own (dot
// products and norms per tensor), as if it had been reduced alone.
//
// The tree runs as vector halving, distance doubling (Horovod's layout):
//  1. Level d = 1, 2, 4, ... < N: rank r and its neighbour r ^ d hold the
//     same window of the buffer.  The one whose bit d is clear keeps the
//     window's first half, the other the second; each sends the half it gives
//     up and receives the neighbour's copy of the half it keeps.
//  2. Each rank computes, per tensor, the partial dot product and squared
//     norms of the two halves it now holds (in double precision), and the
//     2d ranks that hold pieces of the same two subtree vectors sum these
//     partials (recursive doubling of 3 doubles per tensor), so every one
//     of them has the full dot product and norms of each tensor.
//  3. Each rank combines its half in place with the coefficients.
//  4. After the last level every rank holds 1/N of the result; the levels
//     run backwards, each rank exchanging its window with its neighbour,
//     until every rank has the whole reduced buffer.
// Every rank moves about 2 (N-1)/N of the buffer, as a ring allreduce does.
//
// Rank counts: a power of two (Horovod's rule; others are an error).  Types:
// float16, bfloat16, float32, float64, in host memory.
#ifndef TFHVD_CORE_ADASUM_H_
#define TFHVD_CORE_ADASUM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"

namespace tfhvd {

// OK when tensor `name` (of `dtype`, on `device`, -1 for host memory) can be
// reduced with Adasum over `set_size` ranks; else the error, naming it.
Status CheckAdasum(const std::string& name, DataType dtype, int device, int set_size);

// The combination of two vectors' coefficients, from their dot product and
// squared norms: what the tree applies at each node (exposed for tests).
double AdasumCoefficient(double dot, double own_norm_sq);

// Holds the scratch buffers of the reductions one executor runs.
class AdasumReducer {
 public:
  // Reduces `buf` in place over the `size` ranks of `c`, where this rank is
  // `rank`.  `buf` is the concatenation of tensors of `counts[i]` elements
  // of `dtype` (padding may belong to a tensor: zeros change nothing).  Every
  // rank calls with the same counts.
  Status Reduce(Collectives* c, int rank, int size, void* buf, DataType dtype,
                const std::vector<int64_t>& counts);

 private:
  std::vector<char> scratch_;   // the neighbour's half
  std::vector<double> sums_;    // per tensor: dot, |left|^2, |right|^2
  std::vector<double> peer_sums_;
};

}  // namespace tfhvd

#endif  // TFHVD_CORE_ADASUM_H_
