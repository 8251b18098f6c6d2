// CUDA ready events for framework adapters: the one thing a framework's GPU
// kernel needs from the device backend.  An adapter records an event on its
// compute stream when a tensor is ready (an input produced, an output
// allocated) and attaches it to the tensor (Tensor::ready_event); the NCCL
// collectives then make their own stream wait on it (Collectives::WaitFor).
// Plain C++: no CUDA header leaks to the adapter.
#ifndef TFHVD_BACKENDS_NCCL_GPU_EVENTS_H_
#define TFHVD_BACKENDS_NCCL_GPU_EVENTS_H_

#include <memory>

#include "../../core/common.h"

namespace tfhvd {

// Records an event (taken from a per-device pool, returned to it when the
// last reference goes) on `stream` (a cudaStream_t, or null for the legacy
// default stream) of GPU `device`.  The calling thread's current device is
// left as it was.
Status RecordReadyEvent(int device, void* stream, std::shared_ptr<ReadyEvent>* out);

}  // namespace tfhvd

#endif  // TFHVD_BACKENDS_NCCL_GPU_EVENTS_H_
