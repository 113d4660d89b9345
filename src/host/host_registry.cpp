#include "host/host_registry.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/log.hpp"
#include "common/system_random.hpp"
#include "host/host_identity.hpp"

namespace softhca::host {
namespace {

constexpr uint64_t kMagic = 0x736f667468636131ULL;  // "softhca1"
constexpr uint32_t kVersion = 15;  // 2: the multicast group table; 3: the access fence; 4: counters; 5: the GSI agent;
                                  // 6: shared registered memory; 7: counters by writer, QP
                                  // destruction fenced by the access slots; 8: QP slots
                                  // carry the incarnation; 9: memory windows in the MR
                                  // table (kind, parent, qpn, windows); 10: an MR's shared
                                  // span (whole pages only); 11: TGT QPs owned by the host;
                                  // 12: TGT QP holders carry their start time; 13: CQ producers
                                  // under an access announcement are not counted (SharedCq); 14: keys
                                  // and QPNs drawn at random (no cursors), two more counters;
                                  // 15: 32 owner counter slots, closed_qp_drops, stale_responses

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

// Inside a slot's seqlock write.
void store_shared(MrSlot& slot, const SharedSpan& shared) {
  slot.shared_addr.store(shared.addr, std::memory_order_relaxed);
  slot.shared_length.store(shared.length, std::memory_order_relaxed);
  slot.shared_offset.store(shared.offset, std::memory_order_relaxed);
}

void init_layout(RegistryLayout* layout) {
  init_robust_mutex(&layout->mutex);
  layout->next_pd_id.store(1);
  layout->next_incarnation.store(1);
}

}  // namespace

uint64_t process_start_time(uint32_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%u/stat", pid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  // Field 22 (starttime); the command name (field 2) may contain spaces, so count after ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return 0;
  int field = 2;
  for (++p; *p != '\0'; ++p) {
    if (*p == ' ') {
      ++field;
      if (field == 22) return std::strtoull(p + 1, nullptr, 10);
    }
  }
  return 0;
}

Result<HostRegistry*> HostRegistry::open() {
  auto dir = host_directory();
  if (!dir) return fail(dir.error());
  return open_in(*dir, false);
}

std::string HostRegistry::path_in(const std::string& dir) { return dir + "/registry-v" + std::to_string(kVersion); }

Result<HostRegistry*> HostRegistry::open_in(const std::string& dir, bool unlink_on_close) {
  return open_named(path_in(dir), unlink_on_close);
}

Result<HostRegistry*> HostRegistry::open_named(const std::string& path, bool unlink_on_close) {
  auto mem = map_shared_file(path, sizeof(RegistryLayout), kMagic, kVersion, "host registry",
                             [](void* fresh) { init_layout(static_cast<RegistryLayout*>(fresh)); });
  if (!mem) return fail(mem.error());
  return new HostRegistry(static_cast<RegistryLayout*>(*mem), path, unlink_on_close);
}

HostRegistry::~HostRegistry() {
  unmap_shared_file(layout_, sizeof(RegistryLayout));
  if (unlink_on_close_) ::unlink(path_.c_str());
}

uint64_t HostRegistry::file_identity() const {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return 0;
  return (static_cast<uint64_t>(st.st_dev) << 40) ^ static_cast<uint64_t>(st.st_ino);
}

void HostRegistry::lock() {
  // A holder that died left every slot consistent (the validating field is
  // written last), so the state is usable as it is.
  lock_robust_mutex(&layout_->mutex, "host registry");
}

void HostRegistry::unlock() { pthread_mutex_unlock(&layout_->mutex); }

bool HostRegistry::process_alive(uint32_t index) const {
  const ProcSlot& slot = layout_->procs[index];
  const uint32_t pid = slot.pid.load(std::memory_order_acquire);
  if (pid == 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  return process_start_time(pid) == slot.start_time;
}

bool HostRegistry::process_alive(uint32_t index, uint32_t pid) const {
  return layout_->procs[index].pid.load(std::memory_order_acquire) == pid && process_alive(index);
}

bool HostRegistry::process_alive(const ProcessIdentity& who) const {
  return identity_of(who.proc).start_time == who.start_time && process_alive(who.proc, who.pid);
}

ProcessIdentity HostRegistry::identity_of(uint32_t index) const {
  const ProcSlot& slot = layout_->procs[index];
  const uint32_t pid = slot.pid.load(std::memory_order_acquire);  // published after start_time
  return ProcessIdentity{index, pid, slot.start_time};
}

void HostRegistry::release_process_objects_locked(uint32_t proc) {
  uint32_t agent = proc + 1;
  layout_->gsi_agent.compare_exchange_strong(agent, 0, std::memory_order_acq_rel);
  // Its counts stay in the port's totals; the next process starts from zero.
  for (size_t i = 0; i < kCounterSlots; ++i) {
    const uint64_t n = layout_->process_counters[proc].slots[i].exchange(0, std::memory_order_relaxed);
    layout_->retired_counters.slots[i].fetch_add(n, std::memory_order_relaxed);
  }
  // A dead process's accesses ended with it.
  for (auto& slot : layout_->accesses[proc].slots) {
    const uint64_t v = slot.load(std::memory_order_relaxed);
    if (v & 0xFFFFFFFFu) slot.store(v & ~uint64_t{0xFFFFFFFFu}, std::memory_order_release);
  }
  for (auto& qp : layout_->qps)
    if (qp.qpn.load(std::memory_order_relaxed) != 0 && qp.proc.load(std::memory_order_relaxed) == proc)
      qp.qpn.store(0, std::memory_order_release);
  release_tgt_holders_locked(proc);
  remove_mcast_members_locked(0, proc);
  for (auto& mr : layout_->mrs)
    if (mr.key.load(std::memory_order_relaxed) != 0 && mr.proc.load(std::memory_order_relaxed) == proc) {
      mr.seq.fetch_add(1, std::memory_order_acq_rel);
      mr.key.store(0, std::memory_order_release);
      mr.seq.fetch_add(1, std::memory_order_release);
    }
}

std::array<uint64_t, kCounterCount> HostRegistry::port_counters() const {
  std::array<uint64_t, kCounterCount> total{};
  for (size_t c = 0; c < kCounterCount; ++c) total[c] = layout_->retired_counters.get(static_cast<Counter>(c));
  for (uint32_t p = 0; p < kMaxProcs; ++p)
    for (size_t c = 0; c < kCounterCount; ++c) total[c] += layout_->process_counters[p].get(static_cast<Counter>(c));
  return total;
}

void HostRegistry::reclaim_dead_locked() {
  for (uint32_t i = 0; i < kMaxProcs; ++i) {
    if (layout_->procs[i].pid.load(std::memory_order_relaxed) == 0 || process_alive(i)) continue;
    SOFTHCA_INFO("reclaiming resources of dead process %u", layout_->procs[i].pid.load());
    release_process_objects_locked(i);
    layout_->procs[i].pid.store(0, std::memory_order_release);
  }
}

Result<uint32_t> HostRegistry::register_process(uint32_t pid, uint32_t segment_fd) {
  lock();
  reclaim_dead_locked();
  for (uint32_t i = 0; i < kMaxProcs; ++i) {
    ProcSlot& slot = layout_->procs[i];
    if (slot.pid.load(std::memory_order_relaxed) != 0) continue;
    slot.segment_fd = segment_fd;
    slot.start_time = process_start_time(pid);
    slot.backing_fd_plus1.store(0, std::memory_order_relaxed);
    slot.backing_inode.store(0, std::memory_order_relaxed);
    slot.pid.store(pid, std::memory_order_release);
    unlock();
    finish_draining_tgts();  // TGT QPs the dead held alone
    return i;
  }
  unlock();
  finish_draining_tgts();
  return fail(std::errc::too_many_files_open_in_system);
}

void HostRegistry::publish_backing(uint32_t proc, uint32_t fd, uint64_t inode) {
  ProcSlot& slot = layout_->procs[proc];
  slot.backing_inode.store(inode, std::memory_order_relaxed);
  slot.backing_fd_plus1.store(fd + 1, std::memory_order_release);
}

void HostRegistry::unregister_process(uint32_t proc) {
  lock();
  release_process_objects_locked(proc);
  layout_->procs[proc].pid.store(0, std::memory_order_release);
  unlock();
  finish_draining_tgts();  // TGT QPs this process held alone
}

void HostRegistry::claim_gsi_agent(uint32_t proc) {
  const uint32_t current = layout_->gsi_agent.load(std::memory_order_acquire);
  if (current == proc + 1) return;
  lock();
  const uint32_t now = layout_->gsi_agent.load(std::memory_order_relaxed);
  if (now == 0 || !process_alive(now - 1)) layout_->gsi_agent.store(proc + 1, std::memory_order_release);
  unlock();
}

std::optional<uint32_t> HostRegistry::gsi_agent() const {
  const uint32_t agent = layout_->gsi_agent.load(std::memory_order_acquire);
  if (agent == 0 || agent > kMaxProcs) return std::nullopt;
  return agent - 1;
}

Result<uint32_t> HostRegistry::allocate_qpn(uint32_t proc, uint64_t shm_offset) {
  lock();
  auto qpn = allocate_qpn_locked(proc, shm_offset);
  unlock();
  return qpn;
}

Result<uint32_t> HostRegistry::allocate_qpn_locked(uint32_t proc, uint64_t shm_offset) {
  // A QPN nobody can foretell from the ones before (issue #40): the first
  // free slot from a random one, and a random page of QPNs above it.
  const uint64_t random = system_random_u64();
  const uint32_t start = static_cast<uint32_t>(random) % kMaxQpSlots;
  const uint32_t page = static_cast<uint32_t>(random >> 32) % kQpnPages;
  for (uint32_t n = 0; n < kMaxQpSlots; ++n) {
    const uint32_t index = (start + n) % kMaxQpSlots;
    QpSlot& slot = layout_->qps[index];
    if (slot.qpn.load(std::memory_order_relaxed) != 0) continue;
    const uint32_t qpn = page * kMaxQpSlots + kFirstQpn + index;
    slot.proc.store(proc, std::memory_order_relaxed);
    slot.shm_offset.store(shm_offset, std::memory_order_relaxed);
    slot.incarnation.store(0, std::memory_order_relaxed);
    slot.qpn.store(qpn, std::memory_order_release);
    return qpn;
  }
  return fail(std::errc::not_enough_memory);
}

void HostRegistry::publish_qp(uint32_t qpn) {
  QpSlot& slot = layout_->qps[qp_index(qpn)];
  if (slot.qpn.load(std::memory_order_relaxed) == qpn)
    slot.incarnation.store(layout_->next_incarnation.fetch_add(1, std::memory_order_relaxed),
                           std::memory_order_release);
}

void HostRegistry::release_qpn(uint32_t qpn) {
  lock();
  QpSlot& slot = layout_->qps[qp_index(qpn)];
  if (slot.qpn.load(std::memory_order_relaxed) == qpn) {
    // seq_cst: against an initiator's check of this slot after its access
    // announcement (shm::still_there); the destroyer fences after this.
    slot.qpn.store(0, std::memory_order_seq_cst);
    // A destroyed QP leaves its groups, as uverbs detaches on destroy.
    remove_mcast_members_locked(qpn, kMaxProcs);
  }
  unlock();
}

const QpSlot* HostRegistry::find_qp(uint32_t qpn) const {
  if (qpn < kFirstQpn || qpn > kLastQpn) return nullptr;
  const QpSlot& slot = layout_->qps[qp_index(qpn)];
  return slot.qpn.load(std::memory_order_acquire) == qpn ? &slot : nullptr;
}

Result<uint32_t> HostRegistry::allocate_key_locked(uint32_t proc, uint32_t pd_id, uint32_t kind, uint32_t access,
                                                   uint64_t iova, uint64_t length, uint64_t host_addr,
                                                   SharedSpan shared) {
  // Key = a random byte, the slot index, and a random 8-bit tag (never
  // zero) below, as hardware keys carry a key byte under their index; the
  // slot is the first free one from a random one. Seeing any number of
  // keys tells nothing about the next (issue #40), a stale key fails
  // validation, and a lookup is still one index: (key >> 8) % kMaxMrSlots.
  const uint64_t random = system_random_u64();
  const uint32_t start = static_cast<uint32_t>(random) % kMaxMrSlots;
  const uint32_t high = static_cast<uint32_t>(random >> 32) & 0xFF;
  const uint32_t tag = static_cast<uint32_t>(random >> 40) % 0xFF + 1;
  for (uint32_t n = 0; n < kMaxMrSlots; ++n) {
    const uint32_t index = (start + n) % kMaxMrSlots;
    MrSlot& slot = layout_->mrs[index];
    if (slot.key.load(std::memory_order_relaxed) != 0) continue;
    const uint32_t key = (high << 24) | (index << 8) | tag;
    // A window's consumer chooses its key byte (ibv_inc_rkey), 0 included:
    // with the rest zero that would make key 0, which means "free".
    if ((key >> 8) == 0 && kind != kKeyRegion) continue;
    slot.seq.fetch_add(1, std::memory_order_acq_rel);
    slot.proc.store(proc, std::memory_order_relaxed);
    slot.pd_id.store(pd_id, std::memory_order_relaxed);
    slot.access.store(access, std::memory_order_relaxed);
    slot.iova.store(iova, std::memory_order_relaxed);
    slot.length.store(length, std::memory_order_relaxed);
    slot.host_addr.store(host_addr, std::memory_order_relaxed);
    store_shared(slot, shared);
    slot.kind.store(kind, std::memory_order_relaxed);
    slot.parent.store(0, std::memory_order_relaxed);
    slot.qpn.store(0, std::memory_order_relaxed);
    slot.windows.store(0, std::memory_order_relaxed);
    slot.key.store(key, std::memory_order_release);
    slot.seq.fetch_add(1, std::memory_order_release);
    return key;
  }
  return fail(std::errc::not_enough_memory);
}

Result<uint32_t> HostRegistry::allocate_mr(uint32_t proc, uint32_t pd_id, uint32_t access, uint64_t iova,
                                           uint64_t length, uint64_t host_addr, SharedSpan shared) {
  lock();
  auto key = allocate_key_locked(proc, pd_id, kKeyRegion, access, iova, length, host_addr, shared);
  unlock();
  return key;
}

Result<uint32_t> HostRegistry::allocate_window(uint32_t proc, uint32_t pd_id, uint32_t kind) {
  lock();
  auto key = allocate_key_locked(proc, pd_id, kind, 0, 0, 0, 0, SharedSpan{});
  unlock();
  return key;
}

void HostRegistry::unbind_locked(MrSlot& window) {
  const uint32_t parent = window.parent.load(std::memory_order_relaxed);
  if (parent == 0) return;
  MrSlot& mr = layout_->mrs[(parent >> 8) % kMaxMrSlots];
  if (mr.key.load(std::memory_order_relaxed) == parent) mr.windows.fetch_sub(1, std::memory_order_relaxed);
  window.parent.store(0, std::memory_order_relaxed);
}

bool HostRegistry::release_mr(uint32_t key, uint32_t proc) {
  lock();
  MrSlot& slot = layout_->mrs[(key >> 8) % kMaxMrSlots];
  bool released = true;
  if (slot.key.load(std::memory_order_relaxed) == key &&
      (proc == kAnyProc || slot.proc.load(std::memory_order_relaxed) == proc)) {
    if (slot.kind.load(std::memory_order_relaxed) == kKeyRegion && slot.windows.load(std::memory_order_relaxed) != 0) {
      released = false;
    } else {
      slot.seq.fetch_add(1, std::memory_order_acq_rel);
      unbind_locked(slot);
      slot.key.store(0, std::memory_order_seq_cst);  // see begin_access
      slot.seq.fetch_add(1, std::memory_order_seq_cst);
    }
  }
  unlock();
  return released;
}

Result<void> HostRegistry::bind_window(uint32_t key, uint32_t proc, const MrRecord& mr, const WindowBinding& b) {
  lock();
  MrSlot& slot = layout_->mrs[(key >> 8) % kMaxMrSlots];
  const uint32_t kind = slot.kind.load(std::memory_order_relaxed);
  if (slot.key.load(std::memory_order_relaxed) != key || slot.proc.load(std::memory_order_relaxed) != proc ||
      kind == kKeyRegion || (b.new_key >> 8) != (key >> 8) ||
      // A type 2 window binds only while free: checked here too, against a
      // bind of the same window from another send queue meanwhile.
      (kind == kKeyWindow2 && slot.length.load(std::memory_order_relaxed) != 0)) {
    unlock();
    return fail(std::errc::invalid_argument);
  }
  MrSlot* parent = nullptr;
  if (b.length != 0) {
    parent = &layout_->mrs[(mr.key >> 8) % kMaxMrSlots];
    // The MR as the caller checked it: still registered, unchanged.
    if (parent->key.load(std::memory_order_relaxed) != mr.key ||
        parent->kind.load(std::memory_order_relaxed) != kKeyRegion ||
        parent->proc.load(std::memory_order_relaxed) != mr.proc ||
        parent->pd_id.load(std::memory_order_relaxed) != mr.pd_id ||
        parent->access.load(std::memory_order_relaxed) != mr.access ||
        parent->iova.load(std::memory_order_relaxed) != mr.iova ||
        parent->length.load(std::memory_order_relaxed) != mr.length ||
        parent->host_addr.load(std::memory_order_relaxed) != mr.host_addr) {
      unlock();
      return fail(std::errc::invalid_argument);
    }
  }
  slot.seq.fetch_add(1, std::memory_order_acq_rel);
  unbind_locked(slot);
  slot.access.store(b.length != 0 ? b.access : 0, std::memory_order_relaxed);
  slot.iova.store(b.length != 0 ? b.iova : 0, std::memory_order_relaxed);
  slot.length.store(b.length, std::memory_order_relaxed);
  slot.host_addr.store(b.length != 0 ? b.host_addr : 0, std::memory_order_relaxed);
  store_shared(slot, b.length != 0 ? b.shared : SharedSpan{});
  slot.qpn.store(b.length != 0 ? b.qpn : 0, std::memory_order_relaxed);
  if (parent != nullptr) {
    parent->windows.fetch_add(1, std::memory_order_relaxed);
    slot.parent.store(mr.key, std::memory_order_relaxed);
  }
  // The old key goes (seq_cst, as release_mr: see begin_access).
  slot.key.store(b.new_key, std::memory_order_seq_cst);
  slot.seq.fetch_add(1, std::memory_order_seq_cst);
  unlock();
  return {};
}

Result<void> HostRegistry::invalidate_window(uint32_t key, uint32_t proc, uint32_t pd_id) {
  lock();
  MrSlot& slot = layout_->mrs[(key >> 8) % kMaxMrSlots];
  if (key == 0 || slot.key.load(std::memory_order_relaxed) != key || slot.proc.load(std::memory_order_relaxed) != proc ||
      slot.kind.load(std::memory_order_relaxed) != kKeyWindow2 ||
      slot.pd_id.load(std::memory_order_relaxed) != pd_id || slot.length.load(std::memory_order_relaxed) == 0) {
    unlock();
    return fail(std::errc::invalid_argument);
  }
  slot.seq.fetch_add(1, std::memory_order_acq_rel);
  unbind_locked(slot);
  slot.access.store(0, std::memory_order_relaxed);
  slot.iova.store(0, std::memory_order_relaxed);
  slot.length.store(0, std::memory_order_seq_cst);  // see begin_access
  slot.host_addr.store(0, std::memory_order_relaxed);
  store_shared(slot, SharedSpan{});
  slot.qpn.store(0, std::memory_order_relaxed);
  slot.seq.fetch_add(1, std::memory_order_seq_cst);
  unlock();
  return {};
}

bool HostRegistry::windows_bound(uint32_t key) const {
  const MrSlot& slot = layout_->mrs[(key >> 8) % kMaxMrSlots];
  return slot.key.load(std::memory_order_acquire) == key && slot.windows.load(std::memory_order_acquire) != 0;
}

void HostRegistry::update_mr(uint32_t key, uint32_t pd_id, uint32_t access, uint64_t iova, uint64_t length,
                             uint64_t host_addr, SharedSpan shared) {
  lock();
  MrSlot& slot = layout_->mrs[(key >> 8) % kMaxMrSlots];
  if (slot.key.load(std::memory_order_relaxed) == key) {
    slot.seq.fetch_add(1, std::memory_order_acq_rel);
    slot.pd_id.store(pd_id, std::memory_order_relaxed);
    slot.access.store(access, std::memory_order_relaxed);
    slot.iova.store(iova, std::memory_order_relaxed);
    slot.length.store(length, std::memory_order_relaxed);
    slot.host_addr.store(host_addr, std::memory_order_relaxed);
    store_shared(slot, shared);
    slot.seq.fetch_add(1, std::memory_order_seq_cst);  // see begin_access
  }
  unlock();
}

namespace {

// A consistent copy of `slot` and the (even) version it was read at.
uint32_t read_mr_slot(const MrSlot& slot, MrRecord& out) {
  for (;;) {
    const uint32_t before = slot.seq.load(std::memory_order_seq_cst);  // see begin_access
    if (before & 1) {
      __builtin_ia32_pause();
      continue;
    }
    // Acquire loads keep the closing seq read after the field reads (a fence
    // would do the same, but TSan does not model fences).
    out.key = slot.key.load(std::memory_order_acquire);
    out.proc = slot.proc.load(std::memory_order_acquire);
    out.pd_id = slot.pd_id.load(std::memory_order_acquire);
    out.access = slot.access.load(std::memory_order_acquire);
    out.iova = slot.iova.load(std::memory_order_acquire);
    out.length = slot.length.load(std::memory_order_acquire);
    out.host_addr = slot.host_addr.load(std::memory_order_acquire);
    out.shared.addr = slot.shared_addr.load(std::memory_order_acquire);
    out.shared.length = slot.shared_length.load(std::memory_order_acquire);
    out.shared.offset = slot.shared_offset.load(std::memory_order_acquire);
    out.kind = slot.kind.load(std::memory_order_acquire);
    out.parent = slot.parent.load(std::memory_order_acquire);
    out.qpn = slot.qpn.load(std::memory_order_acquire);
    out.windows = slot.windows.load(std::memory_order_acquire);
    if (slot.seq.load(std::memory_order_acquire) == before) return before;
  }
}

}  // namespace

bool HostRegistry::lookup_mr(uint32_t key, MrRecord& out) const {
  read_mr_slot(layout_->mrs[(key >> 8) % kMaxMrSlots], out);
  return key != 0 && out.key == key;
}

bool HostRegistry::refresh_mr_cache(uint32_t key, MrLookupCache& cache) const {
  const MrSlot& slot = layout_->mrs[(key >> 8) % kMaxMrSlots];
  cache.seq = read_mr_slot(slot, cache.record);
  cache.key = key != 0 && cache.record.key == key ? key : 0;
  return cache.key != 0;
}

namespace {

void load_mgid(const McastGroup& group, uint32_t* words) {
  for (int i = 0; i < 4; ++i) words[i] = group.mgid[i].load(std::memory_order_acquire);
}

bool same_mgid(const McastGroup& group, const uint8_t* mgid) {
  uint32_t words[4];
  load_mgid(group, words);
  return std::memcmp(words, mgid, 16) == 0;
}

}  // namespace

void HostRegistry::remove_mcast_members_locked(uint32_t qpn, uint32_t proc) {
  for (auto& group : layout_->mcast) {
    if (group.count.load(std::memory_order_relaxed) == 0) continue;
    for (auto& m : group.members) {
      const uint32_t q = m.qpn.load(std::memory_order_relaxed);
      if (q == 0 || (q != qpn && m.proc.load(std::memory_order_relaxed) != proc)) continue;
      group.seq.fetch_add(1, std::memory_order_acq_rel);
      m.qpn.store(0, std::memory_order_release);
      group.count.fetch_sub(1, std::memory_order_release);
      group.seq.fetch_add(1, std::memory_order_release);
    }
  }
}

Result<void> HostRegistry::attach_mcast(const uint8_t* mgid, uint32_t qpn, uint32_t proc) {
  lock();
  McastGroup* found = nullptr;
  McastGroup* free_group = nullptr;
  for (auto& group : layout_->mcast) {
    if (group.count.load(std::memory_order_relaxed) == 0) {
      if (free_group == nullptr) free_group = &group;
    } else if (same_mgid(group, mgid)) {
      found = &group;
      break;
    }
  }
  McastGroup* group = found ? found : free_group;
  if (group == nullptr) {
    unlock();
    return fail(std::errc::not_enough_memory);
  }
  McastMember* slot = nullptr;
  for (auto& m : group->members) {
    const uint32_t q = m.qpn.load(std::memory_order_relaxed);
    if (q == qpn && found != nullptr) {
      unlock();
      return {};
    }
    if (q == 0 && slot == nullptr) slot = &m;
  }
  if (slot == nullptr) {
    unlock();
    return fail(std::errc::not_enough_memory);
  }
  group->seq.fetch_add(1, std::memory_order_acq_rel);
  if (found == nullptr) {
    uint32_t words[4];
    std::memcpy(words, mgid, 16);
    for (int i = 0; i < 4; ++i) group->mgid[i].store(words[i], std::memory_order_relaxed);
  }
  slot->proc.store(proc, std::memory_order_relaxed);
  slot->qpn.store(qpn, std::memory_order_release);
  group->count.fetch_add(1, std::memory_order_release);
  group->seq.fetch_add(1, std::memory_order_release);
  unlock();
  return {};
}

Result<void> HostRegistry::detach_mcast(const uint8_t* mgid, uint32_t qpn) {
  lock();
  for (auto& group : layout_->mcast) {
    if (group.count.load(std::memory_order_relaxed) == 0 || !same_mgid(group, mgid)) continue;
    for (auto& m : group.members) {
      if (m.qpn.load(std::memory_order_relaxed) != qpn) continue;
      group.seq.fetch_add(1, std::memory_order_acq_rel);
      m.qpn.store(0, std::memory_order_release);
      group.count.fetch_sub(1, std::memory_order_release);
      group.seq.fetch_add(1, std::memory_order_release);
      unlock();
      return {};
    }
    break;
  }
  unlock();
  return fail(std::errc::invalid_argument);
}

uint32_t HostRegistry::mcast_members(const uint8_t* mgid, uint32_t* out) const {
  for (const auto& group : layout_->mcast) {
    for (;;) {
      const uint32_t before = group.seq.load(std::memory_order_acquire);
      if (before & 1) {
        __builtin_ia32_pause();
        continue;
      }
      uint32_t n = 0;
      const bool match = group.count.load(std::memory_order_acquire) != 0 && same_mgid(group, mgid);
      if (match)
        for (const auto& m : group.members)
          if (const uint32_t q = m.qpn.load(std::memory_order_acquire); q != 0) out[n++] = q;
      if (group.seq.load(std::memory_order_acquire) != before) continue;
      if (match) return n;
      break;
    }
  }
  return 0;
}

uint32_t HostRegistry::wait_for_access_slot(uint32_t self, uint32_t target) {
  for (;;) {
    const uint32_t slot = try_begin_access(self, target);
    if (slot != kNoAccessSlot) return slot;
    __builtin_ia32_pause();  // more threads than slots inside peers' memory: wait for one
  }
}

bool HostRegistry::accessor_alive(uint32_t proc) const { return process_alive(proc); }

void HostRegistry::fence_accesses(uint32_t target) const {
  // Announcements in owned slots are plain stores: make every thread that
  // may have made one pass a fence before the slots are read (the caller
  // changed what the accessors check before it called us).
  access_slot_owner::fence_owners_everywhere();
  for (uint32_t p = 0; p < kMaxProcs; ++p) {
    if (layout_->procs[p].pid.load(std::memory_order_acquire) == 0) continue;
    for (const auto& slot : layout_->accesses[p].slots) {
      const uint64_t seen = slot.load(std::memory_order_seq_cst);
      if ((seen & 0xFFFFFFFFu) != target + 1) continue;
      // An access is one bounded copy (large ones re-check their keys every
      // chunk and stop), so this wait is short unless the accessor died.
      const uint64_t start = now_ns();
      uint64_t next_liveness_check = start + 1'000'000;
      while (slot.load(std::memory_order_acquire) == seen) {
        const uint64_t now = now_ns();
        if (now >= next_liveness_check) {
          if (!accessor_alive(p)) break;
          next_liveness_check = now + 1'000'000;
        }
        __builtin_ia32_pause();
      }
    }
  }
}


uint32_t HostRegistry::allocate_pd_id() { return layout_->next_pd_id.fetch_add(1, std::memory_order_relaxed); }

AtomicStripe& HostRegistry::atomic_stripe(uint64_t pid, uint64_t addr) {
  const uint64_t h = (pid * 0x9E3779B97F4A7C15ULL) ^ (addr >> 3) * 0xC2B2AE3D27D4EB4FULL;
  return layout_->atomic_stripes[(h >> 32) % kAtomicStripes];
}

}  // namespace softhca::host
