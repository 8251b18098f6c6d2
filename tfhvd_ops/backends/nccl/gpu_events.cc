#include "gpu_events.h"

#include <cuda_runtime_api.h>

#include "cuda_check.h"

namespace tfhvd {
namespace {

class CudaReadyEvent : public ReadyEvent {
 public:
  CudaReadyEvent(int device, cudaEvent_t e) : device_(device), event_(e) {}
  ~CudaReadyEvent() override { cudaEventDestroy(event_); }  // legal while waits are pending
  int device() const override { return device_; }
  void* handle() const override { return event_; }

 private:
  int device_;
  cudaEvent_t event_;
};

}  // namespace

Status RecordReadyEvent(int device, void* stream, std::shared_ptr<ReadyEvent>* out) {
  int previous = -1;
  cudaGetDevice(&previous);
  Status st = CudaStatus(cudaSetDevice(device), "cudaSetDevice", -1, device);
  cudaEvent_t e = nullptr;
  if (st.ok()) {
    st = CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate", -1,
                    device);
  }
  if (st.ok()) {
    st = CudaStatus(cudaEventRecord(e, static_cast<cudaStream_t>(stream)), "cudaEventRecord", -1,
                    device);
    if (st.ok()) {
      *out = std::make_shared<CudaReadyEvent>(device, e);
    } else {
      cudaEventDestroy(e);
    }
  }
  if (previous >= 0 && previous != device) cudaSetDevice(previous);
  return st;
}

}  // namespace tfhvd
