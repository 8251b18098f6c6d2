// The one place that knows which backends this build contains.  CMake
// compiles the NCCL backend and defines TFHVD_WITH_NCCL only when asked to
// (TFHVD_GPU_OPERATIONS=NCCL); nothing else in the tree tests that macro.
#include "../core/backend.h"
#include "mpi/mpi_backend.h"
#ifdef TFHVD_WITH_NCCL
#include "nccl/nccl_backend.h"
#endif

namespace tfhvd {

Status CreateBackend(const BackendOptions& opts, std::unique_ptr<Backend>* out, bool* excluded) {
#ifdef TFHVD_WITH_NCCL
  // MPI negotiates and moves host tensors; NCCL moves device tensors.
  std::unique_ptr<Backend> host;
  TFHVD_RETURN_IF_ERROR(CreateMpiBackend(opts, &host, excluded));
  if (*excluded) return Status::OK();
  return CreateNcclBackend(opts, std::move(host), out);
#else
  return CreateMpiBackend(opts, out, excluded);
#endif
}

void FinalizeTransports() { FinalizeMpiIfOwned(); }

void AbortTransports(int code) { AbortMpi(code); }

BuildInfo GetBuildInfo() {
  BuildInfo info;
  info.mpi = true;
#ifdef TFHVD_WITH_NCCL
  info.nccl = true;
  info.cuda = true;
  info.device_code = NcclDeviceCodeInfo();
#endif
  return info;
}

}  // namespace tfhvd
