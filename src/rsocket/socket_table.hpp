// The rsockets of the process by descriptor number: the only global state
// of the rsocket layer, guarded by one mutex. Callers keep a shared_ptr, so
// an rclose from another thread cannot free a socket under them.
#pragma once

#include <memory>

#include "rsocket/socket.hpp"

namespace softhca::rsocket {

std::shared_ptr<Socket> find_socket(int fd);
void insert_socket(const std::shared_ptr<Socket>& s);
// Removes and returns the socket, or nullptr when fd is not an rsocket.
std::shared_ptr<Socket> remove_socket(int fd);

}  // namespace softhca::rsocket
