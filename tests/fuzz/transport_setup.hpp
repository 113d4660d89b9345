// What the operand bytes of a transport_flows_fuzz.cpp script stand for:
// the configuration of the connection, and the addresses, keys and lengths
// a step names, each chosen from a few classes (at the registered range's
// edges, just outside it, a key of another PD, one MTU and a byte more...)
// so that a random byte lands on a case worth trying far more often than a
// raw value would.
#pragma once

#include <algorithm>
#include <cstdint>

#include "checked_port.hpp"
#include "transport/psn.hpp"
#include "transport/requester_flow.hpp"
#include "transport/responder_flow.hpp"
#include "transport_script.hpp"

namespace softhca::fuzz {

inline constexpr uint32_t kRequesterQpn = 0x100;
inline constexpr uint32_t kResponderQpn = 0x200;
inline constexpr uint64_t kMaxLength = 9000;  // a few packets at any MTU

struct Setup {
  bool reliable = true;
  uint32_t mtu = 1024;
  transport::RequesterConfig requester;
  transport::ResponderConfig responder;
  uint32_t min_rnr_timer = 0;
  uint32_t access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
};

inline Setup read_setup(script::Reader& in) {
  uint8_t c[script::kConfigBytes];
  for (uint8_t& b : c) b = in.u8();
  Setup s;
  s.mtu = (c[0] & 3) == 3 ? 4096 : 256U << (c[0] & 3);
  s.reliable = (c[0] & 4) == 0;
  uint32_t psn = 0;
  switch (c[2] % 4) {
    case 0:
      psn = transport::kPsnMask - c[3];
      break;
    case 1:
      psn = c[3] | c[4] << 8 | c[5] << 16;
      break;
    case 2:
      psn = 0;
      break;
    default:
      psn = 0x1000;
      break;
  }
  s.requester.dest_qpn = kResponderQpn;
  s.requester.mtu = s.mtu;
  s.requester.reliable = s.reliable;
  s.requester.start_psn = psn;
  s.requester.retry_cnt = static_cast<uint8_t>((c[0] >> 3) & 7);
  s.requester.rnr_retry = static_cast<uint8_t>(c[1] & 7);
  s.requester.timeout = static_cast<uint8_t>(c[1] >> 3);
  s.responder.peer_qpn = kRequesterQpn;
  s.responder.mtu = s.mtu;
  s.responder.reliable = s.reliable;
  s.responder.start_psn = psn;
  s.responder.resources = 1 + (c[6] & 7);
  // Paired as applications pair them: no more READs and atomics out at once
  // than the responder keeps to answer again.
  s.requester.max_rd_atomic = s.responder.resources;
  s.min_rnr_timer = c[6] >> 3;
  // Both ends recover selectively (each uses it once the other's marks show).
  s.requester.selective = s.responder.selective = (c[2] & 0x10) != 0;
  if (c[7] & 0x80) {
    s.access = ((c[7] & 1) ? IBV_ACCESS_REMOTE_WRITE : 0) | ((c[7] & 2) ? IBV_ACCESS_REMOTE_READ : 0) |
               ((c[7] & 4) ? IBV_ACCESS_REMOTE_ATOMIC : 0);
  }
  return s;
}

// An address on the responder's side: at the registered range's edges,
// inside it (aligned or not), or outside.
inline uint64_t remote_address(uint8_t kind, uint16_t offset, uint64_t length) {
  constexpr uint64_t kEnd = transport::kIova + CheckedPort::kRegistered;
  switch (kind % 8) {
    case 0:
      return transport::kIova;
    case 1:
      return transport::kIova + ((offset % CheckedPort::kRegistered) & ~uint64_t{7});
    case 2:
      return kEnd - std::min<uint64_t>(length, CheckedPort::kRegistered);
    case 3:
      return kEnd - std::min<uint64_t>(length, CheckedPort::kRegistered) + 1 + offset % 8;
    case 4:
      return transport::kIova - 1 - offset % 64;
    case 5:
      return uint64_t{offset} << 48 | offset;
    case 6:
      return transport::kIova + offset % CheckedPort::kRegistered;
    default:
      return kEnd - 8 * (1 + offset % 4);
  }
}

inline uint32_t rkey_of(uint8_t kind) {
  switch (kind % 8) {
    case 5:
      return transport::kReadOnlyKey;
    case 6:
      return transport::kOtherPdKey;
    case 7:
      return 0xDEAD;
    default:
      return transport::kKey;
  }
}

inline uint64_t length_of(uint8_t kind, uint16_t extra, uint32_t mtu) {
  uint64_t n = 0;
  switch (kind % 8) {
    case 0:
      n = 0;
      break;
    case 1:
      n = 1 + extra % 32;
      break;
    case 2:
      n = mtu - 1;
      break;
    case 3:
      n = mtu;
      break;
    case 4:
      n = mtu + 1;
      break;
    case 5:
      n = 2 * uint64_t{mtu} + extra % mtu;
      break;
    case 6:
      n = 8;
      break;
    default:
      n = extra % (kMaxLength + 1);
      break;
  }
  return std::min(n, kMaxLength);
}

}  // namespace softhca::fuzz
