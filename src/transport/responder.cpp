#include "transport/responder.hpp"

#include <cstring>

namespace softhca::transport {
namespace {

// Which QP type may receive which operation (IBTA 9.2, table "operations
// supported per service"): UC has no READ or atomics; UD only SENDs.
bool operation_allowed(uint32_t qp_type, Operation op) {
  switch (qp_type) {
    case IBV_QPT_RC:
      return true;
    case IBV_QPT_UC:
      return op == Operation::kSend || op == Operation::kSendWithImm || op == Operation::kWrite ||
             op == Operation::kWriteWithImm;
    case IBV_QPT_UD:
      return op == Operation::kSend || op == Operation::kSendWithImm;
    default:
      return false;
  }
}

// One request's walk through the responder: each stage either lets it on or
// says how it ends.
class Pipeline {
 public:
  Pipeline(const Request& request, ResponderPort& port, bool reliable)
      : req_(request), port_(port), reliable_(reliable), qp_(port.qp()) {}

  Response run() {
    // A message of another transport than the QP's (the BTH opcode's
    // transport bits) or for a QP not ready to receive is dropped.
    if (qp_.type != req_.qp_type || !accepts_messages()) return silence();
    if (!operation_allowed(qp_.type, req_.op)) return fail(Answer::kNakInvalidRequest, IBV_EVENT_QP_REQ_ERR);
    switch (req_.op) {
      case Operation::kWrite:
      case Operation::kWriteWithImm:
        return write();
      case Operation::kSend:
      case Operation::kSendWithImm:
        return send();
      case Operation::kRead:
        return read();
      case Operation::kCompareSwap:
      case Operation::kFetchAdd:
      case Operation::kAtomicWrite:
        return atomic();
    }
    return fail(Answer::kNakInvalidRequest, IBV_EVENT_QP_REQ_ERR);
  }

  // (The stages are public to this file: respond_datagram reuses some.)
  bool accepts_messages() const { return receives_in_state(qp_.state); }

  Response silence() const { return Response{Syndrome::silence(), 0}; }
  Response ack(uint64_t original = 0) {
    port_.established();
    return Response{Syndrome::ack(), original};
  }

  // A responder error: RC NAKs it and the responder QP goes to ERROR with
  // `event`; UC drops the message. A dead responder sends nothing.
  Response fail(Answer nak, ibv_event_type event) {
    if (!reliable_ || port_.gone()) return silence();
    port_.fail_qp(event);
    return Response{Syndrome::nak(nak), 0};
  }

  // No receive WQE: an RNR NAK with the QP's timer (RC), a dropped message (UC).
  Response not_ready() {
    if (!reliable_ || port_.gone()) return silence();
    return Response{Syndrome::rnr(static_cast<uint8_t>(qp_.min_rnr_timer)), 0};
  }

  // Stage "check resources" for READ and atomics: the QP must have accepted
  // RDMA READ / atomic responder resources (max_dest_rd_atomic).
  bool has_read_atomic_resources() const { return qp_.max_dest_rd_atomic != 0; }

  // Stage "check rkey": the QP's own access flags, then the key's PD, access
  // and range; the responder's address of the range on success.
  bool remote_range(uint32_t access, uint64_t length, iovec& out) {
    if ((qp_.access & access) != access) return false;
    if (length == 0) {
      out = iovec{nullptr, 0};
      return true;
    }
    const std::optional<MemoryKey> mr = port_.memory_key(req_.rkey);
    if (!mr || !key_allows(*mr, qp_.pd_id, access, req_.remote_addr, length)) return false;
    out = iovec{owner_address(*mr, req_.remote_addr), static_cast<size_t>(length)};
    return true;
  }

  ReceiveCompletion completion_for(const ReceiveWqe& wqe, ibv_wc_status status, ibv_wc_opcode opcode,
                                   uint64_t byte_len) const {
    ReceiveCompletion c;
    c.wr_id = wqe.wr_id;
    c.status = status;
    c.opcode = opcode;
    c.byte_len = static_cast<uint32_t>(byte_len);
    c.src_qp = req_.src_qpn;
    c.solicited = req_.solicited;
    return c;
  }

