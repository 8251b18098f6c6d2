// The MPI backend: negotiation messages and host-memory collectives over MPI.
//
// tfhvd works on duplicates of the user's communicator (one for control
// messages, one for data), so its traffic never matches a message of the
// user's own mpi4py code.  Errors are returned (MPI_ERRORS_RETURN), never
// fatal.
#ifndef TFHVD_BACKENDS_MPI_MPI_BACKEND_H_
#define TFHVD_BACKENDS_MPI_MPI_BACKEND_H_

#include <memory>

#include "../../core/backend.h"

namespace tfhvd {

// Initialises MPI (MPI_THREAD_MULTIPLE where available) unless mpi4py or the
// application already did, then builds the backend.
Status CreateMpiBackend(const BackendOptions& opts, std::unique_ptr<Backend>* out,
                        bool* excluded);
// MPI_Finalize, only if tfhvd called MPI_Init and nobody finalised since.
void FinalizeMpiIfOwned();
// MPI_Abort(MPI_COMM_WORLD, code) if MPI is initialised and not finalised.
void AbortMpi(int code);

}  // namespace tfhvd

#endif  // TFHVD_BACKENDS_MPI_MPI_BACKEND_H_
