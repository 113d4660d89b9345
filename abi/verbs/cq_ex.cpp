// ibv_create_cq_ex and the extended poll API (ibv_start_poll / ibv_next_poll /
// ibv_end_poll and the ibv_wc_read_* readers).
//
// Every CQ gets these ops, also those made by the legacy ibv_create_cq, so an
// ibv_cq_ex reached by any route polls. A poll pass goes:
//   start_poll: take the CQ's poll lock (unless SINGLE_THREADED), pop one
//               completion into CqHandle::current, publish status and wr_id in
//               the ibv_cq_ex; ENOENT (lock dropped again) when empty;
//   next_poll:  pop the next one under the same lock; ENOENT when empty;
//   end_poll:   drop the lock. A stray end_poll (pyverbs calls it after a
//               start_poll that returned ENOENT) does nothing.
// The readers return fields of `current`. They answer for every field, also
// ones the wc_flags did not ask for (rdma-core providers leave those NULL);
// fields this device never produces (cvlan, flow tag) read as 0 — their
// wc_flags are refused at creation; tag matching info is there for the
// completions of a tag matching SRQ's matched messages. The completion timestamp is
// the device's free-running clock (ns, see ibv_query_device_ex's
// hca_core_clock), recorded only for CQs created with
// IBV_WC_EX_WITH_COMPLETION_TIMESTAMP or _WALLCLOCK; the wall-clock one is
// that stamp moved onto CLOCK_REALTIME when it is read (the two clocks'
// difference then), so one stamp in the 64-byte slot serves both.
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>

#include "engine/completion_queue.hpp"
#include "common/limits.hpp"
#include "ext_verbs.hpp"
#include "handles.hpp"
#include "verbs_ops.hpp"

using namespace softhca;
using namespace softhca::abi;

namespace {

// The work-completion fields the engine records for every completion.
constexpr uint64_t kSupportedWcFlags = uint64_t{IBV_WC_STANDARD_FLAGS} | uint64_t{IBV_WC_EX_WITH_TM_INFO} |
                                       uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP} |
                                       uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK};
constexpr uint32_t kSupportedCreateFlags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
constexpr uint32_t kSupportedCompMask = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;

CqHandle& handle_of(ibv_cq_ex* cq) { return *reinterpret_cast<CqHandle*>(cq); }

void publish(CqHandle& h) {
  h.cq.status = static_cast<ibv_wc_status>(h.current.status);
  h.cq.wr_id = h.current.wr_id;
}

int start_poll(ibv_cq_ex* cq, ibv_poll_cq_attr* attr) {
  if (attr != nullptr && attr->comp_mask != 0) return EINVAL;
  CqHandle& h = handle_of(cq);
  if (!h.single_threaded) h.poll_lock.lock();
  bool got = false;
  try {
    got = h.impl->poll_one(h.current);
  } catch (...) {
    got = false;
  }
  if (!got) {
    if (!h.single_threaded) h.poll_lock.unlock();
    return ENOENT;
  }
  h.polling = true;
  publish(h);
  return 0;
}

int next_poll(ibv_cq_ex* cq) {
  CqHandle& h = handle_of(cq);
  if (!h.polling) return EINVAL;  // no start_poll pass is open
  bool got = false;
  try {
    got = h.impl->poll_one(h.current);
  } catch (...) {
    got = false;
  }
  if (!got) return ENOENT;
  publish(h);
  return 0;
}

void end_poll(ibv_cq_ex* cq) {
  CqHandle& h = handle_of(cq);
  if (!h.polling) return;
  h.polling = false;
  if (!h.single_threaded) h.poll_lock.unlock();
}

