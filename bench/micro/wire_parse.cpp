// Benchmark, not a test: what the udp link's receiver pays to judge a
// packet's ICRC (wire::parse with the ID-0 IPv4 header image a UDP socket
// leaves it to rebuild), by the IPv4 ID the sender's kernel wrote:
//   - id0: a datagram sent alone by softhca, whose ICRC matches the image;
//   - gso_id: a segment of a softhca GSO send (ID 5);
//   - foreign_id: rxe's or a NIC's running counter (ID 22161), which the
//     receiver solves for (wire::ipv4_id_behind_icrc, issue #41);
//   - foreign_id_new_length: the same at a length the thread has not seen
//     (its per-length constants are computed first; every packet pays it).
// The argument is the packet's payload in bytes (an ACK, 1 KiB, 4 KiB).
//
//   wire_parse [google-benchmark flags, e.g. --benchmark_min_time=1s]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "wire/icrc.hpp"
#include "wire/ip_udp.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"

namespace {

using namespace softhca::wire;

UdpFlow flow() {
  UdpFlow f;
  f.src_gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 198, 18, 0, 1};
  f.dst_gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 198, 18, 0, 2};
  f.src_port = 49152;
  return f;
}

std::vector<uint8_t> headers(std::size_t udp_payload_size, uint16_t id) {
  std::vector<uint8_t> h(kIpv4HeaderSize + kUdpHeaderSize);
  if (!write_ip_udp_headers(flow(), udp_payload_size, h, id)) std::abort();
  return h;
}

// An RC SEND ONLY of `data` bytes whose ICRC covers IPv4 ID `id`.
std::vector<uint8_t> packet(std::size_t data, uint16_t id) {
  Headers h;
  h.bth.opcode = static_cast<uint8_t>(Opcode::kRcSendOnly);
  h.bth.dest_qpn = 0x1234;
  std::vector<uint8_t> payload(data, 0x5A);
  const std::size_t size = encoded_size(opcode_info(h.bth.opcode).value(), data);
  std::vector<uint8_t> out(size);
  if (!encode(h, payload, headers(size, id), out)) std::abort();
  return out;
}

void parse_with_id(benchmark::State& state, uint16_t id, bool new_length) {
  const auto data = static_cast<std::size_t>(state.range(0));
  // Two lengths taken in turn, 256 bytes apart, land on the per-thread cache's
  // same slot: each parse recomputes the length's constants.
  const std::vector<uint8_t> packets[2] = {packet(data, id),
                                           packet(new_length ? (data >= 256 ? data - 256 : data + 256) : data, id)};
  const auto p0 = icrc_prefix(headers(packets[0].size(), 0), packets[0].size()).value();
  const auto p1 = icrc_prefix(headers(packets[1].size(), 0), packets[1].size()).value();
  ParseLimits limits;
  limits.ipv4_id_unseen = true;
  bool which = false;
  for (auto _ : state) {
    const auto parsed = parse(which ? p1 : p0, packets[which], limits);
    if (!parsed || parsed->unseen_ipv4_id != id) {
      state.SkipWithError("not accepted");
      return;
    }
    benchmark::DoNotOptimize(parsed->payload.data());
    which = !which;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(packets[0].size()));
}

void id0(benchmark::State& s) { parse_with_id(s, 0, false); }
void gso_id(benchmark::State& s) { parse_with_id(s, 5, false); }
void foreign_id(benchmark::State& s) { parse_with_id(s, 22161, false); }
void foreign_id_new_length(benchmark::State& s) { parse_with_id(s, 22161, true); }

BENCHMARK(id0)->Arg(0)->Arg(1024)->Arg(4096);
BENCHMARK(gso_id)->Arg(0)->Arg(1024)->Arg(4096);
BENCHMARK(foreign_id)->Arg(0)->Arg(1024)->Arg(4096);
BENCHMARK(foreign_id_new_length)->Arg(0)->Arg(1024)->Arg(4096);

}  // namespace

BENCHMARK_MAIN();
