// Which process this is, asked on every operation (getpid() is a syscall, so
// the answer is cached and refreshed in the child after fork()).
#pragma once

#include <cstdint>

namespace softhca::host {

uint32_t self_pid();
// After fork(), in the child.
void refresh_self_pid();

}  // namespace softhca::host
