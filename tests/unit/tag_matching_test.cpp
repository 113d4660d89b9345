// Tag matching (transport/tag_matching.hpp): the TM and rendezvous headers'
// bytes, the matching list (mask, oldest first, handles, deletion, limits),
// the phase sync that stops matching after an unexpected message, and the
// responder's tagged path on a fake port: a matched EAGER lands without its
// header, an unmatched one takes an ordinary WQE whole and is counted (but
// not when it is RNR NAKed), NO_TAG is never counted, a RNDV READs the
// requester's range and asks for a FIN, or ends RNDV_INCOMPLETE.
#include "transport/responder.hpp"
#include "transport/tag_matching.hpp"

#include "fake_responder_port.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

namespace softhca::transport {
namespace {

// A list in ordinary (zeroed) memory, as the SRQ's segment holds it.
class List {
 public:
  explicit List(uint32_t max_tags) : bytes_(TagList::bytes_for(max_tags) + alignof(TagEntry), 0) {
    list = TagList::init(bytes_.data(), max_tags);
  }
  TagList* list;

 private:
  std::vector<uint64_t> bytes_;
};

ReceiveSge sge(uint64_t addr = 0x1000, uint32_t length = 64) { return ReceiveSge{addr, length, kKey}; }

TEST(TmHeader, DecodesTheBigEndianFieldsAndEncodesThemBack) {
  const std::array<unsigned char, 16> bytes = {3, 0, 0, 0, 0xA1, 0xA2, 0xA3, 0xA4,
                                               1, 2, 3, 4, 5, 6, 7, 8};
  const TmHeader h = decode_tm_header(bytes);
  EXPECT_EQ(h.opcode, static_cast<uint8_t>(TmOpcode::kEager));
  EXPECT_EQ(h.app_ctx, 0xA1A2A3A4u);
  EXPECT_EQ(h.tag, 0x0102030405060708ull);
  std::array<unsigned char, 16> out{};
  out.fill(0xff);
  encode_tm_header(h, out);
  EXPECT_EQ(out, bytes);
}

TEST(TmHeader, RendezvousHeaderIsVaRkeyLength) {
  const std::array<unsigned char, 16> bytes = {0, 0, 0x7f, 0, 0, 0, 0x10, 0,
                                               0, 0, 0x12, 0x34, 0, 0, 0x04, 0};
  const RndvHeader h = decode_rndv_header(bytes);
  EXPECT_EQ(h.va, 0x7f0000001000ull);
  EXPECT_EQ(h.rkey, 0x1234u);
  EXPECT_EQ(h.length, 0x400u);
}

TEST(TagList, MatchesUnderTheEntrysMaskAndTakesTheEntryOff) {
  List l(8);
  const ReceiveSge s = sge();
  auto h = l.list->add(0x1200, 0xff00, 55, &s, 1);
  ASSERT_TRUE(h);
  l.list->lock();
  EXPECT_FALSE(l.list->match_locked(0x1300));
  auto e = l.list->match_locked(0x12ab);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->wr_id, 55u);
  EXPECT_EQ(e->sge[0].addr, 0x1000u);
  EXPECT_FALSE(l.list->match_locked(0x12ab));  // consumed
  l.list->unlock();
  EXPECT_EQ(l.list->used, 0u);
  EXPECT_FALSE(l.list->remove(*h));  // a DEL after the message took it: TM_ERR
}

TEST(TagList, TheOldestMatchingEntryWins) {
  List l(4);
  const ReceiveSge s = sge();
  auto first = l.list->add(7, ~0ull, 1, &s, 1);
  auto second = l.list->add(7, ~0ull, 2, &s, 1);
  ASSERT_TRUE(first && second);
  // Free the first slot and reuse it: the entry in it is now the youngest.
  ASSERT_TRUE(l.list->remove(*first));
  auto third = l.list->add(7, ~0ull, 3, &s, 1);
  ASSERT_TRUE(third);
  l.list->lock();
  EXPECT_EQ(l.list->match_locked(7)->wr_id, 2u);
  EXPECT_EQ(l.list->match_locked(7)->wr_id, 3u);
  l.list->unlock();
}

TEST(TagList, DeletionNeedsALiveHandle) {
  List l(2);
  const ReceiveSge s = sge();
  auto h = l.list->add(1, ~0ull, 1, &s, 1);
  ASSERT_TRUE(h);
  EXPECT_TRUE(l.list->remove(*h));
  EXPECT_FALSE(l.list->remove(*h));
  EXPECT_FALSE(l.list->remove(2));  // past max_tags
  l.list->lock();
  EXPECT_FALSE(l.list->match_locked(1));
  l.list->unlock();
}

TEST(TagList, IsLimitedToMaxNumTagsAndMaxSge) {
  List l(2);
  const ReceiveSge s[2] = {sge(), sge()};
  ASSERT_TRUE(l.list->add(1, ~0ull, 1, s, 1));
  ASSERT_TRUE(l.list->add(2, ~0ull, 2, s, 0));
  auto full = l.list->add(3, ~0ull, 3, s, 1);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error(), std::errc::not_enough_memory);
  ASSERT_TRUE(l.list->remove(0));
  auto too_many_sges = l.list->add(3, ~0ull, 3, s, limits::kTmMaxSge + 1);
  ASSERT_FALSE(too_many_sges);
  EXPECT_EQ(too_many_sges.error(), std::errc::invalid_argument);
  EXPECT_TRUE(l.list->add(3, ~0ull, 3, s, 1));
}

