// Runtime settings, each declared once with its default and parsed once at
// init (NCCL's NCCL_PARAM habit).  Every setting is read from its TFHVD_*
// name first and Horovod's HOROVOD_* name second, so existing job scripts
// keep working unchanged.
#ifndef TFHVD_CORE_SETTINGS_H_
#define TFHVD_CORE_SETTINGS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common.h"

namespace tfhvd {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };

// Which CPU backend runs the job (CONTROLLER / CPU_OPERATIONS).
enum class BackendChoice : int { kAuto = 0, kMpi, kGloo };
const char* BackendChoiceName(BackendChoice c);

// What a launcher without mpirun (`tfhvdrun --gloo`) tells each worker, under
// Horovod's names (HOROVOD_RANK, ..., HOROVOD_GLOO_RENDEZVOUS_ADDR) and their
// TFHVD_* twins.  -1 / empty: not set.
struct LaunchEnv {
  int rank = -1;
  int size = -1;
  int local_rank = -1;
  int local_size = -1;
  int cross_rank = -1;
  int cross_size = -1;
  std::string hostname;         // HOSTNAME
  std::string rendezvous_addr;  // GLOO_RENDEZVOUS_ADDR
  int rendezvous_port = -1;     // GLOO_RENDEZVOUS_PORT
  std::string iface;            // GLOO_IFACE: interface of the Gloo TCP transport
  // GLOO_SCOPE: the rendezvous scope of this init (an elastic driver sets a
  // fresh one per round); empty: "init<N>" for the N-th init of the process.
  std::string scope;
  double timeout_s = 30.0;      // GLOO_TIMEOUT_SECONDS: rendezvous and collective timeout
  // SECRET_KEY: the job's secret (auth.h); signs rendezvous requests and keys
  // the control channel's handshake.  Empty: requests go unsigned (refused
  // by tfhvd's rendezvous server) and the handshake uses the bootstrap's key.
  std::string secret;
  bool under_mpirun = false;    // OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK is set
  int mpi_world_size = -1;      // OMPI_COMM_WORLD_SIZE or PMI_SIZE: the processes mpirun started
  int mpi_world_rank = -1;      // OMPI_COMM_WORLD_RANK, PMI_RANK or PMIX_RANK
  // Names of the launch variables that are set (for the half-set warning).
  std::vector<std::string> present;

  // Rank, size and the rendezvous address are all set.
  bool complete() const {
    return rank >= 0 && size > 0 && !rendezvous_addr.empty() && rendezvous_port > 0;
  }
};

// AUTOTUNE and its AUTOTUNE_* options (autotune.h).
struct AutotuneSettings {
  bool enabled = false;                 // AUTOTUNE
  std::string log_path;                 // AUTOTUNE_LOG: CSV written by rank 0
  int64_t warmup_samples = 3;           // AUTOTUNE_WARMUP_SAMPLES: discarded first samples
  int64_t steps_per_sample = 10;        // AUTOTUNE_STEPS_PER_SAMPLE
  int64_t bayes_opt_max_samples = 20;   // AUTOTUNE_BAYES_OPT_MAX_SAMPLES
  double gaussian_process_noise = 0.8;  // AUTOTUNE_GAUSSIAN_PROCESS_NOISE
  // The user set FUSION_THRESHOLD / CYCLE_TIME / CACHE_CAPACITY: autotune
  // keeps that value (as Horovod does).
  bool fusion_threshold_fixed = false;
  bool cycle_time_fixed = false;
  bool cache_fixed = false;
};

struct Settings {
  int64_t fusion_threshold_bytes = 64 * 1024 * 1024;  // FUSION_THRESHOLD
  double cycle_time_ms = 0.0;          // CYCLE_TIME: min gap between rounds
  int64_t cache_capacity = 1024;       // CACHE_CAPACITY: 0 disables the cache
  LogLevel log_level = LogLevel::kWarning;  // LOG_LEVEL
  double stall_check_time_s = 60.0;    // STALL_CHECK_TIME_SECONDS
  double stall_shutdown_time_s = 0.0;  // STALL_SHUTDOWN_TIME_SECONDS (0: off)
  bool stall_check_disable = false;    // STALL_CHECK_DISABLE
  // CONTROL: "tcp" (default) or "mpi".
  ControlKind control = ControlKind::kTcp;
  std::string socket_ifname;           // SOCKET_IFNAME: interface for control sockets
  bool control_shm = true;             // CONTROL_SHM: same-host control bytes via shared memory
  bool mpi_yield_when_idle = true;     // MPI_YIELD_WHEN_IDLE: Open MPI yields while it waits
  bool graph_inline = true;            // GRAPH_INLINE: graph ops may run the loop themselves
  // ENABLE_XLA_OPS (Horovod's HOROVOD_ENABLE_XLA_OPS): an allreduce may sit
  // inside tf.function(jit_compile=True) as an XLA custom call (Python asks).
  bool enable_xla_ops = true;
  std::string timeline_path;           // TIMELINE
  bool timeline_mark_cycles = false;   // TIMELINE_MARK_CYCLES
  bool hierarchical_allreduce = false; // HIERARCHICAL_ALLREDUCE: GPU allreduce
                                       // within nodes (NCCL), across them (MPI)
  // NCCL_TIMEOUT (seconds): the longest wait for GPU work (a collective, a
  // copy) before the job is ended; unset: the stall-shutdown time when set,
  // else 30, so that a lost peer ends a job within a minute (a healthy
  // collective takes milliseconds once every rank has launched it).
  double nccl_timeout_s = 30.0;
  // ELASTIC: set by the elastic launchers (HOROVOD_ELASTIC=1).  A failed GPU
  // collective then aborts its communicators and raises Horovod's internal
  // error on every rank, so hvd.elastic.run can reset.
  bool elastic = false;
  BackendChoice controller = BackendChoice::kAuto;      // CONTROLLER: gloo|mpi
  BackendChoice cpu_operations = BackendChoice::kAuto;  // CPU_OPERATIONS: gloo|mpi
  LaunchEnv launch;
  bool dynamic_process_sets = false;   // DYNAMIC_PROCESS_SETS: allow add/remove_process_set
  AutotuneSettings autotune;
  // Not read from the environment: whether the response cache is in use now
  // (autotune switches it; with CACHE_CAPACITY=0 there is no cache at all).
  bool cache_enabled = true;

  // "key=value" lines, for `tfhvd` diagnostics and tests.
  std::string ToString() const;
};

// Reads an environment variable; returns false when unset.
using EnvLookup = std::function<bool(const std::string& name, std::string* value)>;

// Parses every setting.  A malformed value is an InvalidArgument naming the
// variable and the value, never a silent default.
Status ParseSettings(const EnvLookup& env, Settings* out);

// EnvLookup over the process environment.
EnvLookup ProcessEnv();

}  // namespace tfhvd

#endif  // TFHVD_CORE_SETTINGS_H_
