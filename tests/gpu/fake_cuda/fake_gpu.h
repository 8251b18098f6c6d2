// A fake CUDA + NCCL for tests: host memory stands in for device memory, a
// worker thread per stream runs its operations in order, and NCCL's
// collectives run between the processes of a communicator over POSIX shared
// memory.  One shared library, libcuda.so.1 (its file name and soname), holds
// the CUDA runtime, the three driver entry points the backend opens with
// dlopen("libcuda.so.1") (cuda/device_kernels.cc: the loaded library already
// answers to that name), and NCCL.  It is compiled against the real CUDA 12
// and NCCL headers, and the backend's sources (tfhvd_ops/backends/nccl,
// tfhvd_ops/cuda) link against it unchanged: the build chooses what to link
// (tests/gpu/fake_cuda/fake.mk).
//
// What is real enough to test:
//   - cudaMalloc and friends: aligned host memory; frees of unknown pointers
//     fail (cudaErrorInvalidValue).
//   - streams: a FIFO per stream executed by its own worker thread; the
//     legacy default stream is one more such stream per device, and the
//     synchronous calls (cudaMemcpy, cudaMemset) run on it and wait.  It
//     does not order the other streams (the backend's and the harness's are
//     all non-blocking), and cudaFree does not synchronise the device.
//   - events: cudaEventRecord completes when the stream reaches it;
//     cudaEventQuery says cudaErrorNotReady until then; cudaStreamWaitEvent
//     holds the stream until the record it saw completed;
//     cudaLaunchHostFunc runs its function in stream order.
//   - kernels: the embedded "images" are fake (device_images.cc); loading
//     checks the image's architecture against the device's compute
//     capability like the driver does, and a launch of the batched copy
//     kernel runs the real cuda/gpu_kernels.cu on the host (through
//     tests/gpu/emulated_cuda, kernel_host.cc) for the launch's grid.
//   - NCCL: ncclGetUniqueId names a shared-memory segment; the ranks meet
//     there (process-shared robust mutex and condition variable, no busy
//     polling), exchange their seats (bus id, NCCL_HOSTID) and refuse two
//     ranks on one GPU of one host, like NCCL ("Duplicate GPU detected").
//     Every collective is a set of byte streams between pairs of ranks (a
//     ring buffer per ordered pair) plus a local reduction in rank order,
//     so every rank gets bit-identical results.  Groups run their
//     operations together.  The segment's name is unlinked as soon as every
//     rank has mapped it.  A peer process that exits makes the waiting
//     ranks' communicators fail asynchronously (ncclRemoteError).
//
// Faults, from the environment of each process (read once):
//   TFHVD_FAKE_GPU_COUNT=n               devices (default 1)
//   TFHVD_FAKE_GPU_BUS_ID=0000:41:00.0   PCI bus id of device 0 (device i: bus + i);
//                                        default 00000000:41:00.0 for every process, so
//                                        two processes on one host share a GPU unless told
//   TFHVD_FAKE_GPU_CC=90                 compute capability (major*10+minor)
//   TFHVD_FAKE_GPU_SMS=132               multiprocessor count
//   TFHVD_FAKE_CUDA_STICKY_ERROR_AFTER=n after n stream operations have run, the next
//                                        one faults: it and every later CUDA call return
//                                        cudaErrorIllegalAddress (sticky, like a bad kernel)
//   TFHVD_FAKE_CU_MODULE_LOAD_ERROR=1    cuModuleLoadData fails (CUDA_ERROR_INVALID_IMAGE)
//   TFHVD_FAKE_REPORT_MODULE_LOADS=1     every successful cuModuleLoadData prints
//                                        "fake-gpu: kernel module loaded" to stderr
//   TFHVD_FAKE_OP_DELAY_MS=n             each cudaMemcpyAsync from the host takes n ms
//                                        longer (a slow producer: widens ordering races)
//   TFHVD_FAKE_NCCL_ASYNC_ERROR_AFTER=n  after n NCCL launches (a group or an ungrouped
//                                        call) of this process, the next one never
//                                        completes and its communicator reports
//                                        ncclSystemError from ncclCommGetAsyncError
//   TFHVD_FAKE_NCCL_HANG_AFTER=n         ... the next one never completes, silently
//   TFHVD_FAKE_NCCL_INIT_ERROR=1         ncclCommInitRank fails (ncclSystemError)
//   TFHVD_FAKE_SHM_TAG=word              part of the segment names
//                                        (/dev/shm/tfhvd-fake-nccl-<word>-<random>), so a
//                                        test driver can remove what a killed run left
//
// Everything here is internal to the fake; only the CUDA, driver and NCCL
// entry points are exported (exports.map).
#ifndef TFHVD_TESTS_GPU_FAKE_CUDA_FAKE_GPU_H_
#define TFHVD_TESTS_GPU_FAKE_CUDA_FAKE_GPU_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace fakegpu {

struct Config {
  int gpu_count = 1;
  std::string bus_id = "00000000:41:00.0";
  int cc = 90;
  int sms = 132;
  long sticky_after = -1;      // -1: never
  bool module_load_error = false;
  bool report_loads = false;
  int op_delay_ms = 0;
  long nccl_async_after = -1;
  long nccl_hang_after = -1;
  bool nccl_init_error = false;
  std::string shm_tag = "x";
};
const Config& GetConfig();

// The sticky error (cudaSuccess while there is none).
cudaError_t Sticky();
void SetSticky(cudaError_t e);

// One in-order queue of work with its worker thread.  Never destroyed while
// its worker may still run: cudaStreamDestroy detaches it.
class Stream {
 public:
  explicit Stream(int device);
  ~Stream();
  // Queues `fn`; it runs after everything queued before.  Returns the
  // operation's number (1, 2, ...).
  uint64_t Push(std::function<void()> fn);
  // Whether every operation queued so far has run.
  bool Idle();
  // Waits until operation `upto` (default: everything queued so far) ran.
  void Wait(uint64_t upto = 0);
  // Ends the worker once the queue is empty; the object deletes itself.
  void Release();
  int device() const { return device_; }

 private:
  void Run();
  int device_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t pushed_ = 0;
  uint64_t done_ = 0;
  bool released_ = false;
  std::thread worker_;
};

// The stream of a handle: the legacy default stream of the current device
// for null (cudaStreamLegacy/cudaStreamPerThread too).
Stream* StreamOf(cudaStream_t s);
// Whether `s` is null, a special handle or a stream not yet destroyed.
bool ValidStream(cudaStream_t s);
// Counts a stream operation (copy, memset, kernel, NCCL launch) for the
// sticky-error fault; `slow`: delayed by TFHVD_FAKE_OP_DELAY_MS.
// False: the operation must not run (a fault).
bool BeginStreamOp(bool slow = false);

// kernel_host.cc: the batched copy kernel (cuda/gpu_kernels.cu) for a grid of
// gx * gy blocks of bx threads; `params` is the kernel's parameter block.
void RunCopyKernel(const void* params, unsigned gx, unsigned gy, unsigned bx);
// The parameter block's size (sizeof(tfhvd::cuda::CopyBatch)).
size_t CopyKernelParamBytes();
// Whether a launch's grid matches its batch: one 256-thread block per tile
// (device_kernels.h LayOutTiles).
bool CopyKernelGridFits(const void* params, unsigned gx, unsigned gy, unsigned bx);

}  // namespace fakegpu

#endif  // TFHVD_TESTS_GPU_FAKE_CUDA_FAKE_GPU_H_
