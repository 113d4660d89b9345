// The IBTA responder, pure: given a request and a port onto the QP that
// receives it, it runs the checks in order — the QP accepts messages, the
// operation is valid for its type, its responder resources, the rkey, a
// receive WQE, the length — executes the operation through the port and
// returns the syndrome an RC responder would send (ACK, RNR NAK, NAK invalid
// request / remote access / remote operational, or silence). UC gets the
// same checks and drops the message where RC would NAK (the syndrome is then
// silence). No rule is written anywhere else: every link calls these.
//
// A message arrives whole on the shm link (respond) and packet by packet on
// the udp link, so the work is split the way rxe splits it: accept() at the
// first packet (checks, the receive WQE of a SEND), place() for each
// packet's payload at its offset, finish() at the last (the WRITE-with-
// immediate receive, the receive completion, COMM_EST).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <span>

#include "common/limits.hpp"
#include "transport/request.hpp"
#include "transport/responder_port.hpp"
#include "transport/syndrome.hpp"

namespace softhca::transport {

struct Response {
  Syndrome syndrome;
  uint64_t atomic_original = 0;  // CAS and FAA: the value the atomic replaced (goes back in the ACK)
  // An asynchronous link (udp): the message is in flight, its answer comes
  // later (pending), or there is no room for it now (busy).
  bool pending = false;
  bool busy = false;
  // Tag matching: a rendezvous READ completed at the responder; the
  // requester receives this FIN header (its own receive WQE, after the
  // SEND's completion).
  bool rendezvous_fin = false;
  uint64_t fin_tag = 0;
  uint32_t fin_app_ctx = 0;
};

// The responder's context of a SEND or WRITE in progress (rxe's qp->resp).
struct MessageInProgress {
  Operation op = Operation::kSend;
  bool reliable = true;
  // WRITE: the validated rkey range; SEND: the receive WQE's SGEs, each
  // validated when the payload first reaches it.
  iovec write_range{};
  ReceiveWqe wqe;
  bool has_wqe = false;
  uint32_t receive_pd_id = 0;
  uint32_t cursor_sge = 0;     // SEND: the SGE the next byte goes to
  uint64_t cursor_offset = 0;  // SEND: bytes of it already used
  void* validated[limits::kMaxSge] = {};  // SEND: each SGE's address here once validated
  uint32_t nvalidated = 0;     // SGEs [0, nvalidated) are validated
  uint64_t placed = 0;         // payload bytes placed so far
  uint32_t packets = 0;        // packets placed so far (the first may carry no byte)
  ibv_wc_status status = IBV_WC_SUCCESS;  // SEND: LOC_PROT_ERR / LOC_LEN_ERR once detected
  // The keys validated so far, as validated: a packet after the first
  // re-checks them, so that a deregistration between packets stops the
  // message instead of letting it write into memory no longer registered.
  MemoryKey keys[limits::kMaxSge + 1];
  int nkeys = 0;

