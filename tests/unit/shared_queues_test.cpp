// The shared rings of the shm link, single-threaded: ordering, capacity,
// overrun, arming rules, cleaning a reset QP's completions out, and the SRQ
// limit bookkeeping.
#include "host/shared_queues.hpp"

#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstdlib>
#include <memory>
#include <vector>

namespace softhca::host {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

template <typename T>
std::unique_ptr<T, FreeDeleter> make_zeroed(size_t bytes) {
  void* mem = std::aligned_alloc(4096, (bytes + 4095) & ~size_t{4095});
  std::memset(mem, 0, bytes);
  return std::unique_ptr<T, FreeDeleter>(static_cast<T*>(mem));
}

// A CQ as it sits in a segment: the header at offset 0, its ring at 4096.
struct TestCq {
  explicit TestCq(uint32_t capacity, bool has_channel = true)
      : segment(make_zeroed<char>(4096 + CqRing::bytes_for(capacity))) {
    ring()->capacity = capacity;
    header()->has_channel = has_channel ? 1 : 0;
    header()->ring_offset.store(4096);
  }
  SharedCq* header() { return reinterpret_cast<SharedCq*>(segment.get()); }
  CqRing* ring() { return reinterpret_cast<CqRing*>(segment.get() + 4096); }
  SharedCq::Push push(const Cqe& cqe) { return header()->push(segment.get(), cqe); }
  bool pop(Cqe& out) { return ring()->pop(out); }
  std::unique_ptr<char, FreeDeleter> segment;
};

Cqe cqe_with(uint64_t wr_id, uint32_t status = IBV_WC_SUCCESS, bool solicited = false) {
  Cqe c{};
  c.wr_id = wr_id;
  c.status = status;
  c.solicited = solicited ? 1 : 0;
  return c;
}

TEST(SharedCq, PopsInPushOrder) {
  TestCq cq(8);
  for (uint64_t i = 0; i < 5; ++i) EXPECT_EQ(cq.push(cqe_with(i)), SharedCq::Push::kOk);
  Cqe out;
  for (uint64_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(cq.pop(out));
    EXPECT_EQ(out.wr_id, i);
  }
  EXPECT_FALSE(cq.pop(out));
  EXPECT_TRUE(cq.ring()->empty());
}

TEST(SharedCq, WrapsAroundManyTimes) {
  TestCq cq(4);
  Cqe out;
  for (uint64_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(cq.push(cqe_with(i)), SharedCq::Push::kOk);
    ASSERT_TRUE(cq.pop(out));
    ASSERT_EQ(out.wr_id, i);
  }
}

TEST(SharedCq, OverrunIsStickyAndKeepsEarlierEntries) {
  TestCq cq(4);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_EQ(cq.push(cqe_with(i)), SharedCq::Push::kOk);
  EXPECT_EQ(cq.push(cqe_with(99)), SharedCq::Push::kOverrun);
  Cqe out;
  ASSERT_TRUE(cq.pop(out));
  EXPECT_EQ(out.wr_id, 0u);
  // Once in error the CQ takes nothing more, even with room again.
  EXPECT_EQ(cq.push(cqe_with(100)), SharedCq::Push::kOverrun);
}

// Producers keep the consumer's position they last read (tail_seen) and
// read the real one only when that says the ring is full: a stale copy
// must neither refuse a push that has room nor let one overwrite an
// unpolled completion.
TEST(SharedCq, ACachedConsumerPositionNeitherRefusesRoomNorHidesAnOverrun) {
  TestCq cq(4);
  Cqe out;
  for (uint64_t round = 0; round < 3; ++round) {
    for (uint64_t i = 0; i < 4; ++i) ASSERT_EQ(cq.push(cqe_with(round * 10 + i)), SharedCq::Push::kOk);
    for (uint64_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(cq.pop(out));
      ASSERT_EQ(out.wr_id, round * 10 + i);
    }
  }
  EXPECT_LT(cq.ring()->tail_seen.load(), cq.ring()->tail.load()) << "the cached position lags the consumer";
  for (uint64_t i = 0; i < 4; ++i) ASSERT_EQ(cq.push(cqe_with(100 + i)), SharedCq::Push::kOk);
  EXPECT_EQ(cq.push(cqe_with(199)), SharedCq::Push::kOverrun);
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(cq.pop(out));
    EXPECT_EQ(out.wr_id, 100 + i);
  }
}

