// Every access check at its edge: exactly at the end of a memory region and
// one byte past it, one byte before its start, for the remote side (WRITE,
// READ, atomics), the local SGEs (gather, READ and atomic scatter) and the
// responder's receive scatter; and keys of another PD. Each MR covers the
// middle of a larger buffer filled with a sentinel, so a check that lets one
// byte through shows up as a changed sentinel as well as a wrong status.
#include <vector>

#include "loopback.hpp"

namespace loopback {
namespace {

constexpr size_t kBacking = 1024;
constexpr size_t kMrStart = 256;  // the MR is [kMrStart, kMrStart + kMrLen) of the buffer
constexpr size_t kMrLen = 256;
constexpr uint8_t kSentinel = 0xC5;
constexpr uint8_t kPayload = 0x3A;

// A buffer with an MR over its middle part only.
struct Region {
  Region(ibv_pd* pd, uint8_t fill) : bytes(kBacking, fill) {
    mr = ibv_reg_mr(pd, bytes.data() + kMrStart, kMrLen, Buffer::kAllAccess);
  }
  ~Region() {
    if (mr) ibv_dereg_mr(mr);
  }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  // The address `offset` bytes from the MR's start (negative: before it).
  uint64_t at(long offset) const { return reinterpret_cast<uint64_t>(bytes.data() + kMrStart) + offset; }
  std::span<const uint8_t> before() const { return {bytes.data(), kMrStart}; }
  std::span<const uint8_t> after() const { return {bytes.data() + kMrStart + kMrLen, kBacking - kMrStart - kMrLen}; }
  std::span<const uint8_t> inside() const { return {bytes.data() + kMrStart, kMrLen}; }
  std::vector<uint8_t> bytes;
  ibv_mr* mr = nullptr;
};

// One case: an operation on a range at `offset` from its MR's start (the
// remote range for RemoteEdge, the local SGE for LocalSgeEdge).
struct Edge {
  const char* name;
  ibv_wr_opcode opcode;
  long offset;
  uint32_t length;
  bool allowed;
};

std::string edge_name(const ::testing::TestParamInfo<Edge>& info) { return info.param.name; }

// A signaled WR of `opcode` over one SGE towards remote `addr` under `rkey`
// (the atomic fields for atomics: add 1, or compare 1 and swap 2).
ibv_send_wr remote_wr(uint64_t wr_id, ibv_wr_opcode opcode, ibv_sge* sge, uint64_t addr, uint32_t rkey) {
  ibv_send_wr wr = make_wr(wr_id, opcode, sge, 1);
  if (opcode == IBV_WR_ATOMIC_FETCH_AND_ADD || opcode == IBV_WR_ATOMIC_CMP_AND_SWP) {
    wr.wr.atomic.remote_addr = addr;
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.compare_add = 1;
    wr.wr.atomic.swap = 2;
  } else {
    wr.wr.rdma.remote_addr = addr;
    wr.wr.rdma.rkey = rkey;
  }
  return wr;
}

// Every case on a fresh connected RC pair of its own device: a refused
// operation leaves the QPs in ERROR.
class PairTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dev.ok());
    ASSERT_TRUE(pair.ok());
  }
  // Posts `wr` on QP a and takes its completion; false if either fails.
  bool run(ibv_send_wr& wr, ibv_wc& wc) { return post_send(pair.a, wr) == 0 && poll_one(pair.a_send_cq, &wc); }

  Device dev;
  QpPair pair{dev, QpConfig{}};
};

// ---------------------------------------------------------------------------
// The remote range under an rkey.

class RemoteEdge : public PairTest, public ::testing::WithParamInterface<Edge> {};

