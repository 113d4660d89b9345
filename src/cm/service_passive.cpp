// The passive side of a connection: listening, an incoming REQ or SIDR_REQ
// (the new id it creates and the CONNECT_REQUEST it queues), rdma_accept and
// rdma_reject.
#include <netinet/in.h>

#include <algorithm>
#include <variant>

#include "cm/service.hpp"
#include "cm/service_internal.hpp"
#include "common/log.hpp"
#include "engine/device/device_info.hpp"

namespace softhca::cm {
namespace {

constexpr int kMaxBacklog = 4096;

}  // namespace

Result<void> Service::listen(CmId* id, int backlog) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  const int effective = backlog > 0 ? std::min(backlog, kMaxBacklog) : kMaxBacklog;
  if (id->listening_) {
    id->backlog_ = effective;
    return {};
  }
  if (id->addr_resolved_ || id->conn_.has_cm()) return fail(std::errc::invalid_argument);
  if (!id->bound_) {
    if (auto r = bind_locked(id, wildcard_of(AF_INET)); !r) return r;
  }
  table_->set_listening(id->binding_, true);
  id->listening_ = true;
  id->backlog_ = effective;
  listeners_.push_back(id);
  // Test harnesses wait for this line (SOFTHCA_LOG=info): the listener is
  // registered, a connect now reaches it.
  SOFTHCA_INFO("cm: listening on %s (port space 0x%x)", to_string(id->src_).c_str(), id->ps_);
  return {};
}

CmId* Service::find_listener_locked(const BindKey& dst) {
  CmId* wildcard = nullptr;
  for (CmId* l : listeners_) {
    if (l->destroying_) continue;
    const BindKey k = bind_key(l->ps_, l->src_);
    if (!listener_matches(k, dst)) continue;
    if (!k.wildcard) return l;
    if (wildcard == nullptr) wildcard = l;
  }
  return wildcard;
}

CmId* Service::new_passive_id_locked(CmId* listener, uint32_t pid, const IpHeader& hdr, uint16_t port) {
  auto* child = new CmId;
  child->channel_ = listener->channel_;
  child->ps_ = listener->ps_;
  child->qp_type_ = listener->qp_type_;
  child->comm_id_ = next_comm_id_locked();
  child->src_.family = hdr.ip_version == 4 ? AF_INET : AF_INET6;
  child->src_.addr = hdr.dst;
  child->src_.port = port;
  child->dst_.family = child->src_.family;
  child->dst_.addr = hdr.src;
  child->dst_.port = hdr.src_port;
  child->addr_resolved_ = child->route_resolved_ = true;
  child->has_device_ = true;
  const auto& dev = engine::device_info();
  const uint32_t sidx = local_gid_index(child->src_, dev).value_or(0);
  child->sgid_index_ = static_cast<uint8_t>(sidx);
  child->sgid_ = detail::gid_at(sidx);
  child->dgid_ = detail::gid_at(local_gid_index(child->dst_, dev).value_or(sidx));
  child->peer_pid_ = pid;
  return child;
}

void Service::on_sidr_req(uint32_t pid, const Mad& mad, std::vector<Outgoing>& out) {
  const SidrReqMsg& req = std::get<SidrReqMsg>(mad.msg);
  if (passive_by_peer_.contains(detail::peer_key(pid, req.request_id))) return;  // a duplicate

  auto reply = [&](SidrStatus status) {
    SidrRepMsg rep;
    rep.request_id = req.request_id;
    rep.status = static_cast<uint8_t>(status);
    rep.service_id = req.service_id;
    out.push_back({pid, std::string(), 0, encode(Mad{mad.tid, CmMessage(rep)})});
  };
  if (!is_ip_service_id(req.service_id)) return reply(SidrStatus::kUnsupported);
  auto hdr = decode_ip_header(std::span<const uint8_t, kIpHeaderSize>(req.private_data.data(), kIpHeaderSize));
  if (!hdr) return reply(SidrStatus::kUnsupported);
  IpAddress local;
  local.family = hdr->ip_version == 4 ? AF_INET : AF_INET6;
  local.addr = hdr->dst;
  local.port = service_id_port(req.service_id);
  CmId* listener = find_listener_locked(bind_key(service_id_ps(req.service_id), local));
  if (listener == nullptr) return reply(SidrStatus::kUnsupported);
  if (listener->pending_requests_ >= listener->backlog_) return reply(SidrStatus::kReject);

  CmId* child = new_passive_id_locked(listener, pid, *hdr, local.port);
  PathInfo path;
  path.sgid = child->sgid_;
  path.dgid = child->dgid_;
  path.sgid_index = child->sgid_index_;
  path.pkey = req.pkey;
  Step step;
  child->conn_ = Connection::from_sidr_req(req, child->comm_id_, path, kIpHeaderSize, step);
  add_passive_locked(child);
  listener->pending_requests_++;
  push_event_locked(listener->channel_, Event{child, listener, listener, *step.event});
}