  Response write() {
    iovec to;
    if (!remote_range(IBV_ACCESS_REMOTE_WRITE, req_.length, to))
      return fail(Answer::kNakRemoteAccess, IBV_EVENT_QP_ACCESS_ERR);
    const bool with_imm = req_.op == Operation::kWriteWithImm;
    ReceiveWqe wqe;
    if (with_imm && !port_.take_receive(wqe)) return not_ready();
    switch (port_.write(&to, 1, req_.data, req_.ndata, req_.length)) {
      case CopyStatus::kOk:
        break;
      case CopyStatus::kGone:
        return silence();
      case CopyStatus::kFault:  // the MR was deregistered under the copy
        return fail(Answer::kNakRemoteAccess, IBV_EVENT_QP_ACCESS_ERR);
    }
    Response response = ack();
    if (with_imm) {
      ReceiveCompletion c = completion_for(wqe, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, req_.length);
      c.wc_flags = IBV_WC_WITH_IMM;
      c.imm_data = req_.imm_data;
      port_.complete_receive(c);
    }
    return response;
  }

  Response send() {
    ReceiveWqe wqe;
    if (!port_.take_receive(wqe)) return not_ready();
    iovec to[limits::kMaxSge];
    int nto = 0;
    ibv_wc_status status = scatter_list(wqe, req_.length, to, nto);
    if (status == IBV_WC_SUCCESS) {
      switch (port_.write(to, nto, req_.data, req_.ndata, req_.length)) {
        case CopyStatus::kOk:
          break;
        case CopyStatus::kGone:
          return silence();
        case CopyStatus::kFault:
          status = IBV_WC_LOC_PROT_ERR;
          break;
      }
    }
    ReceiveCompletion c = completion_for(wqe, status, IBV_WC_RECV, req_.length);
    if (req_.op == Operation::kSendWithImm) {
      c.wc_flags = IBV_WC_WITH_IMM;
      c.imm_data = req_.imm_data;
    }
    if (status != IBV_WC_SUCCESS) {
      // The receive WQE completes in error at the responder, whose QP goes to
      // ERROR; the requester learns it from the NAK: invalid request for a
      // message longer than the WQE, remote operational error for a bad lkey.
      if (!reliable_ || port_.gone()) return silence();
      port_.complete_receive(c);
      port_.fail_qp(IBV_EVENT_QP_FATAL);
      return Response{Syndrome::nak(status == IBV_WC_LOC_LEN_ERR ? Answer::kNakInvalidRequest
                                                                 : Answer::kNakRemoteOperational),
                      0};
    }
    Response response = ack();
    port_.complete_receive(c);
    return response;
  }

  Response read() {
    if (!has_read_atomic_resources()) return fail(Answer::kNakInvalidRequest, IBV_EVENT_QP_REQ_ERR);
    iovec from;
    if (!remote_range(IBV_ACCESS_REMOTE_READ, req_.length, from))
      return fail(Answer::kNakRemoteAccess, IBV_EVENT_QP_ACCESS_ERR);
    switch (port_.read(req_.data, req_.ndata, &from, 1, req_.length)) {
      case CopyStatus::kOk:
        return ack();
      case CopyStatus::kGone:
        return silence();
      case CopyStatus::kFault:
        return fail(Answer::kNakRemoteAccess, IBV_EVENT_QP_ACCESS_ERR);
    }
    return silence();
  }

  Response atomic() {
    // ATOMIC WRITE is a WRITE of 8 bytes that lands whole: remote write
    // access, no responder resources; CAS and FAA need both.
    const bool is_write = req_.op == Operation::kAtomicWrite;
    if (!is_write && !has_read_atomic_resources()) return fail(Answer::kNakInvalidRequest, IBV_EVENT_QP_REQ_ERR);
    if (req_.remote_addr & 7) return fail(Answer::kNakInvalidRequest, IBV_EVENT_QP_REQ_ERR);
    iovec word;
    if (!remote_range(is_write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_ATOMIC, 8, word))
      return fail(Answer::kNakRemoteAccess, IBV_EVENT_QP_ACCESS_ERR);
    const AtomicOp op = is_write ? AtomicOp::kWrite
                        : req_.op == Operation::kFetchAdd ? AtomicOp::kFetchAdd
                                                          : AtomicOp::kCompareSwap;
    uint64_t original = 0;
    if (port_.atomic(word.iov_base, op, req_.compare_add, req_.swap, original) != CopyStatus::kOk) return silence();
    return ack(is_write ? 0 : original);
  }

