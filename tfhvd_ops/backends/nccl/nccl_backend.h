// The NCCL backend: device-memory collectives over NCCL, on top of a host
// backend (MPI) that keeps negotiating and moving host tensors.
//
// What it adds to the host backend (see nccl_collectives.h for the details):
//  - one NCCL communicator for the global process set, created on the first
//    GPU collective, i.e. after negotiation, when every rank executes the
//    same response; rank 0's ncclUniqueId travels over the host backend's
//    Broadcast; and one per other process set and GPU, made the same way over
//    the set's host collectives on the set's first GPU collective;
//  - a dedicated CUDA stream per process that waits on the framework's ready
//    events before touching a tensor;
//  - a device fusion buffer and batched copy/scale kernels (cuda/);
//  - hierarchical allreduce when BackendOptions::hierarchical_allreduce.
//
// Built only when CMake is asked for GPU operations; only backends/factory.cc
// includes this header.
#ifndef TFHVD_BACKENDS_NCCL_NCCL_BACKEND_H_
#define TFHVD_BACKENDS_NCCL_NCCL_BACKEND_H_

#include <memory>

#include "../../core/backend.h"

namespace tfhvd {

// Wraps `host` (which keeps its control channel and host collectives) with
// NCCL collectives for device >= 0.
Status CreateNcclBackend(const BackendOptions& opts, std::unique_ptr<Backend> host,
                         std::unique_ptr<Backend>* out);

// Which tool built the embedded device code, for which architectures.
const char* NcclDeviceCodeInfo();
// "built with CUDA runtime 12.5, NCCL 2.27.7; runs with CUDA runtime 12.5,
// NCCL 2.27.7, CUDA driver 13.0" (the driver "none" where there is none).
const char* NcclVersionsInfo();

}  // namespace tfhvd

#endif  // TFHVD_BACKENDS_NCCL_NCCL_BACKEND_H_
