// tfhvd_nccl_harness: checks tfhvd's NCCL backend without TensorFlow.
//
//   tfhvd_nccl_harness [--bench] [--bench-copy] [--bench-step] [--iters N] [--require-gpu]
//                      [--host] [--only TEXT] [--flat] [--loop N]
//   mpirun -np <GPUs> tfhvd_nccl_harness            (the MPI build, CMake)
//   TFHVD_HARNESS_RANK=r TFHVD_HARNESS_SIZE=n ...   (the socket build of
//                                                    tests/gpu/device_check.sh)
//
// On a machine without an NVIDIA driver it prints why and exits 0 (3 with
// --require-gpu), so a CPU machine can still run it to prove that it links
// and loads.  On a machine with one (/dev/nvidiactl), finding no CUDA device
// is a failure, never a skip.  Each check runs twice: with the flat
// allreduce and with TFHVD_HIERARCHICAL_ALLREDUCE=1.  --bench: the
// allreduce tables (microseconds per call, waited and pipelined, against raw
// NCCL); --bench-copy: the copy/scale kernels against cudaMemcpyAsync;
// --bench-step: a training step's gradients (harness_step.cc).  --host: the same runtime and transports on host tensors, no
// GPU needed (a CPU machine checks the harness's own plumbing so).  --only
// TEXT: only the checks whose name contains TEXT (the fault cases of
// tests/gpu/fake_cuda/run_fake_gpu.sh); --flat: without the hierarchical
// round (after a fault the device may be stuck for good); --loop N: instead
// of the checks, N allreduces in a row (a peer is killed meanwhile in the
// lost-peer runs of device_check.sh and run_fake_gpu.sh).  The last
// line is "N passed, N failed".
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "../../tfhvd_ops/core/c_api.h"
#include "harness.h"

