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
#include "device_files.hpp"

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

}  // namespace

std::expected<std::size_t, int> parse_run_options(std::string_view who, std::span<char* const> args,
                                                  RunOptions& options, UnknownOption unknown) {
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    if (arg == "--") {
      return i + 1;
    }
    if (arg == "-v" || arg == "--verbose") {
      options.verbose = true;
    } else if (arg == "--devices") {
      options.devices = DeviceFilesMode::kRequired;
    } else if (arg == "--no-devices") {
      options.devices = DeviceFilesMode::kOff;
    } else if (arg == "--libdir") {
      if (i + 1 == args.size()) {
        std::fprintf(stderr, "softhca %.*s: --libdir needs a directory\n", static_cast<int>(who.size()),
                     who.data());
        return std::unexpected(kExitUsage);
      }
      options.libdir_option = args[++i];
    } else if (arg.starts_with("--libdir=")) {
      options.libdir_option = arg.substr(std::string_view("--libdir=").size());
    } else if (arg.starts_with("-") && unknown == UnknownOption::kReject) {
      std::fprintf(stderr,
                   "softhca %.*s: unknown option '%s'; put '--' before a program whose "
                   "name starts with '-'\n",
                   static_cast<int>(who.size()), who.data(), args[i]);
      return std::unexpected(kExitUsage);
    } else {
      break;
    }
  }
  return i;
}

int exec_on_softhca(std::string_view who, const RunOptions& options, std::vector<char*> argv) {
  const int w = static_cast<int>(who.size());
  fs::path libdir;
  if (!options.libdir_option.empty()) {
    std::error_code ec;
    libdir = fs::absolute(options.libdir_option, ec);
    if (ec) {
      libdir = options.libdir_option;
    }
  } else {
    auto found = default_libdir();
    if (!found) {
      std::fprintf(stderr, "softhca %.*s: %s\n", w, who.data(), found.error().c_str());
      return kExitFailure;
    }
    libdir = *found;
  }
  if (auto ok = check_libdir(libdir); !ok) {
    std::fprintf(stderr, "softhca %.*s: %s\n", w, who.data(), ok.error().c_str());
    return kExitFailure;
  }

  std::string path = libdir.string();
  if (const char* old = std::getenv("LD_LIBRARY_PATH"); old != nullptr && *old != '\0') {
    path += ':';
    path += old;
  }
  if (::setenv("LD_LIBRARY_PATH", path.c_str(), 1) != 0) {
    std::fprintf(stderr, "softhca %.*s: cannot set LD_LIBRARY_PATH: %s\n", w, who.data(), std::strerror(errno));
    return kExitFailure;
  }
  if (options.verbose) {
    std::fprintf(stderr, "softhca %.*s: LD_LIBRARY_PATH=%s\n", w, who.data(), path.c_str());
  }

  if (options.devices != DeviceFilesMode::kOff) {
    const auto files = read_device_files();
    std::expected<Isolation, std::string> isolation =
        files ? enter_device_namespace(*files) : std::expected<Isolation, std::string>(std::unexpected(files.error()));
    if (!isolation) {
      if (options.devices == DeviceFilesMode::kRequired) {
        std::fprintf(stderr, "softhca %.*s: cannot provide the device files: %s\n", w, who.data(),
                     isolation.error().c_str());
        return kExitFailure;
      }
      // One line: the program still runs, and verbs programs do not need the files.
      std::fprintf(stderr,
                   "softhca %.*s: warning: no private %s and /sys/class/infiniband (%s); stacks that "
                   "probe them (UCX, Open MPI) will not see softhca0; running anyway\n",
                   w, who.data(), kDevInfiniband, isolation.error().c_str());
    } else if (options.verbose) {
      std::fprintf(stderr, "softhca %.*s: %s: %s/%s, %s/rdma_cm, %s, %s\n", w, who.data(),
                   *isolation == Isolation::kMountNamespace ? "private mount namespace"
                                                            : "private user and mount namespaces",
                   kDevInfiniband, files->dev_name.c_str(), kDevInfiniband, files->ibdev_path.c_str(),
                   files->dev_path.c_str());
    }
  }

  argv.push_back(nullptr);
  std::fflush(nullptr);
  ::execvp(argv[0], argv.data());
  const int err = errno;
  std::fprintf(stderr, "softhca %.*s: cannot run '%s': %s\n", w, who.data(), argv[0], std::strerror(err));
  return err == ENOENT ? kExitNotFound : kExitCannotExecute;
}