  // Back to a fresh message: every field that says how much of an array is
  // in use, and the scalars; the arrays' contents are left as they are.
  void reset() {
    op = Operation::kSend;
    reliable = true;
    write_range = iovec{};
    wqe.wr_id = 0;
    wqe.num_sge = 0;
    has_wqe = false;
    receive_pd_id = 0;
    cursor_sge = 0;
    cursor_offset = 0;
    nvalidated = 0;
    placed = 0;
    packets = 0;
    status = IBV_WC_SUCCESS;
    nkeys = 0;
  }
};

// RC and UC, a whole message: `request` to the QP behind `port`; `reliable` is true for RC.
Response respond(const Request& request, ResponderPort& port, bool reliable);
// The same with the caller's scratch for the message (a channel keeps one,
// used under its QP's send lock): the thread-local one above costs a TLS
// lookup per message in a shared library.
Response respond(const Request& request, ResponderPort& port, bool reliable, MessageInProgress& scratch);

// The first packet of a SEND or WRITE (`request.length` is the RETH's DMA
// length for a WRITE; ignored for a SEND, whose length is known at its end).
// ACK means: go on placing. READ and atomics are answered whole by respond().
// `preclaimed`: a receive WQE already taken for this QP (UC reuses the one
// of a message a PSN gap dropped).
Response accept(const Request& request, ResponderPort& port, bool reliable, MessageInProgress& message,
                const ReceiveWqe* preclaimed = nullptr);

// A READ request: the checks of respond() without the copy; on ACK, `from`
// is the responder's range to answer with (read it through the port).
Response accept_read(const Request& request, ResponderPort& port, bool reliable, iovec& from);

// The same for a duplicate READ request (a replay): it changes nothing, and
// one that can no longer be answered (its MR deregistered since) is dropped
// silently — the READ it repeats was answered, and the QP must not go to
// ERROR for a stale packet.
Response recheck_read(const Request& request, ResponderPort& port, iovec& from);

// One packet's payload, placed after what came before. A SEND longer than
// its receive WQE, or a WRITE past its RETH length, fails here.
Response place(MessageInProgress& message, const iovec* data, int ndata, uint64_t length, ResponderPort& port);

// Before the last packet's payload is placed: a WRITE with immediate takes
// its receive WQE now (RNR NAK if there is none, before any byte of the
// packet lands).
Response ready_for_last(MessageInProgress& message, ResponderPort& port);

// The last packet: `request` carries its immediate data, solicited bit and
// source QPN.
Response finish(MessageInProgress& message, const Request& request, ResponderPort& port);

// UD: a SEND to the QP behind `port`, `grh` (40 bytes) placed before the
// payload in the receive buffer. A datagram that cannot be received is
// dropped silently, as UD allows.
void respond_datagram(const Request& request, std::span<const unsigned char> grh, ResponderPort& port);

// Raw packet QPs: one Ethernet frame (the request's data, a SEND from a raw
// QP) to the raw QP behind `port`, which flow steering chose. It lands at
// the start of the receive buffer; the completion's byte_len is the frame's
// length. A frame that cannot be received (no receive WQE, QP not in RTR or
// later) is dropped, as a NIC drops it.
void respond_frame(const Request& request, ResponderPort& port);

// What of a message its receive completion reports: the fields of Request
// that receive_completion reads, for a caller that builds no Request (the
// shm link's direct SEND).
struct ReceivedMessage {
  Operation op = Operation::kSend;
  uint32_t src_qpn = 0;
  bool solicited = false;
  uint32_t imm_data = 0;         // kSendWithImm, kWriteWithImm (network byte order)
  uint32_t invalidate_rkey = 0;  // kSendWithInv
};

// The completion of the receive WQE `wr_id` that message `m` consumed,
// `byte_len` bytes placed: its immediate data or invalidated key, solicited
// bit and source QPN.
inline ReceiveCompletion receive_completion(uint64_t wr_id, ibv_wc_status status, ibv_wc_opcode opcode,
                                            uint64_t byte_len, const ReceivedMessage& m) {
  const bool imm = m.op == Operation::kSendWithImm || m.op == Operation::kWriteWithImm;
  const bool inv = m.op == Operation::kSendWithInv;
  // Every field named (rather than defaults overwritten): GCC zeroed the
  // defaults first with `rep stos`, slow to start, on the direct SEND's way.
  return ReceiveCompletion{
      .wr_id = wr_id,
      .status = status,
      .opcode = opcode,
      .byte_len = static_cast<uint32_t>(byte_len),
      // ibv_wc's invalidated_rkey shares the immediate's field
      .imm_data = imm ? m.imm_data : inv ? m.invalidate_rkey : 0,
      .src_qp = m.src_qpn,
      .wc_flags = imm ? uint32_t{IBV_WC_WITH_IMM} : inv ? uint32_t{IBV_WC_WITH_INV} : 0,
      .sl = 0,
      .solicited = m.solicited,
      .no_wqe = false,
      .tm_info = false,
      .tm_tag = 0,
      .tm_priv = 0,
  };
}

inline ReceiveCompletion receive_completion(uint64_t wr_id, ibv_wc_status status, ibv_wc_opcode opcode,
                                            uint64_t byte_len, const Request& request) {
  return receive_completion(
      wr_id, status, opcode, byte_len,
      ReceivedMessage{request.op, request.src_qpn, request.solicited, request.imm_data, request.invalidate_rkey});
}

// True for the states in which a QP accepts incoming messages (RTR and later, but not ERROR).
inline bool receives_in_state(uint32_t state) {
  constexpr uint32_t kReceiving =
      (1u << IBV_QPS_RTR) | (1u << IBV_QPS_RTS) | (1u << IBV_QPS_SQD) | (1u << IBV_QPS_SQE);
  return state < 32 && ((1u << state) & kReceiving) != 0;
}

}  // namespace softhca::transport
