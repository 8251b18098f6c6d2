// The harness's tables (Design rule 12: the raw backend measured in the same
// run, side by side).
//
// Bench: allreduce float32 sum out of place, 4 KiB to 256 MiB, microseconds
// per call:
//  - waited: each call waited for (raw: ncclAllReduce + cudaStreamSynchronize
//    on a stream of its own; tfhvd: Run(), i.e. enqueue, negotiation, launch,
//    completion by the finalizer, the callback);
//  - pipelined: K calls issued back to back, then one wait for all (raw: K
//    ncclAllReduce then one sync; tfhvd: K ops enqueued one by one, each its
//    own name, then one wait for every callback; the runtime fuses what
//    arrives together, as it would for a framework).
// Each figure is the median of three runs of K calls; every buffer is
// allocated before the timed loops.
//
// BenchCopy: the copy/scale kernels (cuda/gpu_kernels.cu) against
// cudaMemcpyAsync device to device, 16 MiB to 1 GiB (GB/s), and a batch of
// 64 small copies as one kernel launch against 64 cudaMemcpyAsync calls
// (microseconds per batch).
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

#include "../../tfhvd_ops/core/backend.h"
#include "../../tfhvd_ops/core/c_api.h"
#include "../../tfhvd_ops/core/runtime.h"
#include "../../tfhvd_ops/cuda/device_kernels.h"
#include "harness.h"

namespace harness {
namespace {

using Clock = std::chrono::steady_clock;
using core::CollectiveType;
using core::DataType;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median over three runs of `iters` calls of `f`, in seconds per call, after
// two warm-up calls; `sync` waits for the GPU and `barrier` lines the ranks
// up before each run.
double Time(int iters, const std::function<void()>& f, const std::function<void()>& sync,
            const std::function<void()>& barrier) {
  f();
  f();
  sync();
  double runs[3];
  for (double& r : runs) {
    barrier();
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) f();
    sync();
    r = Seconds(t0) / iters;
  }
  std::sort(runs, runs + 3);
  return runs[1];
}

const char* SizeName(int64_t bytes, char* buf, size_t len) {
  if (bytes >= (1 << 20)) {
    std::snprintf(buf, len, "%ld MiB", static_cast<long>(bytes >> 20));
  } else {
    std::snprintf(buf, len, "%ld KiB", static_cast<long>(bytes >> 10));
  }
  return buf;
}

}  // namespace

RawNccl::RawNccl(const Env& env) {
  host = core::CurrentRuntime()->backend()->collectives(-1);
  ncclUniqueId id;
  if (env.rank == 0) ncclGetUniqueId(&id);
  host->Broadcast(&id, sizeof(id), 0);
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  ok = ncclCommInitRank(&comm, env.size, id, env.rank) == ncclSuccess;
  if (!ok) std::printf("FAIL bench: ncclCommInitRank of the raw communicator failed\n");
}

RawNccl::~RawNccl() {
  if (ok) ncclCommDestroy(comm);
  cudaStreamDestroy(stream);
}

void Bench(const Env& env, int iters) {
  RawNccl raw(env);
  if (!raw.ok) return;
  ncclComm_t comm = raw.comm;
  cudaStream_t stream = raw.stream;
  if (env.rank == 0) {
    std::printf("\nallreduce float32 sum, out of place, %d rank(s), microseconds per call "
                "(median of 3 runs of K calls; raw = ncclAllReduce on its own stream)\n",
                env.size);
    std::printf("%9s %5s | %9s %9s %8s %6s | %9s %9s %6s\n", "size", "K", "raw wait",
                "tfhvd", "+us", "raw/t", "raw pipe", "tfhvd", "raw/t");
  }
  auto barrier = [&] { raw.host->Barrier(); };
  for (int64_t bytes : {4LL << 10, 16LL << 10, 64LL << 10, 256LL << 10, 1LL << 20, 4LL << 20,
                        16LL << 20, 64LL << 20, 256LL << 20}) {
    const int64_t n = bytes / 4;
    const int k = bytes <= (1 << 20)    ? 10 * iters
                  : bytes <= (16 << 20) ? 2 * iters
                  : bytes <= (64 << 20) ? iters
                                        : std::max(5, iters / 2);
    auto send = std::make_shared<Buffer>(DataType::kFloat32, core::Shape{n}, env.device);
    auto recv = std::make_shared<Buffer>(DataType::kFloat32, core::Shape{n}, env.device);
    if (send->data() == nullptr || recv->data() == nullptr) {
      std::printf("FAIL bench: cannot allocate 2 x %ld bytes\n", static_cast<long>(bytes));
      break;
    }
    cudaMemset(send->mutable_data(), 0, bytes);
    cudaDeviceSynchronize();
    // Made once: Run() builds its entries from these fields and allocates
    // nothing (the outputs are preallocated; the pipelined ops share one).
    std::vector<Op> ops;
    for (int i = 0; i < k; ++i) {
      ops.push_back(MakeOp("bench." + std::to_string(bytes) + "." + std::to_string(i),
                           CollectiveType::kAllreduce, send));
      ops.back().output = recv;
    }
    auto raw_call = [&] {
      ncclAllReduce(send->data(), recv->mutable_data(), n, ncclFloat32, ncclSum, comm, stream);
    };
    auto raw_sync = [&] { cudaStreamSynchronize(stream); };
    const double raw_wait = Time(k, [&] { raw_call(); raw_sync(); }, [] {}, barrier);
    const double tf_wait = Time(k, [&] { Run({&ops[0]}); }, [] {}, barrier);
    const double raw_pipe = Time(k, raw_call, raw_sync, barrier);
    // Pipelined through the runtime: the k ops, each enqueued alone.
    double runs[3];
    bool failed = false;
    for (int warm = 0; warm < 4; ++warm) {
      Countdown done;
      if (warm >= 1) barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < k; ++i) {
        if (!Submit({&ops[i]}, [&](Op*) { done.Add(); }).ok()) failed = true;
      }
      if (!done.Wait(k)) failed = true;
      if (warm >= 1) runs[warm - 1] = Seconds(t0) / k;
    }
    for (const Op& o : ops) failed |= !o.status.ok();
    std::sort(runs, runs + 3);
    const double tf_pipe = runs[1];
    if (env.rank == 0) {
      char name[32];
      std::printf("%9s %5d | %9.1f %9.1f %8.1f %6.2f | %9.1f %9.1f %6.2f%s\n",
                  SizeName(bytes, name, sizeof(name)), k, raw_wait * 1e6, tf_wait * 1e6,
                  (tf_wait - raw_wait) * 1e6, raw_wait / tf_wait, raw_pipe * 1e6, tf_pipe * 1e6,
                  raw_pipe / tf_pipe, failed ? "  (an op FAILED)" : "");
    }
  }
}

