// One rank per GPU.  NCCL refuses a communicator in which two ranks of one
// host share a GPU, with a message ("Duplicate GPU detected") that names
// neither the ranks nor the fix; the usual cause is a script that does not
// pin hvd.local_rank()'s GPU, so that every rank of a host takes GPU 0.
// Before a communicator is created, the ranks exchange where they sit and
// fail alike, naming the ranks, the GPU and the fix.
#ifndef TFHVD_BACKENDS_NCCL_PLACEMENT_H_
#define TFHVD_BACKENDS_NCCL_PLACEMENT_H_

#include <string>
#include <vector>

#include "../../core/backend.h"

namespace tfhvd {

// Where one rank's GPU work runs.  `host` is the host as NCCL tells hosts
// apart: NCCL_HOSTID when set (two ranks with different NCCL_HOSTIDs may
// share a GPU: NCCL then treats them as two hosts), else the host name.
struct GpuSeat {
  int rank = -1;        // the rank in the job (not in the communicator)
  int device = -1;      // the CUDA ordinal this process uses
  std::string host;
  std::string bus_id;   // PCI bus id: the same GPU under any CUDA_VISIBLE_DEVICES
};

// This process's seat on GPU `device`.
Status LocalGpuSeat(int rank, int device, GpuSeat* out);

// Pure: an InvalidArgument naming every GPU that two or more of `seats`
// share (their ranks, the host, the CUDA ordinal and PCI id) and the fix;
// OK when each GPU has one rank.  `what` names the communicator.
Status CheckOneRankPerGpu(const std::vector<GpuSeat>& seats, const char* what);

// Gathers every rank's seat over `over` (a host transport, `nranks` ranks)
// and applies CheckOneRankPerGpu: every rank reaches the same verdict.  A
// rank that cannot tell its seat contributes none (its own error surfaces
// where it next calls CUDA).
Status AgreeOneRankPerGpu(Collectives* over, int nranks, const GpuSeat& mine, const char* what);

}  // namespace tfhvd

#endif  // TFHVD_BACKENDS_NCCL_PLACEMENT_H_
