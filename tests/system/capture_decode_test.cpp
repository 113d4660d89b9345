// system.pcap_capture: a capture written by the udp link's PcapWriter decodes
// in tshark as RoCEv2, field by field, with correct checksums and ICRCs.
//
// The capture holds every golden packet (tests/unit/wire_golden: each opcode
// softhca sends, IPv4 and IPv6, built by scapy), handed to the writer as the
// link hands packets over (flow and UDP payload), then three broken ones
// that the checks must catch, so that a check that cannot fail is noticed:
//   - a payload byte flipped: every field decodes, the ICRC does not match;
//   - a PSN bit flipped: the PSN is wrong and so is the ICRC;
//   - a packet cut to 8 bytes: tshark reports it malformed.
//
// tshark runs once:
//   tshark -r FILE -n --disable-heuristic rpcrdma_infiniband
//          -o ip.check_checksum:TRUE -o udp.check_checksum:TRUE
//          -T fields -E separator=/t -E occurrence=a -E aggregator=| -e ...
// with an empty configuration directory (WIRESHARK_CONFIG_DIR), so a
// developer's own preferences cannot change the decode. RoCEv2 needs no
// option: Wireshark's infiniband dissector claims UDP port 4791 itself.
//
// What Wireshark does not do, and what is checked instead:
//   - It does not check the ICRC (4.0, Debian 12's: it shows "Invariant
//     CRC" and nothing more, also for a wrong one). So each frame's ICRC is
//     computed here over the frame as libpcap reads it back (wire::icrc_of
//     over its own IP and UDP headers, which the wire unit tests match to
//     scapy), and must equal the ICRC tshark shows and, for golden packets,
//     scapy's.
//   - Its RPC-over-RDMA heuristic throws on short payloads (a SEND with no
//     payload, or with an IETH) and marks the frame malformed, a Wireshark
//     fault, not the packet's; the heuristic is disabled.
//   - Opcodes missing from its table (4.0 lacks RDMA ATOMIC WRITE, 0x1D):
//     the BTH must still decode; the rest shows as vendor data, which must
//     be the bytes after the BTH. The opcode list comes from `tshark -G
//     values`, so a newer tshark that knows an opcode gets every check.
//
// Exit status 77 (ctest: skipped) when tshark is not installed.
#include <gtest/gtest.h>
#include <pcap/pcap.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "link/udp/pcap_writer.hpp"
#include "wire/icrc.hpp"
#include "wire_golden/golden_support.hpp"

namespace softhca {
namespace {

namespace golden = wire::golden;
using udp::PcapWriter;

// What the check reports, besides a field's name when that field is wrong.
constexpr const char* kMalformed = "malformed";
constexpr const char* kExpert = "expert";
constexpr const char* kProtocols = "protocols";
constexpr const char* kIcrc = "icrc";

// The fields read from tshark, in its column order. The AtomicETH's address
// and key are decoded into the RETH's fields.
const std::vector<std::string> kFields = {
    "frame.number",
    "frame.protocols",
    "_ws.malformed",
    "_ws.expert.severity",
    "_ws.expert.message",
    "ip.checksum.status",
    "udp.checksum.status",
    "infiniband.bth.opcode",
    "infiniband.bth.se",
    "infiniband.bth.m",
    "infiniband.bth.padcnt",
    "infiniband.bth.tver",
    "infiniband.bth.p_key",
    "infiniband.bth.destqp",
    "infiniband.bth.a",
    "infiniband.bth.psn",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "infiniband.atomicacketh.origremdt",
    "infiniband.immdt",
    "infiniband.ieth",
    "infiniband.vendor",
    "data.data",
    "infiniband.invariant.crc",
};

// The decoded fields checked against the packet: every one of them must be
// as expected when expected, and absent when not.
const std::vector<std::string> kPacketFields(kFields.begin() + 7, kFields.end() - 1);

// The fields that are bytes, compared as lowercase hex; the others are
// numbers, compared as numbers (tshark prints some in hex, some in decimal).
const std::set<std::string> kByteFields = {"infiniband.immdt", "infiniband.ieth", "infiniband.vendor", "data.data"};

// Wireshark's expert severities (epan/proto.h): PI_WARN and above fail.
constexpr unsigned long kSeverityWarn = 0x00600000;

std::string hex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (const uint8_t b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 0xF];
  }
  return out;
}

