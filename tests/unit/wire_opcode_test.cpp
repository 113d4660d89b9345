// The opcode table against IBTA vol. 1's BTH opcode table, written out again
// here by hand so that a slip in one copy shows as a mismatch.
#include "wire/opcode.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "wire/headers.hpp"

namespace softhca::wire {
namespace {

struct Expected {
  uint8_t opcode;
  const char* headers;  // extended headers in wire order, "+"-separated
  PayloadRule payload;
  Operation operation;
  Segment segment;
};

using enum PayloadRule;
using enum Operation;
using enum Segment;

constexpr Expected kSpec[] = {
    {0x00, "", kData, kSend, kFirst},
    {0x01, "", kData, kSend, kMiddle},
    {0x02, "", kData, kSend, kLast},
    {0x03, "ImmDt", kData, kSend, kLast},
    {0x04, "", kData, kSend, kOnly},
    {0x05, "ImmDt", kData, kSend, kOnly},
    {0x06, "RETH", kData, kRdmaWrite, kFirst},
    {0x07, "", kData, kRdmaWrite, kMiddle},
    {0x08, "", kData, kRdmaWrite, kLast},
    {0x09, "ImmDt", kData, kRdmaWrite, kLast},
    {0x0A, "RETH", kData, kRdmaWrite, kOnly},
    {0x0B, "RETH+ImmDt", kData, kRdmaWrite, kOnly},
    {0x0C, "RETH", kNone, kRdmaReadRequest, kOnly},
    {0x0D, "AETH", kData, kRdmaReadResponse, kFirst},
    {0x0E, "", kData, kRdmaReadResponse, kMiddle},
    {0x0F, "AETH", kData, kRdmaReadResponse, kLast},
    {0x10, "AETH", kData, kRdmaReadResponse, kOnly},
    {0x11, "AETH", kNone, kAcknowledge, kOnly},
    {0x12, "AETH+AtomicAckETH", kNone, kAtomicAcknowledge, kOnly},
    {0x13, "AtomicETH", kNone, kCompareSwap, kOnly},
    {0x14, "AtomicETH", kNone, kFetchAdd, kOnly},
    {0x16, "IETH", kData, kSend, kLast},
    {0x17, "IETH", kData, kSend, kOnly},
    {0x1D, "RETH", kAtomicValue, kAtomicWrite, kOnly},
    {0x20, "", kData, kSend, kFirst},
    {0x21, "", kData, kSend, kMiddle},
    {0x22, "", kData, kSend, kLast},
    {0x23, "ImmDt", kData, kSend, kLast},
    {0x24, "", kData, kSend, kOnly},
    {0x25, "ImmDt", kData, kSend, kOnly},
    {0x26, "RETH", kData, kRdmaWrite, kFirst},
    {0x27, "", kData, kRdmaWrite, kMiddle},
    {0x28, "", kData, kRdmaWrite, kLast},
    {0x29, "ImmDt", kData, kRdmaWrite, kLast},
    {0x2A, "RETH", kData, kRdmaWrite, kOnly},
    {0x2B, "RETH+ImmDt", kData, kRdmaWrite, kOnly},
    {0x64, "DETH", kData, kSend, kOnly},
    {0x65, "DETH+ImmDt", kData, kSend, kOnly},
    // XRC: every request carries an XRCETH right after the BTH; responses do not.
    {0xA0, "XRCETH", kData, kSend, kFirst},
    {0xA1, "XRCETH", kData, kSend, kMiddle},
    {0xA2, "XRCETH", kData, kSend, kLast},
    {0xA3, "XRCETH+ImmDt", kData, kSend, kLast},
    {0xA4, "XRCETH", kData, kSend, kOnly},
    {0xA5, "XRCETH+ImmDt", kData, kSend, kOnly},
    {0xA6, "XRCETH+RETH", kData, kRdmaWrite, kFirst},
    {0xA7, "XRCETH", kData, kRdmaWrite, kMiddle},
    {0xA8, "XRCETH", kData, kRdmaWrite, kLast},
    {0xA9, "XRCETH+ImmDt", kData, kRdmaWrite, kLast},
    {0xAA, "XRCETH+RETH", kData, kRdmaWrite, kOnly},
    {0xAB, "XRCETH+RETH+ImmDt", kData, kRdmaWrite, kOnly},
    {0xAC, "XRCETH+RETH", kNone, kRdmaReadRequest, kOnly},
    {0xAD, "AETH", kData, kRdmaReadResponse, kFirst},
    {0xAE, "", kData, kRdmaReadResponse, kMiddle},
    {0xAF, "AETH", kData, kRdmaReadResponse, kLast},
    {0xB0, "AETH", kData, kRdmaReadResponse, kOnly},
    {0xB1, "AETH", kNone, kAcknowledge, kOnly},
    {0xB2, "AETH+AtomicAckETH", kNone, kAtomicAcknowledge, kOnly},
    {0xB3, "XRCETH+AtomicETH", kNone, kCompareSwap, kOnly},
    {0xB4, "XRCETH+AtomicETH", kNone, kFetchAdd, kOnly},
    {0xB6, "XRCETH+IETH", kData, kSend, kLast},
    {0xB7, "XRCETH+IETH", kData, kSend, kOnly},
};

std::string describe(const ExtHeaders& h) {
  std::string s;
  auto add = [&](bool present, const char* name) {
    if (!present) return;
    if (!s.empty()) s += "+";
    s += name;
  };
  add(h.deth, "DETH");
  add(h.xrceth, "XRCETH");
  add(h.reth, "RETH");
  add(h.atomic_eth, "AtomicETH");
  add(h.aeth, "AETH");
  add(h.atomic_ack_eth, "AtomicAckETH");
  add(h.immdt, "ImmDt");
  add(h.ieth, "IETH");
  return s;
}

std::size_t size_of(const ExtHeaders& h) {
  return kBthSize + (h.deth ? 8 : 0) + (h.xrceth ? 4 : 0) + (h.reth ? 16 : 0) + (h.atomic_eth ? 28 : 0) + (h.aeth ? 4 : 0) +
         (h.atomic_ack_eth ? 8 : 0) + (h.immdt ? 4 : 0) + (h.ieth ? 4 : 0);
}

TEST(WireOpcode, TableMatchesTheSpec) {
  ASSERT_EQ(all_opcodes().size(), std::size(kSpec));
  for (const Expected& e : kSpec) {
    SCOPED_TRACE(testing::Message() << "opcode 0x" << std::hex << int{e.opcode});
    const auto info = opcode_info(e.opcode);
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(static_cast<uint8_t>(info->opcode), e.opcode);
    EXPECT_EQ(describe(info->headers), e.headers);
    EXPECT_EQ(info->payload, e.payload);
    EXPECT_EQ(info->operation, e.operation);
    EXPECT_EQ(info->segment, e.segment);
    EXPECT_EQ(info->header_size, size_of(info->headers));
    EXPECT_EQ(info->transport, static_cast<Transport>(e.opcode >> 5));
  }
}

TEST(WireOpcode, NamesAreUniqueAndStartWithTheTransport) {
  std::set<std::string_view> names;
  for (const OpcodeInfo& info : all_opcodes()) {
    EXPECT_TRUE(names.insert(info.name).second) << info.name;
    const std::string_view prefix = info.transport == Transport::kRc    ? "RC_"
                                    : info.transport == Transport::kUc  ? "UC_"
                                    : info.transport == Transport::kXrc ? "XRC_"
                                                                        : "UD_";
    EXPECT_TRUE(info.name.starts_with(prefix)) << info.name;
  }
}

TEST(WireOpcode, EverythingElseIsUnknown) {
  std::set<int> known;
  for (const Expected& e : kSpec) known.insert(e.opcode);
  for (int op = 0; op < 256; ++op) {
    if (known.count(op) == 0) {
      EXPECT_FALSE(opcode_info(static_cast<uint8_t>(op)).has_value()) << op;
    }
  }
  // The ones a peer might actually send: reserved RC codes, FLUSH (needs the
  // FETH), RD, UD codes other than SEND ONLY, RoCEv2's CNP, XRC's reserved
  // and its ATOMIC WRITE (not offered on XRC QPs).
  for (int op : {0x15, 0x18, 0x1C, 0x1E, 0x1F, 0x2C, 0x40, 0x44, 0x60, 0x63, 0x66, 0x81, 0xB5, 0xBD, 0xFF}) {
    EXPECT_FALSE(opcode_info(static_cast<uint8_t>(op)).has_value()) << op;
  }
}

TEST(WireOpcode, TransportIsTheTopThreeBits) {
  EXPECT_EQ(transport_of(0x04), Transport::kRc);
  EXPECT_EQ(transport_of(0x2A), Transport::kUc);
  EXPECT_EQ(transport_of(0x4C), Transport::kRd);
  EXPECT_EQ(transport_of(0x64), Transport::kUd);
  EXPECT_EQ(transport_of(0xA4), Transport::kXrc);
  EXPECT_EQ(rc_twin(0xB1), 0x11);
  EXPECT_EQ(xrc_twin(0x0A), 0xAA);
}

}  // namespace
}  // namespace softhca::wire
