// The harness's tables.  Bench: allreduce bandwidth of tfhvd against the raw
// ncclAllReduce on the same GPUs in the same run, out of place, with every
// buffer allocated before the timed loop.  BenchCopy: the copy/scale kernels
// (cuda/gpu_kernels.cu through cuda/device_kernels.h) against cudaMemcpy
// device to device.  Figures are GB/s (1e9 bytes per second).
#include <nccl.h>

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

// Seconds per call of `f`, after two warm-up calls; `sync` waits for the
// GPU and `barrier` lines the ranks up.
double Time(int iters, const std::function<void()>& f, const std::function<void()>& sync,
            const std::function<void()>& barrier) {
  f();
  f();
  sync();
  barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) f();
  sync();
  return std::chrono::duration<double>(Clock::now() - t0).count() / iters;
}

}  // namespace

void Bench(const Env& env, int iters) {
  auto rt = core::CurrentRuntime();
  core::Collectives* host = rt->backend()->collectives(-1);
  core::Collectives* gpu = rt->backend()->collectives(env.device);
  ncclUniqueId id;
  if (env.rank == 0) ncclGetUniqueId(&id);
  host->Broadcast(&id, sizeof(id), 0);
  ncclComm_t comm;
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (ncclCommInitRank(&comm, env.size, id, env.rank) != ncclSuccess) {
    std::printf("FAIL bench: ncclCommInitRank of the raw communicator failed\n");
    return;
  }
  const double bus = env.size > 1 ? 2.0 * (env.size - 1) / env.size : 1.0;
  if (env.rank == 0) {
    std::printf("\nallreduce float32 sum, out of place, %d rank(s), %d iterations, GB/s "
                "(algbw = bytes/time; busbw = algbw * 2(n-1)/n%s)\n",
                env.size, iters, env.size > 1 ? "" : "; 1 rank: busbw shown = algbw");
    std::printf("%9s | %8s %8s | %8s %8s %6s | %8s %8s %6s\n", "size", "raw alg", "raw bus",
                "backend", "bus", "/raw", "runtime", "bus", "/raw");
  }
  auto barrier = [&] { host->Barrier(); };
  for (int64_t mib : {1, 4, 16, 64, 256}) {
    const int64_t bytes = mib << 20, n = bytes / 4;
    auto send = std::make_shared<Buffer>(DataType::kFloat32, core::Shape{n}, env.device);
    auto recv = std::make_shared<Buffer>(DataType::kFloat32, core::Shape{n}, env.device);
    cudaMemset(send->mutable_data(), 0, bytes);
    cudaDeviceSynchronize();
    if (send->data() == nullptr || recv->data() == nullptr) {
      std::printf("FAIL bench: cannot allocate 2 x %ld MiB\n", static_cast<long>(mib));
      break;
    }
    // Made once: Run() builds its entries from these fields and allocates
    // nothing (the output is preallocated).
    Op op = MakeOp("bench." + std::to_string(mib), CollectiveType::kAllreduce, send);
    op.output = recv;
    double raw = Time(
        iters,
        [&] { ncclAllReduce(send->data(), recv->mutable_data(), n, ncclFloat32, ncclSum, comm,
                            stream); },
        [&] { cudaStreamSynchronize(stream); }, barrier);
    double backend = Time(
        iters,
        [&] { gpu->Allreduce(send->data(), recv->mutable_data(), n, DataType::kFloat32,
                             core::ReduceOp::kSum); },
        [&] { gpu->Synchronize(); }, barrier);
    double runtime = Time(iters, [&] { Run({&op}); }, [] {}, barrier);
    if (env.rank == 0) {
      auto gb = [&](double s) { return bytes / s / 1e9; };
      std::printf("%5ld MiB | %8.1f %8.1f | %8.1f %8.1f %6.2f | %8.1f %8.1f %6.2f\n",
                  static_cast<long>(mib), gb(raw), gb(raw) * bus, gb(backend), gb(backend) * bus,
                  raw / backend, gb(runtime), gb(runtime) * bus, raw / runtime);
    }
  }
  ncclCommDestroy(comm);
  cudaStreamDestroy(stream);
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
  std::printf("\ncopy/scale kernels (%s, %d SMs) vs cudaMemcpyAsync device to device, %d "
              "iterations, GB/s of bytes copied (HBM traffic is twice that)\n",
              kernels.image().c_str(), kernels.sm_count(), iters);
  std::printf("%9s | %10s %10s %10s %12s %12s\n", "size", "cudaMemcpy", "kernel copy",
              "kernel x0.5", "64 copies k", "64 memcpys");
  auto sync = [&] { cudaStreamSynchronize(stream); };
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
    auto one = [&](double factor) {
      core::cuda::CopyBatch b;
      b.n = 1;
      b.tasks[0] = core::cuda::CopyTask{src, dst, n, factor,
                                        static_cast<int32_t>(DataType::kFloat32)};
      return b;
    };
    core::cuda::CopyBatch many;
    many.n = core::cuda::kMaxBatch;
    const int64_t part = n / many.n;
    for (int i = 0; i < many.n; ++i) {
      many.tasks[i] = core::cuda::CopyTask{static_cast<float*>(src) + i * part,
                                           static_cast<float*>(dst) + i * part, part, 1.0,
                                           static_cast<int32_t>(DataType::kFloat32)};
    }
    const core::cuda::CopyBatch copy = one(1.0), scale = one(0.5);
    double memcpy_s = Time(iters, [&] {
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream); }, sync, [] {});
    double copy_s = Time(iters, [&] { kernels.LaunchBatchedScaledCopy(copy, stream); }, sync,
                         [] {});
    double scale_s = Time(iters, [&] { kernels.LaunchBatchedScaledCopy(scale, stream); }, sync,
                          [] {});
    double many_s = Time(iters, [&] { kernels.LaunchBatchedScaledCopy(many, stream); }, sync,
                         [] {});
    double memcpys_s = Time(iters, [&] {
      for (int i = 0; i < many.n; ++i) {
        cudaMemcpyAsync(many.tasks[i].dst, many.tasks[i].src, part * 4, cudaMemcpyDeviceToDevice,
                        stream);
      }
    }, sync, [] {});
    auto gb = [&](double s) { return bytes / s / 1e9; };
    std::printf("%5ld MiB | %10.1f %10.1f %10.1f %12.1f %12.1f\n", static_cast<long>(mib),
                gb(memcpy_s), gb(copy_s), gb(scale_s), gb(many_s), gb(memcpys_s));
    cudaFree(src);
    cudaFree(dst);
  }
  cudaStreamDestroy(stream);
}

}  // namespace harness
