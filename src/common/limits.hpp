// The limits softhca enforces. ibv_query_device reports exactly these values,
// and every create/modify/post path checks against them. Object counts fail
// the create verb with ENOMEM, as a device at its limit does: QPs and MRs are
// host-wide like a NIC's (the host registry's slot tables, static_asserted
// equal in queue_pair.cpp and memory_region.cpp); CQs, SRQs and PDs per
// process (engine/object_quota.hpp), since they use only its own memory.
#pragma once

#include <cstdint>

namespace softhca::limits {

inline constexpr uint32_t kVendorId = 0xFFFFFF;      // unknown vendor: perftest takes its generic path
inline constexpr uint32_t kVendorPartId = 0;         // not in perftest's table of inline-capable parts
inline constexpr uint32_t kHwVersion = 1;
inline constexpr uint64_t kMaxMrSize = 1ULL << 40;
inline constexpr uint64_t kPageSizeCap = 0xFFFFF000ULL;  // 4 KiB and up
inline constexpr int kMaxQp = 65536;
inline constexpr int kMaxQpWr = 16384;
inline constexpr int kMaxSge = 32;
inline constexpr int kMaxSgeRd = 32;
inline constexpr int kMaxCq = 16384;
inline constexpr int kMaxCqe = (1 << 20) - 1;
inline constexpr int kMaxMr = 65536;
// Memory windows take keys from the MR table, host-wide (one of the two
// runs out first: max_mr and max_mw both say 65536).
inline constexpr int kMaxMw = kMaxMr;
inline constexpr int kMaxPd = 65536;
inline constexpr int kMaxQpRdAtom = 16;
inline constexpr int kMaxQpInitRdAtom = 16;
inline constexpr int kMaxResRdAtom = kMaxQp * kMaxQpRdAtom;
inline constexpr int kMaxSrq = 16384;
inline constexpr int kMaxSrqWr = 16383;  // 2^n - 1: an SRQ keeps one WQE spare (queue_sizes.hpp)
inline constexpr int kMaxSrqSge = 32;
inline constexpr int kMaxAh = 65536;
// Device memory (ibv_alloc_dm), per process: what a ConnectX's MEMIC offers,
// doubled. It is ordinary memory of the process, registered like any MR.
inline constexpr uint32_t kMaxDmSize = 256 * 1024;
inline constexpr uint32_t kMaxInlineData = 256;  // perftest asks for up to 236
inline constexpr uint32_t kMaxMsgSize = 1U << 31;
// Raw packet QPs: a frame holds at least an Ethernet header, and at most a
// jumbo frame's 9000-byte payload behind an Ethernet header with two VLAN tags.
inline constexpr uint32_t kMinRawFrame = 14;
inline constexpr uint32_t kMaxRawFrame = 9000 + 14 + 8;
inline constexpr uint16_t kMaxPkeys = 1;
inline constexpr uint16_t kDefaultPkey = 0xFFFF;
inline constexpr int kNumCompVectors = 1;
inline constexpr int kGidTableLen = 32;
// Multicast groups live in the host registry's fixed table (host_registry.hpp).
inline constexpr int kMaxMcastGrp = 256;
inline constexpr int kMaxMcastQpAttach = 32;
inline constexpr int kMaxTotalMcastQpAttach = kMaxMcastGrp * kMaxMcastQpAttach;
inline constexpr int kPhysPortCnt = 1;
inline constexpr int kMtu = 5;           // IBV_MTU_4096
inline constexpr uint32_t kMtuBytes = 4096;
inline constexpr uint32_t kUdGrhBytes = 40;
inline constexpr uint32_t kLocalCaAckDelay = 15;
// Tag matching SRQs (ibv_query_device_ex's tm_caps): the tag list lives in
// the SRQ's shared memory, max_num_tags entries of kTmMaxSge SGEs each.
inline constexpr uint32_t kTmMaxNumTags = 1023;
inline constexpr uint32_t kTmMaxOps = 1024;      // ops per ibv_post_srq_ops call
inline constexpr uint32_t kTmMaxSge = 1;
inline constexpr uint32_t kTmMaxRndvHdrSize = 64;  // TMH + RVH + 32 bytes the sender may add

}  // namespace softhca::limits
