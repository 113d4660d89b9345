// The requester side of a send WQE: the local checks (its SGEs against this
// process's MRs, its length), the message handed to the QP's link, and the
// answer handed to the completer.
#include <cstring>

#include "common/clock.hpp"
#include "common/log.hpp"
#include "common/limits.hpp"
#include "common/settings.hpp"
#include "engine/address_handle.hpp"
#include "engine/device/device_info.hpp"
#include "engine/memory_window.hpp"
#include "engine/node.hpp"
#include "engine/protection_domain.hpp"
#include "engine/qp/foreign_memory.hpp"
#include "engine/qp/queue_pair.hpp"
#include "engine/shared_receive_queue.hpp"
#include "engine/completion_queue.hpp"
#include "host/memory_check.hpp"
#include "link/registered_key.hpp"
#include "transport/answer_counters.hpp"
#include "transport/memory_key.hpp"
#include "transport/tag_matching.hpp"
#include "wire/ud_grh.hpp"

namespace softhca::engine {
namespace {

using transport::Operation;
using transport::Verdict;

Operation operation_of(uint32_t wr_opcode) {
  switch (wr_opcode) {
    case IBV_WR_SEND_WITH_IMM:
      return Operation::kSendWithImm;
    case IBV_WR_RDMA_WRITE:
      return Operation::kWrite;
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return Operation::kWriteWithImm;
    case IBV_WR_RDMA_READ:
      return Operation::kRead;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
      return Operation::kCompareSwap;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return Operation::kFetchAdd;
    case IBV_WR_ATOMIC_WRITE:
      return Operation::kAtomicWrite;
    case IBV_WR_SEND_WITH_INV:
      return Operation::kSendWithInv;
    default:
      return Operation::kSend;
  }
}

// The local SGEs, checked against the MRs of the QP's PD (`access`), as
// iovecs; LOC_PROT_ERR for a bad one. An SGE in an MR of another process
// (imported) is staged in `staging` (its iovec is the staging buffer's);
// without staging such an SGE is a protection error too.
ibv_wc_status local_iovecs(Node& node, uint32_t pd_id, const Sge* sges, uint32_t num_sge, uint32_t access,
                           iovec* out, int* nout, uint64_t* total, ForeignStaging* staging = nullptr) {
  int n = 0;
  uint64_t sum = 0;
  int staged[limits::kMaxSge + 1];
  int nstaged = 0;
  for (uint32_t i = 0; i < num_sge; ++i) {
    const Sge& sge = sges[i];
    if (sge.length == 0) continue;
    host::MrRecord mr;
    if (!node.registry().lookup_mr(sge.lkey, mr)) return IBV_WC_LOC_PROT_ERR;
    const transport::MemoryKey key = link::registered_key(mr);
    if (!transport::local_key_allows(key, pd_id, access, sge.addr, sge.length)) return IBV_WC_LOC_PROT_ERR;
    void* at = transport::owner_address(key, sge.addr);
    if (mr.proc != node.proc()) {
      // Another process's MR, in the same PD: only a context shared with
      // that process (ibv_import_device) gives this process its PD.
      if (staging == nullptr || nstaged == limits::kMaxSge + 1) return IBV_WC_LOC_PROT_ERR;
      const uint32_t pid = node.host().pid_of(mr.proc);
      if (pid == 0) return IBV_WC_LOC_PROT_ERR;
      staging->add(mr, pid, reinterpret_cast<uint64_t>(at), sge.length);
      staged[nstaged++] = n;
      out[n++] = iovec{nullptr, sge.length};
      sum += sge.length;
      continue;
    }
    // Through an ODP MR the pages may have gone since registration (through
    // an implicit one nothing was ever checked): the range must be mapped
    // now, or the copy would fault in this process.
    if (transport::is_on_demand(key) &&
        !host::check_process_range(reinterpret_cast<const void*>(sge.addr), sge.length,
                                   (access & IBV_ACCESS_LOCAL_WRITE) ? host::MemoryNeed::kWrite
                                                                     : host::MemoryNeed::kRead))
      return IBV_WC_LOC_PROT_ERR;
    // Pages the MR moved into this process's file are used through our
    // window onto it, as a NIC uses the pages it pinned: the application
    // may have unmapped the address since (its data is still the MR's).
    host::PeerBackings::View own{};
    if (char* in_file = node.host().in_backing(node.proc(), mr.shared, reinterpret_cast<uint64_t>(at), sge.length, own))
      at = in_file;
    out[n++] = iovec{at, sge.length};
    sum += sge.length;
  }
  if (nstaged != 0) {
    staging->finish();
    for (int i = 0; i < nstaged; ++i) out[staged[i]] = staging->at(static_cast<size_t>(i));
  }
  *nout = n;
  *total = sum;
  return IBV_WC_SUCCESS;
}

// `bytes` from `from` into this process's iovecs.
void scatter(const iovec* to, int nto, const void* from, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(from);
  for (int i = 0; i < nto && bytes > 0; ++i) {
    const size_t n = to[i].iov_len < bytes ? to[i].iov_len : bytes;
    std::memcpy(to[i].iov_base, p, n);
    p += n;
    bytes -= n;
  }
}

}  // namespace

QueuePair::Step QueuePair::execute_locked(SendWqe& wqe, uint32_t position, uint64_t now_ns) {
  auto verdict = [](const Verdict& v) { return Step{Step::Kind::kVerdict, v}; };
  if (wqe.opcode == IBV_WR_BIND_MW || wqe.opcode == IBV_WR_LOCAL_INV) {
    // Local operations execute once every earlier WQE has completed (an
    // asynchronous link may still have some in flight: their answers
    // progress the queue again), so that a window changes only after the
    // operations posted before it, and completions stay in order.
    if (position != sq_tail_.load(std::memory_order_relaxed)) return Step{Step::Kind::kNoRoom, {}};
    if (wqe.opcode == IBV_WR_LOCAL_INV)
      return verdict(Verdict::complete(invalidate_locally(node_.registry(), node_.proc(), wqe.rkey, pd_->id())));
    BindRequest bind;
    bind.new_key = wqe.rkey;
    bind.mr_lkey = wqe.bind_lkey;
    bind.addr = wqe.remote_addr;
    bind.length = wqe.compare_add;
    bind.access = wqe.bind_access;
    return verdict(Verdict::complete(wqe.mw->bind(bind, qpn_, pd_->id())));
  }
  const Operation op = operation_of(wqe.opcode);
  const bool reads_into_local = op == Operation::kRead || op == Operation::kCompareSwap || op == Operation::kFetchAdd;

  // The local side: inline data, or SGEs checked against our MRs (an atomic
  // write's value sits in the WQE itself).
  iovec local[limits::kMaxSge + 1];
  int nlocal = 0;
  uint64_t length = 0;
  if (op == Operation::kAtomicWrite) {
    local[0] = {&wqe.compare_add, sizeof wqe.compare_add};
    nlocal = 1;
    length = sizeof wqe.compare_add;
  } else if (wqe.send_flags & IBV_SEND_INLINE) {
    local[0] = {wqe.inline_data(init_.max_send_sge), wqe.inline_len};
    nlocal = wqe.inline_len ? 1 : 0;
    length = wqe.inline_len;
  } else {
    const uint32_t access = reads_into_local ? IBV_ACCESS_LOCAL_WRITE : 0;
    if (!staging_.empty()) staging_.erase(position);  // an earlier attempt's
    ForeignStaging staging;
    const ibv_wc_status checked =
        local_iovecs(node_, pd_->id(), wqe.sge, wqe.num_sge, access, local, &nlocal, &length, &staging);
    if (checked != IBV_WC_SUCCESS) return verdict(Verdict::complete(checked));
    if (!staging.empty()) {
      // What the request sends is taken now; what it brings back is
      // scattered when it completes (complete_send_locked).
      if (!reads_into_local && !staging.gather(node_.host())) return verdict(Verdict::complete(IBV_WC_LOC_PROT_ERR));
      staging_.emplace(position, std::move(staging));  // the buffer (and the iovecs into it) stays put
    }
  }
  if (length > limits::kMaxMsgSize) return verdict(Verdict::complete(IBV_WC_LOC_LEN_ERR));
  if ((op == Operation::kCompareSwap || op == Operation::kFetchAdd) && length != 8)
    return verdict(Verdict::complete(IBV_WC_LOC_LEN_ERR));
  wqe.length = length;

  transport::Request request;
  request.op = op;
  request.qp_type = init_.type;
  request.src_qpn = qpn_;
  request.solicited = (wqe.send_flags & IBV_SEND_SOLICITED) != 0;
  request.imm_data = wqe.imm_data;
  if (op == Operation::kSendWithInv) request.invalidate_rkey = wqe.imm_data;  // ibv_send_wr's union
  request.remote_addr = wqe.remote_addr;
  request.rkey = wqe.rkey;
  request.compare_add = wqe.compare_add;
  request.swap = wqe.swap;
  if (init_.type == IBV_QPT_XRC_SEND) request.xrc_srqn = wqe.remote_qpn;
  request.data = local;
  request.ndata = nlocal;
  request.length = length;

  if (init_.type == IBV_QPT_RAW_PACKET) {
    // One Ethernet frame onto the port's virtual segment (this process's,
    // on the shm link), where flow steering picks its receivers. Like a
    // frame on a wire, it is sent whether or not anyone takes it.
    if (length < limits::kMinRawFrame || length > limits::kMaxRawFrame)
      return verdict(Verdict::complete(IBV_WC_LOC_LEN_ERR));
    node_.shm_link().send_frame(request);
    return verdict(Verdict::complete(IBV_WC_SUCCESS));
  }

  if (init_.type == IBV_QPT_UD) {
    if (length > device_info().active_mtu_bytes) return verdict(Verdict::complete(IBV_WC_LOC_LEN_ERR));
    const AddressVector& av = wqe.ah->av();
    request.qkey = (wqe.remote_qkey & 0x80000000u) ? attrs_.qkey : wqe.remote_qkey;
    link::Datagram to;
    to.dest_qpn = wqe.remote_qpn;
    to.is_global = av.is_global != 0;
    if (const GidEntry* sgid = device_info().gid_at(av.sgid_index)) std::memcpy(to.sgid, sgid->raw.data(), 16);
    std::memcpy(to.dgid, av.dgid, 16);
    to.traffic_class = av.traffic_class;
    to.hop_limit = av.hop_limit;
    to.flow_label = av.flow_label;
    to.block_self_multicast = init_.block_self_multicast;
    to.qp_counters = &shared_->counters;
    // Without a GRH there is no address: the message is lost, as UD allows.
    const bool multicast = to.is_global && wire::is_multicast_gid(to.dgid);
    const bool local = is_local_gid(std::span<const uint8_t, 16>(av.dgid, 16));
    const bool force_udp = setting_number(SettingId::kLink) == 1;
    if (multicast) {
      // A group: its members on this host through shared memory, those on
      // other hosts through the group's IP address, sent out of the source
      // address's interface (from a loopback source it could reach nobody).
      node_.shm_link().send_datagram(to, request);
      const GidEntry* source = device_info().gid_at(av.sgid_index);
      if (source != nullptr) {
        const uint32_t ifindex = source->ifindex;
        const auto out = group_interfaces(device_info().gids, to.dgid, ifindex);
        if (!out.empty()) {
          to.ifindex = ifindex;
          node_.udp_link().send_datagram(to, request);
        }
      }
    } else if (to.is_global && local && !force_udp) {
      node_.shm_link().send_datagram(to, request);
    } else if (to.is_global) {
      node_.udp_link().send_datagram(to, request);
    }
    return verdict(Verdict::complete(IBV_WC_SUCCESS));
  }

  // RC and UC: the connected QP's channel, opened at RTR.
  const bool reliable = init_.type == IBV_QPT_RC || init_.type == IBV_QPT_XRC_SEND;
  if (now_ns == 0 && !channel_) now_ns = monotonic_ns();
  if (!channel_)
    return verdict(reliable ? transport::on_answer(transport::Syndrome::silence(), wqe.retry, attrs_.rnr_retry,
                                                   attrs_.timeout, now_ns)
                            : Verdict::complete(IBV_WC_SUCCESS));
  const transport::Response response = channel_->deliver(request, position);
  if (response.pending) return Step{Step::Kind::kInFlight, {}};

  if (response.busy) return Step{Step::Kind::kNoRoom, {}};
  // UC has no acknowledgements: the message is done once it is sent.
  if (!reliable) return verdict(Verdict::complete(IBV_WC_SUCCESS));
  transport::count_received_answer(counters(), response.syndrome.answer);
  // Silence after an earlier attempt: that attempt's ACK timer ran out.
  if (response.syndrome.answer == transport::Answer::kSilence && wqe.retry.deadline_ns != 0)
    counters().add(Counter::kCompleterRetryErr);
  // An ACK completes without a deadline; anything else may arm one.
  if (now_ns == 0 && response.syndrome.answer != transport::Answer::kAck) now_ns = monotonic_ns();
  const Verdict v = transport::on_answer(response.syndrome, wqe.retry, attrs_.rnr_retry, attrs_.timeout, now_ns);
  if (v.kind == Verdict::Kind::kComplete && v.status == IBV_WC_SUCCESS &&
      (op == Operation::kCompareSwap || op == Operation::kFetchAdd)) {
    // The ACK carries the value the atomic replaced: it lands in the local SGE.
    scatter(local, nlocal, &response.atomic_original, sizeof response.atomic_original);
  }
  Step step = verdict(v);
  step.rendezvous_fin = response.rendezvous_fin;
  step.fin_tag = response.fin_tag;
  step.fin_app_ctx = response.fin_app_ctx;
  return step;
}

void QueuePair::deliver_fin_locked(uint64_t tag, uint32_t app_ctx) {
  host::SharedRq* rq = init_.srq != nullptr ? init_.srq->shared() : rq_;
  if (rq == nullptr || init_.recv_cq == nullptr) return;
  alignas(16) unsigned char storage[sizeof(host::RecvWqe) + limits::kMaxSge * sizeof(host::RecvSge)];
  auto* wqe = reinterpret_cast<host::RecvWqe*>(storage);
  if (!rq->take(wqe, nullptr)) {
    SOFTHCA_DEBUG("qp 0x%x: no receive wqe for a rendezvous fin; dropped", qpn_);
    return;
  }
  unsigned char header[transport::kTmHeaderBytes];
  transport::encode_tm_header(transport::TmHeader{static_cast<uint8_t>(transport::TmOpcode::kFin), app_ctx, tag},
                              header);
  static_assert(sizeof(host::RecvSge) == sizeof(Sge));
  const uint32_t pd_id = init_.srq != nullptr ? init_.srq->pd().id() : pd_->id();
  iovec to[limits::kMaxSge + 1];
  int nto = 0;
  uint64_t room = 0;
  const uint32_t num_sge = wqe->num_sge < limits::kMaxSge ? wqe->num_sge : limits::kMaxSge;
  ibv_wc_status status = local_iovecs(node_, pd_id, reinterpret_cast<const Sge*>(wqe->sge), num_sge,
                                      IBV_ACCESS_LOCAL_WRITE, to, &nto, &room);
  if (status == IBV_WC_SUCCESS && room < sizeof header) status = IBV_WC_LOC_LEN_ERR;
  if (status == IBV_WC_SUCCESS) scatter(to, nto, header, sizeof header);
  host::Cqe cqe{};
  cqe.wr_id = wqe->wr_id;
  cqe.status = status;
  cqe.opcode = IBV_WC_RECV;
  cqe.byte_len = sizeof header;
  cqe.qp_num = qpn_;
  cqe.src_qp = attrs_.dest_qpn;
  init_.recv_cq->push(cqe);
}

}  // namespace softhca::engine