TEST_P(RemoteEdge, ExactlyInsideWorksOnePastFails) {
  const Edge e = GetParam();
  Region remote(dev.pd, kSentinel);
  ASSERT_NE(remote.mr, nullptr);
  Buffer local(dev.pd, 512, Buffer::kAllAccess, kPayload);
  ibv_sge sge = local.sge(0, e.length);
  ibv_send_wr wr = remote_wr(7, e.opcode, &sge, remote.at(e.offset), remote.mr->rkey);
  ibv_wc wc{};
  ASSERT_TRUE(run(wr, wc));
  EXPECT_EQ(wc.status, e.allowed ? IBV_WC_SUCCESS : IBV_WC_REM_ACCESS_ERR) << wc_str(wc);
  EXPECT_EQ(first_not(remote.before(), kSentinel), -1) << "a byte before the MR changed";
  EXPECT_EQ(first_not(remote.after(), kSentinel), -1) << "a byte after the MR changed";
  if (!e.allowed) {
    EXPECT_EQ(first_not(remote.inside(), kSentinel), -1) << "a refused operation changed the MR";
    drain_async_events(dev.ctx);
  } else if (e.opcode == IBV_WR_RDMA_WRITE) {
    EXPECT_EQ(first_not(std::span<const uint8_t>(remote.bytes.data() + kMrStart + e.offset, e.length), kPayload), -1);
  } else if (e.opcode == IBV_WR_RDMA_READ) {
    EXPECT_EQ(first_not(local.span(0, e.length), kSentinel), -1);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Edges, RemoteEdge,
    ::testing::Values(Edge{"WriteWholeMr", IBV_WR_RDMA_WRITE, 0, kMrLen, true},
                      Edge{"WriteEndingAtTheEnd", IBV_WR_RDMA_WRITE, kMrLen - 1, 1, true},
                      Edge{"WriteOneBytePastTheEnd", IBV_WR_RDMA_WRITE, 1, kMrLen, false},
                      Edge{"WriteStartingAtTheEnd", IBV_WR_RDMA_WRITE, kMrLen, 1, false},
                      Edge{"WriteOneByteBeforeTheStart", IBV_WR_RDMA_WRITE, -1, 8, false},
                      Edge{"ReadWholeMr", IBV_WR_RDMA_READ, 0, kMrLen, true},
                      Edge{"ReadEndingAtTheEnd", IBV_WR_RDMA_READ, kMrLen - 1, 1, true},
                      Edge{"ReadOneBytePastTheEnd", IBV_WR_RDMA_READ, 1, kMrLen, false},
                      Edge{"ReadOneByteBeforeTheStart", IBV_WR_RDMA_READ, -1, 8, false},
                      Edge{"FetchAddLastWord", IBV_WR_ATOMIC_FETCH_AND_ADD, kMrLen - 8, 8, true},
                      Edge{"FetchAddPastTheEnd", IBV_WR_ATOMIC_FETCH_AND_ADD, kMrLen, 8, false},
                      Edge{"FetchAddBeforeTheStart", IBV_WR_ATOMIC_FETCH_AND_ADD, -8, 8, false},
                      Edge{"CompareSwapLastWord", IBV_WR_ATOMIC_CMP_AND_SWP, kMrLen - 8, 8, true},
                      Edge{"CompareSwapPastTheEnd", IBV_WR_ATOMIC_CMP_AND_SWP, kMrLen, 8, false}),
    edge_name);

// ---------------------------------------------------------------------------
// The local SGEs under an lkey: what a SEND or WRITE gathers, where a READ or
// an atomic scatters its result.

class LocalSgeEdge : public PairTest, public ::testing::WithParamInterface<Edge> {};

TEST_P(LocalSgeEdge, ExactlyInsideWorksOnePastFails) {
  const Edge e = GetParam();
  Region local(dev.pd, kPayload);
  ASSERT_NE(local.mr, nullptr);
  Buffer remote(dev.pd, 1024, Buffer::kAllAccess, kSentinel);
  Buffer rbuf(dev.pd, 1024, Buffer::kAllAccess, 0);
  ibv_sge rsge = rbuf.sge(0, 1024);
  ASSERT_EQ(post_recv(pair.b, 1, &rsge, 1), 0);
  ibv_sge sge{local.at(e.offset), e.length, local.mr->lkey};
  ibv_send_wr wr = remote_wr(7, e.opcode, &sge, remote.addr(0), remote.rkey());
  ibv_wc wc{};
  ASSERT_TRUE(run(wr, wc));
  EXPECT_EQ(wc.status, e.allowed ? IBV_WC_SUCCESS : IBV_WC_LOC_PROT_ERR) << wc_str(wc);
  // A READ or atomic result never lands outside the local MR.
  EXPECT_EQ(first_not(local.before(), kPayload), -1);
  EXPECT_EQ(first_not(local.after(), kPayload), -1);
  if (!e.allowed) {
    EXPECT_EQ(first_not(remote.span(0, 1024), kSentinel), -1) << "a refused operation reached the remote side";
    EXPECT_EQ(qp_state(pair.a), IBV_QPS_ERR);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Edges, LocalSgeEdge,
    ::testing::Values(Edge{"SendWholeMr", IBV_WR_SEND, 0, kMrLen, true},
                      Edge{"SendOneBytePastTheEnd", IBV_WR_SEND, 1, kMrLen, false},
                      Edge{"SendOneByteBeforeTheStart", IBV_WR_SEND, -1, 8, false},
                      Edge{"WriteEndingAtTheEnd", IBV_WR_RDMA_WRITE, kMrLen - 1, 1, true},
                      Edge{"WriteStartingAtTheEnd", IBV_WR_RDMA_WRITE, kMrLen, 1, false},
                      Edge{"ReadIntoWholeMr", IBV_WR_RDMA_READ, 0, kMrLen, true},
                      Edge{"ReadIntoOneBytePastTheEnd", IBV_WR_RDMA_READ, 1, kMrLen, false},
                      Edge{"ReadIntoOneByteBeforeTheStart", IBV_WR_RDMA_READ, -1, 8, false},
                      Edge{"AtomicResultInLastWord", IBV_WR_ATOMIC_FETCH_AND_ADD, kMrLen - 8, 8, true},
                      Edge{"AtomicResultOneBytePastTheEnd", IBV_WR_ATOMIC_FETCH_AND_ADD, kMrLen - 7, 8, false}),
    edge_name);

// ---------------------------------------------------------------------------
// The responder's receive scatter: a receive SGE that ends exactly at its MR's
// end takes the message; one that ends one byte past it completes in
// LOC_PROT_ERR at the responder and REM_OP_ERR at the requester.

class ReceiveEdge : public PairTest, public ::testing::WithParamInterface<bool> {};

TEST_P(ReceiveEdge, ScatterUpToTheEndOnly) {
  const bool one_past = GetParam();
  Region target(dev.pd, kSentinel);
  ASSERT_NE(target.mr, nullptr);
  const uint32_t length = 64;
  const long offset = static_cast<long>(kMrLen - length) + (one_past ? 1 : 0);
  ibv_sge rsge{target.at(offset), length, target.mr->lkey};
  ASSERT_EQ(post_recv(pair.b, 5, &rsge, 1), 0);
  Buffer src(dev.pd, length, Buffer::kAllAccess, kPayload);
  ibv_sge sge = src.sge(0, length);
  ibv_send_wr wr = make_wr(6, IBV_WR_SEND, &sge, 1);
  ASSERT_EQ(post_send(pair.a, wr), 0);
  ibv_wc sent{}, received{};
  ASSERT_TRUE(poll_one(pair.a_send_cq, &sent));
  ASSERT_TRUE(poll_one(pair.b_recv_cq, &received));
  EXPECT_EQ(sent.status, one_past ? IBV_WC_REM_OP_ERR : IBV_WC_SUCCESS) << wc_str(sent);
  EXPECT_EQ(received.status, one_past ? IBV_WC_LOC_PROT_ERR : IBV_WC_SUCCESS) << wc_str(received);
  EXPECT_EQ(first_not(target.after(), kSentinel), -1) << "a byte past the receive MR changed";
  if (one_past) {
    EXPECT_EQ(first_not(target.inside(), kSentinel), -1);
    drain_async_events(dev.ctx);
  } else {
    EXPECT_EQ(first_not(std::span<const uint8_t>(target.bytes.data() + kMrStart + offset, length), kPayload), -1);
  }
}

INSTANTIATE_TEST_SUITE_P(Edges, ReceiveEdge, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "OneBytePastTheEnd" : "EndingAtTheEnd");
                         });

