#include "settings.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <sstream>

namespace tfhvd {
namespace {

// The longest Gloo timeout, 2,000,000 s (23 days): the control channel's
// poll() takes it in milliseconds as an int, and Gloo adds it to a clock.
constexpr double kMaxGlooTimeoutS = 2000000.0;

const char* kPrefixes[] = {"TFHVD_", "HOROVOD_"};

// Finds NAME under either prefix; `used` receives the full variable name.
bool Lookup(const EnvLookup& env, const std::string& name, std::string* value,
            std::string* used) {
  for (const char* prefix : kPrefixes) {
    std::string full = std::string(prefix) + name;
    if (env(full, value) && !value->empty()) {
      *used = full;
      return true;
    }
  }
  return false;
}

Status Bad(const std::string& var, const std::string& value, const char* want) {
  return Status::InvalidArgument("invalid value '" + value + "' for " + var +
                                 ": expected " + want);
}

// A finite number from min to max (inf and nan are refused: an infinite cycle
// time sleeps for ever, an infinite timeout overflows the clock).
Status ParseDouble(const EnvLookup& env, const std::string& name, double min,
                   double* out, double max = HUGE_VAL) {
  std::string value, var;
  if (!Lookup(env, name, &value, &var)) return Status::OK();
  char* end = nullptr;
  double v = std::strtod(value.c_str(), &end);
  if (end == value.c_str() || *end != '\0' || !std::isfinite(v) || !(v >= min)) {
    return Bad(var, value, min == 0 ? "a finite number >= 0" : "a finite number");
  }
  if (v > max) {
    std::ostringstream want;
    want << "a number from " << min << " to " << static_cast<int64_t>(max);
    return Bad(var, value, want.str().c_str());
  }
  *out = v;
  return Status::OK();
}

Status ParseInt(const EnvLookup& env, const std::string& name, int64_t* out) {
  std::string value, var;
  if (!Lookup(env, name, &value, &var)) return Status::OK();
  char* end = nullptr;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (end == value.c_str() || *end != '\0' || v < 0) {
    return Bad(var, value, "an integer >= 0");
  }
  *out = v;
  return Status::OK();
}

Status ParseBool(const EnvLookup& env, const std::string& name, bool* out) {
  std::string value, var;
  if (!Lookup(env, name, &value, &var)) return Status::OK();
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), ::tolower);
  if (v == "1" || v == "true" || v == "yes" || v == "on") {
    *out = true;
  } else if (v == "0" || v == "false" || v == "no" || v == "off") {
    *out = false;
  } else {
    return Bad(var, value, "1/0, true/false, yes/no or on/off");
  }
  return Status::OK();
}

Status ParseLogLevel(const EnvLookup& env, LogLevel* out) {
  std::string value, var;
  if (!Lookup(env, "LOG_LEVEL", &value, &var)) return Status::OK();
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), ::tolower);
  static const char* kNames[] = {"trace", "debug", "info", "warning", "error", "fatal"};
  for (int i = 0; i < 6; ++i) {
    if (v == kNames[i] || (v == "warn" && i == 3)) {
      *out = static_cast<LogLevel>(i);
      return Status::OK();
    }
  }
  return Bad(var, value, "one of trace, debug, info, warning, error, fatal");
}

Status ParseChoice(const EnvLookup& env, const std::string& name, BackendChoice* out) {
  std::string value, var;
  if (!Lookup(env, name, &value, &var)) return Status::OK();
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), ::tolower);
  if (v == "mpi") {
    *out = BackendChoice::kMpi;
  } else if (v == "gloo") {
    *out = BackendChoice::kGloo;
  } else {
    return Bad(var, value, "gloo or mpi");
  }
  return Status::OK();
}

