// The subcommands of the `softhca` tool, one file each.
#pragma once

#include <expected>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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
// shell.cpp
extern const Command kShellCommand;
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

// run.cpp: what `softhca run` and `softhca shell` share.
enum class DeviceFilesMode {
  kAuto,      // device files in a private namespace where possible, else one warning line
  kRequired,  // --devices: exit 1 where they cannot be made
  kOff,       // --no-devices: LD_LIBRARY_PATH alone
};
struct RunOptions {
  std::string libdir_option;  // --libdir; empty: default_libdir()
  bool verbose = false;
  DeviceFilesMode devices = DeviceFilesMode::kAuto;
};
enum class UnknownOption {
  kReject,  // run: a usage error (the program's name needs '--' before it)
  kStop,    // shell: the first of the shell's own arguments
};
// Parses the options at the front of `args` (who: "run" or "shell", for
// messages); returns the index after them (after "--" if that ended them), or
// the exit status of a usage error.
std::expected<std::size_t, int> parse_run_options(std::string_view who, std::span<char* const> args,
                                                  RunOptions& options, UnknownOption unknown);
// Sets LD_LIBRARY_PATH, provides the device files (device_files.hpp) and
// execs argv[0] (looked up in PATH); returns only on failure, with the exit status.
int exec_on_softhca(std::string_view who, const RunOptions& options, std::vector<char*> argv);

// True for -h and --help.
bool is_help_flag(std::string_view arg);

}  // namespace softhca::tool