// ---------------------------------------------------------------------------
// A READ or atomic writes its result into local memory: the local MR needs
// IBV_ACCESS_LOCAL_WRITE, or the WR completes in LOC_PROT_ERR and the memory
// stays as it was. A SEND only reads its local memory and needs nothing.

class LocalWriteAccess : public PairTest, public ::testing::WithParamInterface<ibv_wr_opcode> {};

TEST_P(LocalWriteAccess, ResultNeedsLocalWrite) {
  const ibv_wr_opcode opcode = GetParam();
  Buffer remote(dev.pd, 64, Buffer::kAllAccess, kSentinel);
  Buffer rbuf(dev.pd, 64, Buffer::kAllAccess, 0);
  ibv_sge rsge = rbuf.sge(0, 64);
  ASSERT_EQ(post_recv(pair.b, 1, &rsge, 1), 0);
  Buffer local(dev.pd, 64, IBV_ACCESS_REMOTE_READ, kPayload);  // readable, not locally writable
  ASSERT_NE(local.mr(), nullptr);
  ibv_sge sge = local.sge(0, 8);
  ibv_send_wr wr = remote_wr(4, opcode, &sge, remote.addr(0), remote.rkey());
  ibv_wc wc{};
  ASSERT_TRUE(run(wr, wc));
  if (opcode == IBV_WR_SEND) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  } else {
    EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << wc_str(wc);
    EXPECT_EQ(first_not(local.span(0, 64), kPayload), -1) << "the result landed in memory without LOCAL_WRITE";
    EXPECT_EQ(first_not(remote.span(0, 64), kSentinel), -1);
  }
}

