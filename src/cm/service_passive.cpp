// The passive side of a connection: listening, an incoming REQ or SIDR_REQ
// (the new id it creates and the CONNECT_REQUEST it queues), rdma_accept and
// rdma_reject.
#include <netinet/in.h>

#include <algorithm>
#include <expected>
#include <span>
#include <variant>

#include "cm/refusals.hpp"
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
  // A listener on an address other hosts can reach (or on all of them)
  // takes their requests too. Without the udp link it still serves this host.
  if (!id->src_.loopback()) {
    if (auto r = reach_other_hosts_locked(); !r)
      SOFTHCA_WARN("cm: %s is not reachable from other hosts: %s", to_string(id->src_).c_str(),
                   std::make_error_code(r.error()).message().c_str());
  }
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

CmId* Service::new_passive_id_locked(CmId* listener, const Peer& from, const IpHeader& hdr, uint16_t port) {
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
  // A peer on another host is reached at the address it wrote from.
  child->dgid_ = from.on_other_host() ? from.host->remote : detail::gid_at(local_gid_index(child->dst_, dev).value_or(sidx));
  child->dst_on_other_host_ = from.on_other_host();
  child->peer_ = from;
  return child;
}

auto Service::new_request_id_locked(const Peer& from, uint64_t sid, std::span<const uint8_t> private_data)
    -> std::expected<RequestIds, Refusal> {
  // Only rdma_cm's requests are answered: an IP service ID, and its IP
  // header at the start of the private data naming the address it is for.
  if (!is_ip_service_id(sid)) return std::unexpected(Refusal::kNoListener);
  auto hdr = decode_ip_header(private_data.first<kIpHeaderSize>());
  if (!hdr) return std::unexpected(Refusal::kNoListener);
  IpAddress local;
  local.family = hdr->ip_version == 4 ? AF_INET : AF_INET6;
  local.addr = hdr->dst;
  local.port = service_id_port(sid);
  CmId* listener = find_listener_locked(bind_key(service_id_ps(sid), local));
  if (listener == nullptr) return std::unexpected(Refusal::kNoListener);
  if (listener->pending_requests_ >= listener->backlog_) return std::unexpected(Refusal::kBacklogFull);
  return RequestIds{listener, new_passive_id_locked(listener, from, *hdr, local.port)};
}

void Service::admit_request_locked(CmId* listener, CmId* child, const EventOut& connect_request) {
  add_passive_locked(child);
  listener->pending_requests_++;
  push_event_locked(listener->channel_, Event{child, listener, listener, connect_request});
}

void Service::on_sidr_req(const Peer& from, const Mad& mad, std::vector<Outgoing>& out) {
  const SidrReqMsg& req = std::get<SidrReqMsg>(mad.msg);
  if (passive_by_peer_.contains(detail::peer_key(from, req.request_id))) return;  // a duplicate

  auto ids = new_request_id_locked(from, req.service_id, req.private_data);
  if (!ids) {
    const SidrRepMsg rep = refuse_sidr_req(
        req, ids.error() == Refusal::kBacklogFull ? SidrStatus::kReject : SidrStatus::kUnsupported);
    out.push_back({from, 0, encode(Mad{mad.tid, CmMessage(rep)})});
    return;
  }
  CmId* child = ids->id;
  PathInfo path;
  path.sgid = child->sgid_;
  path.dgid = child->dgid_;
  path.sgid_index = child->sgid_index_;
  path.pkey = req.pkey;
  Step step;
  child->conn_ = Connection::from_sidr_req(req, child->comm_id_, path, kIpHeaderSize, step);
  admit_request_locked(ids->listener, child, *step.event);
}

void Service::on_req(const Peer& from, const Mad& mad, std::vector<Outgoing>& out) {
  const ReqMsg& req = std::get<ReqMsg>(mad.msg);
  if (auto dup = passive_by_peer_.find(detail::peer_key(from, req.local_comm_id)); dup != passive_by_peer_.end()) {
    // A duplicate: the sender has not heard from us in time.
    if (!dup->second->destroying_) apply_step_locked(dup->second, dup->second->conn_.on_duplicate_req(), out);
    return;
  }

  auto ids = new_request_id_locked(from, req.service_id, req.private_data);
  if (!ids) {
    const RejMsg rej =
        refuse_req(req, ids.error() == Refusal::kBacklogFull ? RejReason::kNoResources : RejReason::kInvalidServiceId);
    out.push_back({from, 0, encode(Mad{mad.tid, CmMessage(rej)})});
    return;
  }
  CmId* child = ids->id;
  child->dgid_ = req.primary_local_gid;

  PathInfo path;
  path.sgid = child->sgid_;
  path.dgid = child->dgid_;
  path.sgid_index = child->sgid_index_;
  path.pkey = req.pkey;
  path.mtu = detail::path_mtu_at(child->sgid_index_);
  path.hop_limit = req.primary_hop_limit != 0 ? req.primary_hop_limit : path.hop_limit;
  path.traffic_class = req.primary_traffic_class;
  path.flow_label = req.primary_flow_label;
  if (req.primary_local_ack_timeout != 0) path.local_ack_timeout = req.primary_local_ack_timeout;
  Step step;
  child->conn_ = Connection::from_req(req, child->comm_id_, detail::random_psn(), path, kIpHeaderSize, step);
  admit_request_locked(ids->listener, child, *step.event);
  // The MRA: the application answers in its own time, not in the REQ's.
  // (The child's peer is `from`: new_passive_id_locked.)
  if (step.send) out.push_back(message_to_peer_locked(child, *step.send, IfUnreachable::kFailId));
}

Result<void> Service::accept(CmId* id, const AcceptRequest& req) {
  std::vector<Outgoing> out;
  {
    std::lock_guard g(mu_);
    if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
    AcceptArgs a;
    a.qpn = req.qpn;
    a.srq = req.srq;
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