ibv_wc_opcode read_opcode(ibv_cq_ex* cq) { return static_cast<ibv_wc_opcode>(handle_of(cq).current.opcode); }
// A tag matching completion carries its tag in vendor_err and src_qp, its
// app_ctx in imm_data (host::kCqeTmInfo): those read as 0 there.
bool has_tm_info(const CqHandle& h) { return (h.current.flags & host::kCqeTmInfo) != 0; }
uint32_t read_vendor_err(ibv_cq_ex* cq) {
  return has_tm_info(handle_of(cq)) ? 0 : handle_of(cq).current.vendor_err;
}
uint32_t read_byte_len(ibv_cq_ex* cq) { return handle_of(cq).current.byte_len; }
__be32 read_imm_data(ibv_cq_ex* cq) {  // already network order
  return has_tm_info(handle_of(cq)) ? 0 : handle_of(cq).current.imm_data;
}
uint32_t read_qp_num(ibv_cq_ex* cq) { return handle_of(cq).current.qp_num; }
uint32_t read_src_qp(ibv_cq_ex* cq) { return has_tm_info(handle_of(cq)) ? 0 : handle_of(cq).current.src_qp; }
unsigned int read_wc_flags(ibv_cq_ex* cq) { return handle_of(cq).current.wc_flags; }
uint32_t read_slid(ibv_cq_ex* cq) { return handle_of(cq).current.slid; }
uint8_t read_sl(ibv_cq_ex* cq) { return handle_of(cq).current.sl; }
uint8_t read_dlid_path_bits(ibv_cq_ex* cq) { return handle_of(cq).current.dlid_path_bits; }
uint64_t read_completion_ts(ibv_cq_ex* cq) { return handle_of(cq).current.timestamp; }
// Not produced by this device (their wc_flags are refused): read as 0.
uint16_t read_cvlan(ibv_cq_ex*) { return 0; }
uint32_t read_flow_tag(ibv_cq_ex*) { return 0; }
// The matched message's tag and app_ctx (completions with IBV_WC_TM_MATCH);
// 0 for every other completion.
void read_tm_info(ibv_cq_ex* cq, ibv_wc_tm_info* tm_info) {
  if (tm_info == nullptr) return;
  std::memset(tm_info, 0, sizeof *tm_info);
  const CqHandle& h = handle_of(cq);
  if (!has_tm_info(h)) return;
  tm_info->tag = (uint64_t{h.current.src_qp} << 32) | h.current.vendor_err;
  tm_info->priv = h.current.imm_data;
}
uint64_t read_completion_wallclock_ns(ibv_cq_ex* cq) {
  const uint64_t stamp = handle_of(cq).current.timestamp;
  if (stamp == 0) return 0;  // a CQ that asked for no timestamps
  timespec real{};
  clock_gettime(CLOCK_REALTIME, &real);
  const uint64_t now_real = static_cast<uint64_t>(real.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(real.tv_nsec);
  const uint64_t now_device = engine::completion_clock_ns();
  return now_real - (now_device - stamp);
}

}  // namespace

namespace softhca::abi {

void install_cq_poll_ops(CqHandle& h) {
  ibv_cq_ex& c = h.cq;
  c.start_poll = start_poll;
  c.next_poll = next_poll;
  c.end_poll = end_poll;
  c.read_opcode = read_opcode;
  c.read_vendor_err = read_vendor_err;
  c.read_byte_len = read_byte_len;
  c.read_imm_data = read_imm_data;
  c.read_qp_num = read_qp_num;
  c.read_src_qp = read_src_qp;
  c.read_wc_flags = read_wc_flags;
  c.read_slid = read_slid;
  c.read_sl = read_sl;
  c.read_dlid_path_bits = read_dlid_path_bits;
  c.read_completion_ts = read_completion_ts;
  c.read_cvlan = read_cvlan;
  c.read_flow_tag = read_flow_tag;
  c.read_tm_info = read_tm_info;
  c.read_completion_wallclock_ns = read_completion_wallclock_ns;
}

// verbs_context.create_cq_ex (ibv_create_cq_ex). The inline wrapper has already
// refused comp_mask bits beyond IBV_CQ_INIT_ATTR_MASK_RESERVED with EINVAL.
ibv_cq_ex* create_cq_ex_op(ibv_context* context, ibv_cq_init_attr_ex* attr) {
  return pointer_verb([&]() -> ibv_cq_ex* {
    if (attr == nullptr || to_context(context) == nullptr) {
      errno = EINVAL;
      return nullptr;
    }
    if ((attr->comp_mask & ~kSupportedCompMask) != 0 || (attr->wc_flags & ~kSupportedWcFlags) != 0) {
      errno = EOPNOTSUPP;
      return nullptr;
    }
    // A CQ may belong to a parent domain (of this context), not to a plain PD.
    if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) != 0 &&
        (!is_parent_domain(attr->parent_domain) || attr->parent_domain->context != context)) {
      errno = EINVAL;
      return nullptr;
    }
    const uint32_t flags = (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) ? attr->flags : 0;
    if ((flags & ~kSupportedCreateFlags) != 0) {  // IGNORE_OVERRUN: an overrun always puts the CQ in error
      errno = EOPNOTSUPP;
      return nullptr;
    }
    if (attr->cqe > static_cast<uint32_t>(limits::kMaxCqe) || attr->comp_vector > static_cast<uint32_t>(INT_MAX)) {
      errno = EINVAL;
      return nullptr;
    }
    return create_cq_common(context, static_cast<int>(attr->cqe), attr->cq_context, attr->channel,
                            static_cast<int>(attr->comp_vector), attr->wc_flags, flags);
  });
}

}  // namespace softhca::abi
