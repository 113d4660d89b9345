// XRC (manual 3.4.8-3.4.14): XRC domains, XRC SRQs, INI (XRC_SEND) and TGT
// (XRC_RECV) QPs in one process, through the public verbs API. The message a
// sender addresses to a TGT QP lands in the SRQ its WR names, if that SRQ is
// in the TGT QP's domain; anything else is the requester's
// IBV_WC_REM_INV_REQ_ERR. A TGT QP is the host's: ibv_open_qp gives another
// context (here) or process (process_test) a handle to the same QP, which
// lives while any handle does. Cross-process XRC runs in process_test and
// in the system test of ibv_xsrq_pingpong.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <initializer_list>
#include <vector>

#include "loopback.hpp"
#include "xrc.hpp"

namespace {

using loopback::Buffer;
using loopback::Device;
using namespace loopback::xrc;

// Destroys what an XRC test made (each null one is skipped), everything
// before what it holds, and checks that each goes.
void destroy_xrc_objects(ibv_qp* ini, ibv_qp* tgt, ibv_srq* srq, ibv_cq* cq,
                         std::initializer_list<ibv_xrcd*> domains) {
  for (ibv_qp* qp : {ini, tgt}) {
    if (qp) {
      EXPECT_EQ(ibv_destroy_qp(qp), 0);
    }
  }
  if (srq) {
    EXPECT_EQ(ibv_destroy_srq(srq), 0);
  }
  for (ibv_xrcd* xrcd : domains) {
    if (xrcd) {
      EXPECT_EQ(ibv_close_xrcd(xrcd), 0);
    }
  }
  if (cq) {
    EXPECT_EQ(ibv_destroy_cq(cq), 0);
  }
}

// One XRC domain with an SRQ and a TGT QP, and an INI QP connected to that
// TGT QP, all in this process.
class XrcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dev.ok());
    cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    xrcd = open_xrcd(dev.ctx, -1, O_CREAT);
    ASSERT_NE(xrcd, nullptr) << "errno " << errno;
    srq = create_xrc_srq(dev.ctx, dev.pd, xrcd, cq);
    ASSERT_NE(srq, nullptr) << "errno " << errno;
    ASSERT_EQ(ibv_get_srq_num(srq, &srqn), 0);
    ASSERT_NE(srqn, 0u);
    tgt = create_tgt(dev.ctx, xrcd);
    ASSERT_NE(tgt, nullptr) << "errno " << errno;
    ini = create_ini(dev.ctx, dev.pd, cq);
    ASSERT_NE(ini, nullptr) << "errno " << errno;
    const int remote = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    ASSERT_EQ(to_init(tgt, remote), 0);
    ASSERT_EQ(to_init(ini, 0), 0);
    ASSERT_EQ(to_rtr(tgt, ini->qp_num, dev.gid, true), 0);
    ASSERT_EQ(to_rtr(ini, tgt->qp_num, dev.gid, false), 0);
    ASSERT_EQ(ini_to_rts(ini), 0);
  }
  void TearDown() override { destroy_xrc_objects(ini, tgt, srq, cq, {xrcd}); }

  int post_srq_recv(uint64_t wr_id, ibv_sge sge) { return loopback::xrc::post_srq_recv(srq, wr_id, sge); }

  int send_to(uint32_t remote_srqn, uint64_t wr_id, ibv_sge sge, ibv_wr_opcode opcode = IBV_WR_SEND) {
    ibv_send_wr wr = loopback::make_wr(wr_id, opcode, &sge, 1);
    wr.qp_type.xrc.remote_srqn = remote_srqn;
    return loopback::post_send(ini, wr);
  }

  Device dev;
  ibv_cq* cq = nullptr;
  ibv_xrcd* xrcd = nullptr;
  ibv_srq* srq = nullptr;
  uint32_t srqn = 0;
  ibv_qp* tgt = nullptr;
  ibv_qp* ini = nullptr;
};

