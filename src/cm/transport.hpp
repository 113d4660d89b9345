// How CM messages travel between the processes of one host: one Unix
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

#include "common/result.hpp"

namespace softhca::cm {

// The directory for this user's endpoints: its runtime directory.
// Errors: permission_denied (no private directory could be had).
Result<std::string> endpoint_directory();

class Transport {
 public:
  // Binds and listens at `path` (a stale file left by a dead process with our
  // pid is replaced).
  static Result<std::unique_ptr<Transport>> open(const std::string& path);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  const std::string& path() const { return path_; }

  // Sends one message to process `pid`, connecting to its endpoint at `path`
  // first if no connection exists (`path` may be empty when the peer is known
  // to have connected to us). Errors: connection_refused or
  // no_such_file_or_directory (nobody there: the peer is gone), others from
  // send(2) (timed_out after 2 s of a full peer).
  Result<void> send(uint32_t pid, const std::string& path, std::span<const uint8_t> bytes);

  // One round of the CM thread: waits up to timeout_ms (-1: forever) for
  // input or wake(); then delivers each received message and each lost peer
  // (a pid none of whose connections is open any more).
  using MessageFn = std::function<void(uint32_t pid, std::span<const uint8_t> bytes)>;
  using LostFn = std::function<void(uint32_t pid)>;
  void poll_once(int timeout_ms, const MessageFn& on_message, const LostFn& on_lost);

  // Makes a poll_once in progress return (new connections to watch).
  void wake();

  // In a forked child: close every descriptor without touching locks.
  void abandon_after_fork();

 private:
  struct Conn {
    explicit Conn(int f, uint32_t p) : fd(f), pid(p) {}
    ~Conn();
    int fd;
    uint32_t pid;
  };

  Transport(int listen_fd, int wake_fd, std::string path) : listen_fd_(listen_fd), wake_fd_(wake_fd), path_(std::move(path)) {}
  std::shared_ptr<Conn> find(uint32_t pid);
  void add(std::shared_ptr<Conn> conn);

  int listen_fd_;
  int wake_fd_;
  std::string path_;
  std::mutex mu_;
  std::vector<std::shared_ptr<Conn>> conns_;
};

}  // namespace softhca::cm
