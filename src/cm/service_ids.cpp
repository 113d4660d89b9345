// The service's ids: comm IDs, creating and destroying ids (with what
// destroying one tells its peer), their bookkeeping tables, their options and
// what the ABI layer reads of them.
#include <algorithm>

#include "cm/host_routing.hpp"
#include "cm/service.hpp"
#include "cm/service_internal.hpp"

namespace softhca::cm {

uint32_t Service::next_comm_id_locked() {
  // Our port-table handle in the high bits: any process of this host can
  // tell whose id a message from another host names (cm/host_routing.hpp).
  for (;;) {
    const uint32_t id = make_comm_id(proc_, ++comm_id_seed_);
    if (!ids_.contains(id)) return id;
  }
}

uint64_t Service::next_tid_locked(uint32_t comm_id) { return (uint64_t{comm_id} << 32) | (++tid_counter_ & 0xFFFFFFFF); }

Result<CmId*> Service::create_id(Channel* channel, uint16_t ps, ibv_qp_type qp_type, void* user) {
  auto* id = new CmId;
  std::lock_guard g(mu_);
  id->channel_ = channel;
  id->ps_ = ps;
  id->qp_type_ = qp_type;
  id->user_ = user;
  id->comm_id_ = next_comm_id_locked();
  ids_[id->comm_id_] = id;
  return id;
}

void* Service::ensure_user(CmId* id, const std::function<void*()>& make) {
  std::lock_guard g(mu_);
  if (id->user_ == nullptr) id->user_ = make();
  return id->user_;
}

Result<void> Service::destroy_id(CmId* id) {
  std::vector<Outgoing> out;
  {
    std::unique_lock lk(mu_);
    if (id->orphaned_) {
      // Torn down with its channel already. librdmacm would fail here too
      // (its write to the closed channel fd); the memory is freed all the
      // same, at once or when the last event handed out is acknowledged.
      if (id->acked_ >= id->delivered_) {
        delete id;
      } else {
        id->free_when_acked_ = true;
      }
      return fail(std::errc::bad_file_descriptor);
    }
    destroy_locked(id, lk, out);
  }
  send_all(std::move(out));
  return {};
}

void Service::tear_down_locked(CmId* id, std::vector<Outgoing>& out) {
  id->destroying_ = true;
  if (const auto d = id->conn_.departure(); d && id->peer_.on_other_host()) depart_locked(id, *d);
  if (id->conn_.state() == ConnState::kTimewait && id->peer_.on_other_host()) {
    // Its DREP may have been lost; should the process exit before the
    // peer's DREQ comes again, the exit repeats it (remember_drep_locked).
    Step drep = id->conn_.on_exit();
    if (drep.send) remember_drep_locked(id->comm_id_, message_to_peer_locked(id, *drep.send, IfUnreachable::kIgnore));
  }
  Step step = id->conn_.on_destroy();
  if (step.send && id->peer_.known())
    out.push_back(message_to_peer_locked(id, *step.send, IfUnreachable::kIgnore));
  sync_will_locked(id->comm_id_, id);
  cancel_retransmit_timer_locked(id);
  cancel_addr_query_locked(id);
  if (id->listening_) std::erase(listeners_, id);
  if (id->binding_ != 0) {
    table_->unbind(id->binding_);
    id->binding_ = 0;
  }
}

void Service::destroy_locked(CmId* id, std::unique_lock<std::mutex>& lk, std::vector<Outgoing>& out) {
  tear_down_locked(id, out);
  std::vector<CmId*> orphans;
  drop_events_locked(id, orphans);
  acked_cv_.wait(lk, [id] { return id->acked_ >= id->delivered_; });
  forget_locked(id);
  for (CmId* orphan : orphans) destroy_locked(orphan, lk, out);
  delete id;
}

IdInfo Service::info(CmId* id) {
  std::lock_guard g(mu_);
  IdInfo i;
  i.src = id->src_;
  i.dst = id->dst_;
  i.has_device = id->has_device_;
  i.sgid_index = id->sgid_index_;
  i.sgid = id->sgid_;
  i.dgid = id->dgid_;
  i.traffic_class = id->traffic_class_;
  i.conn_state = id->conn_.state();
  i.negotiated = id->conn_.negotiated();
  i.path_mtu = id->conn_.has_cm() ? i.negotiated.path.mtu : detail::path_mtu_at(id->sgid_index_);
  i.listening = id->listening_;
  i.route_resolved = id->route_resolved_;
  return i;
}

Result<void> Service::set_ack_timeout(CmId* id, uint8_t timeout) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  if (id->qp_type_ != IBV_QPT_RC) return fail(std::errc::invalid_argument);
  id->ack_timeout_ = timeout;
  return {};
}

Result<void> Service::set_tos(CmId* id, uint8_t tos) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  id->tos_ = tos;
  return {};
}

Result<QpAttrPlan> Service::init_qp_attr(CmId* id, ibv_qp_state target) {
  std::lock_guard g(mu_);
  if (id->orphaned_) return fail(std::errc::bad_file_descriptor);
  auto plan = cm::init_qp_attr(id->conn_, id->qp_type_, 1, 0, detail::kUdpQkey, target);
  if (plan && id->ack_timeout_ && (plan->mask & IBV_QP_TIMEOUT) != 0) plan->attr.timeout = *id->ack_timeout_;
  return plan;
}

void Service::add_passive_locked(CmId* child) {
  ids_[child->comm_id_] = child;
  passive_by_peer_[detail::peer_key(child->peer_, child->conn_.remote_comm_id())] = child;
}

void Service::forget_locked(CmId* id) {
  ids_.erase(id->comm_id_);
  if (id->peer_.known()) {
    auto it = passive_by_peer_.find(detail::peer_key(id->peer_, id->conn_.remote_comm_id()));
    if (it != passive_by_peer_.end() && it->second == id) passive_by_peer_.erase(it);
  }
}

}  // namespace softhca::cm
