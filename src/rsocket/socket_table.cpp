#include "rsocket/socket_table.hpp"

#include <mutex>
#include <unordered_map>

namespace softhca::rsocket {

namespace {

struct SocketTable {
  std::mutex mu;
  std::unordered_map<int, std::shared_ptr<Socket>> by_fd;
};

// Never destroyed: rsockets may still be closed from atexit handlers.
SocketTable& table() {
  static auto* t = new SocketTable;
  return *t;
}

}  // namespace

std::shared_ptr<Socket> find_socket(int fd) {
  SocketTable& t = table();
  std::lock_guard lock(t.mu);
  auto it = t.by_fd.find(fd);
  return it != t.by_fd.end() ? it->second : nullptr;
}

void insert_socket(const std::shared_ptr<Socket>& s) {
  SocketTable& t = table();
  std::lock_guard lock(t.mu);
  t.by_fd[s->fd()] = s;
}

std::shared_ptr<Socket> remove_socket(int fd) {
  SocketTable& t = table();
  std::lock_guard lock(t.mu);
  auto it = t.by_fd.find(fd);
  if (it == t.by_fd.end()) return nullptr;
  auto s = std::move(it->second);
  t.by_fd.erase(it);
  return s;
}

}  // namespace softhca::rsocket
