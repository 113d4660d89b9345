// softhca: the command-line tool of the software RDMA HCA.
//
//   softhca run [--] PROGRAM ARGS...   run a program on softhca
//   softhca shell [-c COMMAND]         a shell whose programs run on softhca
//   softhca devices [NAME]             list devices, ports and GIDs
//   softhca info [-c]                  version, directories; -c: every setting
//   softhca stat [-a] [--port|--qp N]  counters of the port and of each QP
//   softhca help [COMMAND]             usage
#include <array>
#include <cstdio>
#include <span>
#include <string_view>

#include "commands.hpp"

namespace softhca::tool {

bool is_help_flag(std::string_view arg) { return arg == "-h" || arg == "--help"; }

namespace {

constexpr std::array kCommands = {&kRunCommand,  &kShellCommand, &kDevicesCommand,
                                   &kInfoCommand, &kStatCommand};

const Command* find_command(std::string_view name) {
  for (const Command* command : kCommands) {
    if (command->name == name) {
      return command;
    }
  }
  return nullptr;
}

void print_overview(std::FILE* out) {
  std::fputs(
      "usage: softhca COMMAND [ARGS...]\n"
      "\n"
      "softhca is a software RDMA device behind the libibverbs.so.1 ABI of\n"
      "rdma-core 44: unmodified RDMA programs run on it through LD_LIBRARY_PATH.\n"
      "\n"
      "commands:\n",
      out);
  for (const Command* command : kCommands) {
    std::fprintf(out, "  %-10.*s %.*s\n", static_cast<int>(command->name.size()),
                 command->name.data(), static_cast<int>(command->summary.size()),
                 command->summary.data());
  }
  std::fputs(
      "  help       show this text, or `softhca help COMMAND` for one command\n"
      "\n"
      "exit status: 0 success, 1 failure, 2 usage error; `run` and `shell` return\n"
      "the program's status (126/127 when it cannot be executed or found).\n",
      out);
}

void print_help(const Command& command) {
  std::fwrite(command.help.data(), 1, command.help.size(), stdout);
}

int unknown_command(std::string_view name) {
  std::fprintf(stderr, "softhca: unknown command '%.*s'; run 'softhca --help' for the list\n",
               static_cast<int>(name.size()), name.data());
  return kExitUsage;
}

int help_main(std::span<char* const> args) {
  if (args.empty()) {
    print_overview(stdout);
    return kExitOk;
  }
  if (args.size() > 1) {
    std::fputs("softhca help: expected at most one command name\n", stderr);
    return kExitUsage;
  }
  const Command* command = find_command(args[0]);
  if (command == nullptr) {
    return unknown_command(args[0]);
  }
  print_help(*command);
  return kExitOk;
}

int tool_main(std::span<char* const> args) {
  if (args.empty()) {
    print_overview(stderr);
    return kExitUsage;
  }
  const std::string_view name = args[0];
  const auto rest = args.subspan(1);
  if (is_help_flag(name) || name == "help") {
    return help_main(rest);
  }
  const Command* command = find_command(name);
  if (command == nullptr) {
    return unknown_command(name);
  }
  // `softhca run` passes everything after PROGRAM through untouched, so only
  // look at the first word for --help.
  if (!rest.empty() && is_help_flag(rest[0])) {
    print_help(*command);
    return kExitOk;
  }
  return command->main(rest);
}

}  // namespace
}  // namespace softhca::tool

int main(int argc, char** argv) {
  std::span<char* const> args(argv, static_cast<std::size_t>(argc));
  return softhca::tool::tool_main(args.subspan(argc > 0 ? 1 : 0));
}
