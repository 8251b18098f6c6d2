// Minimal leveled logging to stderr, prefixed with the rank.  The level is a
// field of the owning Logger (no file-level mutable state).
#ifndef TFHVD_CORE_LOGGING_H_
#define TFHVD_CORE_LOGGING_H_

#include <sstream>
#include <string>

#include "settings.h"

namespace tfhvd {

class Logger {
 public:
  Logger(LogLevel level, int rank) : level_(level), rank_(rank) {}
  bool Enabled(LogLevel l) const { return l >= level_; }
  void Log(LogLevel l, const std::string& msg) const;

 private:
  LogLevel level_;
  int rank_;
};

#define TFHVD_LOG(logger, lvl, ...)                           \
  do {                                                        \
    if ((logger).Enabled(::tfhvd::LogLevel::lvl)) {           \
      std::ostringstream _o;                                  \
      _o << __VA_ARGS__;                                      \
      (logger).Log(::tfhvd::LogLevel::lvl, _o.str());         \
    }                                                         \
  } while (0)

}  // namespace tfhvd

#endif  // TFHVD_CORE_LOGGING_H_
