// A forked child process for the loopback tests that need a peer in another
// process: a pipe each way, and the child killed and reaped when the test
// ends early, so a failed assertion never leaves it running. The child
// opens its own context after the fork and reports through its exit status
// (0 = good, otherwise the number of the step that failed) and the pipes.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

#include "loopback.hpp"

namespace loopback {

inline bool write_all(int fd, const void* data, size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

inline bool read_all(int fd, void* data, size_t size, Millis timeout) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    if (!fd_readable(fd, timeout)) return false;
    const ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// A child process with a pipe each way; killed and reaped at the end if still there.
class Child {
 public:
  template <typename Fn>
  explicit Child(Fn&& body) {
    int to_child[2], to_parent[2];
    if (::pipe(to_child) != 0 || ::pipe(to_parent) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(to_child[1]);
      ::close(to_parent[0]);
      const int code = body(to_child[0], to_parent[1]);
      ::_exit(code);
    }
    ::close(to_child[0]);
    ::close(to_parent[1]);
    rfd = to_parent[0];
    wfd = to_child[1];
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      int status;
      ::waitpid(pid_, &status, 0);
    }
    if (rfd >= 0) ::close(rfd);
    if (wfd >= 0) ::close(wfd);
  }
  bool ok() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // The child's exit code, waiting at most `timeout`; -1 if it did not exit normally in time.
  int wait_exit(Millis timeout) {
    const auto until = Clock::now() + timeout;
    for (;;) {
      int status = 0;
      const pid_t got = ::waitpid(pid_, &status, WNOHANG);
      if (got == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      if (got < 0 || Clock::now() > until) return -1;
      ::poll(nullptr, 0, 1);
    }
  }
  void kill_now() {
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
  }

  int rfd = -1;
  int wfd = -1;

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

}  // namespace loopback
