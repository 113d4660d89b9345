// The host registry: one shared-memory file per Unix user (mode 0600, in the
// user's runtime directory under /dev/shm, host/runtime_dir.hpp)
// that every softhca process maps. It allocates what must be unique per host
// (QPNs, MR keys, PD ids), records which process owns each, and lets an
// initiator find a target's shared state from a QPN or an rkey.
//
// Concurrency: allocation and release take the registry's robust, process-shared
// mutex (never on the data path). Lookups on the data path read slots with
// acquire loads and validate them by their key/qpn field, which is written last.
#pragma once

#include <pthread.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "common/asymmetric_fence.hpp"
#include "common/counters.hpp"
#include "common/result.hpp"
#include "host/access_slot_owner.hpp"
#include "host/shared_file.hpp"
#include "host/shared_queues.hpp"

namespace softhca::host {

inline constexpr uint32_t kMaxProcs = 1024;
inline constexpr uint32_t kMaxQpSlots = 1 << 16;
inline constexpr uint32_t kMaxMrSlots = 1 << 16;
inline constexpr uint32_t kAtomicStripes = 1024;
inline constexpr uint32_t kFirstQpn = 0x11;  // QP0/QP1 are special; start above them like hardware
// A QPN is page * kMaxQpSlots + kFirstQpn + slot index, the page random:
// 255 pages keep every QPN under 0xFFFFFF (the multicast QPN).
inline constexpr uint32_t kQpnPages = 255;
inline constexpr uint32_t kLastQpn = (kQpnPages - 1) * kMaxQpSlots + kFirstQpn + kMaxQpSlots - 1;
static_assert(kLastQpn < 0xFFFFFF, "a QPN is 24 bits, and 0xFFFFFF is multicast's");
inline constexpr uint32_t kMaxMcastGroups = 256;   // multicast groups with at least one member, host-wide
inline constexpr uint32_t kMaxMcastMembers = 32;   // UD QPs attached to one group
inline constexpr uint32_t kAccessSlotsPerProc = 16;  // threads of one process inside peers' memory at once
static_assert(kOwnedAccessSlots < kAccessSlotsPerProc, "some slots must stay shared");
// XRC TGT QPs belong to the host, not to a process: any process with the
// same XRC domain may open one (ibv_open_qp), and it lives while any
// handle to it does. Their QPN slots name kHostOwned as their "process"
// and the index of their TgtQpRecord as their offset; initiators announce
// their accesses to kHostOwned (a pseudo process index, for the fence).
inline constexpr uint32_t kHostOwned = kMaxProcs;
inline constexpr uint32_t kMaxTgtQps = 1024;       // TGT QPs on the host at once
inline constexpr uint32_t kMaxTgtHolders = 32;     // handles (ibv_create_qp + ibv_open_qp) to one TGT QP
inline constexpr size_t kTgtAttributeBytes = 128;  // room for the engine's QpAttributes
// The part of a registered range that lives in its owner's backing file
// (host/memory_backing.hpp): [addr, addr + length) of the owner's address
// space is at `offset` in the file. Only whole pages move there, so it is the
// page-aligned inside of an MR; the partial pages at its ends, and all of an
// MR with length 0 here, peers reach by copying (process_vm_*). No
// initializers, for MrRecord's sake: value-initialise (SharedSpan{}) for none.
struct SharedSpan {
  uint64_t addr, length, offset;
  // Whether [a, a + n) lies inside the span (never for an empty span).
  bool holds(uint64_t a, uint64_t n) const { return length != 0 && a >= addr && n <= length && a - addr <= length - n; }
  // The file offset of address `a`, which the span holds.
  uint64_t offset_of(uint64_t a) const { return offset + (a - addr); }
  // The part of the span inside [a, a + n): what a window over that range shares.
  SharedSpan within(uint64_t a, uint64_t n) const {
    const uint64_t lo = a > addr ? a : addr;
    const uint64_t hi = a + n < addr + length ? a + n : addr + length;
    if (length == 0 || hi <= lo) return SharedSpan{};
    return SharedSpan{lo, hi - lo, offset_of(lo)};
  }
  bool operator==(const SharedSpan&) const = default;
};

// A process as the registry knows it: its slot, its pid and when it
// started. Slot and pid alone do not name one process: pids come round
// again (within minutes where pid_max is 32768 and tests start thousands of
// processes), and a later process can get both the slot and the pid of one
// that died.
struct ProcessIdentity {
  uint32_t proc = 0;
  uint32_t pid = 0;
  uint64_t start_time = 0;
  bool operator==(const ProcessIdentity&) const = default;
};

struct ProcSlot {
  std::atomic<uint32_t> pid;   // 0 = free
  uint32_t segment_fd;         // fd of the owner's segment memfd, opened by peers via /proc/PID/fd
  uint64_t start_time;         // from /proc/PID/stat: tells a live owner from a reused pid
  // The owner's file of registered memory (host/memory_backing.hpp), for
  // peers to map through /proc/PID/fd: fd + 1 (0 = none yet) and its inode,
  // which a peer checks after opening. Published once, before any MR that
  // lives in it.
  std::atomic<uint32_t> backing_fd_plus1;
  std::atomic<uint64_t> backing_inode;
};

struct QpSlot {
  std::atomic<uint32_t> qpn;   // 0 = free; written last on allocation, first on release
  std::atomic<uint32_t> proc;  // owner ProcSlot index
  std::atomic<uint64_t> shm_offset;  // the QP's SharedQp in the owner's segment
  // The QP's incarnation (never repeats), 0 until its shared state
  // is written (publish_qp). Initiators check a QP with this and qpn, both
  // here in the registry, never freed: the segment memory of a destroyed
  // QP may already hold another object.
  std::atomic<uint64_t> incarnation;
};

// One handle to a TGT QP: the QueuePair object of process `proc` whose
// id there is `qp_id` (events for the QP go to every handle).
struct TgtHolder {
  std::atomic<uint32_t> proc_plus1;  // 0 = empty
  std::atomic<uint32_t> pid;
  std::atomic<uint32_t> qp_id;
  // The holder's process's start time (ProcSlot::start_time): a later
  // process with its slot and pid does not hold its handles.
  std::atomic<uint64_t> start_time;
};
// A plain copy of a TgtHolder.
struct TgtHandle {
  uint32_t proc, pid, qp_id;
  uint64_t start_time;
  ProcessIdentity process() const { return ProcessIdentity{proc, pid, start_time}; }
};

// A TGT QP, in the host registry. The attributes (the engine's QpAttributes,
// as bytes: the host layer does not know the engine's types) and the holder
// list change under the registry mutex; `shared` is what initiators read, as
// for any QP. `server` is the holder whose udp link answers the QP's peer on
// another host (it opened the QP's channel); the udp link hands it the
// packets that other processes receive.
struct TgtQpRecord {
  std::atomic<uint32_t> qpn;           // 0 = free
  std::atomic<uint32_t> server_plus1;  // the serving holder's index + 1; 0 = none
  // 1 from the last handle's close until the record is free: unpublished,
  // waiting for the initiators inside it (finish_draining_tgts).
  std::atomic<uint32_t> draining;
  alignas(8) unsigned char attributes[kTgtAttributeBytes];
  TgtHolder holders[kMaxTgtHolders];
  SharedQp shared;
};

// What a key of the MR table names: a memory region, or a memory window of
// type 1 or 2 (a window's slot describes the part of its MR it grants, with
// the window's own access, so that an rkey resolves alike whatever it names).
inline constexpr uint32_t kKeyRegion = 0;
inline constexpr uint32_t kKeyWindow1 = 1;
inline constexpr uint32_t kKeyWindow2 = 2;

// Written under the registry mutex as a seqlock (seq odd while changing), read
// lock-free by initiators; fields are relaxed atomics so readers never race.
struct MrSlot {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> key;   // 0 = free; lkey == rkey == key
  std::atomic<uint32_t> proc;
  std::atomic<uint32_t> pd_id;
  std::atomic<uint32_t> access;      // IBV_ACCESS_* flags
  std::atomic<uint64_t> iova;        // the address remote peers use
  std::atomic<uint64_t> length;      // a window: 0 while unbound (invalid)
  std::atomic<uint64_t> host_addr;   // where iova maps in the owner's address space
  // The SharedSpan of the range (shared_length 0: none).
  std::atomic<uint64_t> shared_addr;
  std::atomic<uint64_t> shared_length;
  std::atomic<uint64_t> shared_offset;
  std::atomic<uint32_t> kind;        // kKeyRegion, kKeyWindow1, kKeyWindow2
  std::atomic<uint32_t> parent;      // a bound window: its MR's key (0 unbound)
  std::atomic<uint32_t> qpn;         // a bound type 2 window: the one QP it serves
  std::atomic<uint32_t> windows;     // an MR: the windows bound to it now
};

// A plain copy of an MrSlot (no initializers: arrays of them are filled
// before use, per operation, and must cost nothing to declare).
struct MrRecord {
  uint32_t key, proc, pd_id, access;
  uint64_t iova, length, host_addr;
  SharedSpan shared;
  uint32_t kind, parent, qpn, windows;
};

// The last MR a caller of HostRegistry::lookup_mr_cached found, and the
// version of its slot then. Owned by that caller (not shared).
struct MrLookupCache {
  uint32_t key = 0;  // 0: empty
  uint32_t seq = 0;
  MrRecord record;
};

// A window's new binding (HostRegistry::bind_window): the part of its MR it
// grants, as the window's slot will describe it. length 0 unbinds.
struct WindowBinding {
  uint32_t new_key;
  uint32_t access;
  uint64_t iova, length, host_addr;
  SharedSpan shared;
  uint32_t qpn;  // type 2: the QP it is bound to
};

// A multicast group: its MGID and the UD QPs attached to it. Changed under the
// registry mutex as a seqlock (seq odd while changing); a sender snapshots the
// member list lock-free. A group with no members is free.
struct McastMember {
  std::atomic<uint32_t> qpn;   // 0 = empty
  std::atomic<uint32_t> proc;  // owner ProcSlot index, so a dead process's members are reclaimed
};
struct McastGroup {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> count;       // members in use; 0 = free group
  std::atomic<uint32_t> mgid[4];     // the 16 GID bytes, as four words
  McastMember members[kMaxMcastMembers];
};

// Which process's registered memory the threads of one process are reaching
// into right now: the fence between an initiator's copy and the target's
// ibv_dereg_mr. Each slot holds (sequence << 32) | (target proc + 1), low
// half 0 when free; the sequence grows at every use, so a fence that saw a
// value knows that access ended as soon as the value changes. The first
// kOwnedAccessSlots are each written by one thread only, with plain
// stores (host/access_slot_owner.hpp); the rest are claimed by CAS.
struct alignas(64) ProcAccesses {
  std::atomic<uint64_t> slots[kAccessSlotsPerProc];
};

struct alignas(64) AtomicStripe {
  std::atomic<uint32_t> locked;
};

struct RegistryLayout {
  SharedFileHeader header;
  pthread_mutex_t mutex;  // robust, process-shared
  std::atomic<uint32_t> next_pd_id;
  std::atomic<uint64_t> next_incarnation;  // QP incarnations: never repeat while the file lives
  AtomicStripe atomic_stripes[kAtomicStripes];
  ProcAccesses accesses[kMaxProcs];
  ProcSlot procs[kMaxProcs];
  QpSlot qps[kMaxQpSlots];
  MrSlot mrs[kMaxMrSlots];
  McastGroup mcast[kMaxMcastGroups];
  TgtQpRecord tgt_qps[kMaxTgtQps];
  // The port's counters, one set per process so that processes do not
  // contend on one cache line per packet; a process's set is added to
  // `retired_counters` when its slot is freed, so the port's totals never
  // go back.
  Counters process_counters[kMaxProcs];
  Counters retired_counters;
  // The process that takes the management datagrams (QP1, the GSI: CM MADs
  // from other hosts) that reach a process of this host with no connection
  // manager of its own: slot + 1, 0 = nobody.
  std::atomic<uint32_t> gsi_agent;
};

class HostRegistry {
 public:
  // Maps (creating if needed) the registry of the calling user, in its
  // runtime directory (host/runtime_dir.hpp).
  static Result<HostRegistry*> open();
  // The registry of directory `dir` (for tests: unlinked when closed if asked).
  static Result<HostRegistry*> open_in(const std::string& dir, bool unlink_on_close);
  // The registry file of host directory `dir` (it may not exist yet).
  static std::string path_in(const std::string& dir);
  // For tests: a registry with a private name, unlinked when closed.
  static Result<HostRegistry*> open_named(const std::string& name, bool unlink_on_close);
  ~HostRegistry();

