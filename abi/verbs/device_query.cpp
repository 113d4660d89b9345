// ibv_query_device / _port / _gid / _pkey and their extended forms, for softhca0.
//
// Everything reported comes from engine/limits.hpp (what we enforce) and the
// engine's DeviceInfo (GUID, GID table). Conventions, as rdma-core 44 has them:
//   ibv_query_device, ibv_query_port, _ibv_query_gid_ex, the ops -> 0 or errno
//   ibv_query_gid, ibv_query_pkey, ibv_query_gid_type          -> 0 or -1 + errno
//   ibv_get_pkey_index                                         -> index or -1 + errno
//   _ibv_query_gid_table                                       -> count or -errno
#include "device_query.hpp"

#include <endian.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "device_list.hpp"
#include "engine/flow.hpp"
#include "engine/device/device_info.hpp"
#include "common/limits.hpp"
#include "handles.hpp"
#include "engine/completion_queue.hpp"

// The header turns ibv_query_port into the inline wrapper; we define the real one.
#undef ibv_query_port

namespace softhca::abi {
namespace {

constexpr uint8_t kPort = 1;

// ibv_query_port@IBVERBS_1.1 writes struct _compat_ibv_port_attr: everything up to
// and including `flags`, i.e. all of ibv_port_attr but port_cap_flags2.
constexpr std::size_t kCompatPortAttrSize = offsetof(ibv_port_attr, port_cap_flags2);
static_assert(kCompatPortAttrSize == 48);
static_assert(sizeof(ibv_port_attr) == 52 && sizeof(ibv_device_attr_ex) == 400 && sizeof(ibv_gid_entry) == 32);

// What the device supports. TODO(lead): move to engine/limits.hpp beside the
// numeric limits once the MW / XRC / SRQ-resize paths are in place.
// Only what works today: growing an SRQ is not implemented, and advertising
// it would make applications try. XRC works on one host and between hosts.
// Memory windows of type 1 and 2B (a type 2 window serves the one QP it was
// bound through, and that QP's PD), as rxe reports them.
constexpr unsigned kDeviceCapFlags = IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID |
                                     IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_N_NOTIFY_CQ | IBV_DEVICE_XRC |
                                     IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B |
                                     IBV_DEVICE_MANAGED_FLOW_STEERING;  // raw packet QPs' flows

constexpr uint32_t kPortCapFlags = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;  // what a RoCE port reports
constexpr uint8_t kActiveWidth4x = 2;                                         // IBV_WIDTH_4X
constexpr uint8_t kActiveSpeed25G = 32;                                       // EDR, 25 Gb/s per lane
constexpr uint8_t kPhysStateLinkUp = 5;

void fill_port_attr(ibv_port_attr& a) {
  a = ibv_port_attr{};
  a.state = IBV_PORT_ACTIVE;
  a.max_mtu = static_cast<ibv_mtu>(limits::kMtu);
  a.active_mtu = static_cast<ibv_mtu>(engine::mtu_enum(engine::device_info().active_mtu_bytes));
  a.gid_tbl_len = limits::kGidTableLen;
  a.port_cap_flags = kPortCapFlags;
  a.max_msg_sz = limits::kMaxMsgSize;
  a.bad_pkey_cntr = 0;
  a.qkey_viol_cntr = 0;
  a.pkey_tbl_len = limits::kMaxPkeys;
  a.lid = 0;
  a.sm_lid = 0;
  a.lmc = 0;
  a.max_vl_num = 1;  // VL0 only
  a.sm_sl = 0;
  a.subnet_timeout = 0;
  a.init_type_reply = 0;
  a.active_width = kActiveWidth4x;
  a.active_speed = kActiveSpeed25G;
  a.phys_state = kPhysStateLinkUp;
  a.link_layer = IBV_LINK_LAYER_ETHERNET;
  a.flags = 0;
  a.port_cap_flags2 = 0;
}

void fill_device_attr(ibv_device_attr& d) {
  const engine::DeviceInfo& info = engine::device_info();
  d = ibv_device_attr{};
  std::strncpy(d.fw_ver, kFirmwareVersion, sizeof d.fw_ver - 1);
  d.node_guid = htobe64(info.node_guid);
  d.sys_image_guid = htobe64(info.sys_image_guid);
  d.max_mr_size = limits::kMaxMrSize;
  d.page_size_cap = limits::kPageSizeCap;
  d.vendor_id = limits::kVendorId;
  d.vendor_part_id = limits::kVendorPartId;
  d.hw_ver = limits::kHwVersion;
  d.max_qp = limits::kMaxQp;
  d.max_qp_wr = limits::kMaxQpWr;
  d.device_cap_flags = kDeviceCapFlags;
  d.max_sge = limits::kMaxSge;
  d.max_sge_rd = limits::kMaxSgeRd;
  d.max_cq = limits::kMaxCq;
  d.max_cqe = limits::kMaxCqe;
  d.max_mr = limits::kMaxMr;
  d.max_pd = limits::kMaxPd;
  d.max_qp_rd_atom = limits::kMaxQpRdAtom;
  d.max_ee_rd_atom = 0;
  d.max_res_rd_atom = limits::kMaxResRdAtom;
  d.max_qp_init_rd_atom = limits::kMaxQpInitRdAtom;
  d.max_ee_init_rd_atom = 0;
  d.atomic_cap = IBV_ATOMIC_HCA;
  d.max_ee = 0;
  d.max_rdd = 0;
  d.max_mw = limits::kMaxMw;
  d.max_raw_ipv6_qp = 0;
  d.max_raw_ethy_qp = 0;
  d.max_mcast_grp = limits::kMaxMcastGrp;
  d.max_mcast_qp_attach = limits::kMaxMcastQpAttach;
  d.max_total_mcast_qp_attach = limits::kMaxTotalMcastQpAttach;
  d.max_ah = limits::kMaxAh;
  d.max_fmr = 0;
  d.max_map_per_fmr = 0;
  d.max_srq = limits::kMaxSrq;
  d.max_srq_wr = limits::kMaxSrqWr;
  d.max_srq_sge = limits::kMaxSrqSge;
  d.max_pkeys = limits::kMaxPkeys;
  d.local_ca_ack_delay = static_cast<uint8_t>(limits::kLocalCaAckDelay);
  d.phys_port_cnt = static_cast<uint8_t>(limits::kPhysPortCnt);
}

void fill_device_attr_ex(ibv_device_attr_ex& x) {
  x = ibv_device_attr_ex{};
  fill_device_attr(x.orig_attr);
  // On-demand paging: softhca never pins memory, it reaches registered memory
  // when an operation runs, so every transport's operations work on ODP MRs,
  // implicit ones (the whole address space) included.
  constexpr uint32_t kConnectedOdp = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
                                     IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
  x.odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
  x.odp_caps.per_transport_caps.rc_odp_caps = kConnectedOdp;
  x.odp_caps.per_transport_caps.uc_odp_caps =
      IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV;
  x.odp_caps.per_transport_caps.ud_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
  x.xrc_odp_caps = kConnectedOdp & ~uint32_t{IBV_ODP_SUPPORT_RECV};  // XRC receives into SRQs only
  // Tag matching SRQs (RC QPs on this host: the shm link).
  x.tm_caps.max_rndv_hdr_size = limits::kTmMaxRndvHdrSize;
  x.tm_caps.max_num_tags = limits::kTmMaxNumTags;
  x.tm_caps.flags = IBV_TM_CAP_RC;
  x.tm_caps.max_ops = limits::kTmMaxOps;
  x.tm_caps.max_sge = limits::kTmMaxSge;
  x.max_dm_size = limits::kMaxDmSize;
  // No TSO, RSS, WQs, packet pacing, raw packet, tag matching, CQ moderation
  // or PCI atomics: all zero.
  x.comp_mask = 0;
  // Completion timestamps count the host's monotonic clock in ns: a 1 GHz
  // (1,000,000 kHz) clock that does not wrap in practice.
  x.completion_timestamp_mask = UINT64_MAX;
  x.hca_core_clock = 1'000'000;
  x.device_cap_flags_ex = kDeviceCapFlags;
  x.phys_port_cnt_ex = static_cast<uint32_t>(limits::kPhysPortCnt);
  // RSS over receive work queues (wq.cpp): raw packet QPs, Toeplitz.
  x.rss_caps.supported_qpts = 1u << IBV_QPT_RAW_PACKET;
  x.rss_caps.max_rwq_indirection_tables = static_cast<uint32_t>(limits::kMaxQp);
  x.rss_caps.max_rwq_indirection_table_size = 256;
  x.rss_caps.rx_hash_fields_mask = engine::kRxHashFields;
  x.rss_caps.rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ;
  x.max_wq_type_rq = static_cast<uint32_t>(limits::kMaxQp);
}

// Writes `size` bytes at dst: the first min(size, sizeof src) from src, zeros after.
void copy_out(void* dst, std::size_t size, const void* src, std::size_t src_size) {
  const std::size_t n = std::min(size, src_size);
  std::memcpy(dst, src, n);
  if (size > n) std::memset(static_cast<char*>(dst) + n, 0, size - n);
}

// 0, EINVAL (bad port or index out of the table) or ENODATA (empty index).
int lookup_gid(ibv_context* context, uint32_t port_num, uint32_t index, ibv_gid_entry& entry) {
  if (context == nullptr || port_num != kPort) return EINVAL;
  if (index >= static_cast<uint32_t>(limits::kGidTableLen)) return EINVAL;
  const engine::GidEntry* gid = engine::device_info().gid_at(index);
  if (gid == nullptr) return ENODATA;
  entry = ibv_gid_entry{};
  std::memcpy(entry.gid.raw, gid->raw.data(), sizeof entry.gid.raw);
  entry.gid_index = index;
  entry.port_num = port_num;
  entry.gid_type = static_cast<uint32_t>(gid->type);
  entry.ndev_ifindex = gid->ifindex;
  return 0;
}

// For the verbs that answer -1 + errno.
int fail_errno(int error) {
  errno = error;
  return -1;
}

template <typename Fn>
int minus_one_verb(Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return fail_errno(ENOMEM);
  } catch (...) {
    return fail_errno(EIO);
  }
}

}  // namespace

