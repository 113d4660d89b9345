// Logging: SOFTHCA_LOG (error|warn|info|debug|trace, default warn) selects the
// level, read once per process at its first message (common/settings.hpp).
// Messages go to stderr (or SOFTHCA_LOG_FILE), lowercase, QPN in hex, e.g.
//   softhca: post_send on qp 0x12 in state INIT: move it to RTS first
// The helpers preserve errno so they can sit on error paths.
#pragma once

#include <cstdarg>

namespace softhca {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

LogLevel log_level() noexcept;
bool log_enabled(LogLevel level) noexcept;
void log_message(LogLevel level, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));

// True the first time it is called with `key` (below kLogOnceKeys) in this
// process, false after: for a warning about something met on every call,
// such as a bad setting read at each request. The keys are the settings
// table's indices (settings.cpp), its only user so far.
inline constexpr unsigned kLogOnceKeys = 64;
bool log_first_time(unsigned key) noexcept;

}  // namespace softhca

#define SOFTHCA_LOG_AT(level, ...)                                         \
  do {                                                                     \
    if (::softhca::log_enabled(level)) ::softhca::log_message(level, __VA_ARGS__); \
  } while (0)
#define SOFTHCA_ERROR(...) SOFTHCA_LOG_AT(::softhca::LogLevel::kError, __VA_ARGS__)
#define SOFTHCA_WARN(...) SOFTHCA_LOG_AT(::softhca::LogLevel::kWarn, __VA_ARGS__)
#define SOFTHCA_INFO(...) SOFTHCA_LOG_AT(::softhca::LogLevel::kInfo, __VA_ARGS__)
#define SOFTHCA_DEBUG(...) SOFTHCA_LOG_AT(::softhca::LogLevel::kDebug, __VA_ARGS__)
