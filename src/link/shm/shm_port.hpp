// The responder's port onto a QP of another (or this) process on this host:
// its shared state in the owner's segment, its memory through the owner's
// backing file mapped here where the MR is shared (host/memory_backing.hpp),
// else through process_vm_readv/writev, its CQ and events through the
// owner's segment.
// Every key it hands the responder is remembered, so that a copy longer than
// the fence chunk stops once one of them is deregistered.
#pragma once

#include <optional>

#include "common/limits.hpp"
#include "host/attachment.hpp"
#include "link/shm/target.hpp"
#include "transport/responder_port.hpp"

namespace softhca::shm {

// Copies of this size or less run as one; longer ones in chunks of it, the
// keys re-checked before each: the longest a deregistration waits.
inline constexpr size_t kFenceChunk = 1 << 20;

class ShmResponderPort final : public transport::ResponderPort {
 public:
  // The caller holds a MemoryAccess for `target`, and found it still_there.
  // `key_cache` (optional, the caller's, as long as the port): the last key
  // looked up, kept across ports of one QP (HostRegistry::lookup_mr_cached)
  // so that the packets of one message do not copy its record each.
  ShmResponderPort(host::Attachment& host, TargetQp& target, host::MrLookupCache* key_cache = nullptr)
      : host_(host), target_(target), key_cache_(key_cache) {}
  ~ShmResponderPort() override;
  ShmResponderPort(const ShmResponderPort&) = delete;
  ShmResponderPort& operator=(const ShmResponderPort&) = delete;

  transport::ResponderQp qp() override;
  std::optional<transport::MemoryKey> memory_key(uint32_t key) override;
  std::optional<uint32_t> select_xrc_srq(uint32_t srqn) override;
  bool invalidate(uint32_t rkey) override;
  bool take_receive(transport::ReceiveWqe& out) override;
  transport::CopyStatus write(const iovec* to, int nto, const iovec* from, int nfrom, uint64_t length) override;
  transport::CopyStatus read(const iovec* to, int nto, const iovec* from, int nfrom, uint64_t length) override;
  transport::CopyStatus atomic(void* word, transport::AtomicOp op, uint64_t compare_add, uint64_t swap,
                               uint64_t& original) override;
  void complete_receive(const transport::ReceiveCompletion& completion) override;
  // complete_receive for a message to an RC or UC QP of `target`'s process,
  // without a port (the direct SEND's, which builds none). A WQE taken from
  // the QP's own receive queue (not an SRQ's) gives its `position`: the
  // completion says where (host::kCqeRecvPosition), so that the owner frees
  // the slot without reading the queue's tail, a line the takers write.
  // Called under an access announcement to `target`'s process, which the
  // push into its CQ counts on (host::SharedCq::push_announced).
  static void complete_direct_receive(host::Attachment& host, const TargetQp& target,
                                      const transport::ReceiveCompletion& completion, const uint64_t* position);
  // The CQ entry of a receive completion of `target` (an RC, UC or
  // XRC_RECV QP), `position` as complete_direct_receive's. The one
  // translation of a ReceiveCompletion into a Cqe, for push_receive_to and
  // the SEND lane (send_lane.hpp).
  [[gnu::always_inline]] static host::Cqe receive_cqe(const TargetQp& target, const transport::ReceiveCompletion& c,
                                                      const uint64_t* position) {
    host::Cqe cqe{};
    cqe.wr_id = c.wr_id;
    cqe.status = c.status;
    cqe.opcode = c.opcode;
    cqe.byte_len = c.byte_len;
    cqe.imm_data = c.imm_data;
    cqe.qp_num = target.qpn;
    cqe.src_qp = c.src_qp;
    cqe.wc_flags = c.wc_flags;
    cqe.sl = c.sl;
    cqe.solicited = c.solicited ? 1 : 0;
    if (c.no_wqe) cqe.flags |= host::kCqeNoWqe;
    if (position != nullptr) {
      cqe.flags |= host::kCqeRecvPosition;
      cqe.vendor_err = static_cast<uint32_t>(*position);
    }
    if (c.tm_info) {
      cqe.flags |= host::kCqeTmInfo;
      cqe.src_qp = static_cast<uint32_t>(c.tm_tag >> 32);
      cqe.vendor_err = static_cast<uint32_t>(c.tm_tag);
      cqe.imm_data = c.tm_priv;
    }
    return cqe;
  }
  // What a push into `cq`, the CQ of a receive queue in `owner`'s segment,
  // asks of the owner: a completion event, or the CQ's error event after
  // an overrun (nothing for Push::kOk).
  static void notify_receive_cq(host::Attachment& host, const TargetQp& owner, const host::SharedCq& cq,
                                host::SharedCq::Push pushed);
  void fail_qp(ibv_event_type event) override;
  void established() override;
  bool gone() override;
  transport::TagList* tag_list() override;
  transport::LockTaker tag_list_taker() override;
  bool requester_range(uint32_t requester_qpn, uint64_t va, uint32_t rkey, uint64_t length, iovec& out) override;

