// A shared receive queue: a host::SharedRq in the process segment that initiators
// take receive WQEs from directly, plus the limit event.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <mutex>

#include "common/result.hpp"
#include "engine/context.hpp"
#include "host/shared_queues.hpp"

namespace softhca::transport {
struct TagList;
}

namespace softhca::engine {

class CompletionQueue;
class ProtectionDomain;
class XrcDomain;

// What makes an SRQ an XRC SRQ (ibv_create_srq_ex with IBV_SRQT_XRC): its
// domain, and the CQ its receive completions go to (XRC_RECV QPs have none).
struct XrcSrqInit {
  XrcDomain* xrcd = nullptr;
  CompletionQueue* cq = nullptr;
};

// What makes an SRQ a tag matching SRQ (IBV_SRQT_TM): the CQ its list
// operations complete on, and its tm_cap.
struct TmSrqInit {
  CompletionQueue* cq = nullptr;
  uint32_t max_num_tags = 0;
  uint32_t max_ops = 0;
};

// One ibv_post_srq_ops operation, in engine form.
struct TagOp {
  uint64_t wr_id = 0;
  uint32_t opcode = 0;  // IBV_WR_TAG_ADD / DEL / SYNC
  uint32_t flags = 0;   // IBV_OPS_SIGNALED, IBV_OPS_TM_SYNC
  uint32_t unexpected_cnt = 0;
  uint32_t handle = 0;  // DEL: the entry; ADD: set to the new entry's
  uint64_t recv_wr_id = 0;
  const host::RecvSge* sges = nullptr;
  uint32_t num_sge = 0;
  uint64_t tag = 0;
  uint64_t mask = 0;
};

class SharedReceiveQueue {
 public:
  static Result<SharedReceiveQueue*> create(ProtectionDomain& pd, uint32_t max_wr, uint32_t max_sge,
                                            uint32_t limit, XrcSrqInit xrc = {}, TmSrqInit tm = {});
  ~SharedReceiveQueue();

  // Posts receive WQEs; on failure *bad is the index of the first one not posted.
  Result<void> post(uint64_t wr_id, const host::RecvSge* sges, uint32_t num_sge);
  Result<void> modify(uint32_t max_wr, uint32_t limit, int mask);
  void query(uint32_t& max_wr, uint32_t& max_sge, uint32_t& limit) const;
  // Tag matching SRQs: one list operation (ibv_post_srq_ops). Its
  // completion goes to the SRQ's CQ when it is signaled or fails
  // (IBV_WC_TM_ERR: a DEL of an entry that is not there); EINVAL for an
  // unknown opcode or too many SGEs, ENOMEM when the list is full.
  Result<void> post_tag_op(TagOp& op);
  transport::TagList* tag_list() const { return tag_list_; }
  uint32_t max_ops() const { return tm_.max_ops; }
  void on_limit_reached();
  // Receive completions of a QP on this SRQ were polled (or cleaned away with
  // their QP): the slots of their WQEs are free.
  void retire(uint32_t count = 1);

  ProtectionDomain& pd() { return pd_; }
  uint32_t max_sge() const { return max_sge_; }
  uint32_t max_wr() const { return max_wr_; }
  uint64_t shared_offset() const { return shared_offset_; }
  host::SharedRq* shared() const { return shared_; }
  uint32_t id() const { return id_; }
  // Which SRQ of this process the id names now (ids are reused; serials are not).
  uint32_t serial() const { return serial_; }
  // XRC SRQs: the SRQ number senders name (from the host's QPN space), else 0.
  uint32_t srq_num() const { return srq_num_; }
  XrcDomain* xrcd() const { return xrc_.xrcd; }
  CompletionQueue* cq() const { return xrc_.cq; }

  void* handle = nullptr;
  EventCounters async_events;
  void attach() { users_.fetch_add(1); }
  void detach() { users_.fetch_sub(1); }
  bool in_use() const { return users_.load() != 0; }

 private:
  SharedReceiveQueue(ProtectionDomain& pd) : pd_(pd) {}
  ProtectionDomain& pd_;
  uint32_t max_wr_ = 0;
  uint32_t resize_limit_ = 0;  // modify's max_wr stays below it
  uint32_t max_sge_ = 0;
  uint32_t id_ = 0;
  uint32_t serial_ = 0;
  XrcSrqInit xrc_;
  uint32_t srq_num_ = 0;
  TmSrqInit tm_;
  transport::TagList* tag_list_ = nullptr;
  uint64_t tag_list_offset_ = 0;
  uint64_t tag_list_bytes_ = 0;
  uint64_t record_offset_ = 0;  // XRC: the host::SharedQp record published under srq_num_
  bool counted_ = false;  // holds a unit of the node's srq_quota()
  uint64_t shared_offset_ = 0;
  uint64_t shared_bytes_ = 0;
  host::SharedRq* shared_ = nullptr;
  std::mutex post_mutex_;
  std::atomic<uint32_t> users_{0};
  std::atomic<uint64_t> retired_{0};  // WQEs whose completion was polled
};

}  // namespace softhca::engine