namespace {

int run_main(std::span<char* const> args) {
  RunOptions options;
  const auto first = parse_run_options("run", args, options, UnknownOption::kReject);
  if (!first) {
    return first.error();
  }
  const std::size_t i = *first;
  if (i == args.size()) {
    std::fputs("softhca run: no program given; usage: softhca run [--] PROGRAM [ARGS...]\n",
               stderr);
    return kExitUsage;
  }
  return exec_on_softhca("run", options,
                         std::vector<char*>(args.begin() + static_cast<std::ptrdiff_t>(i), args.end()));
}

}  // namespace

const Command kRunCommand = {
    .name = "run",
    .summary = "run a program on softhca: softhca run [--] PROGRAM [ARGS...]",
    .help =
        "usage: softhca run [-v] [--libdir DIR] [--devices|--no-devices] [--] PROGRAM [ARGS...]\n"
        "\n"
        "Runs PROGRAM with softhca's library directory prepended to LD_LIBRARY_PATH,\n"
        "so that an unmodified RDMA program (ibv_devinfo, ibv_rc_pingpong, perftest,\n"
        "rping, UCX, Open MPI, ...) loads softhca's libibverbs.so.1 instead of the\n"
        "system's. PROGRAM is looked up in PATH; softhca replaces itself with it (exec),\n"
        "so PROGRAM keeps softhca's process id.\n"
        "\n"
        "Device files: UCX (and Open MPI over it) uses a device only if\n"
        "/dev/infiniband/uverbs0 exists, and reads /sys/class/infiniband/softhca0\n"
        "itself. So PROGRAM runs in a private mount namespace (for a user other than\n"
        "root inside a user namespace that maps its uid and gid to themselves: no\n"
        "privilege needed) in which /dev/infiniband/uverbs0 and /dev/infiniband/rdma_cm\n"
        "are /dev/null (a character device anyone may open) and\n"
        "/sys/class/infiniband/softhca0 and /sys/class/infiniband_verbs/uverbs0 hold\n"
        "what softhca's libibverbs reports. The real /dev and /sys do not change: a\n"
        "missing directory cannot be mounted on, so its parent (/dev, /sys/class) is\n"
        "covered by a tmpfs with every original entry bound back (entries that appear\n"
        "in the real one later are not seen inside). Where namespaces cannot be made,\n"
        "one warning line says why and PROGRAM runs without the files.\n"
        "\n"
        "options:\n"
        "  --libdir DIR   use DIR instead of softhca's own library directory\n"
        "                 (`softhca info` shows it: <dir of softhca>/../lib in a\n"
        "                 build tree, <prefix>/lib/softhca once installed)\n"
        "  --devices      fail (exit 1) rather than run without the device files\n"
        "  --no-devices   no namespace and no device files: only LD_LIBRARY_PATH\n"
        "  -v, --verbose  print the LD_LIBRARY_PATH being used and the device files made\n"
        "  --             end of softhca's options (needed before a PROGRAM that\n"
        "                 starts with '-')\n"
        "\n"
        "exit status: PROGRAM's own; 1 if softhca's libibverbs.so.1 is not found (or,\n"
        "with --devices, the device files cannot be made), 2 on a usage error, 126 if\n"
        "PROGRAM cannot be executed, 127 if not found.\n"
        "\n"
        "examples: softhca run -- ibv_devinfo -v\n"
        "          softhca run -- ucx_info -d\n"
        "          UCX_TLS=rc_v,ud_v UCX_NET_DEVICES=softhca0:1 softhca run -- mpirun -np 2 ./app\n",
    .main = run_main,
};

}  // namespace softhca::tool
