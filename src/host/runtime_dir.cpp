#include "host/runtime_dir.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.hpp"
#include "common/settings.hpp"

namespace softhca::host {
namespace {

std::string candidate(const std::string& prefix, int n) {
  return n == 0 ? prefix : prefix + "." + std::to_string(n);
}

// Creates `path` as our private directory. Returns false when the name
// exists (someone, maybe another process of ours, was first).
Result<bool> create_private_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0) {
    if (errno == EEXIST) return false;
    return fail(static_cast<std::errc>(errno));
  }
  // The umask may have taken bits of 0700 away; nobody else can have
  // changed the directory meanwhile (only its owner or root can chmod).
  if (::chmod(path.c_str(), 0700) != 0) return fail(static_cast<std::errc>(errno));
  return true;
}

void warn_fallback(const std::string& prefix, const std::string& dir) {
  const char* problem = private_dir_problem(prefix);
  SOFTHCA_WARN("%s %s; using %s instead", prefix.c_str(), problem ? problem : "is missing while a later one is in use",
               dir.c_str());
}

}  // namespace

const char* private_dir_problem(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return "cannot be examined";
  if (S_ISLNK(st.st_mode)) return "is a symbolic link";
  if (!S_ISDIR(st.st_mode)) return "is not a directory";
  if (st.st_uid != ::getuid()) return "is owned by another user";
  if ((st.st_mode & 07777) != 0700) return "does not have mode 0700";
  return nullptr;
}

Result<std::string> runtime_directory_for(const char* explicit_dir, const std::string& prefix) {
  if (explicit_dir != nullptr && explicit_dir[0] != '\0') {
    // The user's own choice: used as it is or not at all.
    const std::string dir = explicit_dir;
    if (auto made = create_private_dir(dir); !made) {
      SOFTHCA_ERROR("cannot create SOFTHCA_RUNTIME_DIR %s: %s", dir.c_str(), std::strerror(to_errno(made.error())));
      return fail(made.error());
    }
    // A directory of ours that is merely too open (made with mkdir by hand)
    // is tightened, as the CM socket directory always was.
    struct stat st {};
    if (::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::getuid() &&
        (st.st_mode & 07777) != 0700)
      ::chmod(dir.c_str(), 0700);
    if (const char* problem = private_dir_problem(dir)) {
      SOFTHCA_ERROR("SOFTHCA_RUNTIME_DIR %s %s; it must be a directory of this user with mode 0700", dir.c_str(),
                    problem);
      return fail(std::errc::permission_denied);
    }
    return dir;
  }
  // First pass: a candidate already in use by this user wins.
  bool exists[kRuntimeDirCandidates] = {};
  for (int n = 0; n < kRuntimeDirCandidates; ++n) {
    const std::string dir = candidate(prefix, n);
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0) continue;
    exists[n] = true;
    if (private_dir_problem(dir) != nullptr) continue;
    if (n != 0) warn_fallback(prefix, dir);
    return dir;
  }
  // Second pass: create the first free name. Losing the race for a name to
  // another process of ours is fine (it is then ours and private); losing it
  // to a squatter moves us on to the next.
  for (int n = 0; n < kRuntimeDirCandidates; ++n) {
    if (exists[n]) continue;
    const std::string dir = candidate(prefix, n);
    auto made = create_private_dir(dir);
    if (!made) {
      SOFTHCA_ERROR("cannot create %s: %s", dir.c_str(), std::strerror(to_errno(made.error())));
      return fail(made.error());
    }
    if (*made || private_dir_problem(dir) == nullptr) {
      if (n != 0) warn_fallback(prefix, dir);
      return dir;
    }
    exists[n] = true;
  }
  std::string taken;
  for (int n = 0; n < kRuntimeDirCandidates; ++n) {
    const std::string dir = candidate(prefix, n);
    const char* problem = private_dir_problem(dir);
    taken += (n ? ", " : "") + dir + " " + (problem ? problem : "is usable now");
  }
  SOFTHCA_ERROR("no private directory for softhca's files: %s; remove these or set SOFTHCA_RUNTIME_DIR",
                taken.c_str());
  return fail(std::errc::permission_denied);
}

Result<std::string> runtime_directory() {
  return runtime_directory_for(setting_text(SettingId::kRuntimeDir),
                               "/dev/shm/softhca-" + std::to_string(::getuid()));
}

}  // namespace softhca::host
