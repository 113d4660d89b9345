// The relay of a QP's asynchronous events: an initiator that moves a QP to
// ERROR (or establishes it) queues an event in the QP owner's ring, naming
// the QP by its object id, which the owner's progress thread turns into an
// ibv_async_event. Ids are reused as soon as a QP is destroyed, so an event
// still in the ring must not reach the next QP that gets the id: the event
// carries the QP's number, and the relay drops one that names another.
// The same for CQ (completion event, overrun) and SRQ (limit) events, which
// carry the object's serial.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include "engine/completion_channel.hpp"
#include "engine/completion_queue.hpp"
#include "engine/context.hpp"
#include "engine/protection_domain.hpp"
#include "engine/qp/queue_pair.hpp"
#include "engine/shared_receive_queue.hpp"
#include "host/attachment.hpp"

namespace softhca::engine {
namespace {

bool readable_within(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

TEST(QpEventRelay, AnEventNamingAnotherQpNumberIsNotRelayedToTheQpWithItsId) {
  auto ctx = Context::open();
  ASSERT_TRUE(ctx.has_value());
  auto pd = ProtectionDomain::create(**ctx);
  auto cq = CompletionQueue::create(**ctx, 16, nullptr);
  ASSERT_TRUE(pd.has_value() && cq.has_value());
  QpInitAttr init{};
  init.type = IBV_QPT_RC;
  init.send_cq = *cq;
  init.recv_cq = *cq;
  init.max_send_wr = 4;
  init.max_recv_wr = 4;
  init.max_send_sge = 1;
  init.max_recv_sge = 1;
  auto qp = QueuePair::create(**ctx, *pd, init);
  ASSERT_TRUE(qp.has_value());
  int application_qp = 0;  // what the shim would hand the application
  (*qp)->handle.store(&application_qp);

  host::Attachment& host = (**ctx).node().host();
  const auto event = [&](ibv_event_type type, uint32_t qpn) {
    return host::Event{static_cast<uint32_t>(host::EventKind::kQpAsync), (*qp)->id(), static_cast<uint32_t>(type),
                       qpn};
  };
  // A destroyed QP's error, queued under the id this QP now has, then an
  // event of this very QP: relayed in order, only the second arrives.
  host.notify(host.proc(), host.pid(), event(IBV_EVENT_QP_FATAL, (*qp)->qpn() ^ 0x100));
  host.notify(host.proc(), host.pid(), event(IBV_EVENT_PATH_MIG, (*qp)->qpn()));
  ASSERT_TRUE(readable_within((**ctx).async_fd(), 5000));
  auto got = (**ctx).get_async_event();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->type, IBV_EVENT_PATH_MIG);
  EXPECT_EQ(got->handle, &application_qp);
  EXPECT_EQ((*qp)->state(), IBV_QPS_RESET);  // the stale error did not touch it
  EXPECT_FALSE(readable_within((**ctx).async_fd(), 0));

  (**ctx).forget_events(&application_qp);
  delete *qp;
  delete *cq;
  delete *pd;
  (*ctx)->release();
}

// Each phase queues a stale event (another object's serial under a live
// object's id), then a live event of the other object as a barrier: once
// the barrier arrives, the stale event has been handled, and must have
// left no trace.
TEST(CqAndSrqEventRelay, EventsOfAnotherObjectWithTheIdAreNotRelayed) {
  auto ctx = Context::open();
  ASSERT_TRUE(ctx.has_value());
  auto pd = ProtectionDomain::create(**ctx);
  auto channel = CompletionChannel::create();
  ASSERT_TRUE(pd.has_value() && channel.has_value());
  auto cq = CompletionQueue::create(**ctx, 16, *channel);
  auto srq = SharedReceiveQueue::create(**pd, 16, 1, 0);
  ASSERT_TRUE(cq.has_value() && srq.has_value());
  int application_cq = 0, application_srq = 0;
  (*cq)->handle = &application_cq;
  (*srq)->handle = &application_srq;
  host::Attachment& host = (**ctx).node().host();
  const auto cq_event = [&](host::EventKind kind, uint32_t serial) {
    return host::Event{static_cast<uint32_t>(kind), (*cq)->id(), 0, serial};
  };
  const auto srq_event = [&](uint32_t serial) {
    return host::Event{static_cast<uint32_t>(host::EventKind::kSrqLimit), (*srq)->id(), 0, serial};
  };

  // A destroyed CQ's completion event and overrun, then this SRQ's limit.
  host.notify(host.proc(), host.pid(), cq_event(host::EventKind::kCqNotify, (*cq)->serial() + 1));
  host.notify(host.proc(), host.pid(), cq_event(host::EventKind::kCqError, (*cq)->serial() + 1));
  host.notify(host.proc(), host.pid(), srq_event((*srq)->serial()));
  ASSERT_TRUE(readable_within((**ctx).async_fd(), 5000));
  auto got = (**ctx).get_async_event();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->type, IBV_EVENT_SRQ_LIMIT_REACHED);
  EXPECT_EQ(got->handle, &application_srq);
  EXPECT_FALSE(readable_within((*channel)->fd(), 0));
  EXPECT_FALSE(readable_within((**ctx).async_fd(), 0));

  // A destroyed SRQ's limit, then this CQ's completion event.
  host.notify(host.proc(), host.pid(), srq_event((*srq)->serial() + 1));
  host.notify(host.proc(), host.pid(), cq_event(host::EventKind::kCqNotify, (*cq)->serial()));
  ASSERT_TRUE(readable_within((*channel)->fd(), 5000));
  auto signalled = (*channel)->get_event();
  ASSERT_TRUE(signalled.has_value());
  EXPECT_EQ(*signalled, *cq);
  EXPECT_FALSE(readable_within((**ctx).async_fd(), 0));

  (**ctx).forget_events(&application_srq);
  delete *srq;
  delete *cq;
  delete *channel;
  delete *pd;
  (*ctx)->release();
}

}  // namespace
}  // namespace softhca::engine
