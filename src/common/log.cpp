#include "common/log.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace softhca {
namespace {

LogLevel parse_level(const char* text) {
  if (text == nullptr) return LogLevel::kWarn;
  static constexpr struct {
    const char* name;
    LogLevel level;
  } kNames[] = {{"error", LogLevel::kError}, {"warn", LogLevel::kWarn},   {"info", LogLevel::kInfo},
                {"debug", LogLevel::kDebug}, {"trace", LogLevel::kTrace}};
  for (const auto& entry : kNames)
    if (std::strcmp(text, entry.name) == 0) return entry.level;
  return LogLevel::kWarn;
}

struct LogSink {
  LogLevel level = parse_level(std::getenv("SOFTHCA_LOG"));
  FILE* out = nullptr;
  std::mutex mutex;
  LogSink() {
    if (const char* path = std::getenv("SOFTHCA_LOG_FILE")) out = std::fopen(path, "a");
    if (out == nullptr) out = stderr;
  }
};

LogSink& sink() {
  static LogSink instance;
  return instance;
}

}  // namespace

LogLevel log_level() noexcept { return sink().level; }

bool log_enabled(LogLevel level) noexcept { return level <= sink().level; }

void log_message(LogLevel level, const char* fmt, ...) noexcept {
  const int saved_errno = errno;
  static constexpr const char* kTags[] = {"error", "warn", "info", "debug", "trace"};
  char text[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(text, sizeof text, fmt, args);
  va_end(args);
  LogSink& s = sink();
  {
    std::lock_guard guard(s.mutex);
    std::fprintf(s.out, "softhca %s: %s\n", kTags[static_cast<int>(level)], text);
    std::fflush(s.out);
  }
  errno = saved_errno;
}

}  // namespace softhca
