// The local transport of CM messages (cm/transport.hpp): how they travel
// between the processes of one host. One Unix
// SOCK_SEQPACKET endpoint per process, bound at a path in a per-user directory
// (the user's runtime directory, mode 0700, host/runtime_dir.hpp; never the
// abstract namespace, which ignores file permissions and network namespaces
// would split). A process connects to a peer's endpoint the first time it has
// something to send there; either side may then send on that connection.
//
// Why connections rather than datagrams: a connection breaks when its process
// dies, however it dies, so a killed peer is noticed at once (POLLHUP) and its
// CM ids fail the way the kernel's CM would make them fail when it cleans up a
// dead process's ids — without timers or liveness polling. Each message is one
// record (seqpacket keeps boundaries); the peer's pid and uid come from
// SO_PEERCRED, not from anything it says, and other users are refused.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cm/transport.hpp"
#include "common/result.hpp"

namespace softhca::cm {

// The directory for this user's endpoints: its runtime directory.
// Errors: permission_denied (no private directory could be had).
Result<std::string> endpoint_directory();

class LocalTransport final : public Transport {
 public:
  // Binds and listens at `path` (a stale file left by a dead process with our
  // pid is replaced).
  static Result<std::unique_ptr<LocalTransport>> open(const std::string& path);
  ~LocalTransport() override;
  LocalTransport(const LocalTransport&) = delete;
  LocalTransport& operator=(const LocalTransport&) = delete;

  const std::string& path() const { return path_; }

  // Sends one message to process to.pid, connecting to its endpoint at
  // to.path first if no connection exists (the path may be empty when the
  // peer is known to have connected to us). Errors: connection_refused or
  // no_such_file_or_directory (nobody there: the peer is gone), others from
  // send(2) (timed_out after 2 s of a full peer).
  Result<void> send(const Peer& to, std::span<const uint8_t> bytes) override;

  // Messages come from Peer{pid, ""}; a peer is lost when none of the
  // connections with its pid is open any more.
  void poll_once(int timeout_ms, const MessageFn& on_message, const LostFn& on_lost) override;

  // Also used here when a new connection must be watched.
  void wake() override;

  void abandon_after_fork() override;

  // Removes the endpoint's file.
  void leave_at_exit() override;

 private:
  struct Conn {
    explicit Conn(int f, uint32_t p) : fd(f), pid(p) {}
    ~Conn();
    int fd;
    uint32_t pid;
  };

  LocalTransport(int listen_fd, int wake_fd, std::string path)
      : listen_fd_(listen_fd), wake_fd_(wake_fd), path_(std::move(path)) {}
  std::shared_ptr<Conn> find(uint32_t pid);
  void add(std::shared_ptr<Conn> conn);

  int listen_fd_;
  int wake_fd_;
  std::string path_;
  std::mutex mu_;
  std::vector<std::shared_ptr<Conn>> conns_;
};

}  // namespace softhca::cm
