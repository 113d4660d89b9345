// The host's departure table (cm/departure_table.hpp) in a private
// directory, what the CM agent decides from it (cm/departure_agent.hpp) with
// a fake clock and a fake liveness check, and the agent's datagrams
// (link/udp/management_port.hpp) parsed back by the wire's own parser.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "cm/departure_agent.hpp"
#include "cm/departure_table.hpp"
#include "cm/refusals.hpp"
#include "link/link.hpp"
#include "link/udp/management_port.hpp"
#include "wire/ip_udp.hpp"
#include "wire/packet.hpp"

namespace softhca::cm {
namespace {

using namespace std::chrono_literals;

class DepartureTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/softhca-departures-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto t = DepartureTable::open_in(dir_, true);
    ASSERT_TRUE(t.has_value());
    table_.reset(*t);
  }
  void TearDown() override {
    table_.reset();
    std::filesystem::remove_all(dir_);
  }

  static DepartureRecord record(uint32_t pid, uint32_t comm, uint8_t fill = 0xAB) {
    DepartureRecord r;
    r.pid = pid;
    r.start_time = 1000 + pid;
    r.local_comm_id = comm;
    r.wait_ms = 100;
    r.retries = 2;
    r.local[15] = 1;
    r.remote[15] = 2;
    r.mad.fill(fill);
    return r;
  }

  std::string dir_;
  std::unique_ptr<DepartureTable> table_;
};

TEST_F(DepartureTableTest, OwnersWriteAndFreeTheirRecordsBySlot) {
  auto a = table_->write(std::nullopt, record(10, 0x100));
  auto b = table_->write(std::nullopt, record(10, 0x101));
  ASSERT_TRUE(a && b);
  EXPECT_NE(*a, *b);
  auto all = table_->snapshot();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].record.mad[0], 0xAB);
  // Another owner's free, or a free naming another comm ID, frees nothing.
  table_->free(*a, 11, 0x100);
  table_->free(*a, 10, 0x999);
  EXPECT_EQ(table_->snapshot().size(), 2u);
  table_->free(*a, 10, 0x100);
  all = table_->snapshot();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].record.local_comm_id, 0x101u);
  // Writing the same owner and comm ID into its slot rewrites it there.
  auto again = table_->write(*b, record(10, 0x101, 0xCD));
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *b);
  all = table_->snapshot();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].record.mad[0], 0xCD);
}

TEST_F(DepartureTableTest, AnAnswerEndsTheRecordOfItsConnectionOnly) {
  ASSERT_TRUE(table_->write(std::nullopt, record(10, 0x100)));
  Gid other{};
  other[15] = 9;
  EXPECT_FALSE(table_->end(0x100, other));  // the same comm ID from another host: not ours
  EXPECT_FALSE(table_->end(0x200, record(10, 0).remote));
  EXPECT_TRUE(table_->end(0x100, record(10, 0).remote));
  EXPECT_TRUE(table_->snapshot().empty());
}

TEST_F(DepartureTableTest, AFullTableRefusesAndAFreedSlotServesAgain) {
  uint32_t first = 0;
  for (uint32_t i = 0; i < kMaxDepartures; ++i) {
    auto slot = table_->write(std::nullopt, record(10, i + 1));
    ASSERT_TRUE(slot) << i;
    if (i == 0) first = *slot;
  }
  auto full = table_->write(std::nullopt, record(10, 0xFFFFF));
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error(), std::errc::too_many_files_open_in_system);
  table_->free(first, 10, 1);
  EXPECT_TRUE(table_->write(std::nullopt, record(10, 0xFFFFF)));
}

TEST_F(DepartureTableTest, TheAgentMayExitOnlyWhileNoRecordIsInUse) {
  auto slot = table_->write(std::nullopt, record(10, 0x100));
  ASSERT_TRUE(slot);
  EXPECT_FALSE(table_->lock_if_idle());
  table_->free(*slot, 10, 0x100);
  ASSERT_TRUE(table_->lock_if_idle());
  table_->unlock_after_idle();
  // Still usable afterwards.
  EXPECT_TRUE(table_->write(std::nullopt, record(10, 0x100)));
}

TEST_F(DepartureTableTest, TheAgentLeavesTheLivingAlone) {
  ASSERT_TRUE(table_->write(std::nullopt, record(10, 0x100)));
  DepartureAgent agent([](uint32_t, uint64_t) { return true; });
  const auto t0 = DepartureAgent::Clock::time_point{} + 1h;
  EXPECT_TRUE(agent.look(*table_, t0).empty());
  EXPECT_TRUE(agent.look(*table_, t0 + 10s).empty());
  EXPECT_FALSE(agent.table_was_empty());
  EXPECT_FALSE(agent.next_due());
}