  // Registers the calling process (pid, segment fd); reclaims slots of dead processes.
  Result<uint32_t> register_process(uint32_t pid, uint32_t segment_fd);
  void unregister_process(uint32_t proc);

  Result<uint32_t> allocate_qpn(uint32_t proc, uint64_t shm_offset);
  // Makes the QP findable by initiators once its SharedQp is written, with
  // a new incarnation: a requester connected to an earlier QP that had the
  // same QPN finds a different one and gets no answer, as the PSN check
  // drops a stale connection's packets on RoCE.
  void publish_qp(uint32_t qpn);
  void release_qpn(uint32_t qpn);
  const QpSlot* find_qp(uint32_t qpn) const;

  // XRC TGT QPs (TgtQpRecord). create_tgt_qp takes a QPN and a record, with
  // the creator as its first holder; the caller fills `shared` and the
  // attributes, then publish_qp. ENOMEM when the QPN table or the TGT
  // table is full.
  struct NewTgtQp {
    uint32_t qpn;
    TgtQpRecord* record;
  };
  Result<NewTgtQp> create_tgt_qp(uint32_t proc, uint32_t pid, uint32_t qp_id);
  // The record of TGT QP `qpn`, or nullptr when `qpn` names no TGT QP now.
  TgtQpRecord* tgt_qp(uint32_t qpn);
  const TgtQpRecord* tgt_qp(uint32_t qpn) const;
  // ibv_open_qp: one more handle to TGT QP `qpn`, in domain `xrcd_id`.
  // invalid_argument when no TGT QP of that domain has that number (what
  // the kernel answers), not_enough_memory when it has kMaxTgtHolders.
  Result<TgtQpRecord*> open_tgt_qp(uint32_t qpn, uint32_t xrcd_id, uint32_t proc, uint32_t pid, uint32_t qp_id);
  // A handle to TGT QP `qpn` goes. When it was the last, the QP is
  // unpublished (state kDestroyed, QPN released), every access to it is
  // waited out, and the record freed: true. If the handle was the QP's
  // server, another live holder becomes server and `new_server` names it
  // (its proc, pid and qp_id, for the caller to tell it).
  bool close_tgt_qp(uint32_t qpn, uint32_t proc, uint32_t qp_id, TgtHandle* new_server = nullptr);
  // Runs `fn(record)` under the registry mutex (attribute changes, server
  // changes): never on the data path. The record must be one tgt_qp returned.
  template <typename Fn>
  auto with_tgt_qp(TgtQpRecord& record, Fn&& fn) {
    lock();
    struct Unlock {
      HostRegistry* r;
      ~Unlock() { r->unlock(); }
    } unlock_at_end{this};
    return fn(record);
  }
  // The holder that serves TGT QP `qpn`'s remote peer (see TgtQpRecord),
  // if any. Lock-free, for the udp link's hand-offs.
  std::optional<TgtHandle> tgt_server(uint32_t qpn) const;
  // When no live handle serves TGT QP `qpn` (the serving process died or
  // left without closing), makes the first live handle the server and
  // returns it, for the caller to tell it; nullopt when one serves or none
  // is left. Takes the registry mutex: for packets nobody takes.
  std::optional<TgtHandle> elect_tgt_server(uint32_t qpn);
  // Makes holder (proc, qp_id) the server of `record` (under with_tgt_qp);
  // returns the holder that served before, if another did.
  std::optional<TgtHandle> serve_tgt_locked(TgtQpRecord& record, uint32_t proc, uint32_t qp_id);
  // Every holder's (proc, pid, qp_id), at most kMaxTgtHolders; returns how many.
  uint32_t tgt_holders(const TgtQpRecord& record, TgtHandle* out) const;