TEST(SharedCq, ArmedForNextFiresOnceThenDisarms) {
  TestCq cq(8);
  EXPECT_EQ(cq.push(cqe_with(1)), SharedCq::Push::kOk);  // not armed
  cq.header()->armed.store(SharedCq::kArmNext);
  EXPECT_EQ(cq.push(cqe_with(2)), SharedCq::Push::kOkNotify);
  EXPECT_EQ(cq.push(cqe_with(3)), SharedCq::Push::kOk);
}

TEST(SharedCq, SolicitedArmIgnoresUnsolicitedSuccess) {
  TestCq cq(8);
  cq.header()->armed.store(SharedCq::kArmSolicited);
  EXPECT_EQ(cq.push(cqe_with(1)), SharedCq::Push::kOk);
  EXPECT_EQ(cq.push(cqe_with(2, IBV_WC_SUCCESS, true)), SharedCq::Push::kOkNotify);
  cq.header()->armed.store(SharedCq::kArmSolicited);
  // An error completion fires a solicited-only arm too.
  EXPECT_EQ(cq.push(cqe_with(3, IBV_WC_WR_FLUSH_ERR)), SharedCq::Push::kOkNotify);
}

// Without a completion channel no event can be raised: an armed CQ (the
// verbs let a program arm one) neither fires nor disarms, and what is
// pushed is polled as usual.
TEST(SharedCq, WithoutAChannelAPushNeverAsksForAnEvent) {
  TestCq cq(8, /*has_channel=*/false);
  cq.header()->armed.store(SharedCq::kArmNext);
  EXPECT_EQ(cq.push(cqe_with(1)), SharedCq::Push::kOk);
  EXPECT_EQ(cq.header()->push_announced(cq.segment.get(), cqe_with(2, IBV_WC_WR_FLUSH_ERR)), SharedCq::Push::kOk);
  EXPECT_EQ(cq.header()->armed.load(), SharedCq::kArmNext);
  Cqe out;
  ASSERT_TRUE(cq.pop(out));
  EXPECT_EQ(out.wr_id, 1u);
  ASSERT_TRUE(cq.pop(out));
  EXPECT_EQ(out.wr_id, 2u);
  EXPECT_FALSE(cq.pop(out));
}

TEST(SharedCq, ProducersFollowTheRingOffsetAfterAResize) {
  // Two rings in one fake segment; the second replaces the first, as
  // CompletionQueue::resize does: close, copy, publish the new offset.
  auto segment = make_zeroed<char>(4096 + 2 * 8192);
  auto* header = reinterpret_cast<SharedCq*>(segment.get());
  auto* first = reinterpret_cast<CqRing*>(segment.get() + 4096);
  auto* second = reinterpret_cast<CqRing*>(segment.get() + 4096 + 8192);
  first->capacity = 2;
  second->capacity = 8;
  header->ring_offset.store(4096);
  ASSERT_EQ(header->push(segment.get(), cqe_with(1)), SharedCq::Push::kOk);
  ASSERT_EQ(header->push(segment.get(), cqe_with(2)), SharedCq::Push::kOk);
  const uint64_t closed_at = first->head.fetch_or(CqRing::kClosed);
  ASSERT_EQ(closed_at, 2u);
  for (uint64_t i = 0; i < closed_at; ++i) {
    second->slot(i).cqe = first->slot(i).cqe;
    second->slot(i).seq.store(i + 1);
  }
  second->head.store(closed_at);
  header->ring_offset.store(4096 + 8192);
  for (uint64_t i = 3; i <= 6; ++i) ASSERT_EQ(header->push(segment.get(), cqe_with(i)), SharedCq::Push::kOk);
  Cqe out;
  for (uint64_t i = 1; i <= 6; ++i) {
    ASSERT_TRUE(second->pop(out));
    EXPECT_EQ(out.wr_id, i);
  }
  // Nothing was reserved in the closed ring after it closed.
  EXPECT_EQ(first->head.load(), CqRing::kClosed | 2u);
}