void Service::on_req(uint32_t pid, const Mad& mad, std::vector<Outgoing>& out) {
  const ReqMsg& req = std::get<ReqMsg>(mad.msg);
  if (auto dup = passive_by_peer_.find(detail::peer_key(pid, req.local_comm_id)); dup != passive_by_peer_.end()) {
    // A duplicate: the sender has not heard from us in time.
    if (!dup->second->destroying_) apply_step_locked(dup->second, dup->second->conn_.on_duplicate_req(), out);
    return;
  }

  auto reject = [&](RejReason reason) {
    RejMsg rej;
    rej.remote_comm_id = req.local_comm_id;
    rej.message_rejected = RejectedMessage::kReq;
    rej.reason = static_cast<uint16_t>(reason);
    out.push_back({pid, std::string(), 0, encode(Mad{mad.tid, CmMessage(rej)})});
  };
  if (!is_ip_service_id(req.service_id)) return reject(RejReason::kInvalidServiceId);
  auto hdr = decode_ip_header(std::span<const uint8_t, kIpHeaderSize>(req.private_data.data(), kIpHeaderSize));
  if (!hdr) return reject(RejReason::kInvalidServiceId);

  IpAddress local;
  local.family = hdr->ip_version == 4 ? AF_INET : AF_INET6;
  local.addr = hdr->dst;
  local.port = service_id_port(req.service_id);
  CmId* listener = find_listener_locked(bind_key(service_id_ps(req.service_id), local));
  if (listener == nullptr) return reject(RejReason::kInvalidServiceId);
  if (listener->pending_requests_ >= listener->backlog_) return reject(RejReason::kNoResources);

  CmId* child = new_passive_id_locked(listener, pid, *hdr, local.port);
  child->dgid_ = req.primary_local_gid;

  PathInfo path;
  path.sgid = child->sgid_;
  path.dgid = child->dgid_;
  path.sgid_index = child->sgid_index_;
  path.pkey = req.pkey;
  path.hop_limit = req.primary_hop_limit != 0 ? req.primary_hop_limit : path.hop_limit;
  path.traffic_class = req.primary_traffic_class;
  path.flow_label = req.primary_flow_label;
  if (req.primary_local_ack_timeout != 0) path.local_ack_timeout = req.primary_local_ack_timeout;
  Step step;
  child->conn_ = Connection::from_req(req, child->comm_id_, detail::random_psn(), path, kIpHeaderSize, step);
  add_passive_locked(child);
  listener->pending_requests_++;
  push_event_locked(listener->channel_, Event{child, listener, listener, *step.event});
  // The MRA: the application answers in its own time, not in the REQ's.
  if (step.send) out.push_back({pid, std::string(), child->comm_id_, encode(Mad{next_tid_locked(child->comm_id_), *step.send})});
}

Result<void> Service::accept(CmId* id, const AcceptRequest& req) {
  std::vector<Outgoing> out;
  {
    std::lock_guard g(mu_);
    if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
    AcceptArgs a;
    a.qpn = req.qpn;
    a.srq = req.srq;
    a.starting_psn = detail::random_psn();
    a.responder_resources = req.responder_resources;
    a.initiator_depth = req.initiator_depth;
    a.rnr_retry_count = req.rnr_retry_count;
    a.flow_control = req.flow_control;
    a.local_ca_guid = engine::device_info().node_guid;
    a.private_data = req.private_data;
    auto step = id->qp_type_ == IBV_QPT_UD ? id->conn_.sidr_accept(req.qpn, detail::kUdpQkey, req.private_data)
                                          : id->conn_.accept(a);
    if (!step) return fail(step.error());
    apply_step_locked(id, std::move(*step), out);
  }
  send_all(std::move(out));
  return {};
}

Result<void> Service::reject(CmId* id, std::span<const uint8_t> private_data, uint16_t reason) {
  std::vector<Outgoing> out;
  {
    std::lock_guard g(mu_);
    if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
    auto step = id->conn_.reject(private_data, reason);
    if (!step) return fail(step.error());
    apply_step_locked(id, std::move(*step), out);
  }
  send_all(std::move(out));
  return {};
}

}  // namespace softhca::cm
