// Which process this is, asked on every operation (getpid() is a syscall, so
// the answer is cached and refreshed in the child after fork()).
#pragma once

#include <cstdint>

namespace softhca::host {

uint32_t self_pid();
// After fork(), in the child.
void refresh_self_pid();
// Whether process `pid` still runs: not when it is gone, nor when it is a
// zombie (killed, not yet reaped), whose memory and locks are no more use.
// A system call or two: for slow paths only.
bool pid_alive(uint32_t pid);

}  // namespace softhca::host
