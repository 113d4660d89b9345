// The RoCEv2 packet parser (src/wire) under a fuzzer: libFuzzer's entry
// point, also driven without libFuzzer by fuzz_driver.cpp.
//
// Every input is tried three ways: as a whole IP packet (as a capture holds
// it), and as a UDP payload behind an IPv4 and an IPv6 header image (as the
// udp link receives it). Random bytes almost never carry a valid ICRC, and
// parse() checks the ICRC first, so each UDP payload is tried again with its
// ICRC made valid: that is what reaches the length, pad and opcode checks
// behind it. Beyond "no crash, no UB", a successful parse must keep its
// promises: the sizes add up, the payload lies inside the input, and
// encoding the result gives a packet that parses to the same thing.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "wire/icrc.hpp"
#include "wire/ip_udp.hpp"
#include "wire/packet.hpp"

namespace {

using namespace softhca::wire;

[[noreturn]] void broken(const char* promise) {
  std::fprintf(stderr, "wire_parse_fuzz: broken promise: %s\n", promise);
  std::abort();
}

UdpFlow flow(bool ipv6) {
  UdpFlow f;
  if (ipv6) {
    f.src_gid = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    f.dst_gid = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
  } else {
    f.src_gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 198, 18, 0, 1};
    f.dst_gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 198, 18, 0, 2};
  }
  f.src_port = 49152;
  return f;
}

void check_parsed(const ParsedPacket& p, std::span<const uint8_t> headers, std::span<const uint8_t> udp_payload) {
  if (p.info.header_size + p.payload.size() + p.headers.bth.pad_count + kIcrcSize != udp_payload.size()) {
    broken("headers, payload, pad and ICRC add up to the packet");
  }
  if (p.payload.data() != udp_payload.data() + p.info.header_size) broken("payload follows the headers");
  if (present_headers(p.headers) != p.info.headers) broken("the opcode's extended headers, no others");
  if (p.payload.size() > kMaxPayload) broken("payload within the default path MTU");

  std::vector<uint8_t> again(udp_payload.size());
  const auto n = encode(p.headers, p.payload, headers, again);
  if (!n || *n != udp_payload.size()) broken("what parses, encodes to the same size");
  const auto reparsed = parse(headers, again);
  if (!reparsed || !(reparsed->headers == p.headers)) broken("encode(parse(x)) parses to the same headers");
  if (!std::equal(reparsed->payload.begin(), reparsed->payload.end(), p.payload.begin(), p.payload.end())) {
    broken("encode(parse(x)) parses to the same payload");
  }
}

void parse_as_udp_payload(std::span<const uint8_t> input, bool ipv6) {
  std::array<uint8_t, kIpv6HeaderSize + kUdpHeaderSize> buffer{};
  const auto size = write_ip_udp_headers(flow(ipv6), input.size(), buffer);
  if (!size) return;  // longer than one datagram
  const std::span<const uint8_t> headers(buffer.data(), *size);

  if (const auto r = parse(headers, input)) check_parsed(*r, headers, input);
  if (input.size() < kBthSize + kIcrcSize) {
    if (parse(headers, input).error() != ParseError::kTruncated) broken("short input is truncated");
    return;
  }
  std::vector<uint8_t> sealed(input.begin(), input.end());
  const auto icrc = icrc_of(headers, sealed);
  if (!icrc) broken("ICRC of a consistent header image");
  store_icrc(*icrc, std::span(sealed).last<kIcrcSize>());
  const auto r = parse(headers, sealed);
  if (r) {
    check_parsed(*r, headers, sealed);
  } else if (r.error() == ParseError::kBadIcrc || r.error() == ParseError::kBadIpUdpHeader) {
    broken("a valid ICRC and header image are accepted as such");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::span<const uint8_t> input(data, size);
  if (const auto r = parse_ip_packet(input)) {
    const auto view = split_ip_udp(input);
    if (!view) broken("a parsed IP packet splits");
    check_parsed(*r, view->headers, view->udp_payload);
  }
  parse_as_udp_payload(input, false);
  parse_as_udp_payload(input, true);
  return 0;
}
