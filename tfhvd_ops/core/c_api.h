// The C API: what Python (ctypes) and the framework adapters call.
//
// The process's one Runtime lives behind these functions; adapters reach it
// through CurrentRuntime(), which hands out a shared reference so a shutdown
// racing with an op can never free the runtime under it.
#ifndef TFHVD_CORE_C_API_H_
#define TFHVD_CORE_C_API_H_

#ifdef __cplusplus
#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "common.h"

namespace tfhvd {
class Runtime;
// Null when tfhvd is not initialised.
std::shared_ptr<Runtime> CurrentRuntime();
// Enqueues entries on the current runtime, or fails with "call hvd.init()
// first".
Status EnqueueEntries(std::vector<TensorTableEntry> entries);
// The same for a graph kernel, whose entries the runtime may run on the
// calling thread at once, until `done` is set (Runtime::EnqueueInline).
Status EnqueueInlineEntries(std::vector<TensorTableEntry> entries, const std::atomic<bool>& done);
// Calls submit(), then runs the runtime on the calling thread until `done` is
// set (Runtime::Drive); false when it could not (not initialised, shutting
// down), submit() having been called all the same.
bool DriveUntil(const std::function<void()>& submit, const std::atomic<bool>& done);
constexpr const char* kNotInitialized =
    "tfhvd has not been initialized; call hvd.init() first";
}  // namespace tfhvd

extern "C" {
#endif

// Each returns 0 on success or a StatusCode, with a message in `err`.
int tfhvd_init(const int* ranks, int nranks, void* comm, char* err, int errlen);
// 0, or 1 when the peers did not shut down within the stall-shutdown time.
int tfhvd_shutdown(void);
int tfhvd_is_initialized(void);
// -1 when not initialised.
int tfhvd_rank(void);
int tfhvd_size(void);
int tfhvd_local_rank(void);
int tfhvd_local_size(void);
int tfhvd_cross_rank(void);
int tfhvd_cross_size(void);
int tfhvd_is_homogeneous(void);
int tfhvd_mpi_threads_supported(void);
int tfhvd_mpi_built(void);
int tfhvd_gloo_built(void);
// 1 when the running job's host backend is Gloo, 0 when MPI, -1 when not
// initialised.
int tfhvd_gloo_enabled(void);
// How many times a graph op ran the runtime's loop on its own thread
// (Runtime::EnqueueInline) since init; -1 when not initialised.
long long tfhvd_graph_inline_runs(void);
// The autotune setting this rank applies now and each change it applied
// ("key=value" lines, core/autotune.h); -1 when not initialised, 1 when
// `buf` was too short.
int tfhvd_autotune_state(char* buf, int len);
int tfhvd_nccl_built(void);
int tfhvd_cuda_built(void);
// Which tool built the GPU device code, for which architectures ("" in a CPU
// build): "NVRTC 12.5 (...): cubin sm_80 sm_90, PTX compute_90".
const char* tfhvd_gpu_code_info(void);
// The CUDA runtime and NCCL the library was built with and runs with, and the
// CUDA driver ("" in a CPU build).
const char* tfhvd_gpu_versions_info(void);
// Parses the settings from the environment into `buf` ("key=value" lines).
int tfhvd_parse_settings(char* buf, int len);
int tfhvd_start_timeline(const char* path, int mark_cycles, char* err, int errlen);
int tfhvd_stop_timeline(void);
// Process sets (core/process_set.h).  Adding and removing are collective over
// every rank.  `require_dynamic` 0 is for init(process_sets=[...]); 1 fails
// unless DYNAMIC_PROCESS_SETS is set.  Return 0 or a StatusCode (message in
// `err`); the new set's id goes to `*id`.
int tfhvd_add_process_set(const int* ranks, int nranks, int require_dynamic, int* id, char* err,
                          int errlen);
int tfhvd_remove_process_set(int id, char* err, int errlen);
// The same with the dynamic-mode check optional: an elastic reset removes the
// placeholder sets that keep the ids of sets it could not register again.
int tfhvd_remove_process_set_ex(int id, int require_dynamic, char* err, int errlen);
// Set `id`: its size, this rank's index in it (-1: not a member) and up to
// `cap` of its world ranks.  Returns 0, -1 when not initialised, -3 when no
// such set exists (Horovod's codes).
int tfhvd_process_set_info(int id, int* size, int* rank, int* ranks, int cap);
// Up to `cap` ids of the sets that exist, ascending; returns how many exist.
int tfhvd_process_set_ids(int* ids, int cap);
// Shuts down and finalises MPI if tfhvd initialised it (process exit).
void tfhvd_finalize(void);

#ifdef __cplusplus
}
#endif

#endif  // TFHVD_CORE_C_API_H_