namespace harness {

Buffer::Buffer(core::DataType dt, core::Shape shape, int device)
    : dtype_(dt), shape_(std::move(shape)), device_(device) {
  bytes_ = core::NumElements(shape_) * core::DataTypeSize(dt);
  if (bytes_ == 0) return;
  if (device_ >= 0) {
    cudaSetDevice(device_);
    if (cudaMalloc(&data_, bytes_) != cudaSuccess) data_ = nullptr;
    if (data_ != nullptr) cudaMemset(data_, 0xff, bytes_);  // garbage until written
    // The legacy default stream does not order the backend's non-blocking
    // stream: finish the memset before anyone else touches the buffer.  (That
    // stream only: after an injected NCCL failure the backend's stream may be
    // stuck until its communicator is aborted, as on a GPU.)
    cudaStreamSynchronize(nullptr);
  } else {
    data_ = std::calloc(1, bytes_);
  }
}

Buffer::~Buffer() {
  if (data_ == nullptr) return;
  if (device_ >= 0) {
    cudaFree(data_);
  } else {
    std::free(data_);
  }
}

namespace {

double Get(const void* p, core::DataType dt, int64_t i) {
  switch (dt) {
    case core::DataType::kUInt8: return static_cast<const uint8_t*>(p)[i];
    case core::DataType::kInt8: return static_cast<const int8_t*>(p)[i];
    case core::DataType::kUInt16: return static_cast<const uint16_t*>(p)[i];
    case core::DataType::kInt16: return static_cast<const int16_t*>(p)[i];
    case core::DataType::kInt32: return static_cast<const int32_t*>(p)[i];
    case core::DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case core::DataType::kFloat32: return static_cast<const float*>(p)[i];
    case core::DataType::kFloat64: return static_cast<const double*>(p)[i];
    case core::DataType::kBool: return static_cast<const uint8_t*>(p)[i];
    case core::DataType::kFloat16:
    case core::DataType::kBFloat16: {
      uint16_t h = static_cast<const uint16_t*>(p)[i];
      uint32_t bits;
      if (dt == core::DataType::kBFloat16) {
        bits = static_cast<uint32_t>(h) << 16;
      } else {  // normal numbers and zero are all the checks use
        uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
        bits = (h & 0x8000u) << 16 | (e == 0 ? 0 : ((e + 112) << 23 | m << 13));
      }
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
  }
  return 0;
}

void Set(void* p, core::DataType dt, int64_t i, double v) {
  switch (dt) {
    case core::DataType::kUInt8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case core::DataType::kInt8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case core::DataType::kUInt16: static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(v); break;
    case core::DataType::kInt16: static_cast<int16_t*>(p)[i] = static_cast<int16_t>(v); break;
    case core::DataType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case core::DataType::kInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case core::DataType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case core::DataType::kFloat64: static_cast<double*>(p)[i] = v; break;
    case core::DataType::kBool: static_cast<uint8_t*>(p)[i] = v != 0; break;
    case core::DataType::kFloat16:
    case core::DataType::kBFloat16: {
      float f = static_cast<float>(v);
      uint32_t x;
      std::memcpy(&x, &f, 4);
      uint16_t h;
      if (dt == core::DataType::kBFloat16) {
        h = static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
      } else if ((x & 0x7fffffffu) == 0) {
        h = static_cast<uint16_t>(x >> 16);
      } else {  // small integers and halves only: exact
        h = static_cast<uint16_t>((x >> 16 & 0x8000u) | (((x >> 23 & 0xff) - 112) << 10) |
                                  (x >> 13 & 0x3ffu));
      }
      static_cast<uint16_t*>(p)[i] = h;
      break;
    }
  }
}

std::vector<double> ReadRaw(const void* data, int64_t bytes, core::DataType dt, int device) {
  std::vector<char> host(bytes);
  if (bytes > 0) {
    if (device >= 0) {
      cudaMemcpy(host.data(), data, bytes, cudaMemcpyDeviceToHost);
    } else {
      std::memcpy(host.data(), data, bytes);
    }
  }
  const int64_t n = bytes / core::DataTypeSize(dt);
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = Get(host.data(), dt, i);
  return out;
}

}  // namespace

std::vector<double> Buffer::Read() const { return ReadRaw(data_, bytes_, dtype_, device_); }

void Buffer::Write(const std::vector<double>& values) {
  std::vector<char> host(bytes_);
  for (size_t i = 0; i < values.size(); ++i) Set(host.data(), dtype_, i, values[i]);
  if (device_ >= 0) {
    // A pageable copy may return before its DMA lands, and the backend's
    // stream does not wait for the default stream: synchronise.
    cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice);
    cudaStreamSynchronize(nullptr);
  } else if (bytes_ > 0) {
    std::memcpy(data_, host.data(), bytes_);
  }
}

std::vector<double> ReadTensor(const core::Tensor& t) {
  auto* b = dynamic_cast<const Buffer*>(&t);
  return ReadRaw(t.data(), t.size_bytes(), t.dtype(), b ? b->device() : -1);
}

core::Status Context::AllocateOutput(int index, const core::Shape& shape,
                                     std::shared_ptr<core::Tensor>* out) {
  auto b = std::make_shared<Buffer>(index == 1 ? core::DataType::kInt32 : dtype_, shape,
                                    index == 1 ? -1 : device_);
  outputs.push_back(b);
  *out = b;
  return core::Status::OK();
}

namespace {
std::atomic<int> device_buffers{0};
}  // namespace

core::Status Context::AllocateDeviceBuffer(int64_t bytes, std::shared_ptr<core::Tensor>* out) {
  auto b = std::make_shared<Buffer>(core::DataType::kUInt8, core::Shape{bytes}, device_);
  if (b->mutable_data() == nullptr) {
    return core::Status::Internal("the harness's device allocator is out of memory");
  }
  ++device_buffers;
  *out = b;
  return core::Status::OK();
}

int DeviceBufferAllocations() { return device_buffers.load(); }

Op MakeOp(const std::string& name, core::CollectiveType type, std::shared_ptr<Buffer> input) {
  Op op;
  op.name = name;
  op.params.type = type;
  op.params.dtype = input->dtype();
  op.params.shape = input->shape();
  op.params.device = input->device();
  op.input = input;
  if (type == core::CollectiveType::kAllreduce || type == core::CollectiveType::kBroadcast) {
    op.output = std::make_shared<Buffer>(input->dtype(), input->shape(), input->device());
  }
  op.context = std::make_shared<Context>(input->device(), input->dtype());
  return op;
}

core::Status Run(std::vector<Op*> ops) {
  std::vector<std::promise<core::Status>> done(ops.size());
  std::vector<core::TensorTableEntry> entries;
  for (size_t i = 0; i < ops.size(); ++i) {
    core::TensorTableEntry e;
    e.name = ops[i]->name;
    e.params = ops[i]->params;
    e.input = ops[i]->input;
    e.output = ops[i]->output;
    e.context = ops[i]->context;
    std::promise<core::Status>* p = &done[i];
    e.callback = [p](const core::Status& st) { p->set_value(st); };
    entries.push_back(std::move(e));
  }
  core::Status st = core::EnqueueEntries(std::move(entries));
  if (!st.ok()) return st;
  core::Status first;
  for (size_t i = 0; i < ops.size(); ++i) {
    ops[i]->status = done[i].get_future().get();
    if (!ops[i]->status.ok() && first.ok()) first = ops[i]->status;
  }
  return first;
}

core::Status Submit(std::vector<Op*> ops, std::function<void(Op*)> done) {
  std::vector<core::TensorTableEntry> entries;
  for (Op* op : ops) {
    core::TensorTableEntry e;
    e.name = op->name;
    e.params = op->params;
    e.input = op->input;
    e.output = op->output;
    e.context = op->context;
    e.callback = [op, done](const core::Status& st) {
      op->status = st;
      done(op);
    };
    entries.push_back(std::move(e));
  }
  return core::EnqueueEntries(std::move(entries));
}

void Countdown::Add() {
  std::lock_guard<std::mutex> l(mu_);
  ++n_;
  cv_.notify_all();
}

bool Countdown::Wait(int n, double timeout_s) {
  std::unique_lock<std::mutex> l(mu_);
  return cv_.wait_for(l, std::chrono::duration<double>(timeout_s), [&] { return n_ >= n; });
}

int Countdown::count() {
  std::lock_guard<std::mutex> l(mu_);
  return n_;
}

std::shared_ptr<core::Tensor> Output(const Op& op, int index) {
  if (op.output && index == 0) return op.output;
  // Allocation order: allgather/reducescatter allocate output 0; alltoall
  // allocates its splits (1) first, then output 0.
  if (op.params.type == core::CollectiveType::kAlltoall) {
    return op.context->outputs.size() > 1 ? op.context->outputs[index == 0 ? 1 : 0] : nullptr;
  }
  return op.context->outputs.empty() ? nullptr : op.context->outputs[0];
}

}  // namespace harness