TEST_F(DepartureTableTest, TheAgentSendsADeadOwnersDreqAtOnceThenAfterEachWaitThenGivesUp) {
  ASSERT_TRUE(table_->write(std::nullopt, record(10, 0x100)));  // wait 100 ms, 2 retries
  ASSERT_TRUE(table_->write(std::nullopt, record(20, 0x200)));  // alive
  DepartureAgent agent([](uint32_t pid, uint64_t start) { return pid == 20 && start == 1020; });
  const auto t0 = DepartureAgent::Clock::time_point{} + 1h;
  auto sent = agent.look(*table_, t0);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].mad[0], 0xAB);
  EXPECT_EQ(sent[0].remote, record(10, 0).remote);
  EXPECT_EQ(agent.next_due(), t0 + 100ms);
  EXPECT_TRUE(agent.look(*table_, t0 + 99ms).empty());
  EXPECT_EQ(agent.look(*table_, t0 + 100ms).size(), 1u);
  EXPECT_EQ(agent.look(*table_, t0 + 200ms).size(), 1u);  // the second retry, the last
  EXPECT_TRUE(agent.look(*table_, t0 + 300ms).empty());   // given up: the record goes
  const auto left = table_->snapshot();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].record.pid, 20u);
  EXPECT_EQ(agent.adopted(), 0u);
}

TEST_F(DepartureTableTest, AnAnsweredDepartureStopsAndALaterRecordStartsAfresh) {
  auto slot = table_->write(std::nullopt, record(10, 0x100));
  ASSERT_TRUE(slot);
  DepartureAgent agent([](uint32_t, uint64_t) { return false; });
  const auto t0 = DepartureAgent::Clock::time_point{} + 1h;
  ASSERT_EQ(agent.look(*table_, t0).size(), 1u);
  // Another process of the host received the DREP.
  ASSERT_TRUE(table_->end(0x100, record(10, 0).remote));
  EXPECT_TRUE(agent.look(*table_, t0 + 1s).empty());
  EXPECT_EQ(agent.adopted(), 0u);
  EXPECT_TRUE(agent.table_was_empty());
  // A later record (another generation, were it in the same slot) is a new departure.
  auto again = table_->write(std::nullopt, record(11, 0x300, 0x11));
  ASSERT_TRUE(again);
  const auto sent = agent.look(*table_, t0 + 2s);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].mad[0], 0x11);
}

TEST(GsiDatagram, IsAUdSendFromQp1ToQp1WithTheGsiQkeyAndAValidIcrc) {
  wire::Gid src{}, dst{};
  src[10] = src[11] = dst[10] = dst[11] = 0xFF;
  src[12] = 198, src[13] = 18, src[14] = 0, src[15] = 1;
  dst[12] = 198, dst[13] = 18, dst[14] = 0, dst[15] = 2;
  MadBytes mad{};
  for (std::size_t i = 0; i < mad.size(); ++i) mad[i] = static_cast<uint8_t>(i);
  auto bytes = udp::gsi_datagram(src, dst, 49152, 7, mad);
  ASSERT_TRUE(bytes);
  wire::UdpFlow flow;
  flow.src_gid = src;
  flow.dst_gid = dst;
  flow.src_port = 49152;
  uint8_t image[wire::kIpv6HeaderSize + wire::kUdpHeaderSize];
  auto n = wire::write_ip_udp_headers(flow, bytes->size(), image);
  ASSERT_TRUE(n);
  auto parsed = wire::parse(std::span<const uint8_t>(image, *n), *bytes);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->headers.bth.dest_qpn, link::kGsiQpn);
  EXPECT_EQ(parsed->headers.bth.psn, 7u);
  ASSERT_TRUE(parsed->headers.deth);
  EXPECT_EQ(parsed->headers.deth->qkey, link::kGsiQkey);
  EXPECT_EQ(parsed->headers.deth->src_qpn, link::kGsiQpn);
  ASSERT_EQ(parsed->payload.size(), mad.size());
  EXPECT_TRUE(std::equal(mad.begin(), mad.end(), parsed->payload.begin()));
  // The ICRC covers the source port: another port, another ICRC.
  flow.src_port = 49153;
  n = wire::write_ip_udp_headers(flow, bytes->size(), image);
  EXPECT_FALSE(wire::parse(std::span<const uint8_t>(image, *n), *bytes).has_value());
}

TEST(Refusals, AsTheKernelsCmAnswersForIdsItLacks) {
  ReqMsg req;
  req.local_comm_id = 0x1234;
  const RejMsg rej = refuse_req(req, RejReason::kInvalidServiceId);
  EXPECT_EQ(rej.remote_comm_id, 0x1234u);
  EXPECT_EQ(rej.local_comm_id, 0u);
  EXPECT_EQ(rej.reason, static_cast<uint16_t>(RejReason::kInvalidServiceId));
  EXPECT_EQ(rej.message_rejected, RejectedMessage::kReq);

  SidrReqMsg sidr;
  sidr.request_id = 0x55;
  sidr.service_id = 0x0111000000001C06ULL;
  const SidrRepMsg rep = refuse_sidr_req(sidr, SidrStatus::kUnsupported);
  EXPECT_EQ(rep.request_id, 0x55u);
  EXPECT_EQ(rep.status, static_cast<uint8_t>(SidrStatus::kUnsupported));
  EXPECT_EQ(rep.service_id, sidr.service_id);

  // ib_cm's DREP for a DREQ it has no id for names both comm IDs.
  DreqMsg dreq;
  dreq.local_comm_id = 0x10;
  dreq.remote_comm_id = 0x20;
  const DrepMsg drep = answer_unknown_dreq(dreq);
  EXPECT_EQ(drep.local_comm_id, 0x20u);
  EXPECT_EQ(drep.remote_comm_id, 0x10u);
}

}  // namespace
}  // namespace softhca::cm
