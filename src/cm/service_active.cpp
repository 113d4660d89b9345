// The active side of a connection: rdma_connect's REQ (or SIDR_REQ for a UD
// id) and where it goes, the RTU after the REP, and the calls either side
// makes once connected (rdma_notify, rdma_disconnect's DREQ).
#include <algorithm>
#include <cstring>

#include "cm/service.hpp"
#include "cm/service_internal.hpp"
#include "common/settings.hpp"
#include "engine/device/device_info.hpp"

namespace softhca::cm {
namespace {

// The CM timeouts this process's requests carry: rdma_cm's, unless
// SOFTHCA_CM_RESPONSE_TIMEOUT or SOFTHCA_CM_MAX_RETRIES (common/settings.hpp)
// say otherwise. Read at each request, so a test or a user with a slow peer
// can change them without restarting.
CmTimeouts request_timeouts() {
  // The table's defaults are rdma_cm's, and its ranges the REQ's fields
  // (5 bits of exponent, 4 bits of retries).
  static_assert(setting(SettingId::kCmResponseTimeout).default_value == kDefaultCmResponseTimeout &&
                setting(SettingId::kCmResponseTimeout).max == 31);
  static_assert(setting(SettingId::kCmMaxRetries).default_value == kDefaultMaxCmRetries &&
                setting(SettingId::kCmMaxRetries).max == 15);
  CmTimeouts t;
  t.response_timeout = static_cast<uint8_t>(setting_number(SettingId::kCmResponseTimeout));
  t.max_retries = static_cast<uint8_t>(setting_number(SettingId::kCmMaxRetries));
  return t;
}

// rdma_cm's IP header, then the application's bytes.
template <std::size_t N>
void fill_request_private_data(std::array<uint8_t, N>& pd, const IpAddress& src, const IpAddress& dst,
                               std::span<const uint8_t> user) {
  IpHeader hdr;
  hdr.ip_version = src.family == AF_INET6 && dst.family == AF_INET6 ? 6 : 4;
  hdr.src_port = src.port;
  hdr.src = src.addr;
  hdr.dst = dst.addr;
  encode_ip_header(hdr, std::span<uint8_t, kIpHeaderSize>(pd.data(), kIpHeaderSize));
  if (!user.empty()) std::memcpy(pd.data() + kIpHeaderSize, user.data(), user.size());
}
}  // namespace

Result<void> Service::connect(CmId* id, const ConnectRequest& req) {
  std::vector<Outgoing> out;
  {
    std::lock_guard g(mu_);
    if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
    if (!id->route_resolved_ || id->conn_.has_cm()) return fail(std::errc::invalid_argument);
    auto r = id->qp_type_ == IBV_QPT_UD ? sidr_connect_locked(id, req, out) : connect_locked(id, req, out);
    if (!r) return r;
  }
  send_all(std::move(out));
  return {};
}

PathInfo Service::request_path(const CmId& id) {
  PathInfo path;
  path.sgid = id.sgid_;
  path.dgid = id.dgid_;
  path.sgid_index = id.sgid_index_;
  path.traffic_class = id.traffic_class_;
  path.mtu = detail::path_mtu_at(id.sgid_index_);
  return path;
}

Result<void> Service::connect_locked(CmId* id, const ConnectRequest& req, std::vector<Outgoing>& out) {
  if (req.private_data.size() > kReqUserPrivateDataSize) return fail(std::errc::invalid_argument);
  ConnectArgs a;
  a.local_comm_id = id->comm_id_;
  a.service_id = service_id(id->ps_, id->dst_.port);
  a.local_ca_guid = engine::device_info().node_guid;
  a.qpn = req.qpn;
  a.srq = req.srq;
  a.starting_psn = detail::random_psn();
  a.responder_resources = req.responder_resources;
  a.initiator_depth = req.initiator_depth;
  a.retry_count = req.retry_count;
  a.rnr_retry_count = req.rnr_retry_count;
  a.flow_control = req.flow_control;
  a.qp_type = id->qp_type_;
  a.path = request_path(*id);
  a.timeouts = request_timeouts();
  fill_request_private_data(a.private_data, id->src_, id->dst_, req.private_data);

  auto step = id->conn_.connect(a);
  if (!step) return fail(step.error());
  // Nobody listening answers as the target's CM would: REJ "invalid service ID".
  RejMsg rej;
  rej.remote_comm_id = id->comm_id_;
  rej.reason = static_cast<uint16_t>(RejReason::kInvalidServiceId);
  send_request_locked(id, std::move(*step), CmMessage(rej), out);
  return {};
}

void Service::send_request_locked(CmId* id, Step&& request, const CmMessage& if_nobody_listens,
                                  std::vector<Outgoing>& out) {
  if (id->dst_on_other_host_) {
    // The other host's CM finds its listener, or refuses the request.
    id->peer_ = transport_->peer_on_other_host(HostPair{id->dgid_, id->sgid_});
    apply_step_locked(id, std::move(request), out);
    return;
  }
  const auto listener = table_->find_listener(bind_key(id->ps_, id->dst_));
  if (!listener) {
    apply_step_locked(id, id->conn_.on_message(if_nobody_listens), out);
    return;
  }
  id->peer_ = Peer{listener->pid, listener->socket_path};
  apply_step_locked(id, std::move(request), out);
}

Result<void> Service::sidr_connect_locked(CmId* id, const ConnectRequest& req, std::vector<Outgoing>& out) {
  if (req.private_data.size() > kSidrReqUserPrivateDataSize) return fail(std::errc::invalid_argument);
  SidrArgs a;
  a.local_comm_id = id->comm_id_;
  a.service_id = service_id(id->ps_, id->dst_.port);
  a.path = request_path(*id);
  a.timeouts = request_timeouts();
  fill_request_private_data(a.private_data, id->src_, id->dst_, req.private_data);

  auto step = id->conn_.sidr_request(a);
  if (!step) return fail(step.error());
  // Nobody listening: the target's CM answers "unsupported service".
  SidrRepMsg rep;
  rep.request_id = id->comm_id_;
  rep.status = static_cast<uint8_t>(SidrStatus::kUnsupported);
  send_request_locked(id, std::move(*step), CmMessage(rep), out);
  return {};
}

Result<void> Service::establish(CmId* id) {
  std::vector<Outgoing> out;
  {
    std::lock_guard g(mu_);
    if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
    auto step = id->conn_.establish();
    if (!step) return fail(step.error());
    apply_step_locked(id, std::move(*step), out);
  }
  send_all(std::move(out));
  return {};
}

Result<void> Service::notify_established(CmId* id) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  auto step = id->conn_.notify_established();
  if (!step) return fail(step.error());
  std::vector<Outgoing> out;
  apply_step_locked(id, std::move(*step), out);
  return {};
}

Result<bool> Service::disconnect(CmId* id) {
  std::vector<Outgoing> out;
  bool expect = false;
  {
    std::lock_guard g(mu_);
    if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
    auto step = id->conn_.disconnect();
    if (!step) return fail(step.error());
    apply_step_locked(id, std::move(*step), out);
    expect = id->conn_.state() == ConnState::kDreqSent ||
             std::any_of(id->channel_->queue_.begin(), id->channel_->queue_.end(),
                         [id](const Event& e) { return e.id == id; });
  }
  send_all(std::move(out));
  return expect;
}

}  // namespace softhca::cm