int query_port_op(ibv_context* context, uint8_t port_num, ibv_port_attr* port_attr, size_t port_attr_len) {
  return int_verb([&] {
    if (context == nullptr || port_attr == nullptr) return EINVAL;
    if (port_num != kPort) return EINVAL;
    ibv_port_attr attr;
    fill_port_attr(attr);
    copy_out(port_attr, port_attr_len, &attr, sizeof attr);
    return 0;
  });
}

int query_device_ex_op(ibv_context* context, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                       size_t attr_size) {
  return int_verb([&] {
    if (context == nullptr || attr == nullptr) return EINVAL;
    if (input != nullptr && input->comp_mask != 0) return EINVAL;
    if (attr_size < sizeof(ibv_device_attr)) return EINVAL;
    ibv_device_attr_ex full;
    fill_device_attr_ex(full);
    copy_out(attr, attr_size, &full, sizeof full);
    return 0;
  });
}

int query_rt_values_op(ibv_context* context, ibv_values_ex* values) {
  return int_verb([&] {
    if (context == nullptr || values == nullptr) return EINVAL;
    if ((values->comp_mask & ~static_cast<uint32_t>(IBV_VALUES_MASK_RAW_CLOCK)) != 0) return EINVAL;
    const uint32_t asked = values->comp_mask;
    values->comp_mask = 0;
    if ((asked & IBV_VALUES_MASK_RAW_CLOCK) != 0) {
      const uint64_t now = engine::completion_clock_ns();
      values->raw_clock.tv_sec = static_cast<time_t>(now / 1'000'000'000ULL);
      values->raw_clock.tv_nsec = static_cast<long>(now % 1'000'000'000ULL);
      values->comp_mask |= IBV_VALUES_MASK_RAW_CLOCK;
    }
    return 0;
  });
}

}  // namespace softhca::abi

using softhca::abi::fail_errno;
using softhca::abi::kCompatPortAttrSize;
using softhca::abi::lookup_gid;
using softhca::abi::minus_one_verb;

extern "C" {

int ibv_query_device(ibv_context* context, ibv_device_attr* device_attr) {
  return softhca::abi::int_verb([&] {
    if (context == nullptr || device_attr == nullptr) return EINVAL;
    softhca::abi::fill_device_attr(*device_attr);
    return 0;
  });
}

// The exported symbol (IBVERBS_1.1): old binaries and the inline wrapper's
// fallback pass a 48-byte struct _compat_ibv_port_attr; write only that much.
int ibv_query_port(ibv_context* context, uint8_t port_num, _compat_ibv_port_attr* port_attr) {
  return softhca::abi::query_port_op(context, port_num, reinterpret_cast<ibv_port_attr*>(port_attr),
                                     kCompatPortAttrSize);
}

int ibv_query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
  return minus_one_verb([&] {
    if (gid == nullptr || index < 0) return fail_errno(EINVAL);
    ibv_gid_entry entry;
    const int err = lookup_gid(context, port_num, static_cast<uint32_t>(index), entry);
    if (err == ENODATA) {  // an empty index reads as the zero GID
      std::memset(gid, 0, sizeof *gid);
      return 0;
    }
    if (err != 0) return fail_errno(err);
    std::memcpy(gid, &entry.gid, sizeof *gid);
    return 0;
  });
}

int _ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
                      uint32_t flags, size_t entry_size) {
  return softhca::abi::int_verb([&] {
    if (flags != 0 || entry == nullptr || entry_size < sizeof(ibv_gid_entry)) return EINVAL;
    ibv_gid_entry found;
    const int err = lookup_gid(context, port_num, gid_index, found);
    if (err != 0) return err;
    softhca::abi::copy_out(entry, entry_size, &found, sizeof found);
    return 0;
  });
}