// An int launch variable; records its name in `present` when set.
Status ParseLaunchInt(const EnvLookup& env, const std::string& name, int* out,
                      std::vector<std::string>* present) {
  std::string value, var;
  if (!Lookup(env, name, &value, &var)) return Status::OK();
  int64_t v = -1;
  TFHVD_RETURN_IF_ERROR(ParseInt(env, name, &v));
  if (v > (1 << 30)) return Bad(var, value, "an integer < 2^30");
  *out = static_cast<int>(v);
  present->push_back(var);
  return Status::OK();
}

Status ParseLaunchEnv(const EnvLookup& env, LaunchEnv* l) {
  auto* p = &l->present;
  TFHVD_RETURN_IF_ERROR(ParseLaunchInt(env, "RANK", &l->rank, p));
  TFHVD_RETURN_IF_ERROR(ParseLaunchInt(env, "SIZE", &l->size, p));
  TFHVD_RETURN_IF_ERROR(ParseLaunchInt(env, "LOCAL_RANK", &l->local_rank, p));
  TFHVD_RETURN_IF_ERROR(ParseLaunchInt(env, "LOCAL_SIZE", &l->local_size, p));
  TFHVD_RETURN_IF_ERROR(ParseLaunchInt(env, "CROSS_RANK", &l->cross_rank, p));
  TFHVD_RETURN_IF_ERROR(ParseLaunchInt(env, "CROSS_SIZE", &l->cross_size, p));
  TFHVD_RETURN_IF_ERROR(ParseLaunchInt(env, "GLOO_RENDEZVOUS_PORT", &l->rendezvous_port, p));
  std::string var;
  if (Lookup(env, "GLOO_RENDEZVOUS_ADDR", &l->rendezvous_addr, &var)) p->push_back(var);
  Lookup(env, "HOSTNAME", &l->hostname, &var);
  Lookup(env, "GLOO_IFACE", &l->iface, &var);
  Lookup(env, "GLOO_SCOPE", &l->scope, &var);
  Lookup(env, "SECRET_KEY", &l->secret, &var);
  TFHVD_RETURN_IF_ERROR(
      ParseDouble(env, "GLOO_TIMEOUT_SECONDS", 0, &l->timeout_s, kMaxGlooTimeoutS));
  // The first of `names` that is set, as an int (-1: none is).
  auto first_int = [&env](std::initializer_list<const char*> names) {
    std::string value;
    for (const char* name : names) {
      if (env(name, &value)) return std::atoi(value.c_str());
    }
    return -1;
  };
  l->mpi_world_size = first_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"});
  l->mpi_world_rank = first_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"});
  std::string ignored;
  l->under_mpirun = l->mpi_world_size != -1 || env("PMIX_RANK", &ignored);
  if (l->size == 0) return Bad("HOROVOD_SIZE", "0", "an integer >= 1");
  if (l->rank >= 0 && l->size > 0 && l->rank >= l->size) {
    return Status::InvalidArgument("tfhvd: HOROVOD_RANK=" + std::to_string(l->rank) +
                                   " is not below HOROVOD_SIZE=" + std::to_string(l->size));
  }
  return Status::OK();
}

bool IsSet(const EnvLookup& env, const std::string& name) {
  std::string value, var;
  return Lookup(env, name, &value, &var);
}