  Result<uint32_t> allocate_mr(uint32_t proc, uint32_t pd_id, uint32_t access, uint64_t iova, uint64_t length,
                               uint64_t host_addr, SharedSpan shared = SharedSpan{});
  // Releases key `key` (an MR or a window; an MR only while no window is
  // bound to it: false, and nothing changes, otherwise). With `proc`, only
  // if process `proc` registered it (another process sharing its context
  // may have released it, and the key been given out again, already).
  static constexpr uint32_t kAnyProc = ~0u;
  bool release_mr(uint32_t key, uint32_t proc = kAnyProc);
  // Updates a registered MR in place (rereg); the key stays the same.
  void update_mr(uint32_t key, uint32_t pd_id, uint32_t access, uint64_t iova, uint64_t length, uint64_t host_addr,
                 SharedSpan shared = SharedSpan{});
  // Tells peers where process `proc`'s backing file is (see ProcSlot).
  void publish_backing(uint32_t proc, uint32_t fd, uint64_t inode);
  // A consistent copy of the MR for `key`, or false if the key is not registered.
  bool lookup_mr(uint32_t key, MrRecord& out) const;
  // lookup_mr for a caller that asks about the same key again and again (a
  // QP's data path): while the slot's version has not moved since `cache`
  // was filled, the record there is still the slot's (every change of a
  // slot moves its version), and one load replaces the copy. Same ordering
  // as lookup_mr against begin_access / fence_accesses.
  bool lookup_mr_cached(uint32_t key, MrLookupCache& cache) const {
    // seq_cst, as read_mr_slot's first load: a version still the one the
    // record was read at means no change began before this access did.
    if (key != 0 && cache.key == key &&
        layout_->mrs[(key >> 8) % kMaxMrSlots].seq.load(std::memory_order_seq_cst) == cache.seq)
      return true;
    return refresh_mr_cache(key, cache);
  }
  // The version of key's registry slot now, loaded as lookup_mr_cached
  // loads it: a record (or a link::KeyGrant) read at this version still
  // stands, under the caller's access announcement.
  uint32_t mr_version(uint32_t key) const {
    return layout_->mrs[(key >> 8) % kMaxMrSlots].seq.load(std::memory_order_seq_cst);
  }
  // lookup_mr_cached's miss: the slot read again into the cache.
  bool refresh_mr_cache(uint32_t key, MrLookupCache& cache) const;