Cqe cqe_of(uint32_t qp_num, uint64_t wr_id) {
  Cqe c = cqe_with(wr_id);
  c.qp_num = qp_num;
  return c;
}

// Completions of a reset QP (here qp 1) leave the ring; the others keep
// their order, and the room is free for new completions at once.
TEST(CqRingClean, RemovesTheDroppedAndKeepsTheOthersInOrder) {
  TestCq cq(8);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_EQ(cq.push(cqe_of(i % 2 == 0 ? 1 : 2, i)), SharedCq::Push::kOk);
  const uint64_t published = cq.ring()->remove_published_if([](uint64_t, const Cqe& c) { return c.qp_num == 1; });
  EXPECT_EQ(published, 8u);
  EXPECT_EQ(cq.ring()->tail.load(), 4u);
  for (uint64_t i = 100; i < 104; ++i)
    ASSERT_EQ(cq.push(cqe_of(3, i)), SharedCq::Push::kOk) << "the removed completions' room is free";
  EXPECT_EQ(cq.push(cqe_of(3, 104)), SharedCq::Push::kOverrun) << "and no more than that";
  Cqe out;
  for (uint64_t want : {1, 3, 5, 7, 100, 101, 102, 103}) {
    ASSERT_TRUE(cq.pop(out));
    EXPECT_EQ(out.wr_id, want);
  }
  EXPECT_FALSE(cq.pop(out));
}

// Across the ring's end, and with nothing to drop (nothing moves).
TEST(CqRingClean, WorksAcrossTheRingsEnd) {
  TestCq cq(4);
  Cqe out;
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_EQ(cq.push(cqe_of(2, i)), SharedCq::Push::kOk);
    ASSERT_TRUE(cq.pop(out));
  }
  for (uint64_t i = 10; i < 14; ++i) ASSERT_EQ(cq.push(cqe_of(i == 11 || i == 12 ? 1 : 2, i)), SharedCq::Push::kOk);
  EXPECT_EQ(cq.ring()->remove_published_if([](uint64_t, const Cqe&) { return false; }), 7u);
  EXPECT_EQ(cq.ring()->tail.load(), 3u);
  EXPECT_EQ(cq.ring()->remove_published_if([](uint64_t, const Cqe& c) { return c.qp_num == 1; }), 7u);
  EXPECT_EQ(cq.ring()->tail.load(), 5u);
  for (uint64_t want : {10, 13}) {
    ASSERT_TRUE(cq.pop(out));
    EXPECT_EQ(out.wr_id, want);
  }
  EXPECT_FALSE(cq.pop(out));
}