Status ParseAutotune(const EnvLookup& env, AutotuneSettings* a) {
  TFHVD_RETURN_IF_ERROR(ParseBool(env, "AUTOTUNE", &a->enabled));
  std::string var;
  Lookup(env, "AUTOTUNE_LOG", &a->log_path, &var);
  TFHVD_RETURN_IF_ERROR(ParseInt(env, "AUTOTUNE_WARMUP_SAMPLES", &a->warmup_samples));
  TFHVD_RETURN_IF_ERROR(ParseInt(env, "AUTOTUNE_STEPS_PER_SAMPLE", &a->steps_per_sample));
  TFHVD_RETURN_IF_ERROR(
      ParseInt(env, "AUTOTUNE_BAYES_OPT_MAX_SAMPLES", &a->bayes_opt_max_samples));
  TFHVD_RETURN_IF_ERROR(
      ParseDouble(env, "AUTOTUNE_GAUSSIAN_PROCESS_NOISE", 0, &a->gaussian_process_noise));
  std::string value;
  if (a->steps_per_sample < 1 && Lookup(env, "AUTOTUNE_STEPS_PER_SAMPLE", &value, &var)) {
    return Bad(var, value, "an integer >= 1");
  }
  if (a->bayes_opt_max_samples < 1 &&
      Lookup(env, "AUTOTUNE_BAYES_OPT_MAX_SAMPLES", &value, &var)) {
    return Bad(var, value, "an integer >= 1");
  }
  a->fusion_threshold_fixed = IsSet(env, "FUSION_THRESHOLD");
  a->cycle_time_fixed = IsSet(env, "CYCLE_TIME");
  a->cache_fixed = IsSet(env, "CACHE_CAPACITY");
  return Status::OK();
}

}  // namespace

const char* BackendChoiceName(BackendChoice c) {
  switch (c) {
    case BackendChoice::kMpi: return "mpi";
    case BackendChoice::kGloo: return "gloo";
    default: return "auto";
  }
}

EnvLookup ProcessEnv() {
  return [](const std::string& name, std::string* value) {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return false;
    *value = v;
    return true;
  };
}

Status ParseSettings(const EnvLookup& env, Settings* s) {
  *s = Settings();
  TFHVD_RETURN_IF_ERROR(ParseInt(env, "FUSION_THRESHOLD", &s->fusion_threshold_bytes));
  TFHVD_RETURN_IF_ERROR(ParseDouble(env, "CYCLE_TIME", 0, &s->cycle_time_ms));
  TFHVD_RETURN_IF_ERROR(ParseInt(env, "CACHE_CAPACITY", &s->cache_capacity));
  TFHVD_RETURN_IF_ERROR(ParseLogLevel(env, &s->log_level));
  TFHVD_RETURN_IF_ERROR(
      ParseDouble(env, "STALL_CHECK_TIME_SECONDS", 0, &s->stall_check_time_s));
  TFHVD_RETURN_IF_ERROR(
      ParseDouble(env, "STALL_SHUTDOWN_TIME_SECONDS", 0, &s->stall_shutdown_time_s));
  TFHVD_RETURN_IF_ERROR(ParseBool(env, "STALL_CHECK_DISABLE", &s->stall_check_disable));
  std::string var, control;
  if (Lookup(env, "CONTROL", &control, &var)) {
    if (control == "mpi") {
      s->control = ControlKind::kMpi;
    } else if (control == "tcp") {
      s->control = ControlKind::kTcp;
    } else {
      return Bad(var, control, "tcp or mpi");
    }
  }
  Lookup(env, "SOCKET_IFNAME", &s->socket_ifname, &var);
  TFHVD_RETURN_IF_ERROR(ParseBool(env, "CONTROL_SHM", &s->control_shm));
  TFHVD_RETURN_IF_ERROR(ParseBool(env, "MPI_YIELD_WHEN_IDLE", &s->mpi_yield_when_idle));
  TFHVD_RETURN_IF_ERROR(ParseBool(env, "GRAPH_INLINE", &s->graph_inline));
  TFHVD_RETURN_IF_ERROR(ParseBool(env, "ENABLE_XLA_OPS", &s->enable_xla_ops));
  Lookup(env, "TIMELINE", &s->timeline_path, &var);
  // Horovod's HOROVOD_TIMELINE=DYNAMIC: no file until hvd.start_timeline().
  if (s->timeline_path == "DYNAMIC") s->timeline_path.clear();
  TFHVD_RETURN_IF_ERROR(ParseBool(env, "TIMELINE_MARK_CYCLES", &s->timeline_mark_cycles));
  TFHVD_RETURN_IF_ERROR(
      ParseBool(env, "HIERARCHICAL_ALLREDUCE", &s->hierarchical_allreduce));
  TFHVD_RETURN_IF_ERROR(ParseBool(env, "ELASTIC", &s->elastic));
  if (s->stall_shutdown_time_s > 0) s->nccl_timeout_s = s->stall_shutdown_time_s;
  TFHVD_RETURN_IF_ERROR(ParseDouble(env, "NCCL_TIMEOUT", 0, &s->nccl_timeout_s));
  if (s->nccl_timeout_s <= 0) {
    return Status::InvalidArgument("tfhvd: TFHVD_NCCL_TIMEOUT must be a positive number of "
                                   "seconds (a GPU wait without a deadline can hang the job)");
  }
  TFHVD_RETURN_IF_ERROR(ParseChoice(env, "CONTROLLER", &s->controller));
  TFHVD_RETURN_IF_ERROR(ParseChoice(env, "CPU_OPERATIONS", &s->cpu_operations));
  TFHVD_RETURN_IF_ERROR(ParseLaunchEnv(env, &s->launch));
  TFHVD_RETURN_IF_ERROR(ParseBool(env, "DYNAMIC_PROCESS_SETS", &s->dynamic_process_sets));
  TFHVD_RETURN_IF_ERROR(ParseAutotune(env, &s->autotune));
  s->cache_enabled = s->cache_capacity > 0;
  return Status::OK();
}

