// Whether this machine grants owned access slots at all
// (host/access_slot_owner.hpp: the kernel must take membarrier's
// REGISTER_GLOBAL_EXPEDITED); the tests of them skip where it does not.
#pragma once

#include <cstdint>
#include <thread>

#include "host/access_slot_owner.hpp"

namespace softhca::host::testing {

inline bool owned_access_slots_here() {
  uint32_t got = 0;
  std::thread([&] { got = access_slot_owner::owned_plus1(); }).join();
  return got != 0;
}

}  // namespace softhca::host::testing