// A slot a producer reserved and has not filled yet ends the part the
// consumer may touch: neither it nor anything after it is read or moved,
// and the producer's late completion is polled in its place.
TEST(CqRingClean, StopsAtASlotAProducerIsStillFilling) {
  TestCq cq(8);
  ASSERT_EQ(cq.push(cqe_of(1, 0)), SharedCq::Push::kOk);
  ASSERT_EQ(cq.push(cqe_of(2, 1)), SharedCq::Push::kOk);
  const uint64_t reserved = cq.ring()->head.fetch_add(1);  // a producer inside push, between its reservation and its store
  ASSERT_EQ(reserved, 2u);
  ASSERT_EQ(cq.push(cqe_of(1, 3)), SharedCq::Push::kOk);
  ASSERT_EQ(cq.push(cqe_of(2, 4)), SharedCq::Push::kOk);
  std::vector<uint64_t> looked_at;
  const uint64_t published = cq.ring()->remove_published_if([&](uint64_t position, const Cqe& c) {
    looked_at.push_back(position);
    return c.qp_num == 1;
  });
  EXPECT_EQ(published, 2u);
  EXPECT_EQ(looked_at, (std::vector<uint64_t>{1, 0}));
  EXPECT_EQ(cq.ring()->tail.load(), 1u);
  // The producer finishes.
  CqSlot& late = cq.ring()->slot(reserved);
  late.cqe = cqe_of(2, 2);
  late.seq.store(reserved + 1);
  Cqe out;
  for (uint64_t want : {1, 2, 3, 4}) {  // 3 (qp 1) was past the unfilled slot: left for the poll to skip
    ASSERT_TRUE(cq.pop(out));
    EXPECT_EQ(out.wr_id, want);
  }
  EXPECT_FALSE(cq.pop(out));
}

std::unique_ptr<SharedRq, FreeDeleter> make_rq(uint32_t capacity, uint32_t max_sge) {
  auto rq = make_zeroed<SharedRq>(SharedRq::bytes_for(capacity, max_sge));
  rq->capacity = capacity;
  rq->max_sge = max_sge;
  rq->stride = SharedRq::stride_for(max_sge);
  return rq;
}

struct WqeBuffer {
  alignas(16) unsigned char bytes[sizeof(RecvWqe) + 4 * sizeof(RecvSge)];
  RecvWqe* wqe() { return reinterpret_cast<RecvWqe*>(bytes); }
};

TEST(SharedRq, TakesInPostOrderWithSges) {
  auto rq = make_rq(4, 4);
  RecvSge sges[3] = {{0x1000, 10, 7}, {0x2000, 20, 8}, {0x3000, 30, 9}};
  ASSERT_TRUE(rq->push(11, sges, 3, 0));
  ASSERT_TRUE(rq->push(12, sges, 1, 0));
  WqeBuffer buf;
  uint64_t remaining = 0;
  ASSERT_TRUE(rq->take(buf.wqe(), &remaining));
  EXPECT_EQ(buf.wqe()->wr_id, 11u);
  ASSERT_EQ(buf.wqe()->num_sge, 3u);
  EXPECT_EQ(buf.wqe()->sge[2].addr, 0x3000u);
  EXPECT_EQ(buf.wqe()->sge[2].length, 30u);
  EXPECT_EQ(buf.wqe()->sge[2].lkey, 9u);
  EXPECT_EQ(remaining, 1u);
  ASSERT_TRUE(rq->take(buf.wqe(), &remaining));
  EXPECT_EQ(buf.wqe()->wr_id, 12u);
  EXPECT_EQ(remaining, 0u);
  EXPECT_FALSE(rq->take(buf.wqe(), &remaining));
}

TEST(SharedRq, RefusesPostsBeyondCapacity) {
  auto rq = make_rq(2, 1);
  RecvSge sge{0x1000, 1, 1};
  // The owner's count of retired WQEs (0 here: none polled) lags the real
  // tail; push then looks at the tail itself before it refuses.
  EXPECT_TRUE(rq->push(1, &sge, 1, 0));
  EXPECT_TRUE(rq->push(2, &sge, 1, 0));
  EXPECT_FALSE(rq->push(3, &sge, 1, 0));
  EXPECT_EQ(rq->outstanding(), 2u);
  WqeBuffer buf;
  ASSERT_TRUE(rq->take(buf.wqe(), nullptr));
  EXPECT_TRUE(rq->push(3, &sge, 1, 0));
  EXPECT_FALSE(rq->push(4, &sge, 1, 1));
}