  // Stage "check length" of a SEND: the receive WQE's SGEs, each checked as
  // local-write memory of the receive PD, must hold `needed` bytes.
  ibv_wc_status scatter_list(const ReceiveWqe& wqe, uint64_t needed, iovec* out, int& nout) {
    uint64_t room = 0;
    int n = 0;
    for (uint32_t i = 0; i < wqe.num_sge && room < needed; ++i) {
      const ReceiveSge& sge = wqe.sge[i];
      if (sge.length == 0) continue;
      const std::optional<MemoryKey> mr = port_.memory_key(sge.lkey);
      if (!mr || !key_allows(*mr, qp_.receive_pd_id, IBV_ACCESS_LOCAL_WRITE, sge.addr, sge.length))
        return IBV_WC_LOC_PROT_ERR;
      const uint64_t take = sge.length < needed - room ? sge.length : needed - room;
      out[n++] = iovec{owner_address(*mr, sge.addr), static_cast<size_t>(take)};
      room += take;
    }
    nout = n;
    return room < needed ? IBV_WC_LOC_LEN_ERR : IBV_WC_SUCCESS;
  }

  const Request& req_;
  ResponderPort& port_;
  const bool reliable_;
  const ResponderQp qp_;
};

}  // namespace

bool receives_in_state(uint32_t state) {
  constexpr uint32_t kReceiving =
      (1u << IBV_QPS_RTR) | (1u << IBV_QPS_RTS) | (1u << IBV_QPS_SQD) | (1u << IBV_QPS_SQE);
  return state < 32 && ((1u << state) & kReceiving) != 0;
}

Response respond(const Request& request, ResponderPort& port, bool reliable) {
  return Pipeline(request, port, reliable).run();
}

void respond_datagram(const Request& request, std::span<const unsigned char> grh, ResponderPort& port) {
  Pipeline p(request, port, /*reliable=*/false);
  if (p.qp_.type != IBV_QPT_UD || request.qp_type != IBV_QPT_UD || !receives_in_state(p.qp_.state)) return;
  if (request.op != Operation::kSend && request.op != Operation::kSendWithImm) return;
  if (request.qkey != p.qp_.qkey) return;
  ReceiveWqe wqe;
  if (!port.take_receive(wqe)) return;
  const uint64_t needed = grh.size() + request.length;
  iovec to[limits::kMaxSge];
  int nto = 0;
  ibv_wc_status status = p.scatter_list(wqe, needed, to, nto);
  if (status == IBV_WC_SUCCESS) {
    iovec from[limits::kMaxSge + 1];
    from[0] = iovec{const_cast<unsigned char*>(grh.data()), grh.size()};
    int nfrom = 1;
    for (int i = 0; i < request.ndata && nfrom < limits::kMaxSge + 1; ++i) from[nfrom++] = request.data[i];
    if (port.write(to, nto, from, nfrom, needed) != CopyStatus::kOk) status = IBV_WC_LOC_PROT_ERR;
  }
  ReceiveCompletion c = p.completion_for(wqe, status, IBV_WC_RECV, needed);
  c.wc_flags = IBV_WC_GRH;
  if (request.op == Operation::kSendWithImm) {
    c.wc_flags |= IBV_WC_WITH_IMM;
    c.imm_data = request.imm_data;
  }
  c.sl = request.sl;
  port.complete_receive(c);
}

const char* answer_name(Answer answer) {
  switch (answer) {
    case Answer::kAck:
      return "ACK";
    case Answer::kRnrNak:
      return "RNR NAK";
    case Answer::kNakSequenceError:
      return "NAK PSN sequence error";
    case Answer::kNakInvalidRequest:
      return "NAK invalid request";
    case Answer::kNakRemoteAccess:
      return "NAK remote access error";
    case Answer::kNakRemoteOperational:
      return "NAK remote operational error";
    case Answer::kSilence:
      return "no response";
  }
  return "?";
}

}  // namespace softhca::transport
