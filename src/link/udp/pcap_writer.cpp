#include "link/udp/pcap_writer.hpp"

#include <pcap/pcap.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "common/settings.hpp"

namespace softhca::udp {
namespace {

// libpcap's own largest snapshot length: no frame is ever cut (a UDP payload
// is at most 65507 bytes).
constexpr int kSnapLength = 262144;

constexpr uint64_t kNanosPerSecond = 1'000'000'000;

}  // namespace

std::array<uint8_t, 6> capture_mac(const wire::Gid& gid) {
  return {0x02, 0x00, gid[12], gid[13], gid[14], gid[15]};
}

Result<std::size_t> build_capture_frame(const wire::UdpFlow& flow, std::span<const uint8_t> udp_payload,
                                        std::span<uint8_t> out, uint16_t ipv4_id) {
  const auto version = wire::ip_version_of(flow);
  if (!version) return fail(version.error());
  if (out.size() < kEthernetHeaderSize) return fail(std::errc::no_buffer_space);
  const auto ip_packet = out.subspan(kEthernetHeaderSize);
  const auto headers = wire::write_ip_udp_headers(flow, udp_payload.size(), ip_packet, ipv4_id);
  if (!headers) return fail(headers.error());
  if (ip_packet.size() - *headers < udp_payload.size()) return fail(std::errc::no_buffer_space);
  std::copy(udp_payload.begin(), udp_payload.end(), ip_packet.begin() + static_cast<std::ptrdiff_t>(*headers));
  const std::size_t ip_size = *headers + udp_payload.size();
  if (auto checksum = wire::fill_udp_checksum(ip_packet.first(ip_size)); !checksum) return fail(checksum.error());

  const auto dst = capture_mac(flow.dst_gid);
  const auto src = capture_mac(flow.src_gid);
  std::copy(dst.begin(), dst.end(), out.begin());
  std::copy(src.begin(), src.end(), out.begin() + 6);
  const uint16_t ethertype = *version == wire::IpVersion::kV4 ? kEthertypeIpv4 : kEthertypeIpv6;
  out[12] = static_cast<uint8_t>(ethertype >> 8);
  out[13] = static_cast<uint8_t>(ethertype);
  return kEthernetHeaderSize + ip_size;
}

Result<std::unique_ptr<PcapWriter>> PcapWriter::open_append(const std::string& path) {
  // A process's device may be opened and closed many times (a test suite
  // does), and each time its udp link starts again: its packets all belong
  // in one capture, so an existing file of the same format is appended to.
  pcap_t* handle = pcap_open_dead_with_tstamp_precision(DLT_EN10MB, kSnapLength, PCAP_TSTAMP_PRECISION_NANO);
  if (handle == nullptr) return fail(std::errc::not_enough_memory);
  errno = 0;
  pcap_dumper_t* dumper = pcap_dump_open_append(handle, path.c_str());
  if (dumper == nullptr) {
    const int err = errno;
    pcap_close(handle);
    return fail(err != 0 ? static_cast<std::errc>(err) : std::errc::io_error);
  }
  if (pcap_dump_flush(dumper) != 0) {
    pcap_dump_close(dumper);
    pcap_close(handle);
    return fail(std::errc::io_error);
  }
  return std::unique_ptr<PcapWriter>(new PcapWriter(handle, dumper));
}

Result<std::unique_ptr<PcapWriter>> PcapWriter::open(const std::string& path) {
  // The file is opened here rather than by pcap_dump_open so that its errno
  // is ours to return (libpcap turns it into text) and so that it is
  // close-on-exec ('e').
  FILE* file = std::fopen(path.c_str(), "wbe");
  if (file == nullptr) return fail(errno != 0 ? static_cast<std::errc>(errno) : std::errc::io_error);
  pcap_t* handle = pcap_open_dead_with_tstamp_precision(DLT_EN10MB, kSnapLength, PCAP_TSTAMP_PRECISION_NANO);
  if (handle == nullptr) {
    std::fclose(file);
    return fail(std::errc::not_enough_memory);
  }
  // On success the dumper owns `file` (pcap_dump_close closes it).
  pcap_dumper_t* dumper = pcap_dump_fopen(handle, file);
  if (dumper == nullptr) {
    pcap_close(handle);
    std::fclose(file);
    return fail(std::errc::io_error);
  }
  // The header alone makes a valid empty capture, even if nothing follows.
  if (pcap_dump_flush(dumper) != 0) {
    pcap_dump_close(dumper);
    pcap_close(handle);
    return fail(std::errc::io_error);
  }
  return std::unique_ptr<PcapWriter>(new PcapWriter(handle, dumper));
}

PcapWriter::~PcapWriter() {
  pcap_dump_close(dumper_);
  pcap_close(handle_);
}

Result<void> PcapWriter::write(const wire::UdpFlow& flow, std::span<const uint8_t> udp_payload, uint64_t time_ns,
                               uint16_t ipv4_id) {
  std::lock_guard lock(mutex_);
  frame_.resize(kEthernetHeaderSize + wire::kIpv6HeaderSize + wire::kUdpHeaderSize + udp_payload.size());
  const auto size = build_capture_frame(flow, udp_payload, frame_, ipv4_id);
  if (!size) return fail(size.error());
  pcap_pkthdr record{};
  // In a nanosecond capture the field named tv_usec holds nanoseconds.
  record.ts.tv_sec = static_cast<time_t>(time_ns / kNanosPerSecond);
  record.ts.tv_usec = static_cast<suseconds_t>(time_ns % kNanosPerSecond);
  record.caplen = static_cast<bpf_u_int32>(*size);
  record.len = static_cast<bpf_u_int32>(*size);
  pcap_dump(reinterpret_cast<u_char*>(dumper_), &record, frame_.data());
  // pcap_dump writes into stdio's buffer and reports nothing; the flush both
  // puts the record in the file and tells whether that worked.
  if (pcap_dump_flush(dumper_) != 0) return fail(std::errc::io_error);
  ++packets_;
  return {};
}

uint64_t PcapWriter::packets() const {
  std::lock_guard lock(mutex_);
  return packets_;
}

std::string expand_capture_path(std::string_view pattern, pid_t pid) {
  std::string path;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      path += std::to_string(pid);
      ++i;
    } else if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == '%') {
      path += '%';
      ++i;
    } else {
      path += pattern[i];
    }
  }
  return path;
}

std::optional<std::string> pcap_path_from_environment() {
  const char* text = setting_text(SettingId::kPcap);
  if (text == nullptr) return std::nullopt;
  return expand_capture_path(text, getpid());
}

}  // namespace softhca::udp
