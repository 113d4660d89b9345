// softhca shell: a shell in the setting of `softhca run` (LD_LIBRARY_PATH and
// the device files of a private mount namespace), for interactive work and for
// CI jobs that run several commands: every program started from it, and every
// process those start (mpirun's ranks), sees softhca0 as UCX expects it.
#include <cstddef>
#include <cstdlib>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"

namespace softhca::tool {
namespace {

// $SHELL when it names a program, else /bin/sh.
std::string shell_program() {
  const char* shell = std::getenv("SHELL");
  return shell != nullptr && *shell == '/' ? shell : "/bin/sh";
}

int shell_main(std::span<char* const> args) {
  RunOptions options;
  const auto first = parse_run_options("shell", args, options, UnknownOption::kStop);
  if (!first) {
    return first.error();
  }
  std::string shell = shell_program();
  std::vector<char*> argv{shell.data()};
  argv.insert(argv.end(), args.begin() + static_cast<std::ptrdiff_t>(*first), args.end());
  return exec_on_softhca("shell", options, std::move(argv));
}

}  // namespace

const Command kShellCommand = {
    .name = "shell",
    .summary = "a shell whose programs run on softhca: softhca shell [-c COMMAND]",
    .help =
        "usage: softhca shell [-v] [--libdir DIR] [--devices|--no-devices] [--] [SHELL ARGS...]\n"
        "\n"
        "Starts $SHELL (/bin/sh when unset) as `softhca run` starts a program: with\n"
        "softhca's library directory first in LD_LIBRARY_PATH, and in a private mount\n"
        "namespace with /dev/infiniband/uverbs0 and /sys/class/infiniband/softhca0\n"
        "(`softhca help run` says how). Everything started from the shell inherits both,\n"
        "so UCX programs and mpirun's ranks find softhca0. For a long-lived terminal or\n"
        "a CI job of several commands. SHELL ARGS go to the shell: -c COMMAND runs one\n"
        "command line; put '--' before shell arguments that are softhca options (-v).\n"
        "\n"
        "options: as for `softhca run` (--libdir, --devices, --no-devices, -v)\n"
        "\n"
        "exit status: the shell's; 1, 2, 126, 127 as for `softhca run`.\n"
        "\n"
        "examples: softhca shell\n"
        "          softhca shell -c 'ucx_info -d | grep -e Device -e Transport'\n",
    .main = shell_main,
};

}  // namespace softhca::tool