TEST_F(XrcTest, SendLandsInTheNamedSrqAndNamesTheTgtQp) {
  Buffer from(dev.pd, 256), to(dev.pd, 256);
  loopback::fill_pattern(from.span(0, 256), 7);
  ASSERT_EQ(post_srq_recv(11, to.sge(0, 256)), 0);
  ASSERT_EQ(send_to(srqn, 22, from.sge(0, 200)), 0);
  const auto wcs = loopback::poll_n(cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  bool saw_recv = false, saw_send = false;
  for (const ibv_wc& wc : wcs) {
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << loopback::wc_str(wc);
    if (wc.opcode == IBV_WC_RECV) {
      saw_recv = true;
      EXPECT_EQ(wc.wr_id, 11u);
      EXPECT_EQ(wc.byte_len, 200u);
      EXPECT_EQ(wc.qp_num, tgt->qp_num);  // the TGT QP it came through
      EXPECT_EQ(wc.vendor_err, 0u);
    } else {
      saw_send = true;
      EXPECT_EQ(wc.wr_id, 22u);
      EXPECT_EQ(wc.qp_num, ini->qp_num);
    }
  }
  EXPECT_TRUE(saw_recv && saw_send);
  EXPECT_EQ(loopback::first_mismatch(from.span(0, 200), to.span(0, 200)), -1);
}

// Polling an XRC SRQ's completion frees its slot: three times the SRQ's
// depth of messages go through one receive slot after another.
TEST_F(XrcTest, PolledCompletionsFreeTheSrqSlots) {
  ibv_srq_attr attr{};
  ASSERT_EQ(ibv_query_srq(srq, &attr), 0);
  Buffer from(dev.pd, 64), to(dev.pd, 64);
  const uint32_t rounds = attr.max_wr * 3;
  for (uint32_t i = 0; i < rounds; ++i) {
    ASSERT_EQ(post_srq_recv(i, to.sge(0, 64)), 0) << "round " << i << ": the SRQ kept a polled slot";
    ASSERT_EQ(send_to(srqn, i, from.sge(0, 64)), 0);
    const auto wcs = loopback::poll_n(cq, 2);
    ASSERT_EQ(wcs.size(), 2u);
    for (const ibv_wc& wc : wcs) ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << loopback::wc_str(wc);
  }
}

TEST_F(XrcTest, RdmaWriteAndAtomicUseTheSrqsPd) {
  Buffer local(dev.pd, 64), remote(dev.pd, 64);
  loopback::fill_pattern(local.span(0, 64), 3);
  ibv_sge sge = local.sge(0, 32);
  ibv_send_wr wr = loopback::make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma.remote_addr = remote.addr(0);
  wr.wr.rdma.rkey = remote.rkey();
  wr.qp_type.xrc.remote_srqn = srqn;
  ASSERT_EQ(loopback::post_send(ini, wr), 0);
  ibv_wc wc{};
  ASSERT_TRUE(loopback::poll_one(cq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << loopback::wc_str(wc);
  EXPECT_EQ(loopback::first_mismatch(local.span(0, 32), remote.span(0, 32)), -1);

  std::memset(remote.data() + 32, 0, 8);
  ibv_sge result = local.sge(40, 8);
  ibv_send_wr add = loopback::make_wr(2, IBV_WR_ATOMIC_FETCH_AND_ADD, &result, 1);
  add.wr.atomic.remote_addr = remote.addr(32);
  add.wr.atomic.rkey = remote.rkey();
  add.wr.atomic.compare_add = 5;
  add.qp_type.xrc.remote_srqn = srqn;
  ASSERT_EQ(loopback::post_send(ini, add), 0);
  ASSERT_TRUE(loopback::poll_one(cq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << loopback::wc_str(wc);
  uint64_t value = 0;
  std::memcpy(&value, remote.data() + 32, 8);
  EXPECT_EQ(value, 5u);
}

// An MR of another PD than the SRQ's is no MR for this message.
TEST_F(XrcTest, RkeyOfAnotherPdIsRemoteAccessError) {
  ibv_pd* other = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(other, nullptr);
  {
    Buffer local(dev.pd, 64), remote(other, 64);
    ibv_sge sge = local.sge(0, 8);
    ibv_send_wr wr = loopback::make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
    wr.wr.rdma.remote_addr = remote.addr(0);
    wr.wr.rdma.rkey = remote.rkey();
    wr.qp_type.xrc.remote_srqn = srqn;
    ASSERT_EQ(loopback::post_send(ini, wr), 0);
    ibv_wc wc{};
    ASSERT_TRUE(loopback::poll_one(cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << loopback::wc_str(wc);
  }
  loopback::drain_async_events(dev.ctx);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
}

// The SRQ a WR names must be an XRC SRQ of the TGT QP's domain.
TEST_F(XrcTest, SrqOfAnotherDomainIsRemoteInvalidRequest) {
  ibv_xrcd* second = open_xrcd(dev.ctx, -1, O_CREAT);
  ASSERT_NE(second, nullptr);
  ibv_srq* foreign = create_xrc_srq(dev.ctx, dev.pd, second, cq);
  ASSERT_NE(foreign, nullptr);
  uint32_t foreign_srqn = 0;
  ASSERT_EQ(ibv_get_srq_num(foreign, &foreign_srqn), 0);
  Buffer from(dev.pd, 64), to(dev.pd, 64);
  ibv_recv_wr rwr{};
  ibv_sge rsge = to.sge(0, 64);
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_srq_recv(foreign, &rwr, &bad), 0);
  ASSERT_EQ(send_to(foreign_srqn, 5, from.sge(0, 64)), 0);
  ibv_wc wc{};
  ASSERT_TRUE(loopback::poll_one(cq, &wc));
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << loopback::wc_str(wc);
  EXPECT_TRUE(loopback::stays_empty(cq, loopback::Millis{50}));  // nothing reached the foreign SRQ
  loopback::drain_async_events(dev.ctx);
  // The TGT QP is in error now; the foreign SRQ still holds its WQE.
  EXPECT_EQ(ibv_destroy_srq(foreign), 0);
  EXPECT_EQ(ibv_close_xrcd(second), 0);
}

TEST_F(XrcTest, UnknownSrqNumberIsRemoteInvalidRequest) {
  Buffer from(dev.pd, 64);
  // A QP's number is no SRQ number.
  ASSERT_EQ(send_to(ini->qp_num, 6, from.sge(0, 64)), 0);
  ibv_wc wc{};
  ASSERT_TRUE(loopback::poll_one(cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << loopback::wc_str(wc);
  loopback::drain_async_events(dev.ctx);
}

TEST_F(XrcTest, QueuesTheXrcQpsDoNotHaveRefusePosts) {
  Buffer buf(dev.pd, 64);
  ibv_sge sge = buf.sge(0, 64);
  // Neither an INI nor a TGT QP has a receive queue; a TGT QP sends nothing.
  EXPECT_EQ(loopback::post_recv(ini, 1, &sge, 1), EINVAL);
  EXPECT_EQ(loopback::post_recv(tgt, 1, &sge, 1), EINVAL);
  ibv_send_wr wr = loopback::make_wr(1, IBV_WR_SEND, &sge, 1);
  EXPECT_EQ(loopback::post_send(tgt, wr), EINVAL);
}

TEST_F(XrcTest, ObjectsInUseKeepTheirDomainAndCq) {
  EXPECT_EQ(ibv_close_xrcd(xrcd), EBUSY);  // an SRQ and a TGT QP are in it
  EXPECT_EQ(ibv_destroy_cq(cq), EBUSY);    // the SRQ's completions go there
}

TEST(XrcDomain, OpenRules) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  // Without a file, only O_CREAT makes sense.
  errno = 0;
  EXPECT_EQ(open_xrcd(dev.ctx, -1, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // Both fields are required.
  ibv_xrcd_init_attr attr{};
  attr.comp_mask = IBV_XRCD_INIT_ATTR_FD;
  attr.fd = -1;
  errno = 0;
  EXPECT_EQ(ibv_open_xrcd(dev.ctx, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);

  char path[] = "/tmp/softhca-xrcd-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ibv_xrcd* first = open_xrcd(dev.ctx, fd, O_CREAT | O_EXCL);
  ASSERT_NE(first, nullptr);
  // The file's domain exists now: O_EXCL refuses, plain O_CREAT shares it.
  errno = 0;
  EXPECT_EQ(open_xrcd(dev.ctx, fd, O_CREAT | O_EXCL), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_xrcd* again = open_xrcd(dev.ctx, fd, O_CREAT);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(ibv_close_xrcd(again), 0);
  EXPECT_EQ(ibv_close_xrcd(first), 0);
  // Closed everywhere in this process: O_EXCL creates it again.
  ibv_xrcd* fresh = open_xrcd(dev.ctx, fd, O_CREAT | O_EXCL);
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(ibv_close_xrcd(fresh), 0);
  close(fd);
}

// Two opens of one file are one domain: an SRQ made through one takes
// messages through a TGT QP made through the other.
TEST(XrcDomain, OneFileIsOneDomain) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  char path[] = "/tmp/softhca-xrcd-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ibv_xrcd* a = open_xrcd(dev.ctx, fd, O_CREAT);
  ibv_xrcd* b = open_xrcd(dev.ctx, fd, O_CREAT);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_srq* srq = create_xrc_srq(dev.ctx, dev.pd, a, cq);
  ibv_qp* tgt = create_tgt(dev.ctx, b);
  ibv_qp* ini = create_ini(dev.ctx, dev.pd, cq);
  ASSERT_TRUE(srq != nullptr && tgt != nullptr && ini != nullptr);
  ASSERT_EQ(to_init(tgt, 0), 0);
  ASSERT_EQ(to_init(ini, 0), 0);
  ASSERT_EQ(to_rtr(tgt, ini->qp_num, dev.gid, true), 0);
  ASSERT_EQ(to_rtr(ini, tgt->qp_num, dev.gid, false), 0);
  ASSERT_EQ(ini_to_rts(ini), 0);
  uint32_t srqn = 0;
  ASSERT_EQ(ibv_get_srq_num(srq, &srqn), 0);
  {
    Buffer from(dev.pd, 16), to(dev.pd, 16);
    ibv_sge rsge = to.sge(0, 16);
    ibv_recv_wr rwr{};
    rwr.sg_list = &rsge;
    rwr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_srq_recv(srq, &rwr, &bad), 0);
    ibv_sge sge = from.sge(0, 16);
    ibv_send_wr wr = loopback::make_wr(1, IBV_WR_SEND, &sge, 1);
    wr.qp_type.xrc.remote_srqn = srqn;
    ASSERT_EQ(loopback::post_send(ini, wr), 0);
    const auto wcs = loopback::poll_n(cq, 2);
    ASSERT_EQ(wcs.size(), 2u);
    for (const ibv_wc& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << loopback::wc_str(wc);
  }
  EXPECT_EQ(ibv_destroy_qp(ini), 0);
  EXPECT_EQ(ibv_destroy_qp(tgt), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_close_xrcd(a), 0);
  EXPECT_EQ(ibv_close_xrcd(b), 0);
  close(fd);
}

TEST(XrcSrq, BasicSrqHasNoNumberAndXrcNeedsDomainAndCq) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_srq_init_attr basic{};
  basic.attr.max_wr = 4;
  basic.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(dev.pd, &basic);
  ASSERT_NE(srq, nullptr);
  uint32_t num = 0;
  EXPECT_EQ(ibv_get_srq_num(srq, &num), EINVAL);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);

  ibv_srq_init_attr_ex attr{};
  attr.attr.max_wr = 4;
  attr.attr.max_sge = 1;
  attr.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
  attr.srq_type = IBV_SRQT_XRC;
  attr.pd = dev.pd;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(dev.ctx, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // A tag matching SRQ needs its CQ and tm_cap (tag_matching_test.cpp).
  attr.srq_type = IBV_SRQT_TM;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(dev.ctx, &attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
}


// ---------------------------------------------------------------------------
// ibv_open_qp: two contexts of this process, one XRC domain (one file).

class XrcOpenQp : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(a.ok() && b.ok());
    char path[] = "/tmp/softhca-xrc-open-XXXXXX";
    fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    unlink(path);
    xa = open_xrcd(a.ctx, fd, O_CREAT);
    xb = open_xrcd(b.ctx, fd, O_CREAT);
    ASSERT_TRUE(xa != nullptr && xb != nullptr) << "errno " << errno;
    cq = ibv_create_cq(a.ctx, 64, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    srq = create_xrc_srq(a.ctx, a.pd, xa, cq);
    ASSERT_NE(srq, nullptr);
    ASSERT_EQ(ibv_get_srq_num(srq, &srqn), 0);
    tgt = create_tgt(a.ctx, xa);
    ini = create_ini(a.ctx, a.pd, cq);
    ASSERT_TRUE(tgt != nullptr && ini != nullptr);
  }
  void TearDown() override {
    loopback::drain_async_events(a.ctx);
    loopback::drain_async_events(b.ctx);
    destroy_xrc_objects(ini, tgt, srq, cq, {xa, xb});
    if (fd >= 0) close(fd);
  }

  // One SEND from the INI QP through the TGT QP into the SRQ: both
  // completions, and what the receive one names.
  void send_through(uint64_t wr_id) {
    Buffer from(a.pd, 64, Buffer::kAllAccess, 0x5a), to(a.pd, 64);
    ASSERT_EQ(post_srq_recv(srq, wr_id, to.sge(0, 64)), 0);
    ibv_sge sge = from.sge(0, 64);
    ibv_send_wr wr = loopback::make_wr(wr_id, IBV_WR_SEND, &sge, 1);
    wr.qp_type.xrc.remote_srqn = srqn;
    ASSERT_EQ(loopback::post_send(ini, wr), 0);
    const auto wcs = loopback::poll_n(cq, 2);
    ASSERT_EQ(wcs.size(), 2u);
    for (const ibv_wc& wc : wcs) {
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << loopback::wc_str(wc);
      EXPECT_EQ(wc.wr_id, wr_id);
      if (wc.opcode == IBV_WC_RECV) {
        EXPECT_EQ(wc.qp_num, qpn);
        EXPECT_EQ(wc.byte_len, 64u);
      }
    }
    EXPECT_EQ(loopback::first_not(to.span(0, 64), 0x5a), -1);
  }

  void connect_ini() {
    ASSERT_EQ(to_init(ini, 0), 0);
    ASSERT_EQ(to_rtr(ini, qpn, a.gid, false), 0);
    ASSERT_EQ(ini_to_rts(ini), 0);
  }

  Device a, b;
  int fd = -1;
  ibv_xrcd* xa = nullptr;
  ibv_xrcd* xb = nullptr;
  ibv_cq* cq = nullptr;
  ibv_srq* srq = nullptr;
  uint32_t srqn = 0;
  ibv_qp* tgt = nullptr;
  ibv_qp* ini = nullptr;
  uint32_t qpn = 0;
};

TEST_F(XrcOpenQp, AnOpenedHandleIsTheSameQpAndKeepsItAfterTheCreatorsHandleGoes) {
  qpn = tgt->qp_num;
  int cookie = 0;
  ibv_qp* opened = open_tgt(b.ctx, xb, qpn, &cookie);
  ASSERT_NE(opened, nullptr) << "errno " << errno;
  EXPECT_EQ(opened->qp_num, qpn);
  EXPECT_EQ(opened->qp_type, IBV_QPT_XRC_RECV);
  EXPECT_EQ(opened->context, b.ctx);
  EXPECT_EQ(opened->qp_context, &cookie);
  EXPECT_EQ(opened->pd, nullptr);
  EXPECT_EQ(opened->send_cq, nullptr);
  EXPECT_EQ(opened->srq, nullptr);

  // Modified through the opened handle, seen through the creator's.
  const int remote = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ASSERT_EQ(to_init(opened, remote), 0);
  ASSERT_EQ(to_rtr(opened, ini->qp_num, a.gid, true), 0);
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(tgt, &attr, IBV_QP_STATE | IBV_QP_DEST_QPN | IBV_QP_ACCESS_FLAGS, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(attr.dest_qp_num, ini->qp_num);
  EXPECT_EQ(attr.qp_access_flags, static_cast<unsigned>(remote));
  // A transition the QP's state no longer allows fails through either handle.
  EXPECT_EQ(to_init(tgt, 0), EINVAL);
  connect_ini();
  send_through(1);
  // The first message in RTR is reported to every handle, in its context.
  decltype(ibv_async_event::element) element{};
  ASSERT_TRUE(loopback::wait_async_event(a.ctx, IBV_EVENT_COMM_EST, &element));
  EXPECT_EQ(element.qp, tgt);
  ASSERT_TRUE(loopback::wait_async_event(b.ctx, IBV_EVENT_COMM_EST, &element));
  EXPECT_EQ(element.qp, opened);

  // The creator's handle goes: the QP stays, with what the other set.
  ASSERT_EQ(ibv_destroy_qp(tgt), 0);
  tgt = nullptr;
  send_through(2);
  EXPECT_EQ(ibv_close_xrcd(xb), EBUSY);  // the opened handle is in it

  // A handle in the creator's context again; the first handle goes too.
  ibv_qp* again = open_tgt(a.ctx, xa, qpn);
  ASSERT_NE(again, nullptr) << "errno " << errno;
  EXPECT_EQ(again->state, IBV_QPS_RTR);
  ASSERT_EQ(ibv_destroy_qp(opened), 0);
  send_through(3);
  ASSERT_EQ(ibv_query_qp(again, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_RTR);

  // The last handle destroys the QP: its number opens nothing any more.
  ASSERT_EQ(ibv_destroy_qp(again), 0);
  errno = 0;
  EXPECT_EQ(open_tgt(a.ctx, xa, qpn), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(XrcOpenQp, TheKernelsRulesAreEinval) {
  qpn = tgt->qp_num;
  auto expect_einval = [&](const char* what, ibv_context* ctx, ibv_qp_open_attr attr) {
    errno = 0;
    ibv_qp* qp = ibv_open_qp(ctx, &attr);
    EXPECT_EQ(qp, nullptr) << what;
    EXPECT_EQ(errno, EINVAL) << what;
    if (qp) ibv_destroy_qp(qp);
  };
  ibv_qp_open_attr good{};
  good.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  good.qp_num = qpn;
  good.xrcd = xb;
  good.qp_type = IBV_QPT_XRC_RECV;
  ibv_qp_open_attr attr = good;
  attr.comp_mask &= ~IBV_QP_OPEN_ATTR_NUM;
  expect_einval("no NUM", b.ctx, attr);
  attr = good;
  attr.comp_mask &= ~IBV_QP_OPEN_ATTR_XRCD;
  expect_einval("no XRCD", b.ctx, attr);
  attr = good;
  attr.comp_mask &= ~IBV_QP_OPEN_ATTR_TYPE;
  expect_einval("no TYPE", b.ctx, attr);
  attr = good;
  attr.comp_mask |= IBV_QP_OPEN_ATTR_RESERVED;
  expect_einval("a reserved bit", b.ctx, attr);
  attr = good;
  attr.qp_type = IBV_QPT_RC;
  expect_einval("type RC", b.ctx, attr);
  attr = good;
  attr.qp_num = ini->qp_num;
  expect_einval("an INI QP's number", b.ctx, attr);
  attr = good;
  attr.qp_num = srqn;
  expect_einval("an XRC SRQ's number", b.ctx, attr);
  attr = good;
  attr.qp_num = 0xFFFFFF;
  expect_einval("a number nobody has", b.ctx, attr);
  attr = good;
  attr.xrcd = xa;
  expect_einval("a domain of another context", b.ctx, attr);
  // A TGT QP of another domain.
  ibv_xrcd* other = open_xrcd(b.ctx, -1, O_CREAT);
  ASSERT_NE(other, nullptr);
  attr = good;
  attr.xrcd = other;
  expect_einval("another domain", b.ctx, attr);
  EXPECT_EQ(ibv_close_xrcd(other), 0);
  // What the handle may not do, as the QP it names: post.
  ibv_qp* opened = ibv_open_qp(b.ctx, &good);
  ASSERT_NE(opened, nullptr) << "errno " << errno;
  Buffer buf(b.pd, 64);
  ibv_sge sge = buf.sge(0, 64);
  EXPECT_EQ(loopback::post_recv(opened, 1, &sge, 1), EINVAL);
  ibv_send_wr wr = loopback::make_wr(1, IBV_WR_SEND, &sge, 1);
  EXPECT_EQ(loopback::post_send(opened, wr), EINVAL);
  EXPECT_EQ(ibv_destroy_qp(opened), 0);
}

// A TGT QP takes 32 handles (its creator's included): the next open is
// ENOMEM, as a device out of resources answers, until one goes.
TEST_F(XrcOpenQp, HandlesAreBoundedAndComeBack) {
  qpn = tgt->qp_num;
  std::vector<ibv_qp*> handles;
  for (int i = 1; i < 32; ++i) {
    ibv_qp* h = open_tgt(i % 2 ? b.ctx : a.ctx, i % 2 ? xb : xa, qpn);
    ASSERT_NE(h, nullptr) << "handle " << i << ": errno " << errno;
    handles.push_back(h);
  }
  errno = 0;
  EXPECT_EQ(open_tgt(b.ctx, xb, qpn), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  ASSERT_EQ(ibv_destroy_qp(handles.back()), 0);
  handles.pop_back();
  ibv_qp* again = open_tgt(b.ctx, xb, qpn);
  ASSERT_NE(again, nullptr) << "errno " << errno;
  handles.push_back(again);
  for (ibv_qp* h : handles) EXPECT_EQ(ibv_destroy_qp(h), 0);
  // The creator's handle still holds it.
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  EXPECT_EQ(ibv_query_qp(tgt, &attr, IBV_QP_STATE, &init), 0);
}

TEST_F(XrcOpenQp, EveryHandleGetsTheQpsErrorEvent) {
  qpn = tgt->qp_num;
  ibv_qp* opened = open_tgt(b.ctx, xb, qpn);
  ASSERT_NE(opened, nullptr) << "errno " << errno;
  ASSERT_EQ(to_init(tgt, 0), 0);  // no remote access
  ASSERT_EQ(to_rtr(tgt, ini->qp_num, a.gid, true), 0);
  connect_ini();
  // A WRITE the TGT QP does not allow: the requester's REM_ACCESS_ERR, the
  // QP's error, and an access error event in both contexts.
  Buffer from(a.pd, 64), to(a.pd, 64);
  ibv_sge sge = from.sge(0, 64);
  ibv_send_wr wr = loopback::make_wr(7, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma.remote_addr = to.addr();
  wr.wr.rdma.rkey = to.rkey();
  wr.qp_type.xrc.remote_srqn = srqn;
  ASSERT_EQ(loopback::post_send(ini, wr), 0);
  ibv_wc wc{};
  ASSERT_TRUE(loopback::poll_one(cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << loopback::wc_str(wc);
  decltype(ibv_async_event::element) element{};
  ASSERT_TRUE(loopback::wait_async_event(a.ctx, IBV_EVENT_QP_ACCESS_ERR, &element));
  EXPECT_EQ(element.qp, tgt);
  ASSERT_TRUE(loopback::wait_async_event(b.ctx, IBV_EVENT_QP_ACCESS_ERR, &element));
  EXPECT_EQ(element.qp, opened);
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(opened, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_ERR);
  EXPECT_EQ(ibv_destroy_qp(opened), 0);
}

}  // namespace
