#include "host/host_identity.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "common/log.hpp"
#include "host/runtime_dir.hpp"

namespace softhca::host {

std::string host_key() {
  struct stat st {};
  if (::stat("/proc/self/ns/net", &st) != 0) return "net-unknown";
  return "net-" + std::to_string(static_cast<unsigned long long>(st.st_ino));
}

Result<std::string> host_directory_in(const std::string& runtime_dir, const std::string& key) {
  const std::string dir = runtime_dir + "/" + key;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    const int err = errno;
    SOFTHCA_ERROR("cannot create %s: %s", dir.c_str(), std::strerror(err));
    return fail(std::errc(err));
  }
  // Inside a private directory nobody else can create it; still, never
  // trust what we did not make.
  if (const char* problem = private_dir_problem(dir)) {
    SOFTHCA_ERROR("%s %s; it must be a directory of this user with mode 0700", dir.c_str(), problem);
    return fail(std::errc::permission_denied);
  }
  return dir;
}

Result<std::string> host_directory() {
  auto runtime = runtime_directory();
  if (!runtime) return fail(runtime.error());
  return host_directory_in(*runtime, host_key());
}

}  // namespace softhca::host