// -errno, with errno set as well.
ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries, uint32_t flags,
                             size_t entry_size) {
  const auto fail = [](int err) -> ssize_t {
    errno = err;
    return -err;
  };
  try {
    if (context == nullptr || flags != 0 || entry_size == 0 || max_entries == 0) return fail(EINVAL);
    if (entries == nullptr) return fail(EINVAL);
    size_t count = 0;
    for (uint32_t i = 0; i < static_cast<uint32_t>(softhca::limits::kGidTableLen); ++i) {
      ibv_gid_entry entry;
      if (lookup_gid(context, 1, i, entry) != 0) continue;
      if (count == max_entries) return fail(EINVAL);  // the buffer is too small for the table
      softhca::abi::copy_out(reinterpret_cast<char*>(entries) + count * entry_size, entry_size, &entry, sizeof entry);
      ++count;
    }
    return static_cast<ssize_t>(count);
  } catch (const std::bad_alloc&) {
    return fail(ENOMEM);
  } catch (...) {
    return fail(EIO);
  }
}

int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, ibv_gid_type_sysfs* type) {
  return minus_one_verb([&] {
    if (type == nullptr) return fail_errno(EINVAL);
    ibv_gid_entry entry;
    const int err = lookup_gid(context, port_num, index, entry);
    if (err == ENODATA) {  // an empty index reads as IB/RoCE v1, as in rdma-core
      *type = IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
      return 0;
    }
    if (err != 0) return fail_errno(err);
    *type = entry.gid_type == IBV_GID_TYPE_ROCE_V2 ? IBV_GID_TYPE_SYSFS_ROCE_V2 : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
    return 0;
  });
}

int ibv_query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
  if (context == nullptr || pkey == nullptr || port_num != softhca::abi::kPort) return fail_errno(EINVAL);
  if (index < 0 || index >= softhca::limits::kMaxPkeys) return fail_errno(EINVAL);
  *pkey = htobe16(softhca::limits::kDefaultPkey);
  return 0;
}

int ibv_get_pkey_index(ibv_context* context, uint8_t port_num, __be16 pkey) {
  if (context == nullptr || port_num != softhca::abi::kPort) return fail_errno(EINVAL);
  for (int i = 0; i < softhca::limits::kMaxPkeys; ++i) {
    __be16 entry = 0;
    if (ibv_query_pkey(context, port_num, i, &entry) != 0) return -1;
    if (entry == pkey) return i;
  }
  return fail_errno(ENOENT);
}

}  // extern "C"
