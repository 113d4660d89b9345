// Where `softhca run` and `softhca info` look for softhca's libraries when no
// --libdir is given. The answer depends on which copy of the tool this is:
// the build tree keeps the libraries in build/lib beside build/bin, an
// installation keeps them in a private <libdir>/softhca (so that they never
// shadow rdma-core's in <libdir>). This file is therefore compiled once per
// copy, each with its own SOFTHCA_LIBDIR_RELATIVE (tools/softhca/CMakeLists.txt),
// rather than guessing at run time: an installed tool whose private directory
// is missing must say so, not fall back to <prefix>/lib, where another
// libibverbs.so.1 may live.
#include <expected>
#include <filesystem>
#include <string>
#include <system_error>

#include "commands.hpp"

#ifndef SOFTHCA_LIBDIR_RELATIVE
#error "SOFTHCA_LIBDIR_RELATIVE must be the library directory relative to the tool's own"
#endif

namespace softhca::tool {

namespace fs = std::filesystem;

std::expected<fs::path, std::string> default_libdir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) {
    return std::unexpected("cannot resolve /proc/self/exe: " + ec.message());
  }
  return (exe.parent_path() / SOFTHCA_LIBDIR_RELATIVE).lexically_normal();
}

}  // namespace softhca::tool
