// CompletionQueue::resize against producers caught inside push: one that
// reserved a slot and died, one that holds an access announcement. Crafted
// state on a real CQ of a context opened on a private runtime directory.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "engine/completion_queue.hpp"
#include "engine/context.hpp"
#include "engine/node.hpp"

namespace softhca::engine {
namespace {

host::Cqe completion(uint64_t wr_id) {
  host::Cqe c{};
  c.wr_id = wr_id;
  c.opcode = IBV_WC_RDMA_WRITE;
  return c;
}

// A context of its own runtime directory, and a CQ of 3 entries (a ring of 4 slots) in it.
class CqResize : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(::mkdtemp(dir_), nullptr);
    made_dir_ = true;
    ASSERT_EQ(::setenv("SOFTHCA_RUNTIME_DIR", dir_, 1), 0);
    auto context = Context::open();
    ASSERT_TRUE(context.has_value());
    context_ = *context;
    auto created = CompletionQueue::create(*context_, 3, nullptr);
    ASSERT_TRUE(created.has_value());
    cq_ = *created;
  }
  void TearDown() override {
    delete cq_;
    if (context_ != nullptr) context_->release();
    ::unsetenv("SOFTHCA_RUNTIME_DIR");
    if (made_dir_) {
      EXPECT_EQ(std::system((std::string("rm -rf ") + dir_).c_str()), 0);
    }
  }
  char dir_[32] = "/dev/shm/softhca-unit-cq-XXXXXX";
  bool made_dir_ = false;
  Context* context_ = nullptr;
  CompletionQueue* cq_ = nullptr;
};

TEST_F(CqResize, AReservedButUnpublishedSlotIsDroppedNotCopiedStale) {
  CompletionQueue* cq = cq_;
  // Fill and drain the ring once, so that every slot holds an old completion.
  for (uint64_t i = 0; i < 4; ++i) cq->push(completion(100 + i));
  ibv_wc wc[8];
  ASSERT_EQ(cq->poll(8, wc), 4);
  // A producer reserves the next slot and dies before publishing it.
  host::SharedCq* shared = cq->shared();
  auto* ring = reinterpret_cast<host::CqRing*>(context_->node().segment().base() + shared->ring_offset.load());
  ring->head.fetch_add(1);
  cq->push(completion(200));  // a live producer after it
  ASSERT_TRUE(cq->resize(16).has_value());
  const int got = cq->poll(8, wc);
  ASSERT_EQ(got, 1) << "the dead producer's slot was copied (its stale wr_id " << wc[0].wr_id << ")";
  EXPECT_EQ(wc[0].wr_id, 200u);
  // The new ring works on.
  cq->push(completion(201));
  ASSERT_EQ(cq->poll(8, wc), 1);
  EXPECT_EQ(wc[0].wr_id, 201u);
}

// A producer of the owner's process pushes under its access announcement
// to the process (CompletionQueue::push), not counted in `pushers`: while
// one may hold a pointer into the replaced ring, the resize must not free
// that ring. The announcement here stands for such a producer, stopped
// between reading the ring's offset and publishing its slot.
TEST_F(CqResize, WaitsForAnAnnouncedProducerBeforeFreeingTheOldRing) {
  CompletionQueue* cq = cq_;
  Node& node = context_->node();
  std::atomic<bool> announced{false}, let_go{false}, ended{false};
  std::thread producer([&] {
    const uint32_t slot = node.registry().begin_access(node.proc(), node.proc());
    announced = true;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!let_go && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    ended = true;  // before the announcement ends: a resize that saw it end sees this
    node.registry().end_access(node.proc(), slot);
  });
  while (!announced) std::this_thread::yield();
  std::atomic<bool> resized{false}, ended_before_resized{false};
  std::thread resizer([&] {
    EXPECT_TRUE(cq->resize(16).has_value());
    ended_before_resized = ended.load();
    resized = true;
  });
  // The resize may not finish while the announcement stands; give it time
  // to show that it would (it is waited for, not raced: see below).
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (!resized && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  let_go = true;
  producer.join();
  resizer.join();
  EXPECT_TRUE(ended_before_resized.load()) << "the resize freed the old ring under an announced producer";
  cq->push(completion(7));  // the new ring works
  ibv_wc wc[2];
  ASSERT_EQ(cq->poll(2, wc), 1);
  EXPECT_EQ(wc[0].wr_id, 7u);
}

}  // namespace
}  // namespace softhca::engine