  // Memory windows (type kKeyWindow1 or kKeyWindow2), in the MR table: an
  // unbound window has a key and grants nothing (length 0).
  Result<uint32_t> allocate_window(uint32_t proc, uint32_t pd_id, uint32_t kind);
  // Binds window `key` of `proc` as `binding` says, to the MR `mr` as the
  // caller validated it (with length 0: unbinds it). invalid_argument, and
  // nothing changes, if the window's key or the MR changed since (the MR
  // was deregistered, or rereg'd), or if it is a type 2 window that is bound
  // already. The window's key becomes binding.new_key.
  Result<void> bind_window(uint32_t key, uint32_t proc, const MrRecord& mr, const WindowBinding& binding);
  // Invalidates the bound type 2 window `key` of process `proc` whose PD is
  // `pd_id` (LOCAL_INV, SEND_WITH_INV): it keeps its key and grants nothing.
  // invalid_argument if there is no such window, or it is of type 1, or not bound.
  Result<void> invalidate_window(uint32_t key, uint32_t proc, uint32_t pd_id);
  // Whether MR `key` has windows bound to it (lock-free; rereg asks).
  bool windows_bound(uint32_t key) const;

  uint32_t allocate_pd_id();

  // The deregistration fence. An initiator thread of process `self` calls
  // begin_access before it validates any key of process `target` and keeps
  // the returned slot until it no longer touches that memory (end_access).
  // After an MR of `target` is released or changed, fence_accesses waits
  // until every access to `target` that was under way has ended, so that
  // once ibv_dereg_mr returns no initiator writes or reads the old range.
  // Accesses of processes that died are not waited for.
  // Inline: it is on the way of every direct operation, before its store.
  uint32_t begin_access(uint32_t self, uint32_t target) {
    const uint32_t slot = try_begin_access(self, target);
    if (slot != kNoAccessSlot) [[likely]] return slot;
    return wait_for_access_slot(self, target);
  }
  // begin_access without waiting: kNoAccessSlot when every slot of `self` it
  // may use is taken. For a thread that already holds one (a second process
  // to reach), which must not wait for slots that threads like it hold.
  uint32_t try_begin_access(uint32_t self, uint32_t target) {
    if (const uint32_t owned = try_begin_owned_access(self, target); owned != kNoAccessSlot) [[likely]]
      return owned;
    ProcAccesses& mine = layout_->accesses[self];
    const uint32_t hint = access_hint();
    constexpr uint32_t kShared = kAccessSlotsPerProc - kOwnedAccessSlots;
    for (uint32_t n = 0; n < kShared; ++n) {
      const uint32_t index = kOwnedAccessSlots + (hint + n) % kShared;
      std::atomic<uint64_t>& slot = mine.slots[index];
      uint64_t v = slot.load(std::memory_order_relaxed);
      if (v & 0xFFFFFFFFu) continue;
      const uint64_t taken = (((v >> 32) + 1) << 32) | (target + 1);
      // seq_cst: the fence's read of this slot and our later reads of the
      // key table are ordered against its key store and our slot store.
      if (slot.compare_exchange_strong(v, taken, std::memory_order_seq_cst)) [[likely]] return index;
    }
    return kNoAccessSlot;
  }
  static constexpr uint32_t kNoAccessSlot = ~0u;
  // try_begin_access in the thread's own slot only (host/access_slot_owner.hpp):
  // kNoAccessSlot when the thread owns none, or its slot is in use (a thread
  // inside one process's memory reaching a second one). No loop and no
  // call, always inlined: for the lanes (link/shm/memory_lane.hpp, send_lane.hpp).
  [[gnu::always_inline]] uint32_t try_begin_owned_access(uint32_t self, uint32_t target) {
    const uint32_t owned = access_slot_owner::owned_plus1();
    if (owned == 0) [[unlikely]]
      return kNoAccessSlot;
    std::atomic<uint64_t>& slot = layout_->accesses[self].slots[owned - 1];
    const uint64_t v = slot.load(std::memory_order_relaxed);
    if ((v & 0xFFFFFFFFu) != 0) [[unlikely]]
      return kNoAccessSlot;
    slot.store((((v >> 32) + 1) << 32) | (target + 1), std::memory_order_relaxed);
    // Only the compiler's order between this store and our later reads of
    // the key table: fence_accesses' membarrier orders the CPU.
    asymmetric_fence::light_barrier();
    return owned - 1;
  }
  void end_access(uint32_t self, uint32_t slot) {
    std::atomic<uint64_t>& s = layout_->accesses[self].slots[slot];
    s.store(s.load(std::memory_order_relaxed) & ~uint64_t{0xFFFFFFFFu}, std::memory_order_release);
  }
  void fence_accesses(uint32_t target) const;

