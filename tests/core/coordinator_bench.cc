// The coordinator's CPU cost per negotiation round, without transports or
// TensorFlow: N tensors from 2 ranks, every one already in the response
// cache (a steady-state training step), as the runtime drives it:
//
//   worker:      cache lookups, Serialize(RequestList)           ("requests")
//   coordinator: AddRequests(own), Parse + AddRequests(worker's),
//                Compute, Serialize(ResponseList)                ("round")
//   worker:      Parse(ResponseList), cache inserts              ("responses")
//
//   build/tfhvd_coordinator_bench [rounds]
//
// Prints a markdown table: the 10th percentile and the median of each part
// (the 10th percentile is the machine's noise floor on a shared host).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../../tfhvd_ops/core/controller.h"
#include "../../tfhvd_ops/core/message.h"
#include "../../tfhvd_ops/core/response_cache.h"

namespace {

using Clock = tfhvd::Coordinator::Clock;
using Micros = std::chrono::duration<double, std::micro>;

struct Figures {
  std::vector<double> requests, round, responses;
};

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1))];
}

// Returns false when a round did not fuse the N tensors into one response.
bool Run(int n, int rounds, Figures* f) {
  tfhvd::Settings settings;
  tfhvd::Logger log(tfhvd::LogLevel::kError, 0);
  tfhvd::ResponseCache cache0(settings.cache_capacity), cache1(settings.cache_capacity);
  tfhvd::Coordinator coord(2, settings, &cache0, &log);
  std::vector<tfhvd::Request> reqs(n);
  for (int i = 0; i < n; ++i) {  // names as DistributedGradientTape makes them
    reqs[i].name = "DistributedGradientTape_Allreduce/cond_" + std::to_string(i) +
                   "/HorovodAllreduce_grads_" + std::to_string(i) + "_0";
    reqs[i].params.shape = {1024};
  }
  for (int round = 0; round < rounds + 50; ++round) {
    tfhvd::RequestList own;  // rank 0's, as its queue hands them over (TakeNew)
    own.requests = reqs;
    auto t0 = Clock::now();
    tfhvd::RequestList mine;  // the worker's (rank 1)
    for (const auto& r : reqs) {
      int32_t id = cache1.Lookup(r.name, r.params);
      if (id >= 0) {
        mine.cached_ids.push_back(id);
        mine.cached_sets.push_back(0);
      } else {
        mine.requests.push_back(r);
      }
    }
    std::string wire = tfhvd::Serialize(mine);
    auto t1 = Clock::now();
    coord.AddRequests(0, std::move(own), t1);
    tfhvd::RequestList got;
    if (!tfhvd::Parse(wire, &got)) return false;
    coord.AddRequests(1, std::move(got), t1);
    tfhvd::ResponseList out = coord.Compute(t1);
    std::string back = tfhvd::Serialize(out);
    auto t2 = Clock::now();
    tfhvd::ResponseList parsed;
    if (!tfhvd::Parse(back, &parsed)) return false;
    for (const auto& r : parsed.responses) {
      for (size_t i = 0; i < r.names.size() && i < r.cache_ids.size(); ++i) {
        if (r.cache_ids[i] >= 0) cache1.Insert(r.cache_ids[i], r.names[i], reqs[0].params);
      }
    }
    auto t3 = Clock::now();
    if (out.responses.size() != 1 || static_cast<int>(out.responses[0].names.size()) != n) {
      return false;
    }
    if (round < 50) continue;  // warm-up: the cache fills in round 0
    f->requests.push_back(Micros(t1 - t0).count());
    f->round.push_back(Micros(t2 - t1).count());
    f->responses.push_back(Micros(t3 - t2).count());
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3000;
  std::printf("| tensors | worker: requests (us) | coordinator: round (us) | "
              "worker: responses (us) | round per tensor (us) |\n|---:|---:|---:|---:|---:|\n");
  for (int n : {1, 16, 64, 256}) {
    Figures f;
    if (!Run(n, rounds, &f)) {
      std::fprintf(stderr, "N=%d: the round did not fuse the tensors into one response\n", n);
      return 1;
    }
    auto cell = [](const std::vector<double>& v) {
      char b[64];
      std::snprintf(b, sizeof(b), "%.2f (%.2f)", Quantile(v, 0.1), Quantile(v, 0.5));
      return std::string(b);
    };
    std::printf("| %d | %s | %s | %s | %.2f |\n", n, cell(f.requests).c_str(), cell(f.round).c_str(),
                cell(f.responses).c_str(), Quantile(f.round, 0.1) / n);
  }
  std::printf("\n10th percentile (median) of %d rounds each.\n", rounds);
  return 0;
}
