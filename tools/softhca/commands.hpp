// The subcommands of the `softhca` tool, one file each.
#pragma once

#include <expected>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace softhca::tool {

// Exit codes shared by every subcommand (`run` returns the program's own
// status once it has exec'd, or 126/127 as a shell does when it cannot).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitCannotExecute = 126;
inline constexpr int kExitNotFound = 127;

struct Command {
  std::string_view name;
  std::string_view summary;  // one line for `softhca --help`
  std::string_view help;     // full text for `softhca help NAME`
  // args: the words after the subcommand's name.
  int (*main)(std::span<char* const> args);
};

// run.cpp
extern const Command kRunCommand;
// devices.cpp
extern const Command kDevicesCommand;
// info.cpp
extern const Command kInfoCommand;
// stat.cpp
extern const Command kStatCommand;

// libdir.cpp: the library directory `softhca run` uses without --libdir:
// build/lib for build/bin/softhca, <prefix>/lib/softhca for an installed
// <prefix>/bin/softhca.
std::expected<std::filesystem::path, std::string> default_libdir();

// True for -h and --help.
bool is_help_flag(std::string_view arg);

}  // namespace softhca::tool
