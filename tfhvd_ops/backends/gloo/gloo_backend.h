// The Gloo backend: jobs without MPI (tfhvdrun --gloo), and the world that
// elastic training rebuilds in-process.
//
// Start-up (bootstrap from the launcher's environment, never from MPI):
//  1. Rank and size come from HOROVOD_RANK/HOROVOD_SIZE (or TFHVD_*), the
//     rendezvous server from HOROVOD_GLOO_RENDEZVOUS_ADDR/_PORT.  Each init
//     uses a fresh scope on that server: HOROVOD_GLOO_SCOPE when set (an
//     elastic driver sets one per round), else "init<N>" for the process's
//     N-th init, which every rank of a fixed job agrees on.
//  2. Every rank claims "env/<rank>" (exclusively: a second process with the
//     same rank is an error) with its size and host, then checks rank 0's.
//  3. The world Gloo context connects through the store ("global" prefix).
//  4. Hosts are allgathered over it: local and cross ranks follow from them
//     (a launcher-given HOROVOD_LOCAL_RANK that disagrees is an error).
//  5. The TCP control channel (backends/tcp) bootstraps over the world
//     context (broadcast and min-allreduce), exactly as it does over MPI.
// Without the launcher's variables the process runs alone (size 1).
#ifndef TFHVD_BACKENDS_GLOO_GLOO_BACKEND_H_
#define TFHVD_BACKENDS_GLOO_GLOO_BACKEND_H_

#include <memory>

#include "../../core/backend.h"

namespace tfhvd {

Status CreateGlooBackend(const BackendOptions& opts, std::unique_ptr<Backend>* out,
                         bool* excluded);

}  // namespace tfhvd

#endif  // TFHVD_BACKENDS_GLOO_GLOO_BACKEND_H_
