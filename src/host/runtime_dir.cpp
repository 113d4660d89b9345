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

// Why the first name was passed over for a later one. (A missing name is
// passed over when a later one is in use; private_dir_problem would call it
// "cannot be examined".)
std::string fallback_reason(const std::string& prefix) {
  struct stat st {};
  if (::lstat(prefix.c_str(), &st) != 0 && errno == ENOENT) return prefix + " is missing while a later one is in use";
  const char* problem = private_dir_problem(prefix);
  return prefix + " " + (problem ? problem : "became usable meanwhile");
}

void warn_fallback(const std::string& prefix, const std::string& dir) {
  SOFTHCA_WARN("%s; using %s instead", fallback_reason(prefix).c_str(), dir.c_str());
}

// The rule's first pass: the first candidate that exists and is usable, or -1.
// A candidate in use wins over creating an earlier free one, so that a
// squatter that has gone does not split the user's processes. Marks in
// `exists` every name that is taken.
int first_usable_existing(const std::string& prefix, bool (&exists)[kRuntimeDirCandidates]) {
  for (int n = 0; n < kRuntimeDirCandidates; ++n) {
    const std::string dir = candidate(prefix, n);
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0) continue;
    exists[n] = true;
    if (private_dir_problem(dir) == nullptr) return n;
  }
  return -1;
}

// Every candidate and why it is taken, for the message when all are.
std::string taken_list(const std::string& prefix) {
  std::string taken;
  for (int n = 0; n < kRuntimeDirCandidates; ++n) {
    const std::string dir = candidate(prefix, n);
    const char* problem = private_dir_problem(dir);
    taken += (n ? ", " : "") + dir + " " + (problem ? problem : "is usable now");
  }
  return taken;
}

// A directory of ours that is merely too open (made with mkdir by hand):
// runtime_directory_for tightens it rather than refusing it.
bool is_ours_but_open(const std::string& dir) {
  struct stat st {};
  return ::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::getuid() &&
         (st.st_mode & 07777) != 0700;
}

// Why mkdir(path) would fail, judged from its parent, or nullptr.
const char* creation_problem(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat st {};
  if (::stat(parent.c_str(), &st) != 0) return "cannot be created: its parent directory does not exist";
  if (!S_ISDIR(st.st_mode)) return "cannot be created: its parent is not a directory";
  if (::access(parent.c_str(), W_OK | X_OK) != 0) return "cannot be created: its parent is not writable";
  return nullptr;
}

std::string default_runtime_prefix() { return "/dev/shm/softhca-" + std::to_string(::getuid()); }

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
    // A directory of ours that is merely too open is tightened, as the CM
    // socket directory always was.
    if (is_ours_but_open(dir)) ::chmod(dir.c_str(), 0700);
    if (const char* problem = private_dir_problem(dir)) {
      SOFTHCA_ERROR("SOFTHCA_RUNTIME_DIR %s %s; it must be a directory of this user with mode 0700", dir.c_str(),
                    problem);
      return fail(std::errc::permission_denied);
    }
    return dir;
  }
  // First pass: a candidate already in use by this user wins.
  bool exists[kRuntimeDirCandidates] = {};
  if (const int n = first_usable_existing(prefix, exists); n >= 0) {
    const std::string dir = candidate(prefix, n);
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
  SOFTHCA_ERROR("no private directory for softhca's files: %s; remove these or set SOFTHCA_RUNTIME_DIR",
                taken_list(prefix).c_str());
  return fail(std::errc::permission_denied);
}

Result<std::string> runtime_directory() {
  return runtime_directory_for(setting_text(SettingId::kRuntimeDir), default_runtime_prefix());
}

RuntimeDirProbe probe_runtime_directory_for(const char* explicit_dir, const std::string& prefix) {
  using State = RuntimeDirProbe::State;
  if (explicit_dir != nullptr && explicit_dir[0] != '\0') {
    const std::string dir = explicit_dir;
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0) {
      if (errno != ENOENT) return {dir, State::kUnusable, std::string("cannot be examined: ") + std::strerror(errno)};
      if (const char* problem = creation_problem(dir)) return {dir, State::kUnusable, problem};
      return {dir, State::kCreated, {}};
    }
    if (is_ours_but_open(dir)) return {dir, State::kUsable, "its mode is set to 0700 at first use"};
    if (const char* problem = private_dir_problem(dir)) return {dir, State::kUnusable, problem};
    return {dir, State::kUsable, {}};
  }
  bool exists[kRuntimeDirCandidates] = {};
  if (const int n = first_usable_existing(prefix, exists); n >= 0)
    return {candidate(prefix, n), State::kUsable, n != 0 ? fallback_reason(prefix) : std::string()};
  for (int n = 0; n < kRuntimeDirCandidates; ++n) {
    if (exists[n]) continue;
    const std::string dir = candidate(prefix, n);
    if (const char* problem = creation_problem(dir)) return {dir, State::kUnusable, problem};
    return {dir, State::kCreated, n != 0 ? fallback_reason(prefix) : std::string()};
  }
  return {{}, State::kUnusable, "every candidate is taken: " + taken_list(prefix)};
}

RuntimeDirProbe probe_runtime_directory() {
  return probe_runtime_directory_for(setting_text(SettingId::kRuntimeDir), default_runtime_prefix());
}

}  // namespace softhca::host
