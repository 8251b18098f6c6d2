// The ready events core/common.h declares (RecordReadyEvent), for CUDA:
// events taken from a per-device pool and returned to it when the last
// reference goes.
#include <cuda_runtime_api.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "../../core/common.h"
#include "cuda_check.h"

namespace tfhvd {
namespace {

// Events are reused instead of created per tensor (cudaEventCreate costs a
// driver call each time; a training step records one per gradient).  A
// returned event may be recorded again at once: a cudaStreamWaitEvent
// already issued waits for the record it saw, not for later ones.
//
// The pool is process-wide, like the CUDA contexts its events belong to:
// framework threads record ready events without a runtime at hand, and
// events outlive a shutdown()/init() cycle harmlessly.  It is never
// destroyed, so an event released during process exit has a pool to go to.
class EventPool {
 public:
  static EventPool& Get() {
    static EventPool* pool = new EventPool;
    return *pool;
  }

  Status Take(int device, cudaEvent_t* out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (device < static_cast<int>(free_.size()) && !free_[device].empty()) {
        *out = free_[device].back();
        free_[device].pop_back();
        return Status::OK();
      }
    }
    return CudaStatus(cudaEventCreateWithFlags(out, cudaEventDisableTiming), "cudaEventCreate",
                      -1, device);
  }

  void Give(int device, cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (device >= static_cast<int>(free_.size())) free_.resize(device + 1);
    if (free_[device].size() < kMaxPooled) {
      free_[device].push_back(e);
    } else {
      cudaEventDestroy(e);
    }
  }

 private:
  static constexpr size_t kMaxPooled = 4096;  // per device
  std::mutex mu_;
  std::vector<std::vector<cudaEvent_t>> free_;  // by device
};

class CudaReadyEvent : public ReadyEvent {
 public:
  CudaReadyEvent(int device, cudaEvent_t e) : device_(device), event_(e) {}
  ~CudaReadyEvent() override { EventPool::Get().Give(device_, event_); }
  int device() const override { return device_; }
  void* handle() const override { return event_; }

 private:
  int device_;
  cudaEvent_t event_;
};

}  // namespace

Status RecordReadyEvent(int device, void* stream, std::shared_ptr<ReadyEvent>* out) {
  // A framework thread usually is on the tensor's device already: then no
  // cudaSetDevice/restore pair.
  int previous = -1;
  cudaGetDevice(&previous);
  Status st = previous == device
                  ? Status::OK()
                  : CudaStatus(cudaSetDevice(device), "cudaSetDevice", -1, device);
  cudaEvent_t e = nullptr;
  if (st.ok()) st = EventPool::Get().Take(device, &e);
  if (st.ok()) {
    st = CudaStatus(cudaEventRecord(e, static_cast<cudaStream_t>(stream)), "cudaEventRecord", -1,
                    device);
    if (st.ok()) {
      *out = std::make_shared<CudaReadyEvent>(device, e);
    } else {
      EventPool::Get().Give(device, e);
    }
  }
  if (previous >= 0 && previous != device) cudaSetDevice(previous);
  return st;
}

cudaError_t AwaitEvent(cudaEvent_t e, std::chrono::microseconds spin) {
  const auto until = std::chrono::steady_clock::now() + spin;
  cudaError_t q;
  while ((q = cudaEventQuery(e)) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() > until) return cudaEventSynchronize(e);
    std::this_thread::yield();
  }
  return q;
}

}  // namespace tfhvd