  // Attaches QP `qpn` (owned by `proc`) to the group `mgid`; attaching twice
  // succeeds and changes nothing, as the kernel's uverbs does. ENOMEM when the
  // group table or the group is full.
  Result<void> attach_mcast(const uint8_t* mgid, uint32_t qpn, uint32_t proc);
  // EINVAL if the QP is not attached to the group (uverbs' answer).
  Result<void> detach_mcast(const uint8_t* mgid, uint32_t qpn);
  // A consistent copy of the QPNs attached to `mgid` (at most kMaxMcastMembers); returns their number.
  uint32_t mcast_members(const uint8_t* mgid, uint32_t* out) const;

  // The host's GSI agent (see RegistryLayout::gsi_agent). claim_gsi_agent
  // makes `proc` the agent unless a live process already is; gsi_agent
  // returns the agent's slot, or nullopt when there is none (or it died).
  // A process's claim ends when its slot is released.
  void claim_gsi_agent(uint32_t proc);
  std::optional<uint32_t> gsi_agent() const;

  // Which registry file this is (its device and inode, folded): what a
  // process's PD ids and keys mean depends on it. 0 if it cannot be told.
  uint64_t file_identity() const;

  const ProcSlot& proc(uint32_t index) const { return layout_->procs[index]; }
  // QP slot `index` (0 <= index < kMaxQpSlots), for tools that list every QP.
  const QpSlot& qp_slot(uint32_t index) const { return layout_->qps[index]; }