namespace {

bool Init(bool hierarchical, harness::Env* env) {
  setenv("TFHVD_HIERARCHICAL_ALLREDUCE", hierarchical ? "1" : "0", 1);
  char err[1024] = {0};
  if (tfhvd_init(nullptr, 0, nullptr, err, sizeof(err)) != 0) {
    std::fprintf(stderr, "tfhvd_init failed: %s\n", err);
    return false;
  }
  env->rank = tfhvd_rank();
  env->size = tfhvd_size();
  env->local_rank = tfhvd_local_rank();
  env->local_size = tfhvd_local_size();
  env->hierarchical = hierarchical;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a timeout's kill
  bool bench = false, bench_copy = false, bench_step = false, require_gpu = false, host = false;
  bool flat_only = false;
  int iters = 20;
  long loop = 0;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--bench")) bench = true;
    if (!std::strcmp(argv[i], "--bench-copy")) bench_copy = true;
    if (!std::strcmp(argv[i], "--bench-step")) bench_step = true;
    if (!std::strcmp(argv[i], "--require-gpu")) require_gpu = true;
    if (!std::strcmp(argv[i], "--host")) host = true;
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    if (!std::strcmp(argv[i], "--flat")) flat_only = true;
    if (!std::strcmp(argv[i], "--loop") && i + 1 < argc) loop = std::atol(argv[++i]);
  }
  std::printf("tfhvd NCCL harness: NCCL built in: %s; device code: %s\n",
              tfhvd_nccl_built() ? "yes" : "no", tfhvd_gpu_code_info());
  if (!tfhvd_nccl_built()) {
    std::printf("FAIL: this build has no NCCL\n0 passed, 1 failed\n");
    return 1;
  }
  int count = 0;
  cudaError_t e = host ? cudaSuccess : cudaGetDeviceCount(&count);
  if (!host && (e != cudaSuccess || count == 0)) {
    const char* why = e != cudaSuccess ? cudaGetErrorString(e) : "0 devices";
    if (access("/dev/nvidiactl", F_OK) == 0) {
      std::printf("FAIL: this machine has an NVIDIA driver (/dev/nvidiactl) but CUDA finds no "
                  "device: %s\n0 passed, 1 failed\n", why);
      return 1;
    }
    std::printf("SKIP: no CUDA device (%s); nothing to check on this machine\n", why);
    return require_gpu ? 3 : 0;
  }
  std::vector<std::pair<std::string, harness::Check>> checks;
  harness::AddChecks(!host, &checks);
  if (loop > 0) {
    checks.clear();
    checks.emplace_back("a loop of allreduces", [loop](const harness::Env& env) {
      auto in = std::make_shared<harness::Buffer>(harness::core::DataType::kFloat32, harness::core::Shape{1024},
                                                  env.device);
      in->Write(std::vector<double>(1024, 1.0));
      for (long i = 0; i < loop; ++i) {
        harness::Op o = harness::MakeOp("loop", harness::core::CollectiveType::kAllreduce, in);
        harness::core::Status st = harness::Run({&o});
        if (!st.ok()) return "allreduce " + std::to_string(i) + ": " + st.message();
      }
      return std::string();
    });
  }
  if (!only.empty()) {
    std::vector<std::pair<std::string, harness::Check>> chosen;
    for (auto& c : checks) {
      if (c.first.find(only) != std::string::npos) chosen.push_back(c);
    }
    checks.swap(chosen);
  }
  int passed = 0, failed = 0;
  harness::Env env;
  for (bool hierarchical : {false, true}) {
    if (hierarchical && flat_only) break;
    if (!Init(hierarchical, &env)) return 1;
    env.device = host ? -1 : env.local_rank % count;
    if (!host) cudaSetDevice(env.device);
    for (auto& c : checks) {
      std::string why = c.second(env);
      if (env.rank == 0 || !why.empty()) {
        std::printf("%s %s%s%s (rank %d)\n", why.empty() ? "PASS" : "FAIL", c.first.c_str(),
                    hierarchical ? " [hierarchical]" : "", why.empty() ? "" : (": " + why).c_str(),
                    env.rank);
      }
      (why.empty() ? passed : failed)++;
    }
    if (bench && !hierarchical) harness::Bench(env, iters);
    if (bench_step && !hierarchical) harness::BenchStep(env, iters);
    if (bench_copy && !hierarchical && env.rank == 0) harness::BenchCopy(env, iters);
    tfhvd_shutdown();
  }
  std::fflush(stdout);
  tfhvd_finalize();
  // Every rank's own tally; rank 0's line is the plain closing line.
  if (env.rank == 0) {
    std::printf("%d passed, %d failed\n", passed, failed);
  } else {
    std::printf("rank %d: %d passed, %d failed\n", env.rank, passed, failed);
  }
  return failed == 0 ? 0 : 1;
}
