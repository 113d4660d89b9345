// link/udp/pcap_writer: the frames of a capture and the file libpcap writes.
// Each golden packet (built by scapy, wire_golden/) goes through the writer
// as the link would hand it over, flow and UDP payload; the frame must hold
// scapy's IP packet byte for byte (headers, both checksums, ICRC), and
// libpcap must read back what was written. tests/system/pcap_capture_test
// shows the same capture to tshark.
#include "link/udp/pcap_writer.hpp"

#include <gtest/gtest.h>
#include <pcap/pcap.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "wire/icrc.hpp"
#include "wire/packet.hpp"
#include "wire_golden/golden_support.hpp"

namespace softhca::udp {
namespace {

namespace golden = wire::golden;

std::vector<uint8_t> frame_of(const golden::Packet& p) {
  std::vector<uint8_t> out(kEthernetHeaderSize + p.ip_packet.size() + 16);
  auto size = build_capture_frame(golden::to_flow(p.flow), golden::udp_payload_of(p), out);
  EXPECT_TRUE(size.has_value()) << p.name;
  out.resize(size.value_or(0));
  return out;
}

class GoldenFrame : public testing::TestWithParam<std::size_t> {};

TEST_P(GoldenFrame, IsEthernetAroundScapysPacket) {
  const golden::Packet& p = golden::kPackets[GetParam()];
  const std::vector<uint8_t> frame = frame_of(p);
  ASSERT_EQ(frame.size(), kEthernetHeaderSize + p.ip_packet.size());
  EXPECT_TRUE(std::equal(p.ip_packet.begin(), p.ip_packet.end(), frame.begin() + kEthernetHeaderSize))
      << "the IP packet differs from scapy's";
  const auto flow = golden::to_flow(p.flow);
  const auto dst = capture_mac(flow.dst_gid);
  const auto src = capture_mac(flow.src_gid);
  EXPECT_TRUE(std::equal(dst.begin(), dst.end(), frame.begin()));
  EXPECT_TRUE(std::equal(src.begin(), src.end(), frame.begin() + 6));
  const uint16_t ethertype = static_cast<uint16_t>(frame[12] << 8 | frame[13]);
  EXPECT_EQ(ethertype, p.flow.ipv6 ? kEthertypeIpv6 : kEthertypeIpv4);
}

INSTANTIATE_TEST_SUITE_P(Wire, GoldenFrame, testing::ValuesIn(golden::all_packet_indices()), golden::packet_name);

TEST(CaptureFrame, MacsAreLocallyAdministeredAndFromTheAddress) {
  wire::Gid v4{};
  v4[10] = v4[11] = 0xFF;
  v4[12] = 198;
  v4[13] = 18;
  v4[14] = 0;
  v4[15] = 1;
  EXPECT_EQ(capture_mac(v4), (std::array<uint8_t, 6>{0x02, 0x00, 198, 18, 0, 1}));
}

// A received GSO segment's ICRC covers the IPv4 ID it came with: the frame
// carries that ID, so the capture's ICRC checks out against its own header.
TEST(CaptureFrame, CarriesTheIpv4IdTheIcrcCovers) {
  const golden::Packet* p = nullptr;
  for (const auto& candidate : golden::kPackets) {
    if (!candidate.flow.ipv6) {
      p = &candidate;
      break;
    }
  }
  ASSERT_NE(p, nullptr);
  const auto original = golden::udp_payload_of(*p);
  std::vector<uint8_t> payload(original.begin(), original.end());
  const auto icrc = std::span<uint8_t>(payload).last<wire::kIcrcSize>();
  wire::store_icrc(wire::load_icrc(icrc) ^ wire::icrc_ipv4_id_delta(9, payload.size()), icrc);
  std::vector<uint8_t> out(kEthernetHeaderSize + p->ip_packet.size() + 16);
  for (uint16_t id : {0, 9}) {
    const auto size = build_capture_frame(golden::to_flow(p->flow), payload, out, id);
    ASSERT_TRUE(size.has_value());
    const auto ip_packet = std::span<const uint8_t>(out).subspan(kEthernetHeaderSize, *size - kEthernetHeaderSize);
    EXPECT_EQ(ip_packet[4], 0);
    EXPECT_EQ(ip_packet[5], id);
    EXPECT_EQ(wire::parse_ip_packet(ip_packet).has_value(), id == 9) << "id " << id;
  }
}

TEST(CaptureFrame, RefusesWhatItCannotBuild) {
  const golden::Packet& p = golden::kPackets[0];
  auto flow = golden::to_flow(p.flow);
  std::vector<uint8_t> out(2048);
  std::vector<uint8_t> small(kEthernetHeaderSize + 20);
  EXPECT_EQ(build_capture_frame(flow, golden::udp_payload_of(p), small).error(), std::errc::no_buffer_space);
  std::vector<uint8_t> tiny(4);
  EXPECT_EQ(build_capture_frame(flow, golden::udp_payload_of(p), tiny).error(), std::errc::no_buffer_space);
  flow.dst_gid = golden::to_flow(golden::kPackets[std::size(golden::kPackets) - 1].flow).dst_gid;  // IPv6
  EXPECT_EQ(build_capture_frame(flow, golden::udp_payload_of(p), out).error(), std::errc::invalid_argument);
}

TEST(CapturePath, PercentPIsThePid) {
  EXPECT_EQ(expand_capture_path("/tmp/cap-%p.pcap", 4242), "/tmp/cap-4242.pcap");
  EXPECT_EQ(expand_capture_path("%p%p", 7), "77");
  EXPECT_EQ(expand_capture_path("100%%-%p", 7), "100%-7");
  EXPECT_EQ(expand_capture_path("a%b%", 7), "a%b%");
  EXPECT_EQ(expand_capture_path("plain.pcap", 7), "plain.pcap");
}

// A temporary file name, removed at the end of the test.
class PcapFile : public testing::Test {
 protected:
  void SetUp() override {
    const auto dir = std::filesystem::temp_directory_path();
    path_ = (dir / ("softhca-pcap-test-" + std::to_string(getpid()) + "-" +
                    testing::UnitTest::GetInstance()->current_test_info()->name() + ".pcap"))
                .string();
  }
  void TearDown() override { std::filesystem::remove(path_); }

