// Error values from CUDA and NCCL results (DESIGN rule 7: errors are
// values).  Messages carry the library's own error string, the rank and the
// GPU, so that a user sees which process failed and why.
#ifndef TFHVD_BACKENDS_NCCL_CUDA_CHECK_H_
#define TFHVD_BACKENDS_NCCL_CUDA_CHECK_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <string>

#include "../../core/common.h"

// The oldest NCCL the backend supports: 2.16, the first release for CUDA 12
// (TensorFlow 2.21's CUDA).  Everything used below is there (ncclAvg and
// bfloat16 2.10, PreMulSum 2.11, ncclGetLastError 2.13, ncclCommFinalize
// 2.14), so no call is conditional on the version.  `make test-fake-gpu`
// builds and runs the backend against the 2.16 headers as well.
#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 16, 0)
#error "tfhvd's GPU build needs NCCL 2.16 or newer (the first NCCL for CUDA 12): point TFHVD_NCCL_HOME (or the nvidia-nccl-cu12 wheel) at a newer NCCL"
#endif

namespace tfhvd {

// rank < 0: not known where the call happens (a framework thread).
inline std::string WhereString(int rank, int device) {
  std::string gpu = "GPU " + std::to_string(device);
  return rank < 0 ? gpu : "rank " + std::to_string(rank) + " (" + gpu + ")";
}

inline Status CudaStatus(cudaError_t e, const std::string& what, int rank, int device) {
  if (e == cudaSuccess) return Status::OK();
  return Status::Internal("tfhvd: CUDA error on " + WhereString(rank, device) + " in " + what +
                          ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// Waits for `e`: spins (yielding the core) for up to `spin`, while a short
// collective is likely to end, then sleeps in the driver's blocking wait.
// (gpu_events.cc)
cudaError_t AwaitEvent(cudaEvent_t e, std::chrono::microseconds spin);

// `comm` may be null (init failures); NCCL's last error adds the detail its
// result code lacks ("peer 3 closed the connection", ...).
inline Status NcclStatus(ncclResult_t r, const std::string& what, int rank, int device,
                         ncclComm_t comm) {
  if (r == ncclSuccess) return Status::OK();
  std::string msg = "tfhvd: NCCL error on " + WhereString(rank, device) + " in " + what + ": " +
                    ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') msg += " (" + std::string(last) + ")";
  return r == ncclInvalidArgument || r == ncclInvalidUsage ? Status::InvalidArgument(msg)
                                                           : Status::Internal(msg);
}

}  // namespace tfhvd

#endif  // TFHVD_BACKENDS_NCCL_CUDA_CHECK_H_
