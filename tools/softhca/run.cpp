// softhca run: exec a program with softhca's lib directory first in
// LD_LIBRARY_PATH, so that its libibverbs.so.1 (and librdmacm.so.1) are ours.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <expected>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "commands.hpp"

namespace softhca::tool {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kVerbsLibrary = "libibverbs.so.1";

std::expected<void, std::string> check_libdir(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return std::unexpected(dir.string() + " is not a directory");
  }
  if (!fs::exists(dir / kVerbsLibrary, ec)) {
    return std::unexpected("no " + std::string(kVerbsLibrary) + " in " + dir.string() +
                           " (build or install softhca first, or pass --libdir)");
  }
  return {};
}

int run_main(std::span<char* const> args) {
  std::string libdir_option;
  bool verbose = false;
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-v" || arg == "--verbose") {
      verbose = true;
    } else if (arg == "--libdir") {
      if (i + 1 == args.size()) {
        std::fputs("softhca run: --libdir needs a directory\n", stderr);
        return kExitUsage;
      }
      libdir_option = args[++i];
    } else if (arg.starts_with("--libdir=")) {
      libdir_option = arg.substr(std::string_view("--libdir=").size());
    } else if (arg.starts_with("-")) {
      std::fprintf(stderr,
                   "softhca run: unknown option '%s'; put '--' before a program whose "
                   "name starts with '-'\n",
                   args[i]);
      return kExitUsage;
    } else {
      break;
    }
  }
  if (i == args.size()) {
    std::fputs("softhca run: no program given; usage: softhca run [--] PROGRAM [ARGS...]\n",
               stderr);
    return kExitUsage;
  }

  fs::path libdir;
  if (!libdir_option.empty()) {
    std::error_code ec;
    libdir = fs::absolute(libdir_option, ec);
    if (ec) {
      libdir = libdir_option;
    }
  } else {
    auto found = default_libdir();
    if (!found) {
      std::fprintf(stderr, "softhca run: %s\n", found.error().c_str());
      return kExitFailure;
    }
    libdir = *found;
  }
  if (auto ok = check_libdir(libdir); !ok) {
    std::fprintf(stderr, "softhca run: %s\n", ok.error().c_str());
    return kExitFailure;
  }

  std::string path = libdir.string();
  if (const char* old = std::getenv("LD_LIBRARY_PATH"); old != nullptr && *old != '\0') {
    path += ':';
    path += old;
  }
  if (::setenv("LD_LIBRARY_PATH", path.c_str(), 1) != 0) {
    std::fprintf(stderr, "softhca run: cannot set LD_LIBRARY_PATH: %s\n", std::strerror(errno));
    return kExitFailure;
  }
  if (verbose) {
    std::fprintf(stderr, "softhca run: LD_LIBRARY_PATH=%s\n", path.c_str());
  }

  std::vector<char*> argv(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  ::execvp(argv[0], argv.data());
  const int err = errno;
  std::fprintf(stderr, "softhca run: cannot run '%s': %s\n", argv[0], std::strerror(err));
  return err == ENOENT ? kExitNotFound : kExitCannotExecute;
}

}  // namespace

const Command kRunCommand = {
    .name = "run",
    .summary = "run a program on softhca: softhca run [--] PROGRAM [ARGS...]",
    .help =
        "usage: softhca run [-v] [--libdir DIR] [--] PROGRAM [ARGS...]\n"
        "\n"
        "Runs PROGRAM with softhca's library directory prepended to LD_LIBRARY_PATH,\n"
        "so that an unmodified RDMA program (ibv_devinfo, ibv_rc_pingpong, perftest,\n"
        "rping, ...) loads softhca's libibverbs.so.1 instead of the system's.\n"
        "PROGRAM is looked up in PATH; softhca replaces itself with it (exec).\n"
        "\n"
        "options:\n"
        "  --libdir DIR   use DIR instead of softhca's own library directory\n"
        "                 (`softhca info` shows it: <dir of softhca>/../lib in a\n"
        "                 build tree, <prefix>/lib/softhca once installed)\n"
        "  -v, --verbose  print the LD_LIBRARY_PATH being used\n"
        "  --             end of softhca's options (needed before a PROGRAM that\n"
        "                 starts with '-')\n"
        "\n"
        "exit status: PROGRAM's own; 1 if softhca's libibverbs.so.1 is not found,\n"
        "2 on a usage error, 126 if PROGRAM cannot be executed, 127 if not found.\n"
        "\n"
        "example: softhca run -- ibv_devinfo -v\n",
    .main = run_main,
};

}  // namespace softhca::tool
