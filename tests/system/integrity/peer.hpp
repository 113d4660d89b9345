// The two roles of integrity_peer once the hosts are connected.
#pragma once

#include <chrono>
#include <cstdint>

#include "cases.hpp"
#include "oob.hpp"
#include "rdma.hpp"

namespace integrity {

struct PeerOptions {
  std::chrono::milliseconds op_timeout{20000};  // one case's completions
  std::chrono::milliseconds idle_timeout{60000};  // the server's wait for the next message
  Plan plan;
  int soak_seconds = 0;  // > 0: WRITE-then-READ-back for that long instead of the cases
};

// Both return the process's exit status: 0 when every check passed.
int run_server(Host& host, Channel& channel, const Endpoint& peer, const PeerOptions& options);
int run_client(Host& host, Channel& channel, const Endpoint& peer, const PeerOptions& options);

}  // namespace integrity
