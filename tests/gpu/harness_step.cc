// BenchStep: one training step's gradients allreduced through the runtime
// as one step (every tensor enqueued as one group, as a DistributedOptimizer
// hands them over; the runtime fuses them into buffers of up to
// TFHVD_FUSION_THRESHOLD and pipelines the responses), against
//  - the floor: one raw ncclAllReduce of the same total bytes;
//  - no fusion: each tensor its own raw ncclAllReduce, back to back on one
//    stream, one wait at the end.
// Gradient sets, with their real shapes, made here:
//  - ResNet-50 (torchvision layout): 53 convolutions without bias, 53 batch
//    norms (weight, bias), the classifier (weight, bias): 161 tensors,
//    25,557,032 values;
//  - BERT-base (uncased, the encoder and pooler): embeddings (30522 words,
//    512 positions, 2 token types, LayerNorm), 12 layers of 16 tensors, the
//    pooler: 199 tensors, 109,482,240 values.
// float32 and float16.  Horovod's Compression.fp16 is a cast in the
// framework before and after the allreduce: its allreduce is the float16 row
// (the casts are not in this harness).  Sum, as the raw calls.
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "../../tfhvd_ops/core/backend.h"
#include "../../tfhvd_ops/core/c_api.h"
#include "../../tfhvd_ops/core/runtime.h"
#include "harness.h"

namespace harness {

namespace {

using Clock = std::chrono::steady_clock;
using core::Shape;

std::vector<Shape> ResNet50() {
  std::vector<Shape> s;
  auto conv = [&](int64_t out, int64_t in, int64_t k) {
    s.push_back({out, in, k, k});
    s.push_back({out});  // batch norm weight
    s.push_back({out});  // batch norm bias
  };
  conv(64, 3, 7);
  int64_t in = 64;
  const int blocks[4] = {3, 4, 6, 3};
  for (int layer = 0; layer < 4; ++layer) {
    const int64_t width = 64 << layer;
    for (int b = 0; b < blocks[layer]; ++b) {
      conv(width, in, 1);
      conv(width, width, 3);
      conv(width * 4, width, 1);
      if (b == 0) conv(width * 4, in, 1);  // the downsample branch
      in = width * 4;
    }
  }
  s.push_back({1000, 2048});
  s.push_back({1000});
  return s;
}

std::vector<Shape> BertBase() {
  const int64_t h = 768, ff = 3072;
  std::vector<Shape> s = {{30522, h}, {512, h}, {2, h}, {h}, {h}};
  for (int layer = 0; layer < 12; ++layer) {
    for (int i = 0; i < 4; ++i) {  // query, key, value, attention output
      s.push_back({h, h});
      s.push_back({h});
    }
    s.push_back({h});  // attention LayerNorm
    s.push_back({h});
    s.push_back({h, ff});  // intermediate
    s.push_back({ff});
    s.push_back({ff, h});  // output
    s.push_back({h});
    s.push_back({h});  // output LayerNorm
    s.push_back({h});
  }
  s.push_back({h, h});  // pooler
  s.push_back({h});
  return s;
}

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

void BenchStep(const Env& env, int iters) {
  RawNccl raw(env);
  if (!raw.ok) return;
  ncclComm_t comm = raw.comm;
  cudaStream_t stream = raw.stream;
  const int steps = std::max(3, iters / 4);
  if (env.rank == 0) {
    std::printf("\none training step's gradients, allreduce sum, %d rank(s), milliseconds per "
                "step (median of %d)\n", env.size, steps);
    std::printf("%-10s %-8s %7s %9s | %8s %9s %8s | %7s %8s\n", "model", "dtype", "tensors",
                "MiB", "floor", "separate", "tfhvd", "floor/t", "separ/t");
  }
  auto barrier = [&] { raw.host->Barrier(); };
  struct Model {
    const char* name;
    std::vector<Shape> shapes;
    int64_t values;
  };
  for (const Model& m : {Model{"ResNet-50", ResNet50(), 25557032},
                         Model{"BERT-base", BertBase(), 109482240}}) {
    int64_t values = 0;
    for (const Shape& s : m.shapes) values += core::NumElements(s);
    if (values != m.values && env.rank == 0) {
      std::printf("FAIL bench-step: %s has %ld values, want %ld\n", m.name,
                  static_cast<long>(values), static_cast<long>(m.values));
    }
    for (core::DataType dt : {core::DataType::kFloat32, core::DataType::kFloat16}) {
      const int64_t esize = core::DataTypeSize(dt);
      const ncclDataType_t nt = dt == core::DataType::kFloat32 ? ncclFloat32 : ncclFloat16;
      std::vector<Op> ops;
      bool ok = true;
      for (size_t i = 0; i < m.shapes.size(); ++i) {
        auto in = std::make_shared<Buffer>(dt, m.shapes[i], env.device);
        ok &= in->data() != nullptr;
        if (ok) cudaMemset(in->mutable_data(), 0, in->size_bytes());
        ops.push_back(MakeOp(std::string("step.") + m.name + "." + std::to_string(i),
                             core::CollectiveType::kAllreduce, in));
        ok &= ops.back().output->data() != nullptr;
      }
      void *flat_in = nullptr, *flat_out = nullptr;
      ok &= cudaMalloc(&flat_in, values * esize) == cudaSuccess &&
            cudaMalloc(&flat_out, values * esize) == cudaSuccess;
      if (!ok) {
        std::printf("FAIL bench-step: cannot allocate %s\n", m.name);
        cudaFree(flat_in);
        break;
      }
      cudaMemset(flat_in, 0, values * esize);
      cudaDeviceSynchronize();
      std::vector<Op*> all;
      for (Op& o : ops) all.push_back(&o);
      auto median = [&](const std::function<void()>& step) {
        step();  // warm-up (first: communicator, fusion buffer, cache)
        std::vector<double> t;
        for (int i = 0; i < steps; ++i) {
          barrier();
          const auto t0 = Clock::now();
          step();
          t.push_back(Seconds(t0));
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
      };
      const double floor = median([&] {
        ncclAllReduce(flat_in, flat_out, values, nt, ncclSum, comm, stream);
        cudaStreamSynchronize(stream);
      });
      const double separate = median([&] {
        for (Op& o : ops) {
          ncclAllReduce(o.input->data(), o.output->mutable_data(), o.input->size_bytes() / esize,
                        nt, ncclSum, comm, stream);
        }
        cudaStreamSynchronize(stream);
      });
      core::Status st;
      const double runtime = median([&] {
        core::Status s = Run(all);
        if (!s.ok()) st = s;
      });
      if (env.rank == 0) {
        std::printf("%-10s %-8s %7zu %9.1f | %8.2f %9.2f %8.2f | %7.2f %8.2f%s\n", m.name,
                    core::DataTypeName(dt), m.shapes.size(), values * esize / 1048576.0,
                    floor * 1e3, separate * 1e3, runtime * 1e3, floor / runtime,
                    separate / runtime, st.ok() ? "" : ("  FAILED: " + st.message()).c_str());
      }
      cudaFree(flat_in);
      cudaFree(flat_out);
    }
  }
}

}  // namespace harness