std::string hex_be32(uint32_t v) {
  const uint8_t bytes[4] = {static_cast<uint8_t>(v >> 24), static_cast<uint8_t>(v >> 16), static_cast<uint8_t>(v >> 8),
                            static_cast<uint8_t>(v)};
  return hex(bytes);
}

// One frame that goes into the capture and what tshark must show for it.
struct Frame {
  std::string name;
  wire::UdpFlow flow;
  std::vector<uint8_t> udp_payload;
  // Field -> expected text: a decimal number or, for kByteFields, lowercase
  // hex. A field not listed must be absent.
  std::map<std::string, std::string> fields;
  std::optional<uint32_t> golden_icrc;  // scapy's (or annex A17 by hand)
  std::set<std::string> problems;      // what the checks must report; empty for a good frame
  bool problems_at_least = false;      // problems only has to be a subset of what is found
};

// The expected fields of a golden packet whose opcode this tshark knows.
std::map<std::string, std::string> expected_fields(const golden::Packet& p, bool opcode_known) {
  const golden::Fields& f = p.fields;
  std::map<std::string, std::string> e;
  const auto num = [](uint64_t v) { return std::to_string(v); };
  e["infiniband.bth.opcode"] = num(f.opcode);
  e["infiniband.bth.se"] = num(f.solicited);
  e["infiniband.bth.m"] = num(f.migreq);
  e["infiniband.bth.padcnt"] = num(f.pad_count);
  e["infiniband.bth.tver"] = "0";
  e["infiniband.bth.p_key"] = num(f.pkey);
  e["infiniband.bth.destqp"] = num(f.dest_qpn);
  e["infiniband.bth.a"] = num(f.ack_req);
  e["infiniband.bth.psn"] = num(f.psn);
  const auto udp_payload = golden::udp_payload_of(p);
  if (!opcode_known) {
    // Everything after the 12-byte BTH, ICRC included, as vendor data.
    e["infiniband.vendor"] = hex(udp_payload.subspan(12));
    return e;
  }
  if (f.has_deth) {
    e["infiniband.deth.q_key"] = num(f.deth_qkey);
    e["infiniband.deth.srcqp"] = num(f.deth_src_qpn);
  }
  if (f.has_reth) {
    e["infiniband.reth.va"] = num(f.reth_va);
    e["infiniband.reth.r_key"] = num(f.reth_rkey);
    e["infiniband.reth.dmalen"] = num(f.reth_dma_length);
  }
  if (f.has_atomic_eth) {
    e["infiniband.reth.va"] = num(f.atomic_va);
    e["infiniband.reth.r_key"] = num(f.atomic_rkey);
    e["infiniband.atomiceth.swapdt"] = num(f.atomic_swap_add);
    e["infiniband.atomiceth.cmpdt"] = num(f.atomic_compare);
  }
  if (f.has_aeth) {
    e["infiniband.aeth.syndrome"] = num(f.aeth_syndrome);
    e["infiniband.aeth.msn"] = num(f.aeth_msn);
  }
  if (f.has_atomic_ack_eth) e["infiniband.atomicacketh.origremdt"] = num(f.atomic_ack_original);
  if (f.has_immdt) e["infiniband.immdt"] = hex_be32(f.imm);
  if (f.has_ieth) e["infiniband.ieth"] = hex_be32(f.ieth_rkey);
  // Wireshark shows the pad with the payload: the bytes before the ICRC.
  const std::size_t data_size = p.payload.size() + f.pad_count;
  if (data_size > 0) e["data.data"] = hex(udp_payload.subspan(udp_payload.size() - wire::kIcrcSize - data_size, data_size));
  return e;
}

Frame golden_frame(const golden::Packet& p, const std::set<unsigned>& known_opcodes) {
  const auto payload = golden::udp_payload_of(p);
  return Frame{.name = std::string(p.name),
               .flow = golden::to_flow(p.flow),
               .udp_payload = std::vector<uint8_t>(payload.begin(), payload.end()),
               .fields = expected_fields(p, known_opcodes.contains(p.fields.opcode)),
               .golden_icrc = p.icrc};
}