// A WQE's mark shows it posted exactly when the head does: never before the
// post, never for a slot's earlier lap, and never for a position past the
// head (a taker that trusts it must not move the tail past the head).
TEST(SharedRq, PostedMarkMatchesOnlyThePostedPosition) {
  auto rq = make_rq(2, 1);
  RecvSge sge{0x1000, 1, 1};
  EXPECT_EQ(rq->posted_at(0), nullptr);  // a fresh ring: nothing posted
  ASSERT_TRUE(rq->push(1, &sge, 1, 0));
  ASSERT_NE(rq->posted_at(0), nullptr);
  EXPECT_EQ(rq->posted_at(0)->wr_id, 1u);
  EXPECT_EQ(rq->posted_at(1), nullptr);
  EXPECT_EQ(rq->posted_at(2), nullptr);  // slot 0's next lap
  WqeBuffer buf;
  uint64_t t = 0;
  for (uint64_t wr = 2; wr < 40; ++wr) {  // laps of the two slots
    ASSERT_TRUE(rq->push(wr, &sge, 1, t));
    ASSERT_TRUE(rq->take(buf.wqe(), nullptr));
    ++t;
    // Each slot holds its latest post: the two positions below the head.
    const uint64_t h = rq->head.load();
    for (uint64_t p = 0; p < 44; ++p) {
      EXPECT_EQ(rq->posted_at(p) != nullptr, p < h && p + 2 >= h) << "position " << p << " head " << h;
    }
  }
}

// The owner's retire with a floor: while the floor shows WQEs taken it need
// not read the tail; it never retires past what was taken, and a floor left
// behind (a completion from before a reset) only sends it to the tail.
TEST(SharedRq, RetireTrustsTheFloorAndNeverPassesTheTail) {
  std::atomic<uint64_t> retired{0};
  std::atomic<uint64_t> tail{0};
  std::atomic<uint64_t> floor{0};
  // Nothing taken: nothing retires, whatever the count.
  SharedRq::retire(retired, tail, 1, &floor);
  EXPECT_EQ(retired.load(), 0u);
  // Two taken, the floor still 0: the tail is read and the floor raised.
  tail.store(2);
  SharedRq::retire(retired, tail, 1, &floor);
  EXPECT_EQ(retired.load(), 1u);
  EXPECT_EQ(floor.load(), 2u);
  // The floor shows one more: retired from it without the tail (set to 0
  // here only to show that it is not read).
  tail.store(0);
  SharedRq::retire(retired, tail, 1, &floor);
  EXPECT_EQ(retired.load(), 2u);
  // At the floor, the tail (0 here) decides: nothing more.
  SharedRq::retire(retired, tail, 5, &floor);
  EXPECT_EQ(retired.load(), 2u);
  tail.store(3);
  SharedRq::retire(retired, tail, 5, &floor);
  EXPECT_EQ(retired.load(), 3u);
  // raise_to only raises.
  SharedRq::raise_to(floor, 1);
  EXPECT_EQ(floor.load(), 3u);
  SharedRq::raise_to(floor, 4);
  EXPECT_EQ(floor.load(), 4u);
}

TEST(SegmentHeaderEvents, RingKeepsOrderAndRefusesWhenFull) {
  auto header = make_zeroed<SegmentHeader>(sizeof(SegmentHeader));
  for (uint32_t i = 0; i < SegmentHeader::kEventCapacity; ++i)
    ASSERT_TRUE(header->push(Event{static_cast<uint32_t>(EventKind::kCqNotify), i, 0, 0}));
  EXPECT_FALSE(header->push(Event{static_cast<uint32_t>(EventKind::kCqNotify), 9999, 0, 0}));
  Event out;
  for (uint32_t i = 0; i < SegmentHeader::kEventCapacity; ++i) {
    ASSERT_TRUE(header->pop(out));
    ASSERT_EQ(out.object, i);
  }
  EXPECT_FALSE(header->pop(out));
}

}  // namespace
}  // namespace softhca::host