TEST(TagList, ALockWhoseHolderDiedIsTakenOverAndItsCountRepaired) {
  List l(2);
  const ReceiveSge s = sge();
  auto h = l.list->add(1, ~0ull, 1, &s, 1);
  ASSERT_TRUE(h);
  // Process 42 matched the entry and died between its two stores: the
  // entry is off the list, the count not yet lowered, the lock still its.
  l.list->lock(LockTaker{42, nullptr});
  l.list->entries()[*h].in_use = 0;
  const LockTaker survivor{7, [](uint32_t pid) { return pid != 42; }};
  EXPECT_TRUE(l.list->add(2, ~0ull, 2, &s, 1, survivor));
  EXPECT_TRUE(l.list->add(3, ~0ull, 3, &s, 1, survivor));  // room for two again
  EXPECT_FALSE(l.list->add(4, ~0ull, 4, &s, 1, survivor));
  // A holder that lives is waited for, not taken over: the lock is free here.
  l.list->lock(survivor);
  l.list->unlock();
}

TEST(TagList, AnUnexpectedMessageStopsMatchingUntilSoftwareReportsIt) {
  List l(4);
  const ReceiveSge s = sge();
  ASSERT_TRUE(l.list->add(9, ~0ull, 1, &s, 1));
  EXPECT_TRUE(l.list->in_sync());
  l.list->lock();
  l.list->count_unexpected_locked();
  EXPECT_FALSE(l.list->match_locked(9));
  l.list->unlock();
  EXPECT_FALSE(l.list->in_sync());
  l.list->report(0);  // a stale count changes nothing
  EXPECT_FALSE(l.list->in_sync());
  l.list->report(1);
  EXPECT_TRUE(l.list->in_sync());
  l.list->lock();
  EXPECT_TRUE(l.list->match_locked(9));
  l.list->unlock();
}

// A port onto an RC QP on a TM SRQ, the requester's memory being `requester`.
class TmPort final : public FakePort {
 public:
  TmPort() : list_(8) {}
  TagList* tag_list() override { return list_.list; }
  bool requester_range(uint32_t, uint64_t va, uint32_t rkey, uint64_t length, iovec& out) override {
    const uint64_t base = reinterpret_cast<uint64_t>(requester.data());
    if (rkey != kRequesterKey || va < base || va + length > base + requester.size()) return false;
    out = iovec{reinterpret_cast<void*>(va), static_cast<size_t>(length)};
    return true;
  }
  static constexpr uint32_t kRequesterKey = 0x4567;
  std::vector<unsigned char> requester = std::vector<unsigned char>(256, 0x5A);
  List list_;
};