struct Output {
  std::string out;
  int status = -1;  // pclose's: 0 when the command exited 0
};

Output run(const std::string& command) {
  Output result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) result.out.append(buf, n);
  result.status = pclose(pipe);
  return result;
}

std::string read_text(const std::string& path) {
  std::string text;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[4096];
    std::size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    std::fclose(f);
  }
  return text;
}

// The opcodes this tshark names, from its value table.
std::set<unsigned> tshark_opcodes(const std::string& env) {
  std::set<unsigned> opcodes;
  std::istringstream lines(run(env + " tshark -G values 2>/dev/null").out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream cols(line);
    std::string kind, field, value;
    if (std::getline(cols, kind, '\t') && std::getline(cols, field, '\t') && std::getline(cols, value, '\t') &&
        kind == "V" && field == "infiniband.bth.opcode")
      opcodes.insert(static_cast<unsigned>(std::stoul(value)));
  }
  return opcodes;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!s.empty() && s.back() == sep) parts.emplace_back();
  return parts;
}

// Whether tshark's text of `field` shows `want` (expected_fields' form).
bool same_value(const std::string& field, const std::string& shown, const std::string& want) {
  if (kByteFields.contains(field)) {
    std::string lower = shown;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return lower == want;
  }
  // Base 0: tshark writes hex fields with 0x, decimal ones without leading zeros.
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(shown.c_str(), &end, 0);
  return !shown.empty() && *end == '\0' && errno == 0 && std::to_string(value) == want;
}

