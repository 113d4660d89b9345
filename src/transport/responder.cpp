#include "transport/responder.hpp"

#include <cstring>

#include "transport/tag_matching.hpp"
#include "wire/ud_grh.hpp"

namespace softhca::transport {
namespace {

// Which QP type may receive which operation (IBTA 9.2, table "operations
// supported per service"): UC has no READ or atomics; UD only SENDs.
bool operation_allowed(uint32_t qp_type, Operation op) {
  switch (qp_type) {
    case IBV_QPT_RC:
    case IBV_QPT_XRC_RECV:
      return true;
    case IBV_QPT_UC:
      return op == Operation::kSend || op == Operation::kSendWithImm || op == Operation::kWrite ||
             op == Operation::kWriteWithImm;  // no READ, atomics or SEND WITH INVALIDATE
    case IBV_QPT_UD:
      return op == Operation::kSend || op == Operation::kSendWithImm;
    default:
      return false;
  }
}

// Whether a message of the requester's transport reaches a QP of this type:
// the same type, or an XRC INI's message at an XRC TGT.
bool same_transport(uint32_t qp_type, uint32_t requester_type) {
  return qp_type == requester_type || (qp_type == IBV_QPT_XRC_RECV && requester_type == IBV_QPT_XRC_SEND);
}

// Stage "check XRC SRQ" of an XRC TGT: the SRQ the message names must be an
// XRC SRQ of the QP's domain; its PD stands for the QP's from then on (rkeys
// and receive lkeys alike). Other QP types pass.
bool bind_xrc_srq(const Request& req, ResponderPort& port, ResponderQp& qp) {
  if (qp.type != IBV_QPT_XRC_RECV) return true;
  const std::optional<uint32_t> pd = port.select_xrc_srq(req.xrc_srqn);
  if (!pd) return false;
  qp.pd_id = *pd;
  qp.receive_pd_id = *pd;
  return true;
}

Response silence() { return Response{Syndrome::silence(), 0}; }
// A stage passed: the message goes on (the ACK itself is finish()'s).
Response proceed() { return Response{Syndrome::ack(), 0}; }
bool passed(const Response& r) { return r.syndrome.answer == Answer::kAck; }

// A responder error: RC NAKs it and the responder QP goes to ERROR with
// `event`; UC drops the message. A dead responder sends nothing.
Response fail(ResponderPort& port, bool reliable, Answer nak, ibv_event_type event) {
  if (!reliable || port.gone()) return silence();
  port.fail_qp(event);
  return Response{Syndrome::nak(nak), 0};
}

// No receive WQE: an RNR NAK with the QP's timer (RC), a dropped message (UC).
Response not_ready(ResponderPort& port, bool reliable, uint32_t min_rnr_timer) {
  if (!reliable || port.gone()) return silence();
  return Response{Syndrome::rnr(static_cast<uint8_t>(min_rnr_timer)), 0};
}

// Stage "check rkey": the QP's own access flags, then the key's PD, access
// and range (a window's: and, type 2, that it is bound to this QP); the
// responder's address of the range on success.
bool remote_range(ResponderPort& port, const ResponderQp& qp, const Request& req, uint32_t access, uint64_t length,
                  iovec& out, MessageInProgress* record = nullptr) {
  if ((qp.access & access) != access) return false;
  if (length == 0) {
    out = iovec{nullptr, 0};
    return true;
  }
  const std::optional<MemoryKey> mr = port.memory_key(req.rkey);
  if (!mr || !remote_key_allows(*mr, qp.pd_id, qp.qpn, access, req.remote_addr, length)) return false;
  out = iovec{owner_address(*mr, req.remote_addr), static_cast<size_t>(length)};
  if (record != nullptr && record->nkeys < limits::kMaxSge + 1) record->keys[record->nkeys++] = *mr;
  return true;
}

// Whether every key the message validated is still registered as it was.
bool keys_unchanged(const MessageInProgress& m, ResponderPort& port) {
  for (int i = 0; i < m.nkeys; ++i) {
    const std::optional<MemoryKey> now = port.memory_key(m.keys[i].key);
    if (!now || !(*now == m.keys[i])) return false;
  }
  return true;
}

// Stage "check length" of a SEND, for its next `length` bytes: the receive
// WQE's SGEs from the cursor on, each validated as local-write memory of the
// receive PD when the payload first reaches it. LOC_PROT_ERR for a bad SGE,
// LOC_LEN_ERR when the WQE has no room left.
ibv_wc_status scatter_next(MessageInProgress& m, uint64_t length, ResponderPort& port, iovec* out, int& nout) {
  nout = 0;
  uint64_t left = length;
  while (left > 0) {
    if (m.cursor_sge >= m.wqe.num_sge) return IBV_WC_LOC_LEN_ERR;
    const ReceiveSge& sge = m.wqe.sge[m.cursor_sge];
    if (m.cursor_sge >= m.nvalidated) {
      if (sge.length != 0) {
        const std::optional<MemoryKey> mr = port.memory_key(sge.lkey);
        if (!mr || !local_key_allows(*mr, m.receive_pd_id, IBV_ACCESS_LOCAL_WRITE, sge.addr, sge.length))
          return IBV_WC_LOC_PROT_ERR;
        m.validated[m.cursor_sge] = owner_address(*mr, sge.addr);
        if (m.nkeys < limits::kMaxSge + 1) m.keys[m.nkeys++] = *mr;
      }
      m.nvalidated = m.cursor_sge + 1;
    }
    const uint64_t room = sge.length - m.cursor_offset;
    const uint64_t take = room < left ? room : left;
    if (take > 0) {
      out[nout++] = iovec{static_cast<char*>(m.validated[m.cursor_sge]) + m.cursor_offset, static_cast<size_t>(take)};
      m.cursor_offset += take;
      left -= take;
    }
    if (m.cursor_offset == sge.length) {
      ++m.cursor_sge;
      m.cursor_offset = 0;
    }
  }
  return IBV_WC_SUCCESS;
}

// Stages "check resources" and "check rkey" of a READ.
Response check_read(const Request& req, ResponderPort& port, const ResponderQp& qp, iovec& from) {
  if (qp.max_dest_rd_atomic == 0) return fail(port, true, Answer::kNakInvalidRequest, IBV_EVENT_QP_REQ_ERR);
  if (!remote_range(port, qp, req, IBV_ACCESS_REMOTE_READ, req.length, from))
    return fail(port, true, Answer::kNakRemoteAccess, IBV_EVENT_QP_ACCESS_ERR);
  return proceed();
}

Response read(const Request& req, ResponderPort& port, const ResponderQp& qp) {
  iovec from;
  if (Response r = check_read(req, port, qp, from); !passed(r)) return r;
  switch (port.read(req.data, req.ndata, &from, 1, req.length)) {
    case CopyStatus::kOk:
      port.established();
      return Response{Syndrome::ack(), 0};
    case CopyStatus::kGone:
      return silence();
    case CopyStatus::kFault:
      return fail(port, true, Answer::kNakRemoteAccess, IBV_EVENT_QP_ACCESS_ERR);
  }
  return silence();
}

Response atomic(const Request& req, ResponderPort& port, const ResponderQp& qp) {
  // ATOMIC WRITE is a WRITE of 8 bytes that lands whole: remote write
  // access, no responder resources; CAS and FAA need both.
  const bool is_write = req.op == Operation::kAtomicWrite;
  if (!is_write && qp.max_dest_rd_atomic == 0)
    return fail(port, true, Answer::kNakInvalidRequest, IBV_EVENT_QP_REQ_ERR);
  if (req.remote_addr & 7) return fail(port, true, Answer::kNakInvalidRequest, IBV_EVENT_QP_REQ_ERR);
  iovec word;
  if (!remote_range(port, qp, req, is_write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_ATOMIC, 8, word))
    return fail(port, true, Answer::kNakRemoteAccess, IBV_EVENT_QP_ACCESS_ERR);
  const AtomicOp op = is_write                           ? AtomicOp::kWrite
                      : req.op == Operation::kFetchAdd ? AtomicOp::kFetchAdd
                                                       : AtomicOp::kCompareSwap;
  uint64_t original = 0;
  switch (port.atomic(word.iov_base, op, req.compare_add, req.swap, original)) {
    case CopyStatus::kOk:
      break;
    case CopyStatus::kGone:
      return silence();
    case CopyStatus::kFault:  // the word is not there (an ODP range unmapped): as a WRITE's
      return fail(port, true, Answer::kNakRemoteAccess, IBV_EVENT_QP_ACCESS_ERR);
  }
  port.established();
  return Response{Syndrome::ack(), is_write ? 0 : original};
}

}  // namespace

Response accept(const Request& req, ResponderPort& port, bool reliable, MessageInProgress& m,
                const ReceiveWqe* preclaimed) {
  m.reset();
  m.op = req.op;
  m.reliable = reliable;
  ResponderQp qp = port.qp();
  // A message of another transport than the QP's (the BTH opcode's
  // transport bits) or for a QP not ready to receive is dropped.
  if (!same_transport(qp.type, req.qp_type) || !receives_in_state(qp.state)) return silence();
  if (!operation_allowed(qp.type, req.op) || !bind_xrc_srq(req, port, qp))
    return fail(port, reliable, Answer::kNakInvalidRequest, IBV_EVENT_QP_REQ_ERR);
  m.receive_pd_id = qp.receive_pd_id;
  switch (req.op) {
    case Operation::kWrite:
    case Operation::kWriteWithImm:
      if (!remote_range(port, qp, req, IBV_ACCESS_REMOTE_WRITE, req.length, m.write_range, &m))
        return fail(port, reliable, Answer::kNakRemoteAccess, IBV_EVENT_QP_ACCESS_ERR);
      return proceed();
    case Operation::kSend:
    case Operation::kSendWithImm:
    case Operation::kSendWithInv:
      if (preclaimed != nullptr) {
        m.wqe = *preclaimed;
      } else if (!port.take_receive(m.wqe)) {
        return not_ready(port, reliable, qp.min_rnr_timer);
      }
      m.has_wqe = true;
      return proceed();
    default:
      return fail(port, reliable, Answer::kNakInvalidRequest, IBV_EVENT_QP_REQ_ERR);
  }
}

Response accept_read(const Request& req, ResponderPort& port, bool reliable, iovec& from) {
  ResponderQp qp = port.qp();
  if (!same_transport(qp.type, req.qp_type) || !receives_in_state(qp.state)) return silence();
  if (!reliable || !operation_allowed(qp.type, req.op) || req.op != Operation::kRead || !bind_xrc_srq(req, port, qp))
    return fail(port, reliable, Answer::kNakInvalidRequest, IBV_EVENT_QP_REQ_ERR);
  if (Response r = check_read(req, port, qp, from); !passed(r)) return r;
  port.established();
  return proceed();
}

Response recheck_read(const Request& req, ResponderPort& port, iovec& from) {
  ResponderQp qp = port.qp();
  if (!same_transport(qp.type, req.qp_type) || !receives_in_state(qp.state) || req.op != Operation::kRead ||
      qp.max_dest_rd_atomic == 0 || !bind_xrc_srq(req, port, qp) ||
      !remote_range(port, qp, req, IBV_ACCESS_REMOTE_READ, req.length, from))
    return silence();
  return proceed();
}

Response ready_for_last(MessageInProgress& m, ResponderPort& port) {
  if (m.op != Operation::kWriteWithImm || m.has_wqe) return proceed();
  if (!port.take_receive(m.wqe)) return not_ready(port, m.reliable, port.qp().min_rnr_timer);
  m.has_wqe = true;
  return proceed();
}

Response place(MessageInProgress& m, const iovec* data, int ndata, uint64_t length, ResponderPort& port) {
  const bool is_write = m.op == Operation::kWrite || m.op == Operation::kWriteWithImm;
  // Each packet after the first (whose keys accept() has just checked)
  // checks them again, counted in packets rather than bytes: a first
  // packet without payload let the next one skip the check.
  const bool later_packet = m.packets++ > 0;
  if (later_packet && !keys_unchanged(m, port)) {
    // Deregistered (or re-registered) since the message began.
    if (is_write) return fail(port, m.reliable, Answer::kNakRemoteAccess, IBV_EVENT_QP_ACCESS_ERR);
    m.status = IBV_WC_LOC_PROT_ERR;
  }
  if (is_write) {
    // Stage "check length": a WRITE places no more than its RETH announced.
    if (m.placed + length > m.write_range.iov_len)
      return fail(port, m.reliable, Answer::kNakInvalidRequest, IBV_EVENT_QP_REQ_ERR);
    if (length == 0) return proceed();
    const iovec to{static_cast<char*>(m.write_range.iov_base) + m.placed, static_cast<size_t>(length)};
    switch (port.write(&to, 1, data, ndata, length)) {
      case CopyStatus::kOk:
        m.placed += length;
        return proceed();
      case CopyStatus::kGone:
        return silence();
      case CopyStatus::kFault:  // the MR was deregistered under the copy
        return fail(port, m.reliable, Answer::kNakRemoteAccess, IBV_EVENT_QP_ACCESS_ERR);
    }
    return silence();
  }
  iovec to[limits::kMaxSge];
  int nto = 0;
  ibv_wc_status status = m.status != IBV_WC_SUCCESS ? m.status : scatter_next(m, length, port, to, nto);
  if (status == IBV_WC_SUCCESS) {
    switch (port.write(to, nto, data, ndata, length)) {
      case CopyStatus::kOk:
        m.placed += length;
        return proceed();
      case CopyStatus::kGone:
        return silence();
      case CopyStatus::kFault:
        status = IBV_WC_LOC_PROT_ERR;
        break;
    }
  }
  // The receive WQE completes in error at the responder, whose QP goes to
  // ERROR; the requester learns it from the NAK: invalid request for a
  // message longer than the WQE, remote operational error for a bad lkey.
  m.status = status;
  if (!m.reliable || port.gone()) return silence();
  Request about;
  about.op = m.op;
  ReceiveCompletion c = receive_completion(m.wqe.wr_id, status, IBV_WC_RECV, m.placed + length, about);
  c.wc_flags = 0;
  port.complete_receive(c);
  port.fail_qp(IBV_EVENT_QP_FATAL);
  return Response{
      Syndrome::nak(status == IBV_WC_LOC_LEN_ERR ? Answer::kNakInvalidRequest : Answer::kNakRemoteOperational), 0};
}

Response finish(MessageInProgress& m, const Request& req, ResponderPort& port) {
  if (req.op == Operation::kSendWithInv && !port.invalidate(req.invalidate_rkey)) {
    // Not a bound type 2 window of the QP's PD (an MR, a type 1 window, a
    // stale key): the receive WQE completes in error, the QP goes to ERROR
    // and the requester gets NAK invalid request, as rxe answers.
    if (!m.reliable || port.gone()) return silence();
    Request about = req;
    about.op = Operation::kSend;
    port.complete_receive(receive_completion(m.wqe.wr_id, IBV_WC_REM_INV_REQ_ERR, IBV_WC_RECV, m.placed, about));
    port.fail_qp(IBV_EVENT_QP_REQ_ERR);
    return Response{Syndrome::nak(Answer::kNakInvalidRequest), 0};
  }
  port.established();
  if (m.op == Operation::kWriteWithImm) {
    port.complete_receive(receive_completion(m.wqe.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, m.placed, req));
  } else if (is_send(m.op)) {
    port.complete_receive(receive_completion(m.wqe.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, m.placed, req));
  }
  return Response{Syndrome::ack(), 0};
}

namespace {

// The first `n` bytes of a request's data (the requester's memory, readable
// here: the shm link runs the responder in the requester's process).
void copy_prefix(const Request& req, unsigned char* out, uint64_t n) {
  for (int i = 0; i < req.ndata && n > 0; ++i) {
    const uint64_t take = req.data[i].iov_len < n ? req.data[i].iov_len : n;
    std::memcpy(out, req.data[i].iov_base, take);
    out += take;
    n -= take;
  }
}

// `in` without its first `skip` bytes.
int skip_iovecs(const iovec* in, int n, uint64_t skip, iovec* out) {
  int nout = 0;
  for (int i = 0; i < n; ++i) {
    if (skip >= in[i].iov_len) {
      skip -= in[i].iov_len;
      continue;
    }
    out[nout++] = iovec{static_cast<char*>(in[i].iov_base) + skip, in[i].iov_len - skip};
    skip = 0;
  }
  return nout;
}

// A message that takes an ordinary receive WQE of the TM SRQ (NO_TAG, or an
// unexpected tagged one): placed whole, header included, completed as `opcode`.
Response receive_whole(MessageInProgress& m, const Request& req, ResponderPort& port, ibv_wc_opcode opcode) {
  Response r = place(m, req.data, req.ndata, req.length, port);
  if (!passed(r)) return r;
  port.established();
  port.complete_receive(receive_completion(m.wqe.wr_id, IBV_WC_SUCCESS, opcode, m.placed, req));
  return Response{Syndrome::ack(), 0};
}

// `length` bytes from `from` into the tagged buffer of `m.wqe`; the status
// of the copy (kGone is reported as IBV_WC_GENERAL_ERR).
ibv_wc_status fill_tagged(MessageInProgress& m, const iovec* from, int nfrom, uint64_t length, ResponderPort& port,
                          bool& gone) {
  iovec to[limits::kMaxSge];
  int nto = 0;
  const ibv_wc_status status = scatter_next(m, length, port, to, nto);
  if (status != IBV_WC_SUCCESS) return status;
  switch (port.write(to, nto, from, nfrom, length)) {
    case CopyStatus::kOk:
      m.placed = length;
      return IBV_WC_SUCCESS;
    case CopyStatus::kGone:
      gone = true;
      return IBV_WC_GENERAL_ERR;
    case CopyStatus::kFault:
      return IBV_WC_LOC_PROT_ERR;
  }
  return IBV_WC_GENERAL_ERR;
}

// A SEND to an RC QP on a tag matching SRQ (tag_matching.hpp): by its TM
// header, into a matching tagged buffer (EAGER: the payload after the
// header; RNDV: the sender's range, read), else into an ordinary receive
// WQE whole (NO_TAG, FIN, a message too short for its header, and
// unexpected tagged messages, which the unexpected count records).
Response respond_tagged(const Request& req, ResponderPort& port, TagList& list, MessageInProgress& m) {
  unsigned char head[kTmHeaderBytes + kRndvHeaderBytes] = {};
  copy_prefix(req, head, req.length < sizeof head ? req.length : sizeof head);
  const TmHeader tmh = decode_tm_header(std::span<const unsigned char, kTmHeaderBytes>(head, kTmHeaderBytes));
  const bool eager = req.length >= kTmHeaderBytes && tmh.opcode == static_cast<uint8_t>(TmOpcode::kEager);
  const bool rndv = req.length >= kTmHeaderBytes + kRndvHeaderBytes && tmh.opcode == static_cast<uint8_t>(TmOpcode::kRndv);
  if (!eager && !rndv) {
    Response r = accept(req, port, true, m);
    if (!passed(r)) return r;
    return receive_whole(m, req, port, IBV_WC_TM_NO_TAG);
  }
  list.lock(port.tag_list_taker());
  std::optional<TagEntry> entry = list.match_locked(tmh.tag);
  if (!entry) {
    // Unexpected: it needs an ordinary WQE (else RNR, and it is not counted).
    Response r = accept(req, port, true, m);
    if (passed(r)) list.count_unexpected_locked();
    list.unlock();
    if (!passed(r)) return r;
    return receive_whole(m, req, port, IBV_WC_TM_RECV);
  }
  list.unlock();
  // Matched: the tagged buffer is the message's receive WQE.
  const ResponderQp qp = port.qp();
  m.reset();
  m.op = req.op;
  m.receive_pd_id = qp.receive_pd_id;
  m.wqe.wr_id = entry->wr_id;
  m.wqe.num_sge = entry->num_sge;
  for (uint32_t i = 0; i < entry->num_sge; ++i) m.wqe.sge[i] = entry->sge[i];
  m.has_wqe = true;
  Request about = req;
  ReceiveCompletion c = receive_completion(m.wqe.wr_id, IBV_WC_SUCCESS, IBV_WC_TM_RECV, 0, about);
  c.no_wqe = true;
  c.tm_info = true;
  c.tm_tag = tmh.tag;
  c.tm_priv = tmh.app_ctx;
  bool gone = false;
  if (eager) {
    iovec payload[limits::kMaxSge + 1];
    const int npayload = skip_iovecs(req.data, req.ndata, kTmHeaderBytes, payload);
    const uint64_t length = req.length - kTmHeaderBytes;
    const ibv_wc_status status = fill_tagged(m, payload, npayload, length, port, gone);
    if (gone) return silence();
    c.status = status;
    c.byte_len = static_cast<uint32_t>(length);
    c.wc_flags |= IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID;
    port.complete_receive(c);
    if (status != IBV_WC_SUCCESS) {
      // As place(): the QP goes to ERROR, the requester gets the NAK.
      port.fail_qp(IBV_EVENT_QP_FATAL);
      return Response{Syndrome::nak(status == IBV_WC_LOC_LEN_ERR ? Answer::kNakInvalidRequest
                                                                  : Answer::kNakRemoteOperational),
                      0};
    }
    port.established();
    return Response{Syndrome::ack(), 0};
  }
  // Rendezvous: the match is reported first, then the READ's data lands and
  // a second completion says so (DATA_VALID); the requester gets a FIN. A
  // READ that cannot be done (the range not readable, the buffer too small)
  // ends in IBV_WC_TM_RNDV_INCOMPLETE: software then moves the data itself.
  const RndvHeader rvh =
      decode_rndv_header(std::span<const unsigned char, kRndvHeaderBytes>(head + kTmHeaderBytes, kRndvHeaderBytes));
  c.wc_flags |= IBV_WC_TM_MATCH;
  port.complete_receive(c);
  port.established();
  ReceiveCompletion data = receive_completion(m.wqe.wr_id, IBV_WC_SUCCESS, IBV_WC_TM_RECV, rvh.length, about);
  data.no_wqe = true;
  iovec from{};
  ibv_wc_status status = IBV_WC_TM_RNDV_INCOMPLETE;
  if (port.requester_range(req.src_qpn, rvh.va, rvh.rkey, rvh.length, from)) {
    status = fill_tagged(m, &from, 1, rvh.length, port, gone);
    if (gone) return silence();
    if (status != IBV_WC_SUCCESS) status = IBV_WC_TM_RNDV_INCOMPLETE;
  }
  data.status = status;
  if (status == IBV_WC_SUCCESS) data.wc_flags |= IBV_WC_TM_DATA_VALID;
  port.complete_receive(data);
  Response r{Syndrome::ack(), 0};
  if (status == IBV_WC_SUCCESS) {
    r.rendezvous_fin = true;
    r.fin_tag = tmh.tag;
    r.fin_app_ctx = tmh.app_ctx;
  }
  return r;
}

}  // namespace

Response respond(const Request& req, ResponderPort& port, bool reliable) {
  // One per thread, reused: the message's arrays (2 KiB of keys, SGEs and
  // addresses) are read only below their counts, which accept() resets, so
  // no operation pays for clearing them.
  static thread_local MessageInProgress m;
  return respond(req, port, reliable, m);
}

Response respond(const Request& req, ResponderPort& port, bool reliable, MessageInProgress& m) {
  if (reliable && (req.op == Operation::kSend || req.op == Operation::kSendWithImm)) {
    if (TagList* list = port.tag_list()) {
      ResponderQp qp = port.qp();
      if (!same_transport(qp.type, req.qp_type) || !receives_in_state(qp.state)) return silence();
      if (!operation_allowed(qp.type, req.op)) return fail(port, true, Answer::kNakInvalidRequest, IBV_EVENT_QP_REQ_ERR);
      return respond_tagged(req, port, *list, m);
    }
  }
  if (req.op == Operation::kRead || is_atomic(req.op)) {
    ResponderQp qp = port.qp();
    if (!same_transport(qp.type, req.qp_type) || !receives_in_state(qp.state)) return silence();
    if (!operation_allowed(qp.type, req.op) || !bind_xrc_srq(req, port, qp))
      return fail(port, reliable, Answer::kNakInvalidRequest, IBV_EVENT_QP_REQ_ERR);
    return req.op == Operation::kRead ? read(req, port, qp) : atomic(req, port, qp);
  }
  Response r = accept(req, port, reliable, m);
  if (!passed(r)) return r;
  r = ready_for_last(m, port);
  if (!passed(r)) return r;
  r = place(m, req.data, req.ndata, req.length, port);
  if (!passed(r)) return r;
  return finish(m, req, port);
}

void respond_datagram(const Request& req, std::span<const unsigned char> grh, ResponderPort& port) {
  const ResponderQp qp = port.qp();
  if (qp.type != IBV_QPT_UD || req.qp_type != IBV_QPT_UD || !receives_in_state(qp.state)) return;
  if (req.op != Operation::kSend && req.op != Operation::kSendWithImm) return;
  if (req.qkey != qp.qkey) return;
  MessageInProgress m;
  m.op = req.op;
  m.reliable = false;
  m.receive_pd_id = qp.receive_pd_id;
  if (!port.take_receive(m.wqe)) return;
  const uint64_t needed = grh.size() + req.length;
  iovec to[limits::kMaxSge];
  int nto = 0;
  ibv_wc_status status = scatter_next(m, needed, port, to, nto);
  if (status == IBV_WC_SUCCESS) {
    iovec from[limits::kMaxSge + 1];
    from[0] = iovec{const_cast<unsigned char*>(grh.data()), grh.size()};
    int nfrom = 1;
    for (int i = 0; i < req.ndata && nfrom < limits::kMaxSge + 1; ++i) from[nfrom++] = req.data[i];
    if (port.write(to, nto, from, nfrom, needed) != CopyStatus::kOk) status = IBV_WC_LOC_PROT_ERR;
  }
  ReceiveCompletion c = receive_completion(m.wqe.wr_id, status, IBV_WC_RECV, needed, req);
  c.wc_flags |= IBV_WC_GRH;
  // On a RoCE port the service level is not reported: mlx5 puts the
  // datagram's network header type there (wire/ud_grh.hpp says why we follow).
  c.sl = grh.size() >= wire::kUdGrhBytes ? wire::ud_grh_header_type(grh.data()) : wire::kRoceHeaderIpv6;
  port.complete_receive(c);
}

void respond_frame(const Request& req, ResponderPort& port) {
  const ResponderQp qp = port.qp();
  if (qp.type != IBV_QPT_RAW_PACKET || req.qp_type != IBV_QPT_RAW_PACKET || !receives_in_state(qp.state)) return;
  if (req.op != Operation::kSend) return;
  MessageInProgress m;
  m.op = req.op;
  m.reliable = false;
  m.receive_pd_id = qp.receive_pd_id;
  if (!port.take_receive(m.wqe)) return;
  iovec to[limits::kMaxSge];
  int nto = 0;
  ibv_wc_status status = scatter_next(m, req.length, port, to, nto);
  if (status == IBV_WC_SUCCESS && port.write(to, nto, req.data, req.ndata, req.length) != CopyStatus::kOk)
    status = IBV_WC_LOC_PROT_ERR;
  ReceiveCompletion c = receive_completion(m.wqe.wr_id, status, IBV_WC_RECV, req.length, req);
  c.src_qp = 0;  // a frame comes from the wire, not from a QP
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
