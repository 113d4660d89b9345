// capture_check FILE.pcap [OPCODE...]: reads a capture the udp link wrote
// (SOFTHCA_PCAP) with libpcap and checks every frame with softhca's own
// parser: Ethernet, then an IP/UDP/RoCEv2 packet whose ICRC is right and
// whose headers are well formed. Prints how many frames of each opcode it
// saw; exits 1 if any frame is bad or a named opcode (hex, e.g. 0x0c) never
// appears. tshark decodes the same file; it does not check the ICRC.
#include <pcap/pcap.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <span>
#include <string>

#include "wire/opcode.hpp"
#include "wire/packet.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: capture_check FILE.pcap [OPCODE...]\n");
    return 2;
  }
  char error[PCAP_ERRBUF_SIZE];
  pcap_t* capture = pcap_open_offline(argv[1], error);
  if (capture == nullptr) {
    std::fprintf(stderr, "capture_check: %s\n", error);
    return 2;
  }
  std::map<int, long> seen;
  long frames = 0, bad = 0;
  pcap_pkthdr* header = nullptr;
  const u_char* data = nullptr;
  while (pcap_next_ex(capture, &header, &data) == 1) {
    ++frames;
    if (header->caplen != header->len || header->caplen < 14) {
      ++bad;
      continue;
    }
    const auto parsed = softhca::wire::parse_ip_packet(std::span<const uint8_t>(data + 14, header->caplen - 14));
    if (!parsed) {
      const auto why = softhca::wire::to_string(parsed.error());
      std::printf("frame %ld: %.*s\n", frames, static_cast<int>(why.size()), why.data());
      ++bad;
      continue;
    }
    ++seen[parsed->headers.bth.opcode];
  }
  pcap_close(capture);
  for (const auto& [opcode, count] : seen) {
    const auto info = softhca::wire::opcode_info(static_cast<uint8_t>(opcode));
    std::printf("0x%02x %-32.*s %ld\n", opcode, info ? static_cast<int>(info->name.size()) : 1,
                info ? info->name.data() : "?", count);
  }
  int status = bad == 0 && frames > 0 ? 0 : 1;
  for (int i = 2; i < argc; ++i) {
    const int opcode = static_cast<int>(std::strtol(argv[i], nullptr, 16));
    if (seen.count(opcode) == 0) {
      std::printf("opcode 0x%02x never appears\n", opcode);
      status = 1;
    }
  }
  std::printf("%ld frames, %ld bad\n", frames, bad);
  return status;
}