class TaggedResponder : public ::testing::Test {
 protected:
  // A SEND of `total` bytes: the TMH (and RVH), then 0xC0 bytes.
  Request message(TmOpcode opcode, uint64_t tag, uint32_t total, RndvHeader rvh = {}) {
    bytes_.assign(total, 0xC0);
    std::array<unsigned char, 16> tmh{};
    encode_tm_header(TmHeader{static_cast<uint8_t>(opcode), 0xAB, tag}, tmh);
    std::memcpy(bytes_.data(), tmh.data(), std::min<size_t>(16, total));
    if (opcode == TmOpcode::kRndv && total >= 32) {
      for (int i = 0; i < 8; ++i) bytes_[16 + i] = static_cast<unsigned char>(rvh.va >> (56 - 8 * i));
      for (int i = 0; i < 4; ++i) bytes_[24 + i] = static_cast<unsigned char>(rvh.rkey >> (24 - 8 * i));
      for (int i = 0; i < 4; ++i) bytes_[28 + i] = static_cast<unsigned char>(rvh.length >> (24 - 8 * i));
    }
    iov_ = iovec{bytes_.data(), bytes_.size()};
    Request r;
    r.op = Operation::kSend;
    r.qp_type = IBV_QPT_RC;
    r.src_qpn = 0x99;
    r.data = &iov_;
    r.ndata = 1;
    r.length = total;
    return r;
  }
  void add_tag(uint64_t tag, uint64_t wr_id, uint64_t iova, uint32_t length) {
    const ReceiveSge s{iova, length, kKey};
    ASSERT_TRUE(port_.list_.list->add(tag, ~0ull, wr_id, &s, 1));
  }

  TmPort port_;
  std::vector<unsigned char> bytes_;
  iovec iov_{};
};