  struct Record {
    uint64_t time_ns;
    std::vector<uint8_t> bytes;
  };

  // Every record of the file, read with libpcap.
  std::vector<Record> read_back() const {
    char error[PCAP_ERRBUF_SIZE] = {};
    pcap_t* p = pcap_open_offline_with_tstamp_precision(path_.c_str(), PCAP_TSTAMP_PRECISION_NANO, error);
    EXPECT_NE(p, nullptr) << error;
    if (p == nullptr) return {};
    EXPECT_EQ(pcap_datalink(p), DLT_EN10MB);
    std::vector<Record> records;
    pcap_pkthdr* header = nullptr;
    const u_char* data = nullptr;
    int rc = 0;
    while ((rc = pcap_next_ex(p, &header, &data)) == 1) {
      EXPECT_EQ(header->caplen, header->len) << "a frame was cut";
      records.push_back({static_cast<uint64_t>(header->ts.tv_sec) * 1'000'000'000 +
                             static_cast<uint64_t>(header->ts.tv_usec),
                         std::vector<uint8_t>(data, data + header->caplen)});
    }
    EXPECT_EQ(rc, PCAP_ERROR_BREAK) << "the file does not end after a whole record: " << pcap_geterr(p);
    pcap_close(p);
    return records;
  }

  std::string path_;
};

TEST_F(PcapFile, OpenFailsWithTheReason) {
  auto writer = PcapWriter::open("/nonexistent-softhca-dir/x.pcap");
  ASSERT_FALSE(writer.has_value());
  EXPECT_EQ(writer.error(), std::errc::no_such_file_or_directory);
}

TEST_F(PcapFile, AnOpenedFileIsAnEmptyCaptureAtOnce) {
  auto writer = PcapWriter::open(path_);
  ASSERT_TRUE(writer.has_value());
  EXPECT_TRUE(read_back().empty());
}

TEST_F(PcapFile, EveryPacketIsReadableAsSoonAsItIsWritten) {
  auto writer = PcapWriter::open(path_);
  ASSERT_TRUE(writer.has_value());
  const uint64_t t0 = 1'700'000'000'123'456'789;  // nanoseconds survive
  for (std::size_t i = 0; i < std::size(golden::kPackets); ++i) {
    const golden::Packet& p = golden::kPackets[i];
    ASSERT_TRUE((*writer)->write(golden::to_flow(p.flow), golden::udp_payload_of(p), t0 + i).has_value()) << p.name;
    // Read while the writer is still open: what a killed process leaves.
    ASSERT_EQ(read_back().size(), i + 1);
  }
  EXPECT_EQ((*writer)->packets(), std::size(golden::kPackets));
  writer->reset();
  const auto records = read_back();
  ASSERT_EQ(records.size(), std::size(golden::kPackets));
  for (std::size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(records[i].time_ns, t0 + i);
    EXPECT_EQ(records[i].bytes, frame_of(golden::kPackets[i])) << golden::kPackets[i].name;
  }
}

TEST_F(PcapFile, APacketThatCannotBeFramedIsLeftOut) {
  auto writer = PcapWriter::open(path_);
  ASSERT_TRUE(writer.has_value());
  const golden::Packet& p = golden::kPackets[0];
  auto mixed = golden::to_flow(p.flow);
  mixed.dst_gid = wire::Gid{0x20, 0x01, 0x0d, 0xb8};
  EXPECT_EQ((*writer)->write(mixed, golden::udp_payload_of(p), 1).error(), std::errc::invalid_argument);
  EXPECT_TRUE((*writer)->write(golden::to_flow(p.flow), golden::udp_payload_of(p), 2).has_value());
  EXPECT_EQ((*writer)->packets(), 1u);
  const auto records = read_back();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].time_ns, 2u);
}

TEST_F(PcapFile, ThreadsWriteWholeRecords) {
  // Four threads, each its own golden packet: every record must be one of
  // them, whole, and each thread's records in its own order.
  auto writer = PcapWriter::open(path_);
  ASSERT_TRUE(writer.has_value());
  constexpr int kThreads = 4;
  constexpr uint64_t kPerThread = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&w = **writer, t] {
      const golden::Packet& p = golden::kPackets[static_cast<std::size_t>(t) * 5];
      for (uint64_t i = 0; i < kPerThread; ++i)
        ASSERT_TRUE(w.write(golden::to_flow(p.flow), golden::udp_payload_of(p), static_cast<uint64_t>(t) << 32 | i)
                        .has_value());
    });
  for (auto& t : threads) t.join();
  const auto records = read_back();
  ASSERT_EQ(records.size(), kThreads * kPerThread);
  std::vector<uint64_t> next(kThreads, 0);
  for (const Record& r : records) {
    const auto t = static_cast<std::size_t>(r.time_ns >> 32);
    ASSERT_LT(t, static_cast<std::size_t>(kThreads));
    ASSERT_EQ(r.time_ns & 0xFFFFFFFF, next[t]++);
    ASSERT_EQ(r.bytes, frame_of(golden::kPackets[t * 5]));
  }
}

}  // namespace
}  // namespace softhca::udp