std::string Settings::ToString() const {
  static const char* kNames[] = {"trace", "debug", "info", "warning", "error", "fatal"};
  std::ostringstream o;
  o << "fusion_threshold_bytes=" << fusion_threshold_bytes << "\n"
    << "cycle_time_ms=" << cycle_time_ms << "\n"
    << "cache_capacity=" << cache_capacity << "\n"
    << "log_level=" << kNames[static_cast<int>(log_level)] << "\n"
    << "stall_check_time_s=" << stall_check_time_s << "\n"
    << "stall_shutdown_time_s=" << stall_shutdown_time_s << "\n"
    << "nccl_timeout_s=" << nccl_timeout_s << "\n"
    << "stall_check_disable=" << (stall_check_disable ? 1 : 0) << "\n"
    << "control="
    << (control == ControlKind::kMpi ? "mpi" : "tcp")
    << "\n"
    << "control_shm=" << (control_shm ? 1 : 0) << "\n"
    << "mpi_yield_when_idle=" << (mpi_yield_when_idle ? 1 : 0) << "\n"
    << "graph_inline=" << (graph_inline ? 1 : 0) << "\n"
    << "enable_xla_ops=" << (enable_xla_ops ? 1 : 0) << "\n"
    << "socket_ifname=" << socket_ifname << "\n"
    << "timeline_path=" << timeline_path << "\n"
    << "timeline_mark_cycles=" << (timeline_mark_cycles ? 1 : 0) << "\n"
    << "hierarchical_allreduce=" << (hierarchical_allreduce ? 1 : 0) << "\n"
    << "elastic=" << (elastic ? 1 : 0) << "\n"
    << "controller=" << BackendChoiceName(controller) << "\n"
    << "cpu_operations=" << BackendChoiceName(cpu_operations) << "\n"
    << "gloo_timeout_s=" << launch.timeout_s << "\n"
    << "dynamic_process_sets=" << (dynamic_process_sets ? 1 : 0) << "\n"
    << "autotune=" << (autotune.enabled ? 1 : 0) << "\n"
    << "autotune_log=" << autotune.log_path << "\n"
    << "autotune_warmup_samples=" << autotune.warmup_samples << "\n"
    << "autotune_steps_per_sample=" << autotune.steps_per_sample << "\n"
    << "autotune_bayes_opt_max_samples=" << autotune.bayes_opt_max_samples << "\n"
    << "autotune_gaussian_process_noise=" << autotune.gaussian_process_noise << "\n";
  return o.str();
}

}  // namespace tfhvd
