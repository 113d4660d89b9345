// The host registry's XRC TGT QPs (TgtQpRecord): created by one process,
// opened by others of the same XRC domain, alive while any handle is.
#include <cstring>

#include "common/log.hpp"
#include "host/host_registry.hpp"

namespace softhca::host {
namespace {

TgtHandle handle_of(const TgtHolder& h) {
  return TgtHandle{h.proc_plus1.load(std::memory_order_relaxed) - 1, h.pid.load(std::memory_order_relaxed),
                   h.qp_id.load(std::memory_order_relaxed), h.start_time.load(std::memory_order_relaxed)};
}

bool holds(const TgtHolder& h, uint32_t proc, uint32_t qp_id) {
  return h.proc_plus1.load(std::memory_order_relaxed) == proc + 1 && h.qp_id.load(std::memory_order_relaxed) == qp_id;
}

void clear(TgtHolder& h) {
  h.proc_plus1.store(0, std::memory_order_release);
  h.pid.store(0, std::memory_order_relaxed);
  h.qp_id.store(0, std::memory_order_relaxed);
  h.start_time.store(0, std::memory_order_relaxed);
}

bool add_holder(TgtQpRecord& record, uint32_t proc, uint32_t pid, uint64_t start_time, uint32_t qp_id) {
  for (auto& h : record.holders) {
    if (h.proc_plus1.load(std::memory_order_relaxed) != 0) continue;
    h.pid.store(pid, std::memory_order_relaxed);
    h.start_time.store(start_time, std::memory_order_relaxed);
    h.qp_id.store(qp_id, std::memory_order_relaxed);
    h.proc_plus1.store(proc + 1, std::memory_order_release);
    return true;
  }
  return false;
}

// After the serving holder left: the first holder left serves, if any.
std::optional<TgtHandle> pass_service_on(TgtQpRecord& record) {
  for (uint32_t i = 0; i < kMaxTgtHolders; ++i) {
    if (record.holders[i].proc_plus1.load(std::memory_order_relaxed) == 0) continue;
    record.server_plus1.store(i + 1, std::memory_order_release);
    return handle_of(record.holders[i]);
  }
  record.server_plus1.store(0, std::memory_order_release);
  return std::nullopt;
}

bool has_holders(const TgtQpRecord& record) {
  for (const auto& h : record.holders)
    if (h.proc_plus1.load(std::memory_order_relaxed) != 0) return true;
  return false;
}

}  // namespace

Result<HostRegistry::NewTgtQp> HostRegistry::create_tgt_qp(uint32_t proc, uint32_t pid, uint32_t qp_id) {
  lock();
  for (uint32_t index = 0; index < kMaxTgtQps; ++index) {
    TgtQpRecord& record = layout_->tgt_qps[index];
    if (record.qpn.load(std::memory_order_relaxed) != 0) continue;
    auto qpn = allocate_qpn_locked(kHostOwned, index);
    if (!qpn) {
      unlock();
      return fail(qpn.error());
    }
    record.draining.store(0, std::memory_order_relaxed);
    std::memset(static_cast<void*>(&record.shared), 0, sizeof record.shared);
    std::memset(record.attributes, 0, sizeof record.attributes);
    for (auto& h : record.holders) clear(h);
    record.server_plus1.store(0, std::memory_order_relaxed);
    add_holder(record, proc, pid, layout_->procs[proc].start_time, qp_id);
    record.qpn.store(*qpn, std::memory_order_release);
    unlock();
    return NewTgtQp{*qpn, &record};
  }
  unlock();
  return fail(std::errc::not_enough_memory);
}

TgtQpRecord* HostRegistry::tgt_qp(uint32_t qpn) {
  return const_cast<TgtQpRecord*>(static_cast<const HostRegistry*>(this)->tgt_qp(qpn));
}

const TgtQpRecord* HostRegistry::tgt_qp(uint32_t qpn) const {
  const QpSlot* slot = find_qp(qpn);
  if (slot == nullptr || slot->proc.load(std::memory_order_relaxed) != kHostOwned) return nullptr;
  const uint64_t index = slot->shm_offset.load(std::memory_order_relaxed);
  if (index >= kMaxTgtQps) return nullptr;
  const TgtQpRecord& record = layout_->tgt_qps[index];
  return record.qpn.load(std::memory_order_acquire) == qpn ? &record : nullptr;
}

Result<TgtQpRecord*> HostRegistry::open_tgt_qp(uint32_t qpn, uint32_t xrcd_id, uint32_t proc, uint32_t pid,
                                               uint32_t qp_id) {
  lock();
  TgtQpRecord* record = tgt_qp(qpn);
  const QpSlot* slot = find_qp(qpn);
  // Published (its creation finished), not being destroyed, of this domain.
  if (record == nullptr || slot->incarnation.load(std::memory_order_acquire) == 0 ||
      record->shared.state.load(std::memory_order_acquire) == SharedQp::kDestroyed || xrcd_id == 0 ||
      record->shared.xrcd_id != xrcd_id) {
    unlock();
    return fail(std::errc::invalid_argument);
  }
  const bool added = add_holder(*record, proc, pid, layout_->procs[proc].start_time, qp_id);
  unlock();
  if (!added) return fail(std::errc::not_enough_memory);
  return record;
}

void HostRegistry::unpublish_tgt_locked(TgtQpRecord& record) {
  const uint32_t qpn = record.qpn.load(std::memory_order_relaxed);
  record.shared.state.store(SharedQp::kDestroyed, std::memory_order_seq_cst);
  QpSlot& slot = layout_->qps[qp_index(qpn)];
  // seq_cst: against an initiator's check after its access announcement
  // (shm::still_there), as release_qpn.
  if (slot.qpn.load(std::memory_order_relaxed) == qpn) slot.qpn.store(0, std::memory_order_seq_cst);
  record.draining.store(1, std::memory_order_release);
}

void HostRegistry::finish_draining_tgts() {
  bool any = false;
  for (const auto& record : layout_->tgt_qps) any = any || record.draining.load(std::memory_order_acquire) != 0;
  if (!any) return;
  // Initiators announce kHostOwned for every TGT QP: once this fence has
  // passed, none is inside a record unpublished before it.
  fence_accesses(kHostOwned);
  lock();
  for (auto& record : layout_->tgt_qps) {
    if (record.draining.load(std::memory_order_relaxed) == 0) continue;
    record.server_plus1.store(0, std::memory_order_relaxed);
    record.draining.store(0, std::memory_order_relaxed);
    record.qpn.store(0, std::memory_order_release);  // free for create_tgt_qp
  }
  unlock();
}

bool HostRegistry::close_tgt_qp(uint32_t qpn, uint32_t proc, uint32_t qp_id, TgtHandle* new_server) {
  lock();
  TgtQpRecord* record = tgt_qp(qpn);
  if (record == nullptr) {
    unlock();
    return false;
  }
  bool was_server = false;
  for (uint32_t i = 0; i < kMaxTgtHolders; ++i) {
    TgtHolder& h = record->holders[i];
    const uint32_t p = h.proc_plus1.load(std::memory_order_relaxed);
    if (p == 0) continue;
    // Ours, or one of a process that died (its slot is reclaimed only when
    // another process registers): neither keeps the QP alive.
    if (holds(h, proc, qp_id) || !process_alive(handle_of(h).process())) {
      was_server = was_server || record->server_plus1.load(std::memory_order_relaxed) == i + 1;
      clear(h);
    }
  }
  if (!has_holders(*record)) {
    unpublish_tgt_locked(*record);
    unlock();
    finish_draining_tgts();
    return true;
  }
  if (was_server) {
    auto next = pass_service_on(*record);
    if (next && new_server) *new_server = *next;
  }
  unlock();
  return false;
}

std::optional<TgtHandle> HostRegistry::serve_tgt_locked(TgtQpRecord& record, uint32_t proc, uint32_t qp_id) {
  std::optional<TgtHandle> before;
  const uint32_t current = record.server_plus1.load(std::memory_order_relaxed);
  if (current != 0 && !holds(record.holders[current - 1], proc, qp_id)) before = handle_of(record.holders[current - 1]);
  for (uint32_t i = 0; i < kMaxTgtHolders; ++i)
    if (holds(record.holders[i], proc, qp_id)) record.server_plus1.store(i + 1, std::memory_order_release);
  return before;
}

std::optional<TgtHandle> HostRegistry::tgt_server(uint32_t qpn) const {
  const TgtQpRecord* record = tgt_qp(qpn);
  if (record == nullptr) return std::nullopt;
  const uint32_t server = record->server_plus1.load(std::memory_order_acquire);
  if (server == 0 || server > kMaxTgtHolders) return std::nullopt;
  const TgtHolder& h = record->holders[server - 1];
  if (h.proc_plus1.load(std::memory_order_acquire) == 0) return std::nullopt;
  return handle_of(h);
}

std::optional<TgtHandle> HostRegistry::elect_tgt_server(uint32_t qpn) {
  lock();
  TgtQpRecord* record = tgt_qp(qpn);
  std::optional<TgtHandle> elected;
  if (record != nullptr) {
    const uint32_t server = record->server_plus1.load(std::memory_order_relaxed);
    bool served = false;
    if (server != 0 && server <= kMaxTgtHolders) {
      const TgtHandle h = handle_of(record->holders[server - 1]);
      served = record->holders[server - 1].proc_plus1.load(std::memory_order_relaxed) != 0 &&
               process_alive(h.process());
    }
    if (!served) {
      // The first live handle serves; the dead ones go.
      for (uint32_t i = 0; i < kMaxTgtHolders; ++i) {
        TgtHolder& h = record->holders[i];
        if (h.proc_plus1.load(std::memory_order_relaxed) == 0) continue;
        const TgtHandle candidate = handle_of(h);
        if (!process_alive(candidate.process())) {
          clear(h);
        } else if (!elected) {
          record->server_plus1.store(i + 1, std::memory_order_release);
          elected = candidate;
        }
      }
      if (!elected) record->server_plus1.store(0, std::memory_order_release);
    }
  }
  unlock();
  return elected;
}

uint32_t HostRegistry::tgt_holders(const TgtQpRecord& record, TgtHandle* out) const {
  uint32_t n = 0;
  for (const auto& h : record.holders)
    if (h.proc_plus1.load(std::memory_order_acquire) != 0) out[n++] = handle_of(h);
  return n;
}

void HostRegistry::release_tgt_holders_locked(uint32_t proc) {
  for (auto& record : layout_->tgt_qps) {
    if (record.qpn.load(std::memory_order_relaxed) == 0) continue;
    bool held = false;
    bool served = false;
    for (uint32_t i = 0; i < kMaxTgtHolders; ++i) {
      if (record.holders[i].proc_plus1.load(std::memory_order_relaxed) != proc + 1) continue;
      held = true;
      served = served || record.server_plus1.load(std::memory_order_relaxed) == i + 1;
      clear(record.holders[i]);
    }
    if (!held) continue;
    if (!has_holders(record)) {
      SOFTHCA_DEBUG("tgt qp 0x%x: its last holder is gone", record.qpn.load(std::memory_order_relaxed));
      unpublish_tgt_locked(record);  // freed by finish_draining_tgts, after the mutex
    } else if (served) {
      // Nobody serves its remote peer until a holder opens a channel again
      // (the udp link elects one when a packet for it arrives).
      record.server_plus1.store(0, std::memory_order_release);
    }
  }
}

}  // namespace softhca::host