class CaptureDecode : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto dir = std::filesystem::temp_directory_path() / ("softhca-capture-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir / "wireshark-config");
    dir_ = dir.string();
    path_ = (dir / "golden.pcap").string();
    env_ = "WIRESHARK_CONFIG_DIR='" + (dir / "wireshark-config").string() + "' LC_ALL=C";
    known_opcodes_ = tshark_opcodes(env_);

    for (const golden::Packet& p : golden::kPackets) frames_.push_back(golden_frame(p, known_opcodes_));
    const golden::Packet& base = golden::kPackets[0];  // rc_send_only, 16 bytes of payload
    ASSERT_EQ(base.name, "rc_send_only");
    Frame flipped = golden_frame(base, known_opcodes_);
    flipped.name = "rc_send_only.payload_byte_flipped";
    flipped.udp_payload[12] ^= 0x40;  // the first payload byte
    flipped.fields["data.data"] = hex(std::span(flipped.udp_payload).subspan(12, 16));
    flipped.problems = {kIcrc};
    frames_.push_back(flipped);
    Frame psn = golden_frame(base, known_opcodes_);
    psn.name = "rc_send_only.psn_bit_flipped";
    psn.udp_payload[11] ^= 0x01;  // PSN 1 -> 0
    psn.problems = {"infiniband.bth.psn", kIcrc};
    frames_.push_back(psn);
    Frame cut = golden_frame(base, known_opcodes_);
    cut.name = "rc_send_only.cut_to_8_bytes";
    cut.udp_payload.resize(8);
    cut.golden_icrc.reset();
    cut.problems = {kMalformed};
    cut.problems_at_least = true;  // and whatever it could not decode
    frames_.push_back(cut);

    auto writer = PcapWriter::open(path_);
    ASSERT_TRUE(writer.has_value()) << path_ << ": " << std::make_error_code(writer.error()).message();
    uint64_t time_ns = 1'700'000'000'000'000'000;
    for (const Frame& f : frames_)
      ASSERT_TRUE((*writer)->write(f.flow, f.udp_payload, time_ns++).has_value()) << f.name;
    writer->reset();

    std::string command = env_ +
                          " tshark -r '" + path_ +
                          "' -n --disable-heuristic rpcrdma_infiniband"
                          " -o ip.check_checksum:TRUE -o udp.check_checksum:TRUE"
                          " -T fields -E separator=/t -E occurrence=a -E 'aggregator=|'";
    for (const std::string& field : kFields) command += " -e " + field;
    command_ = command;
    const std::string errors = dir_ + "/tshark.err";
    const Output tshark = run(command + " 2>'" + errors + "'");
    // A tshark that refuses an option (a renamed heuristic, say) says so.
    ASSERT_EQ(tshark.status, 0) << "tshark failed:\n" << read_text(errors);
    for (const std::string& line : split(tshark.out, '\n')) {
      if (line.empty()) continue;
      const auto cols = split(line, '\t');
      ASSERT_EQ(cols.size(), kFields.size()) << "tshark printed: " << line;
      std::map<std::string, std::string> row;
      for (std::size_t i = 0; i < cols.size(); ++i)
        if (!cols[i].empty()) row[kFields[i]] = cols[i];
      decoded_.push_back(row);
      lines_.push_back(line);
    }
    read_back_frames();
  }

  static void TearDownTestSuite() {
    // Kept when something failed, for a look with tshark -V.
    if (!testing::UnitTest::GetInstance()->Failed()) std::filesystem::remove_all(dir_);
    else std::printf("capture kept: %s\ntshark command: %s\n", path_.c_str(), command_.c_str());
  }

  // The frames as libpcap reads them back.
  static void read_back_frames() {
    char error[PCAP_ERRBUF_SIZE] = {};
    pcap_t* p = pcap_open_offline(path_.c_str(), error);
    ASSERT_NE(p, nullptr) << error;
    pcap_pkthdr* header = nullptr;
    const u_char* data = nullptr;
    while (pcap_next_ex(p, &header, &data) == 1) bytes_.emplace_back(data, data + header->caplen);
    pcap_close(p);
  }

  // Everything wrong with frame i as tshark decoded it.
  static std::set<std::string> problems_of(std::size_t i) {
    const Frame& f = frames_[i];
    const auto& row = decoded_[i];
    std::set<std::string> problems;
    const auto shown = [&](const std::string& field) -> std::optional<std::string> {
      auto it = row.find(field);
      if (it == row.end()) return std::nullopt;
      // Some byte fields are shown twice, as a subtree's heading and as the
      // value: the same four bytes (immdt, ieth), or the first four bytes
      // and then all of them (vendor). The longest is the value.
      // A number shown more than once must be the same each time; if not,
      // the whole list is returned, which no number matches.
      const auto values = split(it->second, '|');
      if (!kByteFields.contains(field))
        return std::all_of(values.begin(), values.end(), [&](const std::string& v) { return v == values.front(); })
                   ? values.front()
                   : it->second;
      std::string value;
      for (const std::string& v : values)
        if (v.size() > value.size()) value = v;
      return value;
    };
    if (row.contains("_ws.malformed")) problems.insert(kMalformed);
    if (auto severities = row.find("_ws.expert.severity"); severities != row.end())
      for (const std::string& s : split(severities->second, '|'))
        if (std::strtoul(s.c_str(), nullptr, 0) >= kSeverityWarn) problems.insert(kExpert);
    const bool v6 = wire::ip_version_of(f.flow) == wire::IpVersion::kV6;
    const std::string chain = v6 ? "eth:ethertype:ipv6:udp:infiniband" : "eth:ethertype:ip:udp:infiniband";
    const std::string protocols = shown("frame.protocols").value_or("");
    if (protocols != chain && protocols != chain + ":data") problems.insert(kProtocols);
    if (!v6 && shown("ip.checksum.status") != "1") problems.insert("ip.checksum.status");
    if (shown("udp.checksum.status") != "1") problems.insert("udp.checksum.status");
    for (const std::string& field : kPacketFields) {
      const auto value = shown(field);
      const auto want = f.fields.find(field);
      if (want == f.fields.end() ? value.has_value() : !value || !same_value(field, *value, want->second))
        problems.insert(field);
    }
    // The ICRC, computed over the frame as captured, must be the one it
    // carries (and scapy's), and tshark must show that one: it reads the
    // four bytes as a big-endian number. For an opcode tshark does not know,
    // the ICRC is in its vendor data, checked above.
    const auto ip_packet = std::span<const uint8_t>(bytes_[i]).subspan(udp::kEthernetHeaderSize);
    const auto icrc = wire::icrc_of(ip_packet);
    if (!icrc) {
      problems.insert(kIcrc);
    } else {
      const uint32_t carried = wire::load_icrc(ip_packet.last<wire::kIcrcSize>());
      if (*icrc != carried || (f.golden_icrc && *icrc != *f.golden_icrc)) problems.insert(kIcrc);
      const auto shown_icrc = shown("infiniband.invariant.crc");
      if (!f.fields.contains("infiniband.vendor") &&
          (!shown_icrc || !same_value("infiniband.invariant.crc", *shown_icrc, std::to_string(std::byteswap(carried)))))
        problems.insert(kIcrc);
    }
    return problems;
  }

  static std::string dir_, path_, env_, command_;
  static std::set<unsigned> known_opcodes_;
  static std::vector<Frame> frames_;
  static std::vector<std::map<std::string, std::string>> decoded_;
  static std::vector<std::string> lines_;
  static std::vector<std::vector<uint8_t>> bytes_;
};

