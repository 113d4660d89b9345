// What the driver (fuzz_driver.cpp) knows of wire_parse_fuzz.cpp's input: the
// golden packets of the unit tests as seeds, whole IP packets and UDP
// payloads; the bytes that steer the parser (IP version and lengths, opcode,
// pad count and TVer) as the format-aware mutation; and the IP and UDP
// lengths and the ICRC made consistent as the repair, so that the checks
// behind them are reached.
#include <iterator>

#include "fuzz_driver.hpp"
#include "wire/icrc.hpp"
#include "wire/ip_udp.hpp"
#include "wire_golden/golden_packets.hpp"

namespace softhca::fuzz {
namespace {

using wire::kIcrcSize;

std::vector<Bytes> seeds() {
  std::vector<Bytes> out;
  for (const auto& p : wire::golden::kPackets) {
    out.emplace_back(p.ip_packet.begin(), p.ip_packet.end());
    const std::size_t udp = (p.flow.ipv6 ? 40 : 20) + 8;
    out.emplace_back(p.ip_packet.begin() + static_cast<std::ptrdiff_t>(udp), p.ip_packet.end());
  }
  return out;
}

// A byte that steers the parser: IP version, lengths, opcode, pad/TVer.
void tweak(Bytes& b, Random& random) {
  static constexpr std::size_t kSteering[] = {0, 2, 3, 4, 5, 6, 9, 24, 25, 28, 29, 44, 45, 48, 49, 0, 1};
  const std::size_t at = kSteering[random.below(std::size(kSteering))];
  if (at < b.size()) b[at] = random.below(2) ? random.byte() : static_cast<uint8_t>(b[at] ^ (0x10U << random.below(4)));
}

// Rewrites the IP and UDP lengths to the packet's size and stores a valid
// ICRC, where the bytes still look like IPv4 or IPv6.
void make_consistent(Bytes& b) {
  if (b.empty()) return;
  const bool v4 = (b[0] >> 4) == 4;
  const std::size_t ip = v4 ? 20 : 40;
  if (b.size() < ip + 8 || b.size() > 0xFFFF) return;
  const std::size_t udp_length = b.size() - ip;
  if (v4) {
    b[2] = static_cast<uint8_t>(b.size() >> 8);
    b[3] = static_cast<uint8_t>(b.size());
  } else {
    b[4] = static_cast<uint8_t>(udp_length >> 8);
    b[5] = static_cast<uint8_t>(udp_length);
  }
  b[ip + 4] = static_cast<uint8_t>(udp_length >> 8);
  b[ip + 5] = static_cast<uint8_t>(udp_length);
  if (const auto icrc = wire::icrc_of(b)) wire::store_icrc(*icrc, std::span(b).last<kIcrcSize>());
}

}  // namespace

const Target kTarget{"wire_parse", seeds, tweak, make_consistent, nullptr};

}  // namespace softhca::fuzz
