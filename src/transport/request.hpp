// One message as a responder sees it, whichever link carried it: the
// operation, its remote address and key, its immediate data, and where its
// bytes are in the requester's hands (the payload of a SEND or WRITE, the
// place a READ's data goes, the place an atomic's original value goes).
#pragma once

#include <sys/uio.h>

#include <cstdint>

namespace softhca::transport {

enum class Operation : uint8_t {
  kSend,
  kSendWithImm,
  kWrite,
  kWriteWithImm,
  kRead,
  kCompareSwap,
  kFetchAdd,
  kAtomicWrite,
  kSendWithInv,  // a SEND whose responder invalidates `invalidate_rkey` (RC only)
};

struct Request {
  Operation op = Operation::kSend;
  uint32_t qp_type = 0;     // the requester's transport (ibv_qp_type): a responder of another type drops it
  uint32_t src_qpn = 0;     // reported in the receiver's completion
  bool solicited = false;
  uint32_t imm_data = 0;    // network byte order, as ibv_wc carries it
  uint32_t invalidate_rkey = 0;  // kSendWithInv
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0; // atomics: the compare (CAS) or add (FAA) operand; ATOMIC_WRITE: the value
  uint64_t swap = 0;
  // XRC only: the SRQ that receives at the responder (the XRCETH's XRCSRQ).
  uint32_t xrc_srqn = 0;
  // UD only.
  uint32_t qkey = 0;        // the Q_Key the message carries (already resolved from the AH/QP)
  // The requester's side of the data, `length` bytes in all.
  const iovec* data = nullptr;
  int ndata = 0;
  uint64_t length = 0;
};

inline bool is_atomic(Operation op) {
  return op == Operation::kCompareSwap || op == Operation::kFetchAdd || op == Operation::kAtomicWrite;
}
inline bool is_send(Operation op) {
  return op == Operation::kSend || op == Operation::kSendWithImm || op == Operation::kSendWithInv;
}
inline bool consumes_receive(Operation op) { return is_send(op) || op == Operation::kWriteWithImm; }

}  // namespace softhca::transport
