// The one place that knows which backends this build contains.  CMake
// compiles each backend and defines its TFHVD_WITH_* macro only when it is
// built (MPI and Gloo are each optional, at least one is required; NCCL only
// when asked for); nothing else in the tree tests those macros.
#include <cstdio>
#include <cstdlib>

#include "../core/backend.h"
#ifdef TFHVD_WITH_MPI
#include "mpi/mpi_backend.h"
#endif
#ifdef TFHVD_WITH_GLOO
#include "gloo/gloo_backend.h"
#endif
#ifdef TFHVD_WITH_NCCL
#include "nccl/nccl_backend.h"
#endif

namespace tfhvd {
namespace {

#ifdef TFHVD_WITH_MPI
constexpr bool kMpiBuilt = true;
#else
constexpr bool kMpiBuilt = false;
#endif
#ifdef TFHVD_WITH_GLOO
constexpr bool kGlooBuilt = true;
#else
constexpr bool kGlooBuilt = false;
#endif

// Horovod's rule: CONTROLLER and CPU_OPERATIONS name the backend; without
// them, Gloo when a launcher without mpirun set the rendezvous variables,
// MPI when mpirun started the process, else whichever is built (MPI first:
// a lone process is an MPI singleton, as before).
Status Choose(const BackendOptions& opts, BackendChoice* out) {
  BackendChoice c = opts.controller;
  if (opts.cpu_operations != BackendChoice::kAuto) {
    if (c != BackendChoice::kAuto && c != opts.cpu_operations) {
      return Status::InvalidArgument(
          std::string("tfhvd: HOROVOD_CONTROLLER=") + BackendChoiceName(c) +
          " with HOROVOD_CPU_OPERATIONS=" + BackendChoiceName(opts.cpu_operations) +
          " is not supported: tfhvd negotiates and moves host tensors with the same backend; "
          "set both to the same value");
    }
    c = opts.cpu_operations;
  }
  if (c == BackendChoice::kAuto) {
    if (opts.launch.complete() && kGlooBuilt && !opts.launch.under_mpirun) {
      c = BackendChoice::kGloo;
    } else if (kMpiBuilt) {
      c = BackendChoice::kMpi;
    } else {
      c = BackendChoice::kGloo;
    }
  }
  const LaunchEnv& l = opts.launch;
  if (c == BackendChoice::kGloo && !l.complete() && l.mpi_world_size > 1) {
    // Gloo asked for in the environment of an mpirun job: Horovod bootstraps
    // Gloo from MPI there.  Gloo's own rendezvous (tfhvdrun --gloo) is not
    // set, so Gloo alone would make every rank a job of size 1.
    if (!kMpiBuilt) {
      return Status::InvalidArgument(
          "tfhvd: mpirun started " + std::to_string(l.mpi_world_size) +
          " processes and HOROVOD_CONTROLLER/CPU_OPERATIONS=gloo, but this build has no MPI "
          "and Gloo's rendezvous variables (HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, HOROVOD_RANK, "
          "HOROVOD_SIZE) are not set, so every rank would train alone: start the job with "
          "tfhvdrun --gloo");
    }
    if (l.mpi_world_rank <= 0) {
      std::fprintf(stderr,
                   "[tfhvd WARNING] HOROVOD_CONTROLLER/CPU_OPERATIONS=gloo in a job mpirun "
                   "started, without Gloo's rendezvous: the ranks connect over MPI instead "
                   "(start the job with tfhvdrun --gloo to run over Gloo)\n");
    }
    c = BackendChoice::kMpi;
  }
  if (c == BackendChoice::kGloo && !kGlooBuilt) {
    return Status::InvalidArgument(
        "tfhvd: the Gloo backend was asked for (HOROVOD_CONTROLLER/CPU_OPERATIONS=gloo or "
        "tfhvdrun --gloo) but this build has no Gloo: install it with 'sudo apt-get install -y "
        "libgloo-dev' and rebuild tfhvd (make setup), or run under mpirun");
  }
  if (c == BackendChoice::kMpi && !kMpiBuilt) {
    return Status::InvalidArgument(
        "tfhvd: the MPI backend was asked for but this build has no MPI (it was built with "
        "TFHVD_WITHOUT_MPI=1 or without Open MPI): install it with 'sudo apt-get install -y "
        "openmpi-bin libopenmpi-dev' and rebuild, or start the job with tfhvdrun --gloo");
  }
  if (!l.complete() && !l.present.empty() && !l.under_mpirun) {
    std::string names;
    for (const auto& n : l.present) names += (names.empty() ? "" : ", ") + n;
    std::fprintf(stderr,
                 "[tfhvd WARNING] %s set, but not all of HOROVOD_RANK, HOROVOD_SIZE, "
                 "HOROVOD_GLOO_RENDEZVOUS_ADDR and HOROVOD_GLOO_RENDEZVOUS_PORT: running as a "
                 "job of size 1 (start the job with tfhvdrun --gloo)\n",
                 names.c_str());
  }
  *out = c;
  return Status::OK();
}

Status CreateHostBackend(const BackendOptions& opts, std::unique_ptr<Backend>* out,
                         bool* excluded) {
  BackendChoice choice = BackendChoice::kAuto;
  TFHVD_RETURN_IF_ERROR(Choose(opts, &choice));
#ifdef TFHVD_WITH_GLOO
  if (choice == BackendChoice::kGloo) return CreateGlooBackend(opts, out, excluded);
#endif
#ifdef TFHVD_WITH_MPI
  if (choice == BackendChoice::kMpi) return CreateMpiBackend(opts, out, excluded);
#endif
  return Status::Internal("tfhvd: no CPU backend was built");
}

}  // namespace

Status CreateBackend(const BackendOptions& opts, std::unique_ptr<Backend>* out, bool* excluded) {
#ifdef TFHVD_WITH_NCCL
  // The host backend negotiates and moves host tensors; NCCL moves device
  // tensors (its unique id travels over the host backend's broadcast).
  std::unique_ptr<Backend> host;
  TFHVD_RETURN_IF_ERROR(CreateHostBackend(opts, &host, excluded));
  if (*excluded) return Status::OK();
  return CreateNcclBackend(opts, std::move(host), out);
#else
  return CreateHostBackend(opts, out, excluded);
#endif
}

// MPI_Initialized/MPI_Finalized may be called at any time, so these never
// initialise MPI in a process that ran under Gloo.
void FinalizeTransports() {
#ifdef TFHVD_WITH_MPI
  FinalizeMpiIfOwned();
#endif
}

void AbortTransports(int code) {
#ifdef TFHVD_WITH_MPI
  AbortMpi(code);  // returns when MPI is not running (a Gloo job)
#endif
  std::fflush(nullptr);
  std::_Exit(code);
}

BuildInfo GetBuildInfo() {
  BuildInfo info;
  info.mpi = kMpiBuilt;
  info.gloo = kGlooBuilt;
#ifdef TFHVD_WITH_NCCL
  info.nccl = true;
  info.cuda = true;
  info.device_code = NcclDeviceCodeInfo();
  info.gpu_versions = NcclVersionsInfo();
#endif
  return info;
}

}  // namespace tfhvd