  // Process `proc`'s share of the port's counters.
  Counters& process_counters(uint32_t proc) { return layout_->process_counters[proc]; }
  // The port's counters: every process's, live or gone.
  std::array<uint64_t, kCounterCount> port_counters() const;
  bool process_alive(uint32_t index) const;
  // Whether process `pid`, seen in slot `index` earlier, still runs. False
  // once the slot was reclaimed, even if a new process has taken it since.
  bool process_alive(uint32_t index, uint32_t pid) const;
  // Whether the very process `who` still runs in its slot (not a later one
  // that got the slot and the pid).
  bool process_alive(const ProcessIdentity& who) const;
  // Who holds slot `index` now (pid 0: nobody).
  ProcessIdentity identity_of(uint32_t index) const;

  AtomicStripe& atomic_stripe(uint64_t pid, uint64_t addr);

  static uint32_t qp_index(uint32_t qpn) { return (qpn - kFirstQpn) & (kMaxQpSlots - 1); }

 private:
  // Where a thread looks for a free access slot first, so that threads spread
  // over the slots: a hash of where its stack is (each thread has its own,
  // megabytes apart). A thread_local counter did the same at the price of a
  // TLS lookup (__tls_get_addr, in a shared library) per operation.
  // (The stack pointer is read directly where it can be: asking for the
  // frame's address makes the caller set up a frame pointer.)
  static uint32_t access_hint() {
#if defined(__x86_64__)
    uintptr_t stack;
    asm("mov %%rsp, %0" : "=r"(stack));
#else
    const auto stack = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
#endif
    return static_cast<uint32_t>(((stack >> 20) * 0x9E3779B97F4A7C15ULL) >> 60);
  }
  // begin_access when every slot of `self` is taken: more threads than slots
  // inside peers' memory; waits for one.
  uint32_t wait_for_access_slot(uint32_t self, uint32_t target);
  HostRegistry(RegistryLayout* layout, std::string path, bool unlink_on_close)
      : layout_(layout), path_(std::move(path)), unlink_on_close_(unlink_on_close) {}
  void lock();
  void unlock();
  void reclaim_dead_locked();
  Result<uint32_t> allocate_qpn_locked(uint32_t proc, uint64_t shm_offset);
  Result<uint32_t> allocate_key_locked(uint32_t proc, uint32_t pd_id, uint32_t kind, uint32_t access, uint64_t iova,
                                       uint64_t length, uint64_t host_addr, SharedSpan shared);
  // A window's MR no longer counts it as bound.
  void unbind_locked(MrSlot& window);
  void release_process_objects_locked(uint32_t proc);
  // Whether the process in slot `proc` is still the one that made an access.
  bool accessor_alive(uint32_t proc) const;
  // Drops the handles of process `proc` from every TGT QP (it died or
  // left), freeing the QPs that nobody holds any more.
  void release_tgt_holders_locked(uint32_t proc);
  // A TGT QP nobody holds goes in two steps. Under the mutex it is
  // unpublished (state kDestroyed, QPN released) and marked draining; then,
  // with the mutex released, the initiators inside it are waited out and
  // the record freed. Not under the mutex: an initiator inside may need it
  // (a SEND WITH INVALIDATE invalidates a window through the registry).
  void unpublish_tgt_locked(TgtQpRecord& record);
  void finish_draining_tgts();
  // Removes every member matching `qpn` (if non-zero) or owned by `proc`.
  void remove_mcast_members_locked(uint32_t qpn, uint32_t proc);

  RegistryLayout* layout_;
  std::string path_;
  bool unlink_on_close_;
};

uint64_t process_start_time(uint32_t pid);

}  // namespace softhca::host
