#include "common/log.hpp"

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>

#include "common/settings.hpp"

namespace softhca {
namespace {

static_assert(std::size(kLogLevelNames) == static_cast<std::size_t>(LogLevel::kTrace) + 1 &&
                  kLogLevelNames[static_cast<int>(LogLevel::kWarn)] == "warn",
              "SOFTHCA_LOG's words are LogLevel's, in order");

void write_line(FILE* out, LogLevel level, const char* text) {
  std::fprintf(out, "softhca %.*s: %s\n", static_cast<int>(kLogLevelNames[static_cast<int>(level)].size()),
               kLogLevelNames[static_cast<int>(level)].data(), text);
  std::fflush(out);
}

struct LogSink {
  LogLevel level = LogLevel::kWarn;
  FILE* out = stderr;
  std::mutex mutex;
  std::atomic<uint64_t> said_once{0};  // log_first_time's keys, one bit each
  LogSink() {
    // Built inside log_enabled, which may sit on an error path before
    // log_message has saved errno.
    const int saved_errno = errno;
    const SettingReading reading = read_setting_number(SettingId::kLog, setting_text(SettingId::kLog));
    level = static_cast<LogLevel>(reading.value);
    const char* path = setting_text(SettingId::kLogFile);
    int open_errno = 0;
    if (path != nullptr) {
      if (FILE* file = std::fopen(path, "a")) {
        out = file;
      } else {
        open_errno = errno;
      }
    }
    // The log's own settings are warned about here, straight to `out`:
    // log_message would ask for this sink while it is being built.
    if (level >= LogLevel::kWarn) {
      if (reading.warning) write_line(out, LogLevel::kWarn, reading.warning->c_str());
      if (open_errno != 0) {
        char text[512];
        std::snprintf(text, sizeof text, "cannot open SOFTHCA_LOG_FILE %s: %s; logging to stderr", path,
                      std::strerror(open_errno));
        write_line(out, LogLevel::kWarn, text);
      }
    }
    errno = saved_errno;
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
  char text[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(text, sizeof text, fmt, args);
  va_end(args);
  LogSink& s = sink();
  {
    std::lock_guard guard(s.mutex);
    write_line(s.out, level, text);
  }
  errno = saved_errno;
}

bool log_first_time(unsigned key) noexcept {
  const uint64_t bit = uint64_t{1} << (key % kLogOnceKeys);
  return (sink().said_once.fetch_or(bit, std::memory_order_relaxed) & bit) == 0;
}

}  // namespace softhca
