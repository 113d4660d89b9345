// Messages to and from other CMs: the one place where the service meets its
// transport. Outgoing messages are sent here after the service's lock is
// released; incoming ones are decoded and given to the passive side (REQ,
// SIDR_REQ) or to the id they name; a peer that is gone fails its ids.
#include <string>
#include <type_traits>
#include <variant>

#include "cm/refusals.hpp"
#include "cm/service.hpp"
#include "cm/service_internal.hpp"
#include "common/log.hpp"

namespace softhca::cm {

void Service::send_all(std::vector<Outgoing>&& out) {
  for (auto& o : out) {
    auto r = transport_->send(o.to, o.bytes);
    if (r) continue;
    SOFTHCA_DEBUG("cm: cannot reach process %u: %s", o.to.pid, std::make_error_code(r.error()).message().c_str());
    if (!o.to.on_other_host()) table_->reclaim_if_dead(o.to.pid);
    if (o.comm_id != 0) peer_unreachable(o.comm_id, o.to);
  }
}

auto Service::message_to_peer_locked(const CmId* id, const CmMessage& msg, IfUnreachable if_unreachable) -> Outgoing {
  const uint32_t fail = if_unreachable == IfUnreachable::kFailId ? id->comm_id_ : 0;
  return {id->peer_, fail, encode(Mad{next_tid_locked(id->comm_id_), msg})};
}

void Service::peer_unreachable(uint32_t comm_id, const Peer& peer) {
  std::lock_guard g(mu_);
  auto it = ids_.find(comm_id);
  if (it == ids_.end() || !it->second->peer_.same_cm(peer) || it->second->destroying_) return;
  CmId* id = it->second;
  std::vector<Outgoing> ignored;
  if (id->conn_.state() == ConnState::kReqSent) {
    // The listener's process is gone: nobody listens there any more.
    RejMsg rej;
    rej.remote_comm_id = id->comm_id_;
    rej.reason = static_cast<uint16_t>(RejReason::kInvalidServiceId);
    apply_step_locked(id, id->conn_.on_message(CmMessage(rej)), ignored);
  } else if (id->conn_.state() == ConnState::kSidrReqSent) {
    SidrRepMsg rep;
    rep.request_id = id->comm_id_;
    rep.status = static_cast<uint8_t>(SidrStatus::kUnsupported);
    apply_step_locked(id, id->conn_.on_message(CmMessage(rep)), ignored);
  } else {
    apply_step_locked(id, id->conn_.on_peer_lost(), ignored);
  }
}

void Service::on_peer_lost(const Peer& peer) {
  {
    std::lock_guard g(mu_);
    std::vector<Outgoing> ignored;  // nobody to send to
    for (auto& [comm, id] : ids_) {
      if (!id->peer_.same_cm(peer) || id->destroying_) continue;
      apply_step_locked(id, id->conn_.on_peer_lost(), ignored);
    }
  }
  if (!peer.on_other_host()) table_->reclaim_if_dead(peer.pid);
}

void Service::on_message(const Peer& from, std::span<const uint8_t> bytes) {
  auto mad = decode(bytes);
  if (!mad) {
    SOFTHCA_DEBUG("cm: dropping an undecodable message from process %u", from.pid);
    return;
  }
  std::vector<Outgoing> out;
  std::unique_lock lk(mu_);
  if (std::holds_alternative<ReqMsg>(mad->msg)) {
    on_req(from, *mad, out);
  } else if (std::holds_alternative<SidrReqMsg>(mad->msg)) {
    on_sidr_req(from, *mad, out);
  } else {
    uint32_t local = 0, remote = 0;
    std::visit(
        [&](const auto& m) {
          using T = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<T, SidrRepMsg>) {
            local = m.request_id;
          } else if constexpr (!std::is_same_v<T, ReqMsg> && !std::is_same_v<T, SidrReqMsg>) {
            local = m.remote_comm_id;
            remote = m.local_comm_id;
          }
        },
        mad->msg);
    auto it = ids_.find(local);
    CmId* id = it == ids_.end() ? nullptr : it->second;
    if (const auto* rej = std::get_if<RejMsg>(&mad->msg); rej != nullptr && rej->remote_comm_id == 0) {
      // A REJ for a REQ whose sender gave up before our REP (reason
      // timeout): it names no comm id of ours; the connection is the one
      // its sender's REQ made here.
      auto passive = passive_by_peer_.find(detail::peer_key(from, rej->local_comm_id));
      id = passive == passive_by_peer_.end() ? nullptr : passive->second;
    }
    const bool stale = id == nullptr || id->destroying_ || !id->peer_.same_cm(from) ||
                       (id->conn_.remote_comm_id() != 0 && remote != 0 && id->conn_.remote_comm_id() != remote);
    // A departed connection's DREQ is answered (its DREP), or crossed by the
    // peer's own DREQ: the peer knows; the departure ends. (At exit the id
    // may still be there, disconnected by the exit.)
    if (std::holds_alternative<DrepMsg>(mad->msg) || std::holds_alternative<DreqMsg>(mad->msg)) {
      // Neither an id nor a departure of ours: a process of this host that
      // is gone, whose DREQ the host's CM agent sent.
      const bool ours = !stale || departures_.contains(local);
      end_departure_locked(local, from);
      if (!ours) end_orphan_departure_locked(local, from);
    }
    if (stale) {
      SOFTHCA_DEBUG("cm: dropping a %s for comm id %u, which has no such peer", message_name(mad->msg), local);
      if (const auto* dreq = std::get_if<DreqMsg>(&mad->msg)) {
        // The kernel's CM answers a DREQ for an id it no longer has, so the
        // peer does not wait for its DREP timeout.
        out.push_back({from, 0, encode(Mad{mad->tid, CmMessage(answer_unknown_dreq(*dreq))})});
      }
    } else {
      apply_step_locked(id, id->conn_.on_message(mad->msg), out);
    }
  }
  send_all(lk, std::move(out));
}

void Service::send_all(std::unique_lock<std::mutex>& decided, std::vector<Outgoing>&& out) {
  const std::size_t n = out.size();
  if (n == 0) {
    decided.unlock();
    return;
  }
  {
    // Counted before mu_ is let go: from then on the application may see
    // the events that came with these messages, and exit on them.
    std::lock_guard g(unsent_mu_);
    unsent_ += n;
  }
  decided.unlock();
  send_all(std::move(out));
  std::lock_guard g(unsent_mu_);
  unsent_ -= n;
  if (unsent_ == 0) unsent_cv_.notify_all();
}

void Service::wait_for_unsent_at_exit() {
  std::unique_lock lk(unsent_mu_);
  unsent_cv_.wait_for(lk, std::chrono::milliseconds(200), [this] { return unsent_ == 0; });
}

}  // namespace softhca::cm