std::string CaptureDecode::dir_, CaptureDecode::path_, CaptureDecode::env_, CaptureDecode::command_;
std::set<unsigned> CaptureDecode::known_opcodes_;
std::vector<Frame> CaptureDecode::frames_;
std::vector<std::map<std::string, std::string>> CaptureDecode::decoded_;
std::vector<std::string> CaptureDecode::lines_;
std::vector<std::vector<uint8_t>> CaptureDecode::bytes_;

TEST_F(CaptureDecode, TsharkAndLibpcapSeeEveryFrame) {
  EXPECT_FALSE(known_opcodes_.empty()) << "tshark -G values lists no infiniband.bth.opcode";
  ASSERT_EQ(decoded_.size(), frames_.size()) << "tshark decoded another number of frames";
  ASSERT_EQ(bytes_.size(), frames_.size()) << "libpcap read another number of frames";
  for (std::size_t i = 0; i < frames_.size(); ++i)
    EXPECT_EQ(decoded_[i].at("frame.number"), std::to_string(i + 1));
}

TEST_F(CaptureDecode, EveryGoldenPacketDecodesAsRoceV2) {
  ASSERT_EQ(decoded_.size(), frames_.size());
  ASSERT_EQ(bytes_.size(), frames_.size());
  std::set<unsigned> opcodes_v4, opcodes_v6;
  for (std::size_t i = 0; i < std::size(golden::kPackets); ++i) {
    const auto problems = problems_of(i);
    EXPECT_TRUE(problems.empty()) << "frame " << i + 1 << " (" << frames_[i].name << "): "
                                  << testing::PrintToString(problems) << "\n  tshark: " << lines_[i];
    const golden::Packet& p = golden::kPackets[i];
    (p.flow.ipv6 ? opcodes_v6 : opcodes_v4).insert(p.fields.opcode);
    if (!known_opcodes_.contains(p.fields.opcode))
      std::printf("note: this tshark does not know opcode 0x%02x (%s): checked its BTH and bytes only\n",
                  p.fields.opcode, std::string(p.name).c_str());
  }
  // The capture covers both IP versions and many opcodes (every one the
  // golden set has; its own tests say which those are).
  EXPECT_GE(opcodes_v4.size(), 15u);
  EXPECT_GE(opcodes_v6.size(), 4u);
}

TEST_F(CaptureDecode, BrokenFramesAreCaught) {
  ASSERT_EQ(decoded_.size(), frames_.size());
  ASSERT_EQ(bytes_.size(), frames_.size());
  for (std::size_t i = std::size(golden::kPackets); i < frames_.size(); ++i) {
    const Frame& f = frames_[i];
    const auto problems = problems_of(i);
    if (f.problems_at_least) {
      for (const std::string& p : f.problems)
        EXPECT_TRUE(problems.contains(p)) << f.name << ": " << p << " not reported; found "
                                          << testing::PrintToString(problems) << "\n  tshark: " << lines_[i];
    } else {
      EXPECT_EQ(problems, f.problems) << f.name << "\n  tshark: " << lines_[i];
    }
  }
}

}  // namespace
}  // namespace softhca

int main(int argc, char** argv) {
  if (std::system("command -v tshark >/dev/null 2>&1") != 0) {
    std::puts("SKIP: tshark is not installed (Debian package tshark)");
    return 77;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