void BenchCopy(const Env& env, int iters) {
  core::cuda::DeviceKernels kernels;
  core::Status st = kernels.Load(env.device);
  if (!st.ok()) {
    std::printf("FAIL bench-copy: %s\n", st.message().c_str());
    return;
  }
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::printf("\ncopy/scale kernels (%s, %d SMs) vs cudaMemcpyAsync device to device, median "
              "of 3 runs of %d, GB/s of bytes copied (HBM traffic is twice that)\n",
              kernels.image().c_str(), kernels.sm_count(), iters);
  std::printf("%9s | %10s %11s %6s %11s %6s\n", "size", "cudaMemcpy", "kernel copy", "/mcpy",
              "kernel x0.5", "/mcpy");
  auto sync = [&] { cudaStreamSynchronize(stream); };
  auto nothing = [] {};
  auto one = [](const void* src, void* dst, int64_t n, double factor) {
    core::cuda::CopyBatch b;
    b.n = 1;
    b.tasks[0] = core::cuda::CopyTask{src, dst, n, factor,
                                      static_cast<int32_t>(DataType::kFloat32)};
    return b;
  };
  for (int64_t mib : {16, 64, 256, 1024}) {
    const int64_t bytes = mib << 20, n = bytes / 4;
    void *src = nullptr, *dst = nullptr;
    if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&dst, bytes) != cudaSuccess) {
      std::printf("FAIL bench-copy: cannot allocate 2 x %ld MiB\n", static_cast<long>(mib));
      cudaFree(src);
      break;
    }
    cudaMemset(src, 0, bytes);
    cudaDeviceSynchronize();
    const core::cuda::CopyBatch copy = one(src, dst, n, 1.0), scale = one(src, dst, n, 0.5);
    double memcpy_s = Time(iters, [&] {
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream); }, sync, nothing);
    double copy_s = Time(iters, [&] { kernels.LaunchBatchedScaledCopy(copy, stream); }, sync,
                         nothing);
    double scale_s = Time(iters, [&] { kernels.LaunchBatchedScaledCopy(scale, stream); }, sync,
                          nothing);
    auto gb = [&](double s) { return bytes / s / 1e9; };
    std::printf("%5ld MiB | %10.1f %11.1f %6.2f %11.1f %6.2f\n", static_cast<long>(mib),
                gb(memcpy_s), gb(copy_s), memcpy_s / copy_s, gb(scale_s), memcpy_s / scale_s);
    cudaFree(src);
    cudaFree(dst);
  }
  // 64 small tensors, as a fused response's copies into the buffer.
  const int kMany = core::cuda::kMaxBatch;
  std::printf("\n%d small copies: one batched kernel launch vs %d cudaMemcpyAsync calls, "
              "microseconds per batch (median of 3 runs of %d)\n",
              kMany, kMany, 10 * iters);
  std::printf("%12s | %12s %12s %8s\n", "each tensor", "batch kernel", "64 memcpys",
              "mcpy/k");
  for (int64_t each : {256LL, 4LL << 10, 64LL << 10, 256LL << 10, 1LL << 20}) {
    const int64_t bytes = each * kMany;
    void *src = nullptr, *dst = nullptr;
    if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&dst, bytes) != cudaSuccess) {
      cudaFree(src);
      break;
    }
    cudaMemset(src, 0, bytes);
    cudaDeviceSynchronize();
    core::cuda::CopyBatch many;
    many.n = kMany;
    for (int i = 0; i < kMany; ++i) {
      many.tasks[i] = core::cuda::CopyTask{static_cast<char*>(src) + i * each,
                                           static_cast<char*>(dst) + i * each, each / 4, 1.0,
                                           static_cast<int32_t>(DataType::kFloat32)};
    }
    double many_s = Time(10 * iters, [&] { kernels.LaunchBatchedScaledCopy(many, stream); },
                         sync, nothing);
    double memcpys_s = Time(10 * iters, [&] {
      for (int i = 0; i < kMany; ++i) {
        cudaMemcpyAsync(many.tasks[i].dst, many.tasks[i].src, each, cudaMemcpyDeviceToDevice,
                        stream);
      }
    }, sync, nothing);
    char name[32];
    if (each < 1024) {
      std::snprintf(name, sizeof(name), "%ld B", static_cast<long>(each));
    } else {
      SizeName(each, name, sizeof(name));
    }
    std::printf("%12s | %12.1f %12.1f %8.2f\n", name, many_s * 1e6, memcpys_s * 1e6,
                memcpys_s / many_s);
    cudaFree(src);
    cudaFree(dst);
  }
  cudaStreamDestroy(stream);
}

}  // namespace harness
