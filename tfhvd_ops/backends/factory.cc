// The one place that knows which backends this build contains.  CMake
// compiles the NCCL backend and defines TFHVD_WITH_NCCL only when asked to.
#include "../core/backend.h"
#include "mpi/mpi_backend.h"

namespace tfhvd {

Status CreateBackend(const BackendOptions& opts, std::unique_ptr<Backend>* out, bool* excluded) {
  return CreateMpiBackend(opts, out, excluded);
}

void FinalizeTransports() { FinalizeMpiIfOwned(); }

BuildInfo GetBuildInfo() {
  BuildInfo info;
  info.mpi = true;
#ifdef TFHVD_WITH_NCCL
  info.nccl = true;
  info.cuda = true;
#endif
  return info;
}

}  // namespace tfhvd
