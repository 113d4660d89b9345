#include "cm/mad_codec.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace softhca::cm {
namespace {

// Field access inside the CM payload. Offsets are payload offsets (the MAD
// header is added here); bit fields are numbered from the most significant bit
// of their byte, as IBTA and the kernel's ibta_vol1_c12.h do.
class Writer {
 public:
  explicit Writer(MadBytes& out) : p_(out.data() + kMadHeaderSize) {}
  void u8(std::size_t off, uint8_t v) { p_[off] = v; }
  void u16(std::size_t off, uint16_t v) {
    p_[off] = static_cast<uint8_t>(v >> 8);
    p_[off + 1] = static_cast<uint8_t>(v);
  }
  void u24(std::size_t off, uint32_t v) {
    p_[off] = static_cast<uint8_t>(v >> 16);
    p_[off + 1] = static_cast<uint8_t>(v >> 8);
    p_[off + 2] = static_cast<uint8_t>(v);
  }
  void u32(std::size_t off, uint32_t v) {
    u16(off, static_cast<uint16_t>(v >> 16));
    u16(off + 2, static_cast<uint16_t>(v));
  }
  void u64(std::size_t off, uint64_t v) {
    u32(off, static_cast<uint32_t>(v >> 32));
    u32(off + 4, static_cast<uint32_t>(v));
  }
  // `width` bits starting `bit` bits below the byte's most significant bit.
  void bits(std::size_t off, int bit, int width, unsigned v) {
    const unsigned shift = static_cast<unsigned>(8 - bit - width);
    const unsigned mask = ((1U << width) - 1U) << shift;
    p_[off] = static_cast<uint8_t>((p_[off] & ~mask) | ((v << shift) & mask));
  }
  void bytes(std::size_t off, std::span<const uint8_t> src) { std::memcpy(p_ + off, src.data(), src.size()); }

 private:
  uint8_t* p_;
};

class Reader {
 public:
  explicit Reader(const uint8_t* mad) : p_(mad + kMadHeaderSize) {}
  uint8_t u8(std::size_t off) const { return p_[off]; }
  uint16_t u16(std::size_t off) const { return static_cast<uint16_t>((p_[off] << 8) | p_[off + 1]); }
  uint32_t u24(std::size_t off) const {
    return (uint32_t{p_[off]} << 16) | (uint32_t{p_[off + 1]} << 8) | p_[off + 2];
  }
  uint32_t u32(std::size_t off) const { return (uint32_t{u16(off)} << 16) | u16(off + 2); }
  uint64_t u64(std::size_t off) const { return (uint64_t{u32(off)} << 32) | u32(off + 4); }
  unsigned bits(std::size_t off, int bit, int width) const {
    return (p_[off] >> (8 - bit - width)) & ((1U << width) - 1U);
  }
  template <std::size_t N>
  void bytes(std::size_t off, std::array<uint8_t, N>& dst) const {
    std::memcpy(dst.data(), p_ + off, N);
  }

