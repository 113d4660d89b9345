#include "wire/ud_grh.hpp"

#include <arpa/inet.h>

#include <cstring>

namespace softhca::wire {

void build_ud_grh(unsigned char* grh, const uint8_t* sgid, const uint8_t* dgid, uint32_t payload,
                  uint8_t traffic_class, uint8_t hop_limit, uint32_t flow_label) {
  std::memset(grh, 0, kUdGrhBytes);
  static constexpr uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  const bool v4 = std::memcmp(sgid, kMappedPrefix, 12) == 0 && std::memcmp(dgid, kMappedPrefix, 12) == 0;
  // UDP (8) + BTH (12) + DETH (8) + payload + ICRC (4): what the wire packet would carry.
  const uint32_t udp_len = 8 + 12 + 8 + payload + 4;
  if (v4) {
    unsigned char* ip = grh + 20;
    ip[0] = 0x45;
    ip[1] = traffic_class;
    const uint16_t total = htons(static_cast<uint16_t>(20 + udp_len));
    std::memcpy(ip + 2, &total, 2);
    ip[6] = 0x40;  // don't fragment
    ip[8] = hop_limit ? hop_limit : 64;
    ip[9] = 17;  // UDP
    std::memcpy(ip + 12, sgid + 12, 4);
    std::memcpy(ip + 16, dgid + 12, 4);
    uint32_t sum = 0;
    for (int i = 0; i < 20; i += 2) sum += (ip[i] << 8) | ip[i + 1];
    while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
    const uint16_t check = htons(static_cast<uint16_t>(~sum));
    std::memcpy(ip + 10, &check, 2);
  } else {
    const uint32_t vtf = htonl((6u << 28) | (uint32_t{traffic_class} << 20) | (flow_label & kFlowLabelMask));
    std::memcpy(grh, &vtf, 4);
    const uint16_t plen = htons(static_cast<uint16_t>(udp_len));
    std::memcpy(grh + 4, &plen, 2);
    grh[6] = 17;
    grh[7] = hop_limit ? hop_limit : 64;
    std::memcpy(grh + 8, sgid, 16);
    std::memcpy(grh + 24, dgid, 16);
  }
}

uint8_t ud_grh_header_type(const unsigned char* grh) {
  // build_ud_grh leaves the first 20 bytes zero before an IPv4 header; an
  // IPv6 header starts with version 6 there.
  return (grh[20] >> 4) == 4 && (grh[0] >> 4) != 6 ? kRoceHeaderIpv4 : kRoceHeaderIpv6;
}

bool is_multicast_gid(const uint8_t* gid) {
  static constexpr uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (gid[0] == 0xff) return true;
  return std::memcmp(gid, kMappedPrefix, 12) == 0 && (gid[12] & 0xF0) == 0xE0;
}

}  // namespace softhca::wire
