// A send work request as the send queue keeps it: copied at post time (inline
// data included, so the application may reuse its buffer at once), plus the
// retry state of the operation.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>

#include "transport/completer.hpp"

namespace softhca::engine {

class AddressHandle;
class MemoryWindow;

struct Sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

// IBV_WR_ATOMIC_WRITE carries its 8-byte value in wr.atomic.compare_add, which
// only the ibv_qp_ex path (ibv_wr_atomic_write) fills; it marks its WRs with
// this bit, outside every ibv_send_flags value. Without it the opcode is EINVAL,
// as the legacy ibv_post_send has no way to name the value.
inline constexpr uint32_t kSendFlagAtomicWriteValue = 1u << 31;

// A WR's opcode read as a number: an application may pass any value, and
// one outside the enum's range is not a valid ibv_wr_opcode to load (what
// the checks before validation ask must not assume it is).
inline uint32_t send_opcode_of(const ibv_send_wr& wr) {
  static_assert(sizeof wr.opcode == sizeof(uint32_t));
  uint32_t opcode;
  std::memcpy(&opcode, &wr.opcode, sizeof opcode);
  return opcode;
}

struct SendWqe {
  uint64_t wr_id;
  uint32_t opcode;       // ibv_wr_opcode
  uint32_t send_flags;   // ibv_send_flags
  uint32_t imm_data;     // network byte order (or the rkey to invalidate)
  uint32_t num_sge;
  uint64_t remote_addr;
  uint32_t rkey;
  uint32_t remote_qpn;   // UD
  uint32_t remote_qkey;  // UD
  uint32_t inline_len;   // bytes in inline_data() when IBV_SEND_INLINE
  uint64_t compare_add;
  uint64_t swap;
  AddressHandle* ah;     // UD
  MemoryWindow* mw;      // BIND_MW: the window; remote_addr, compare_add (length), rkey (the new key) and
  uint32_t bind_lkey;    //   these two describe the binding
  uint32_t bind_access;
  uint64_t length;       // total message length
  transport::RetryState retry;  // RNR and ACK-timeout retries so far, and when the next is due
  Sge sge[];             // num_sge entries, then inline data

  static uint32_t stride_for(uint32_t max_sge, uint32_t max_inline) {
    return static_cast<uint32_t>((sizeof(SendWqe) + max_sge * sizeof(Sge) + max_inline + 15) & ~15u);
  }
  unsigned char* inline_data(uint32_t max_sge) { return reinterpret_cast<unsigned char*>(sge + max_sge); }
};

}  // namespace softhca::engine