TEST_F(TaggedResponder, AMatchedEagerLandsWithoutItsHeader) {
  add_tag(0x42, 7, kIova + 512, 128);
  EXPECT_EQ(respond(message(TmOpcode::kEager, 0x42, 80), port_, true).syndrome, Syndrome::ack());
  ASSERT_EQ(port_.completions.size(), 1u);
  const ReceiveCompletion& c = port_.completions[0];
  EXPECT_EQ(c.wr_id, 7u);
  EXPECT_EQ(c.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(c.byte_len, 64u);
  EXPECT_EQ(c.wc_flags, uint32_t{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
  EXPECT_TRUE(c.no_wqe && c.tm_info);
  EXPECT_EQ(c.tm_tag, 0x42u);
  EXPECT_EQ(c.tm_priv, 0xABu);
  EXPECT_EQ(port_.at(kIova + 512)[0], 0xC0);
  EXPECT_EQ(port_.at(kIova + 512)[63], 0xC0);
  EXPECT_EQ(port_.at(kIova + 512)[64], 0);
}

TEST_F(TaggedResponder, AnUnmatchedEagerIsUnexpectedWholeAndCounted) {
  add_tag(0x42, 7, kIova + 512, 128);
  port_.post_receive(9, kIova, 128);
  EXPECT_EQ(respond(message(TmOpcode::kEager, 0x43, 80), port_, true).syndrome, Syndrome::ack());
  ASSERT_EQ(port_.completions.size(), 1u);
  const ReceiveCompletion& c = port_.completions[0];
  EXPECT_EQ(c.wr_id, 9u);
  EXPECT_EQ(c.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(c.byte_len, 80u);
  EXPECT_EQ(c.wc_flags, 0u);
  EXPECT_FALSE(c.no_wqe || c.tm_info);
  EXPECT_EQ(port_.at(kIova)[0], static_cast<unsigned char>(TmOpcode::kEager));
  EXPECT_EQ(port_.list_.list->unexpected, 1u);
  // Out of sync now: even the posted tag is not matched.
  port_.post_receive(10, kIova, 128);
  EXPECT_EQ(respond(message(TmOpcode::kEager, 0x42, 80), port_, true).syndrome, Syndrome::ack());
  EXPECT_EQ(port_.completions.back().wr_id, 10u);
  EXPECT_EQ(port_.list_.list->unexpected, 2u);
  port_.list_.list->report(2);
  EXPECT_EQ(respond(message(TmOpcode::kEager, 0x42, 80), port_, true).syndrome, Syndrome::ack());
  EXPECT_EQ(port_.completions.back().wr_id, 7u);
  EXPECT_EQ(port_.completions.back().wc_flags, uint32_t{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
}

TEST_F(TaggedResponder, AnUnexpectedMessageWithoutAWqeIsRnrAndNotCounted) {
  EXPECT_EQ(respond(message(TmOpcode::kEager, 0x43, 80), port_, true).syndrome.answer, Answer::kRnrNak);
  EXPECT_EQ(port_.list_.list->unexpected, 0u);
  EXPECT_TRUE(port_.completions.empty());
}

TEST_F(TaggedResponder, NoTagAndShortMessagesTakeAnOrdinaryWqeUncounted) {
  add_tag(0x42, 7, kIova + 512, 128);
  port_.post_receive(1, kIova, 128);
  port_.post_receive(2, kIova, 128);
  EXPECT_EQ(respond(message(TmOpcode::kNoTag, 0x42, 40), port_, true).syndrome, Syndrome::ack());
  EXPECT_EQ(respond(message(TmOpcode::kEager, 0x42, 8), port_, true).syndrome, Syndrome::ack());
  ASSERT_EQ(port_.completions.size(), 2u);
  EXPECT_EQ(port_.completions[0].opcode, IBV_WC_TM_NO_TAG);
  EXPECT_EQ(port_.completions[0].byte_len, 40u);
  EXPECT_EQ(port_.completions[1].opcode, IBV_WC_TM_NO_TAG);
  EXPECT_EQ(port_.completions[1].wr_id, 2u);
  EXPECT_EQ(port_.list_.list->unexpected, 0u);
  EXPECT_EQ(port_.list_.list->used, 1u);
}

TEST_F(TaggedResponder, AnEagerLongerThanItsTaggedBufferFailsTheQp) {
  add_tag(0x42, 7, kIova + 512, 16);
  EXPECT_EQ(respond(message(TmOpcode::kEager, 0x42, 80), port_, true).syndrome,
            Syndrome::nak(Answer::kNakInvalidRequest));
  ASSERT_EQ(port_.completions.size(), 1u);
  EXPECT_EQ(port_.completions[0].status, IBV_WC_LOC_LEN_ERR);
  ASSERT_EQ(port_.events.size(), 1u);
}

TEST_F(TaggedResponder, AMatchedRendezvousReadsTheRequestersRangeAndAsksForAFin) {
  add_tag(0x42, 7, kIova + 512, 256);
  const uint64_t va = reinterpret_cast<uint64_t>(port_.requester.data());
  const Response r = respond(message(TmOpcode::kRndv, 0x42, 64, RndvHeader{va, TmPort::kRequesterKey, 200}), port_, true);
  EXPECT_EQ(r.syndrome, Syndrome::ack());
  EXPECT_TRUE(r.rendezvous_fin);
  EXPECT_EQ(r.fin_tag, 0x42u);
  EXPECT_EQ(r.fin_app_ctx, 0xABu);
  ASSERT_EQ(port_.completions.size(), 2u);
  EXPECT_EQ(port_.completions[0].wc_flags, uint32_t{IBV_WC_TM_MATCH});
  EXPECT_TRUE(port_.completions[0].tm_info);
  EXPECT_EQ(port_.completions[1].wc_flags, uint32_t{IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(port_.completions[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(port_.completions[1].byte_len, 200u);
  EXPECT_FALSE(port_.completions[1].tm_info);
  EXPECT_EQ(port_.at(kIova + 512)[199], 0x5A);
  EXPECT_EQ(port_.at(kIova + 512)[200], 0);
}

TEST_F(TaggedResponder, ARendezvousThatCannotBeReadIsIncomplete) {
  add_tag(0x42, 7, kIova + 512, 64);
  const uint64_t va = reinterpret_cast<uint64_t>(port_.requester.data());
  // Longer than the tagged buffer, then a key the requester does not have.
  Response r = respond(message(TmOpcode::kRndv, 0x42, 64, RndvHeader{va, TmPort::kRequesterKey, 200}), port_, true);
  EXPECT_EQ(r.syndrome, Syndrome::ack());
  EXPECT_FALSE(r.rendezvous_fin);
  ASSERT_EQ(port_.completions.size(), 2u);
  EXPECT_EQ(port_.completions[1].status, IBV_WC_TM_RNDV_INCOMPLETE);
  EXPECT_EQ(port_.completions[1].wc_flags, 0u);
  add_tag(0x43, 8, kIova + 512, 256);
  r = respond(message(TmOpcode::kRndv, 0x43, 64, RndvHeader{va, 0xBAD, 200}), port_, true);
  EXPECT_FALSE(r.rendezvous_fin);
  ASSERT_EQ(port_.completions.size(), 4u);
  EXPECT_EQ(port_.completions[3].status, IBV_WC_TM_RNDV_INCOMPLETE);
}

}  // namespace
}  // namespace softhca::transport