 private:
  // The completion, into the CQ of `target`'s receive queue in `owner`'s
  // segment: the QP's own process, or for an XRC_RECV QP the process of
  // `xrc_srq` (the SRQ the message named, nullptr if none). `announced`:
  // the caller holds an access announcement to `owner`'s process.
  static void push_receive_to(host::Attachment& host, const TargetQp& target, const TargetQp& owner,
                              const host::SharedQp* xrc_srq, const transport::ReceiveCompletion& completion,
                              const uint64_t* position, bool announced);
  // The keys validated so far, as validated.
  class KeysInUse {
   public:
    void add(const host::MrRecord& record) {
      if (n_ < kMax) records_[n_++] = record;
    }
    bool still_valid(host::HostRegistry& registry) const;
    // Whether one of them is an ODP MR (transport::is_on_demand): its pages
    // are checked when used.
    bool any_on_demand() const;
    // The validated MR of process `proc` that holds [addr, addr + length)
    // of its memory, or nullptr.
    const host::MrRecord* holding(uint32_t proc, uint64_t addr, uint64_t length) const;

   private:
    static constexpr int kMax = limits::kMaxSge + 1;
    host::MrRecord records_[kMax];
    int n_ = 0;
  };

  host::SharedRq* receive_queue() const;
  // Makes the process of `mr` (key `key`, read before) the message's other
  // memory process, if no key named one yet; `mr` is read again under its
  // announcement.
  [[gnu::noinline, gnu::cold]] bool adopt_memory_process(uint32_t key, host::MrRecord& mr);
  void raise(uint32_t detail);
  // `owner`'s memory `target` (n ranges) as seen here through its backing
  // file, into `local`; false if any range is not in a shared MR.
  bool local_views(TargetQp& owner, const iovec* target, int n, iovec* local);
  // False if `n` ranges of `owner`, reached through an ODP key in
  // this very process (copied with memcpy, not by the kernel), are not mapped
  // with the access the copy needs.
  bool own_ranges_mapped(const TargetQp& owner, const iovec* ranges, int n, bool written);
  // The responder computes target addresses from the keys memory_key gave
  // it and hands them back to write, read and atomic, never dereferencing
  // them. The keys of memory_'s process carry this bit in their host
  // address, so that every range says whose memory it is even where the two
  // processes' address spaces overlap (a process and its forked child).
  // User addresses never have it.
  static constexpr uint64_t kOtherProcess = uint64_t{1} << 63;
  // Whose memory `range` (as the responder gave it) is, and the range
  // itself, untagged, in `untagged`.
  TargetQp* owner_of(const iovec& range, iovec& untagged);
  transport::CopyStatus fenced_copy(bool into_target, const iovec* to, int nto, const iovec* from, int nfrom,
                                    uint64_t length);
  // fenced_copy when a second process's key was given (memory_): kept out
  // of the common path.
  [[gnu::noinline, gnu::cold]] transport::CopyStatus copy_two_processes(bool into_target, const iovec* to, int nto,
                                                                        const iovec* from, int nfrom, uint64_t length);
  // fenced_copy for ranges that are all `owner`'s.
  transport::CopyStatus copy_owned(TargetQp& owner, bool into_target, const iovec* to, int nto, const iovec* from,
                                   int nfrom, uint64_t length);

  host::Attachment& host_;
  TargetQp& target_;  // the QP: its state, its events
  host::MrLookupCache* key_cache_;
  // Whose memory, receive queue and CQ the message reaches: the QP's
  // process, or for an XRC_RECV QP the process of the SRQ it names.
  TargetQp* data_ = &target_;
  KeysInUse keys_;
  // The XRC SRQ's record (in its owner's segment) a message to an XRC_RECV
  // QP named, once select_xrc_srq accepted it; the SRQ as a target.
  const host::SharedQp* xrc_srq_ = nullptr;
  uint32_t xrc_srqn_ = 0;
  TargetQp xrc_owner_;
  // The access to the SRQ's process, when it is not the QP's.
  uint32_t xrc_access_ = host::HostRegistry::kNoAccessSlot;
  // The process of an MR in the QP's PD that another process registered
  // (a PD shared through ibv_import_pd), when the message's keys name one
  // (the others are data_'s): its memory as a target, and the access
  // announced to it.
  TargetQp* memory_ = nullptr;
  std::optional<TargetQp> memory_owner_;  // (not built for the common message: the port is made per message)
  uint32_t memory_access_ = host::HostRegistry::kNoAccessSlot;
};

}  // namespace softhca::shm