INSTANTIATE_TEST_SUITE_P(Opcodes, LocalWriteAccess,
                         ::testing::Values(IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_SEND),
                         [](const ::testing::TestParamInfo<ibv_wr_opcode>& info) {
                           return std::string(info.param == IBV_WR_RDMA_READ             ? "Read"
                                              : info.param == IBV_WR_ATOMIC_FETCH_AND_ADD ? "FetchAdd"
                                                                                          : "SendNeedsNone");
                         });

// ---------------------------------------------------------------------------
// Keys of another protection domain: an lkey is valid only on a QP of its own PD.

class OtherPd : public PairTest {};

TEST_F(OtherPd, LocalSgeLkeyIsLocalProtectionError) {
  ibv_pd* other = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(other, nullptr);
  {
    Buffer foreign(other, 64, Buffer::kAllAccess, kPayload);
    Buffer remote(dev.pd, 64, Buffer::kAllAccess, kSentinel);
    ibv_sge sge = foreign.sge(0, 64);
    ibv_send_wr wr = make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
    wr.wr.rdma.remote_addr = remote.addr(0);
    wr.wr.rdma.rkey = remote.rkey();
    ibv_wc wc{};
    ASSERT_TRUE(run(wr, wc));
    EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << wc_str(wc);
    EXPECT_EQ(first_not(remote.span(0, 64), kSentinel), -1);
  }
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
}

TEST_F(OtherPd, ReceiveSgeLkeyIsLocalProtectionErrorAtTheResponder) {
  ibv_pd* other = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(other, nullptr);
  {
    Buffer foreign(other, 64, Buffer::kAllAccess, kSentinel);
    ibv_sge rsge = foreign.sge(0, 64);
    ASSERT_EQ(post_recv(pair.b, 2, &rsge, 1), 0);
    Buffer src(dev.pd, 64, Buffer::kAllAccess, kPayload);
    ibv_sge sge = src.sge(0, 64);
    ibv_send_wr wr = make_wr(3, IBV_WR_SEND, &sge, 1);
    ASSERT_EQ(post_send(pair.a, wr), 0);
    ibv_wc sent{}, received{};
    ASSERT_TRUE(poll_one(pair.a_send_cq, &sent));
    ASSERT_TRUE(poll_one(pair.b_recv_cq, &received));
    EXPECT_EQ(sent.status, IBV_WC_REM_OP_ERR) << wc_str(sent);
    EXPECT_EQ(received.status, IBV_WC_LOC_PROT_ERR) << wc_str(received);
    EXPECT_EQ(first_not(foreign.span(0, 64), kSentinel), -1);
    drain_async_events(dev.ctx);
  }
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
}

}  // namespace
}  // namespace loopback
