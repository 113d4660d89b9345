// What the responder needs of the QP it answers for and of its host, as an
// interface: the pure responder (responder.hpp) decides, a link's port does.
// The shm link implements it over the target process's shared state (its
// memory reached with process_vm_*), the udp link over this process's own.
#pragma once

#include <infiniband/verbs.h>
#include <sys/uio.h>

#include <cstdint>
#include <optional>

#include "common/limits.hpp"
#include "transport/memory_key.hpp"
#include "transport/request.hpp"

namespace softhca::transport {

// What the responder reads of its QP, taken once per request.
struct ResponderQp {
  uint32_t type = 0;              // ibv_qp_type
  uint32_t state = 0;             // ibv_qp_state
  uint32_t access = 0;            // qp_access_flags: the remote operations it accepts
  uint32_t pd_id = 0;             // the QP's PD: rkeys must belong to it
  uint32_t receive_pd_id = 0;     // the PD of its receive WQEs' lkeys (its SRQ's, if it has one)
  uint32_t qkey = 0;              // UD
  uint32_t min_rnr_timer = 0;
  uint32_t max_dest_rd_atomic = 0;
  uint32_t qpn = 0;               // a type 2 window serves only the QP it is bound to
};

struct ReceiveSge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

struct ReceiveWqe {
  uint64_t wr_id = 0;
  uint32_t num_sge = 0;
  ReceiveSge sge[limits::kMaxSge];
};

// A receive completion for the responder's CQ (its QP number is the port's).
struct ReceiveCompletion {
  uint64_t wr_id = 0;
  ibv_wc_status status = IBV_WC_SUCCESS;
  ibv_wc_opcode opcode = IBV_WC_RECV;
  uint32_t byte_len = 0;
  uint32_t imm_data = 0;
  uint32_t src_qp = 0;
  uint32_t wc_flags = 0;
  uint8_t sl = 0;
  bool solicited = false;
  // Tag matching: the completion used a tagged buffer, not a receive WQE
  // (no_wqe); with tm_info it reports the message's tag and app_ctx
  // (ibv_wc_read_tm_info).
  bool no_wqe = false;
  bool tm_info = false;
  uint64_t tm_tag = 0;
  uint32_t tm_priv = 0;
};

enum class CopyStatus {
  kOk,
  kFault,  // the memory is not there (any more): an access error
  kGone,   // the responder's process is gone: nobody answers
};

enum class AtomicOp { kCompareSwap, kFetchAdd, kWrite };

struct TagList;

// Who takes a list's lock. The lock word holds the holder's pid, so that a
// holder killed in the middle of a walk (a sender on SIGKILL: the list is
// in another process's memory) does not stop the list for good: a taker
// that has waited long asks `alive` about that pid and, if the process is
// gone, takes the lock over. Nonzero: 0 marks the lock free. Without
// `alive` (the unit tests) a taker only waits.
struct LockTaker {
  uint32_t pid = 1;
  bool (*alive)(uint32_t pid) = nullptr;
};

class ResponderPort {
 public:
  virtual ~ResponderPort() = default;

  virtual ResponderQp qp() = 0;
  // A key registered by the responder's process, or nothing.
  virtual std::optional<MemoryKey> memory_key(uint32_t key) = 0;
  // XRC_RECV QPs: binds the port to the SRQ `srqn` that the message names,
  // if it is an XRC SRQ of the QP's XRC domain that this port can reach;
  // its PD then. take_receive and complete_receive use that SRQ from here on.
  // Links that do not carry XRC have none.
  virtual std::optional<uint32_t> select_xrc_srq(uint32_t /*srqn*/) { return std::nullopt; }
  // The stages are about to run the request at `psn`: the packet that came,
  // or one kept past a gap that it filled (selective.hpp). For checks.
  virtual void running(uint32_t /*psn*/) {}
  // Claims the next receive WQE of the QP's RQ or SRQ; false if there is none.
  virtual bool take_receive(ReceiveWqe& out) = 0;
  // Bytes into the responder's memory (`to`) from the requester's (`from`).
  virtual CopyStatus write(const iovec* to, int nto, const iovec* from, int nfrom, uint64_t length) = 0;
  // Bytes out of the responder's memory (`from`) into the requester's (`to`).
  virtual CopyStatus read(const iovec* to, int nto, const iovec* from, int nfrom, uint64_t length) = 0;
  // One 8-byte atomic on the responder's word at `word`, atomic against every
  // other atomic the device executes; `original` gets the value it replaced.
  virtual CopyStatus atomic(void* word, AtomicOp op, uint64_t compare_add, uint64_t swap, uint64_t& original) = 0;
  virtual void complete_receive(const ReceiveCompletion& completion) = 0;
  // SEND WITH INVALIDATE: invalidates the responder's type 2 window `rkey`
  // of the QP's PD; false if there is no such bound window (a type 1 window
  // or an MR cannot be invalidated so).
  virtual bool invalidate(uint32_t rkey) = 0;
  // The QP detected an error as responder: it goes to ERROR and its owner
  // gets `event` (QP_ACCESS_ERR, QP_REQ_ERR or QP_FATAL).
  virtual void fail_qp(ibv_event_type event) = 0;
  // A message arrived: COMM_EST if the QP is still in RTR.
  virtual void established() = 0;
  // The responder's process is dead: it can send no NAK (asked on error paths only).
  virtual bool gone() = 0;
  // The matching list of the QP's SRQ when it is a tag matching SRQ; links
  // that cannot carry tag matching have none (the QP then refuses RTR
  // towards them).
  virtual TagList* tag_list() { return nullptr; }
  // Who this responder is when it takes that list's lock.
  virtual LockTaker tag_list_taker() { return {}; }
  // A rendezvous: the requester's range [va, va + length) under `rkey`, as
  // readable here (the `from` of a write()), if the requester QP
  // `requester_qpn` allows remote READ and the key covers it in its PD.
  virtual bool requester_range(uint32_t /*requester_qpn*/, uint64_t /*va*/, uint32_t /*rkey*/, uint64_t /*length*/,
                               iovec& /*out*/) {
    return false;
  }
};

}  // namespace softhca::transport