 private:
  const uint8_t* p_;
};

void encode_payload(Writer& w, const ReqMsg& m) {
  w.u32(0, m.local_comm_id);
  w.u24(5, m.vendor_id);
  w.u64(8, m.service_id);
  w.u64(16, m.local_ca_guid);
  w.u32(28, m.local_qkey);
  w.u24(32, m.local_qpn);
  w.u8(35, m.responder_resources);
  w.u24(36, m.local_eecn);
  w.u8(39, m.initiator_depth);
  w.u24(40, m.remote_eecn);
  w.bits(43, 0, 5, m.remote_cm_response_timeout);
  w.bits(43, 5, 2, static_cast<unsigned>(m.transport));
  w.bits(43, 7, 1, m.end_to_end_flow_control ? 1 : 0);
  w.u24(44, m.starting_psn);
  w.bits(47, 0, 5, m.local_cm_response_timeout);
  w.bits(47, 5, 3, m.retry_count);
  w.u16(48, m.pkey);
  w.bits(50, 0, 4, m.path_mtu);
  w.bits(50, 4, 1, m.rdc_exists ? 1 : 0);
  w.bits(50, 5, 3, m.rnr_retry_count);
  w.bits(51, 0, 4, m.max_cm_retries);
  w.bits(51, 4, 1, m.srq ? 1 : 0);
  w.bits(51, 5, 3, m.extended_transport);
  w.u16(52, m.primary_local_lid);
  w.u16(54, m.primary_remote_lid);
  w.bytes(56, m.primary_local_gid);
  w.bytes(72, m.primary_remote_gid);
  // Flow label: the top 20 bits of the 32-bit word at 88; packet rate: the
  // low 6 bits of byte 91.
  w.u32(88, (m.primary_flow_label & 0xFFFFF) << 12);
  w.bits(91, 2, 6, m.primary_packet_rate);
  w.u8(92, m.primary_traffic_class);
  w.u8(93, m.primary_hop_limit);
  w.bits(94, 0, 4, m.primary_sl);
  w.bits(94, 4, 1, m.primary_subnet_local ? 1 : 0);
  w.bits(95, 0, 5, m.primary_local_ack_timeout);
  // 96..139: the alternate path, always absent (zero).
  w.bytes(140, m.private_data);
}

void decode_payload(const Reader& r, ReqMsg& m) {
  m.local_comm_id = r.u32(0);
  m.vendor_id = r.u24(5);
  m.service_id = r.u64(8);
  m.local_ca_guid = r.u64(16);
  m.local_qkey = r.u32(28);
  m.local_qpn = r.u24(32);
  m.responder_resources = r.u8(35);
  m.local_eecn = r.u24(36);
  m.initiator_depth = r.u8(39);
  m.remote_eecn = r.u24(40);
  m.remote_cm_response_timeout = static_cast<uint8_t>(r.bits(43, 0, 5));
  m.transport = static_cast<TransportType>(r.bits(43, 5, 2));
  m.end_to_end_flow_control = r.bits(43, 7, 1) != 0;
  m.starting_psn = r.u24(44);
  m.local_cm_response_timeout = static_cast<uint8_t>(r.bits(47, 0, 5));
  m.retry_count = static_cast<uint8_t>(r.bits(47, 5, 3));
  m.pkey = r.u16(48);
  m.path_mtu = static_cast<uint8_t>(r.bits(50, 0, 4));
  m.rdc_exists = r.bits(50, 4, 1) != 0;
  m.rnr_retry_count = static_cast<uint8_t>(r.bits(50, 5, 3));
  m.max_cm_retries = static_cast<uint8_t>(r.bits(51, 0, 4));
  m.srq = r.bits(51, 4, 1) != 0;
  m.extended_transport = static_cast<uint8_t>(r.bits(51, 5, 3));
  m.primary_local_lid = r.u16(52);
  m.primary_remote_lid = r.u16(54);
  r.bytes(56, m.primary_local_gid);
  r.bytes(72, m.primary_remote_gid);
  m.primary_flow_label = r.u32(88) >> 12;
  m.primary_packet_rate = static_cast<uint8_t>(r.bits(91, 2, 6));
  m.primary_traffic_class = r.u8(92);
  m.primary_hop_limit = r.u8(93);
  m.primary_sl = static_cast<uint8_t>(r.bits(94, 0, 4));
  m.primary_subnet_local = r.bits(94, 4, 1) != 0;
  m.primary_local_ack_timeout = static_cast<uint8_t>(r.bits(95, 0, 5));
  r.bytes(140, m.private_data);
}

void encode_payload(Writer& w, const RepMsg& m) {
  w.u32(0, m.local_comm_id);
  w.u32(4, m.remote_comm_id);
  w.u32(8, m.local_qkey);
  w.u24(12, m.local_qpn);
  w.u8(15, static_cast<uint8_t>(m.vendor_id >> 16));
  w.u24(16, m.local_eecn);
  w.u8(19, static_cast<uint8_t>(m.vendor_id >> 8));
  w.u24(20, m.starting_psn);
  w.u8(23, static_cast<uint8_t>(m.vendor_id));
  w.u8(24, m.responder_resources);
  w.u8(25, m.initiator_depth);
  w.bits(26, 0, 5, m.target_ack_delay);
  w.bits(26, 5, 2, m.failover_accepted);
  w.bits(26, 7, 1, m.end_to_end_flow_control ? 1 : 0);
  w.bits(27, 0, 3, m.rnr_retry_count);
  w.bits(27, 3, 1, m.srq ? 1 : 0);
  w.u64(28, m.local_ca_guid);
  w.bytes(36, m.private_data);
}

void decode_payload(const Reader& r, RepMsg& m) {
  m.local_comm_id = r.u32(0);
  m.remote_comm_id = r.u32(4);
  m.local_qkey = r.u32(8);
  m.local_qpn = r.u24(12);
  m.vendor_id = (uint32_t{r.u8(15)} << 16) | (uint32_t{r.u8(19)} << 8) | r.u8(23);
  m.local_eecn = r.u24(16);
  m.starting_psn = r.u24(20);
  m.responder_resources = r.u8(24);
  m.initiator_depth = r.u8(25);
  m.target_ack_delay = static_cast<uint8_t>(r.bits(26, 0, 5));
  m.failover_accepted = static_cast<uint8_t>(r.bits(26, 5, 2));
  m.end_to_end_flow_control = r.bits(26, 7, 1) != 0;
  m.rnr_retry_count = static_cast<uint8_t>(r.bits(27, 0, 3));
  m.srq = r.bits(27, 3, 1) != 0;
  m.local_ca_guid = r.u64(28);
  r.bytes(36, m.private_data);
}

void encode_payload(Writer& w, const RejMsg& m) {
  w.u32(0, m.local_comm_id);
  w.u32(4, m.remote_comm_id);
  w.bits(8, 0, 2, static_cast<unsigned>(m.message_rejected));
  w.bits(9, 0, 7, m.ari_length);
  w.u16(10, m.reason);
  w.bytes(12, m.ari);
  w.bytes(84, m.private_data);
}

void decode_payload(const Reader& r, RejMsg& m) {
  m.local_comm_id = r.u32(0);
  m.remote_comm_id = r.u32(4);
  m.message_rejected = static_cast<RejectedMessage>(r.bits(8, 0, 2));
  m.ari_length = static_cast<uint8_t>(std::min<unsigned>(r.bits(9, 0, 7), kRejAriSize));
  m.reason = r.u16(10);
  r.bytes(12, m.ari);
  r.bytes(84, m.private_data);
}

void encode_payload(Writer& w, const RtuMsg& m) {
  w.u32(0, m.local_comm_id);
  w.u32(4, m.remote_comm_id);
  w.bytes(8, m.private_data);
}

void decode_payload(const Reader& r, RtuMsg& m) {
  m.local_comm_id = r.u32(0);
  m.remote_comm_id = r.u32(4);
  r.bytes(8, m.private_data);
}

void encode_payload(Writer& w, const DreqMsg& m) {
  w.u32(0, m.local_comm_id);
  w.u32(4, m.remote_comm_id);
  w.u24(8, m.remote_qpn);
  w.bytes(12, m.private_data);
}

void decode_payload(const Reader& r, DreqMsg& m) {
  m.local_comm_id = r.u32(0);
  m.remote_comm_id = r.u32(4);
  m.remote_qpn = r.u24(8);
  r.bytes(12, m.private_data);
}

void encode_payload(Writer& w, const DrepMsg& m) {
  w.u32(0, m.local_comm_id);
  w.u32(4, m.remote_comm_id);
  w.bytes(8, m.private_data);
}

void decode_payload(const Reader& r, DrepMsg& m) {
  m.local_comm_id = r.u32(0);
  m.remote_comm_id = r.u32(4);
  r.bytes(8, m.private_data);
}

void encode_payload(Writer& w, const MraMsg& m) {
  w.u32(0, m.local_comm_id);
  w.u32(4, m.remote_comm_id);
  w.bits(8, 0, 2, static_cast<unsigned>(m.message_mraed));
  w.bits(9, 0, 5, m.service_timeout);
  w.bytes(10, m.private_data);
}

void decode_payload(const Reader& r, MraMsg& m) {
  m.local_comm_id = r.u32(0);
  m.remote_comm_id = r.u32(4);
  m.message_mraed = static_cast<MraedMessage>(r.bits(8, 0, 2));
  m.service_timeout = static_cast<uint8_t>(r.bits(9, 0, 5));
  r.bytes(10, m.private_data);
}

void encode_payload(Writer& w, const SidrReqMsg& m) {
  w.u32(0, m.request_id);
  w.u16(4, m.pkey);
  w.u64(8, m.service_id);
  w.bytes(16, m.private_data);
}

void decode_payload(const Reader& r, SidrReqMsg& m) {
  m.request_id = r.u32(0);
  m.pkey = r.u16(4);
  m.service_id = r.u64(8);
  r.bytes(16, m.private_data);
}

void encode_payload(Writer& w, const SidrRepMsg& m) {
  w.u32(0, m.request_id);
  w.u8(4, m.status);
  w.u8(5, m.add_info_length);
  w.u16(6, static_cast<uint16_t>(m.vendor_id >> 8));
  w.u24(8, m.qpn);
  w.u8(11, static_cast<uint8_t>(m.vendor_id));
  w.u64(12, m.service_id);
  w.u32(20, m.qkey);
  w.bytes(24, m.add_info);
  w.bytes(96, m.private_data);
}

void decode_payload(const Reader& r, SidrRepMsg& m) {
  m.request_id = r.u32(0);
  m.status = r.u8(4);
  m.add_info_length = static_cast<uint8_t>(std::min<unsigned>(r.u8(5), kSidrRepAddInfoSize));
  m.vendor_id = (uint32_t{r.u16(6)} << 8) | r.u8(11);
  m.qpn = r.u24(8);
  m.service_id = r.u64(12);
  m.qkey = r.u32(20);
  r.bytes(24, m.add_info);
  r.bytes(96, m.private_data);
}

template <typename T>
Mad decode_as(const uint8_t* bytes, uint64_t tid) {
  T m;
  decode_payload(Reader(bytes), m);
  return Mad{tid, CmMessage(std::move(m))};
}

uint16_t load16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
uint64_t load64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

AttrId attr_id_of(const CmMessage& msg) {
  static constexpr AttrId kIds[] = {AttrId::kReq,  AttrId::kRep,  AttrId::kRej,     AttrId::kRtu,
                                    AttrId::kDreq, AttrId::kDrep, AttrId::kSidrReq, AttrId::kSidrRep, AttrId::kMra};
  static_assert(std::variant_size_v<CmMessage> == std::size(kIds));
  return kIds[msg.index()];
}

const char* message_name(const CmMessage& msg) {
  static constexpr const char* kNames[] = {"REQ", "REP", "REJ", "RTU", "DREQ", "DREP", "SIDR_REQ", "SIDR_REP", "MRA"};
  static_assert(std::variant_size_v<CmMessage> == std::size(kNames));
  return kNames[msg.index()];
}

MadBytes encode(const Mad& mad) {
  MadBytes out{};
  out[0] = kMadBaseVersion;
  out[1] = kMgmtClassCm;
  out[2] = kCmClassVersion;
  out[3] = kMadMethodSend;
  // status (2) and class-specific (2) stay zero.
  for (int i = 0; i < 8; ++i) out[8 + i] = static_cast<uint8_t>(mad.tid >> (56 - 8 * i));
  const auto attr = static_cast<uint16_t>(attr_id_of(mad.msg));
  out[16] = static_cast<uint8_t>(attr >> 8);
  out[17] = static_cast<uint8_t>(attr);
  // reserved (2) and attribute modifier (4) stay zero.
  Writer w(out);
  std::visit([&w](const auto& m) { encode_payload(w, m); }, mad.msg);
  return out;
}

Result<Mad> decode(std::span<const uint8_t> bytes) {
  if (bytes.size() != kMadSize) return fail(std::errc::invalid_argument);
  const uint8_t* b = bytes.data();
  if (b[0] != kMadBaseVersion || b[1] != kMgmtClassCm || b[2] != kCmClassVersion || b[3] != kMadMethodSend)
    return fail(std::errc::invalid_argument);
  const uint64_t tid = load64(b + 8);
  switch (static_cast<AttrId>(load16(b + 16))) {
    case AttrId::kReq: return decode_as<ReqMsg>(b, tid);
    case AttrId::kRep: return decode_as<RepMsg>(b, tid);
    case AttrId::kRej: return decode_as<RejMsg>(b, tid);
    case AttrId::kRtu: return decode_as<RtuMsg>(b, tid);
    case AttrId::kDreq: return decode_as<DreqMsg>(b, tid);
    case AttrId::kDrep: return decode_as<DrepMsg>(b, tid);
    case AttrId::kSidrReq: return decode_as<SidrReqMsg>(b, tid);
    case AttrId::kSidrRep: return decode_as<SidrRepMsg>(b, tid);
    case AttrId::kMra: return decode_as<MraMsg>(b, tid);
    case AttrId::kLap:
    case AttrId::kApr: return fail(std::errc::not_supported);
  }
  return fail(std::errc::invalid_argument);
}

void encode_ip_header(const IpHeader& hdr, std::span<uint8_t, kIpHeaderSize> out) {
  std::fill(out.begin(), out.end(), uint8_t{0});
  out[0] = kCmaVersion;
  out[1] = static_cast<uint8_t>(hdr.ip_version << 4);
  out[2] = static_cast<uint8_t>(hdr.src_port >> 8);
  out[3] = static_cast<uint8_t>(hdr.src_port);
  if (hdr.ip_version == 4) {
    std::memcpy(out.data() + 4 + 12, hdr.src.data() + 12, 4);
    std::memcpy(out.data() + 20 + 12, hdr.dst.data() + 12, 4);
  } else {
    std::memcpy(out.data() + 4, hdr.src.data(), 16);
    std::memcpy(out.data() + 20, hdr.dst.data(), 16);
  }
}

Result<IpHeader> decode_ip_header(std::span<const uint8_t, kIpHeaderSize> in) {
  if (in[0] != kCmaVersion) return fail(std::errc::invalid_argument);
  IpHeader hdr;
  hdr.ip_version = static_cast<uint8_t>(in[1] >> 4);
  hdr.src_port = static_cast<uint16_t>((in[2] << 8) | in[3]);
  if (hdr.ip_version == 4) {
    hdr.src[10] = hdr.src[11] = 0xff;
    hdr.dst[10] = hdr.dst[11] = 0xff;
    std::memcpy(hdr.src.data() + 12, in.data() + 4 + 12, 4);
    std::memcpy(hdr.dst.data() + 12, in.data() + 20 + 12, 4);
  } else if (hdr.ip_version == 6) {
    std::memcpy(hdr.src.data(), in.data() + 4, 16);
    std::memcpy(hdr.dst.data(), in.data() + 20, 16);
  } else {
    return fail(std::errc::invalid_argument);
  }
  return hdr;
}

}  // namespace softhca::cm
