// The TensorFlow-free harness of the NCCL backend: device tensors and op
// contexts that stand in for a framework's, a way to run entries through
// the real runtime (negotiation, fusion, executor, NCCL collectives) and
// wait for them, and a tiny check registry.  harness_checks.cc holds the
// checks and the bandwidth table; nccl_harness.cc is main().
#ifndef TFHVD_TESTS_GPU_HARNESS_H_
#define TFHVD_TESTS_GPU_HARNESS_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../../tfhvd_ops/core/backend.h"
#include "../../tfhvd_ops/core/common.h"

namespace harness {

namespace core = ::tfhvd;

// A tensor in device memory (or host memory when device < 0).
class Buffer : public core::Tensor {
 public:
  Buffer(core::DataType dt, core::Shape shape, int device);
  ~Buffer() override;
  core::DataType dtype() const override { return dtype_; }
  const core::Shape& shape() const override { return shape_; }
  const void* data() const override { return data_; }
  void* mutable_data() override { return data_; }
  int64_t size_bytes() const override { return bytes_; }
  std::shared_ptr<core::ReadyEvent> ready_event() const override { return event_; }
  void set_ready_event(std::shared_ptr<core::ReadyEvent> e) { event_ = std::move(e); }
  int device() const { return device_; }

  // Element i as a double, and back (any dtype; copies through the host).
  std::vector<double> Read() const;
  void Write(const std::vector<double>& values);

 private:
  core::DataType dtype_;
  core::Shape shape_;
  int device_;
  int64_t bytes_ = 0;
  void* data_ = nullptr;
  std::shared_ptr<core::ReadyEvent> event_;
};

// Allocates outputs on the tensor's device, except output 1 (alltoall's
// received splits), which a framework keeps in host memory.
class Context : public core::OpContext {
 public:
  Context(int device, core::DataType dtype) : device_(device), dtype_(dtype) {}
  core::Status AllocateOutput(int index, const core::Shape& shape,
                              std::shared_ptr<core::Tensor>* out) override;
  // The "framework's" device allocator (TensorFlow's in the library): device
  // ops hand the GPU fusion buffer out from here.
  bool HasDeviceAllocator() const override { return device_ >= 0; }
  core::Status AllocateDeviceBuffer(int64_t bytes, std::shared_ptr<core::Tensor>* out) override;
  std::vector<std::shared_ptr<core::Tensor>> outputs;

 private:
  int device_;
  core::DataType dtype_;
};

struct Op {
  std::string name;
  core::CollectiveParams params;
  std::shared_ptr<Buffer> input;
  std::shared_ptr<Buffer> output;          // preallocated for allreduce/broadcast
  std::shared_ptr<Context> context;
  core::Status status;
};

// Makes an op on `device` for `input`; allreduce and broadcast get an output
// of the same shape.
// How many device buffers Context::AllocateDeviceBuffer handed out (all threads).
int DeviceBufferAllocations();

Op MakeOp(const std::string& name, core::CollectiveType type, std::shared_ptr<Buffer> input);
// Enqueues the ops as one group and waits for every callback.
core::Status Run(std::vector<Op*> ops);
// Enqueues the ops as one group and returns; `done` is called once per op,
// from the runtime's threads.  Sets each op's status before calling it.
core::Status Submit(std::vector<Op*> ops, std::function<void(Op*)> done);
// Counts callbacks: Wait(n) returns once n have arrived, or false after
// `timeout_s`.
class Countdown {
 public:
  void Add();
  bool Wait(int n, double timeout_s = 600);
  int count();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_ = 0;
};
// The output after Run: the preallocated one, or the first allocated.
std::shared_ptr<core::Tensor> Output(const Op& op, int index = 0);
std::vector<double> ReadTensor(const core::Tensor& t);

struct Env {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int device = 0;  // -1: host tensors (--host)
  bool hierarchical = false;
};

// Checks: each returns "" on success or what went wrong.
using Check = std::function<std::string(const Env&)>;
// gpu == false: the checks that also make sense on host tensors (--host).
void AddChecks(bool gpu, std::vector<std::pair<std::string, Check>>* checks);
// harness_bench.cc: allreduce microseconds per call against raw
// ncclAllReduce (each call waited for, and pipelined), and the copy/scale
// kernels against cudaMemcpyAsync.
void Bench(const Env& env, int iters);
void BenchCopy(const Env& env, int iters);
// A raw NCCL communicator over the same ranks and GPU as the runtime (its
// id travels over the runtime's host collectives), with a stream of its own:
// what the tables compare with.  `host` lines the ranks up (Barrier).
struct RawNccl {
  explicit RawNccl(const Env& env);
  ~RawNccl();
  bool ok = false;
  core::Collectives* host = nullptr;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};
// harness_step.cc: one training step's gradients (ResNet-50, BERT-base)
// through the runtime against raw NCCL.
void BenchStep(const Env& env, int iters);

}  // namespace harness

#endif  // TFHVD_TESTS_GPU_HARNESS_H_
