// How the shm link's direct paths move a message's bytes into the target's
// memory (ShmChannel::write_direct and send_direct, shm::MemoryLane).
#pragma once

#include <cstdint>
#include <cstring>

namespace softhca::shm {

// A WRITE or SEND of a few bytes (a latency test's, a flag, a counter) is on
// the critical path of a ping-pong: up to 16 bytes are moved here as two
// overlapping loads and stores, the last byte in the second store as in
// libc's copy, rather than through a call into libc.
template <typename Word>
inline void copy_ends(unsigned char* to, const unsigned char* from, uint64_t length) {
  Word head, tail;
  std::memcpy(&head, from, sizeof head);
  std::memcpy(&tail, from + length - sizeof tail, sizeof tail);
  std::memcpy(to, &head, sizeof head);
  std::memcpy(to + length - sizeof tail, &tail, sizeof tail);
}

// `length` > 0.
[[gnu::always_inline]] inline void copy_write(void* to, const void* from, uint64_t length) {
  auto* d = static_cast<unsigned char*>(to);
  const auto* s = static_cast<const unsigned char*>(from);
  if (length > 16) {
    std::memcpy(d, s, length);
  } else if (length >= 8) {
    copy_ends<uint64_t>(d, s, length);
  } else if (length >= 4) {
    copy_ends<uint32_t>(d, s, length);
  } else if (length >= 2) {
    copy_ends<uint16_t>(d, s, length);
  } else {
    *d = *s;
  }
}

}  // namespace softhca::shm
