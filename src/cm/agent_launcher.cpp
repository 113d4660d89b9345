#include "cm/agent_launcher.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>

#include "common/log.hpp"
#include "common/settings.hpp"

extern char** environ;

namespace softhca::cm {
namespace {

constexpr const char* kAgentName = "softhca-cm-agent";

// The agent beside the object file that holds this code: librdmacm.so.1
// for applications, a test's executable in the build tree.
std::string agent_beside_this_library() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&agent_lock_path), &info) == 0 || info.dli_fname == nullptr) return {};
  std::error_code ec;
  const auto self = std::filesystem::canonical(info.dli_fname, ec);
  if (ec) return {};
  const auto agent = self.parent_path() / kAgentName;
  if (::access(agent.c_str(), X_OK) != 0) return {};
  return agent.string();
}

}  // namespace

std::string agent_lock_path(const std::string& dir) { return dir + "/cm-agent.lock"; }

AgentLauncher::AgentLauncher(std::string host_dir) : lock_path_(agent_lock_path(host_dir)) {
  if (setting_number(SettingId::kCmAgent) != 0) return;  // off
  executable_ = agent_beside_this_library();
  if (executable_.empty()) {
    SOFTHCA_INFO(
        "cm: no %s beside the library; connections of a process killed while connected to another "
        "host are not disconnected for its peers",
        kAgentName);
    return;
  }
  fd_ = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) {
    SOFTHCA_WARN("cm: cannot open %s: %s; no CM agent", lock_path_.c_str(), std::strerror(errno));
    executable_.clear();
  }
}

AgentLauncher::~AgentLauncher() {
  if (fd_ >= 0) ::close(fd_);
}

void AgentLauncher::ensure_running() {
  if (fd_ < 0) return;
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) return;  // held: an agent runs
  ::flock(fd_, LOCK_UN);
  if (!spawn()) SOFTHCA_WARN("cm: cannot start %s: %s", executable_.c_str(), std::strerror(errno));
}

bool AgentLauncher::spawn() {
  // The agent forks at once and its first process exits (tools/cm_agent),
  // so that the application never sees a child of ours: the one we start
  // is waited for here.
  posix_spawn_file_actions_t files;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&files);
  posix_spawnattr_init(&attr);
  for (int fd = 0; fd < 3; ++fd) posix_spawn_file_actions_addopen(&files, fd, "/dev/null", O_RDWR, 0);
  posix_spawn_file_actions_addclosefrom_np(&files, 3);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  char* argv[] = {const_cast<char*>(kAgentName), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, executable_.c_str(), &files, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    errno = rc;
    return false;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  SOFTHCA_DEBUG("cm: started the host's CM agent");
  return true;
}

}  // namespace softhca::cm
