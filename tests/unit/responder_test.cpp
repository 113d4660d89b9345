// The pure IBTA responder (transport/responder.hpp) against crafted requests,
// on a port that keeps the QP, its keys, receive queue and memory in this
// test: every syndrome, completion and QP error it can produce.
#include "transport/responder.hpp"
#include "wire/ud_grh.hpp"

#include "fake_responder_port.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace softhca::transport {
namespace {

class Responder : public ::testing::Test {
 protected:
  Request request(Operation op, uint64_t remote_addr = kIova, uint32_t rkey = kKey) {
    Request r;
    r.op = op;
    r.qp_type = IBV_QPT_RC;
    r.src_qpn = 0x99;
    r.remote_addr = remote_addr;
    r.rkey = rkey;
    r.data = &payload_iov_;
    r.ndata = 1;
    r.length = payload_.size();
    return r;
  }
  Response run(const Request& r, bool reliable = true) { return respond(r, port_, reliable); }

  FakePort port_;
  std::vector<unsigned char> payload_ = std::vector<unsigned char>(64, 0xAB);
  iovec payload_iov_{payload_.data(), payload_.size()};
};

TEST_F(Responder, WriteLandsAndIsAcked) {
  const Response r = run(request(Operation::kWrite, kIova + 128));
  EXPECT_EQ(r.syndrome, Syndrome::ack());
  EXPECT_EQ(port_.at(kIova + 128)[0], 0xAB);
  EXPECT_EQ(port_.at(kIova + 128)[63], 0xAB);
  EXPECT_EQ(port_.at(kIova + 192)[0], 0);
  EXPECT_EQ(port_.established_count, 1);
  EXPECT_TRUE(port_.events.empty());
}

TEST_F(Responder, WriteWithAKeyOfAnotherPdIsARemoteAccessNakAndAnAccessError) {
  const Response r = run(request(Operation::kWrite, kIova, kOtherPdKey));
  EXPECT_EQ(r.syndrome, Syndrome::nak(Answer::kNakRemoteAccess));
  ASSERT_EQ(port_.events.size(), 1u);
  EXPECT_EQ(port_.events[0], IBV_EVENT_QP_ACCESS_ERR);
  EXPECT_EQ(port_.at(kIova)[0], 0);
  EXPECT_EQ(port_.established_count, 0);
}

TEST_F(Responder, WriteThroughAReadOnlyKeyIsRefused) {
  EXPECT_EQ(run(request(Operation::kWrite, kIova, kReadOnlyKey)).syndrome, Syndrome::nak(Answer::kNakRemoteAccess));
}

TEST_F(Responder, WriteTheQpDoesNotAllowIsRefused) {
  port_.qp_.access = IBV_ACCESS_REMOTE_READ;
  EXPECT_EQ(run(request(Operation::kWrite)).syndrome, Syndrome::nak(Answer::kNakRemoteAccess));
}

TEST_F(Responder, RangesPastTheKeyOrWrappingTheAddressSpaceAreRefused) {
  EXPECT_EQ(run(request(Operation::kWrite, kIova + 4096 - 63)).syndrome, Syndrome::nak(Answer::kNakRemoteAccess));
  port_.qp_.state = IBV_QPS_RTS;
  // addr + length wraps to a small number that a naive `addr + len <= end` accepts.
  Request wrap = request(Operation::kWrite, ~uint64_t{0} - 15);
  port_.keys[kKey].iova = 0;
  port_.keys[kKey].length = ~uint64_t{0};
  EXPECT_EQ(run(wrap).syndrome, Syndrome::nak(Answer::kNakRemoteAccess));
}

TEST_F(Responder, AZeroLengthWriteNeedsNoKey) {
  Request r = request(Operation::kWrite, 0, 0xDEAD);
  r.ndata = 0;
  r.length = 0;
  EXPECT_EQ(run(r).syndrome, Syndrome::ack());
}

TEST_F(Responder, SendWithoutAReceiveIsAnRnrNakWithTheQpsTimer) {
  const Response r = run(request(Operation::kSend));
  EXPECT_EQ(r.syndrome, Syndrome::rnr(12));
  EXPECT_TRUE(port_.events.empty());
  EXPECT_TRUE(port_.completions.empty());
}

TEST_F(Responder, UcDropsWhatRcWouldNak) {
  Request r = request(Operation::kSend);
  r.qp_type = IBV_QPT_UC;
  port_.qp_.type = IBV_QPT_UC;
  EXPECT_EQ(run(r, false).syndrome, Syndrome::silence());
  r = request(Operation::kWrite, kIova, kOtherPdKey);
  r.qp_type = IBV_QPT_UC;
  EXPECT_EQ(run(r, false).syndrome, Syndrome::silence());
  EXPECT_TRUE(port_.events.empty());
  r = request(Operation::kRead);
  r.qp_type = IBV_QPT_UC;
  EXPECT_EQ(run(r, false).syndrome, Syndrome::silence());
}

TEST_F(Responder, SendFillsTheReceiveAndCompletesIt) {
  port_.post_receive(77, kIova + 1024, 100);
  Request r = request(Operation::kSendWithImm);
  r.imm_data = 0xCAFE;
  r.solicited = true;
  EXPECT_EQ(run(r).syndrome, Syndrome::ack());
  ASSERT_EQ(port_.completions.size(), 1u);
  const ReceiveCompletion& c = port_.completions[0];
  EXPECT_EQ(c.wr_id, 77u);
  EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  EXPECT_EQ(c.opcode, IBV_WC_RECV);
  EXPECT_EQ(c.byte_len, 64u);
  EXPECT_EQ(c.src_qp, 0x99u);
  EXPECT_EQ(c.wc_flags, static_cast<uint32_t>(IBV_WC_WITH_IMM));
  EXPECT_EQ(c.imm_data, 0xCAFEu);
  EXPECT_TRUE(c.solicited);
  EXPECT_EQ(port_.at(kIova + 1024)[63], 0xAB);
}

TEST_F(Responder, SendLongerThanTheReceiveIsAnInvalidRequestNakAndAFatalError) {
  port_.post_receive(5, kIova, 32);
  EXPECT_EQ(run(request(Operation::kSend)).syndrome, Syndrome::nak(Answer::kNakInvalidRequest));
  ASSERT_EQ(port_.completions.size(), 1u);
  EXPECT_EQ(port_.completions[0].status, IBV_WC_LOC_LEN_ERR);
  ASSERT_EQ(port_.events.size(), 1u);
  EXPECT_EQ(port_.events[0], IBV_EVENT_QP_FATAL);
}

TEST_F(Responder, ReceiveWithABadLkeyIsARemoteOperationalNak) {
  port_.post_receive(5, kIova, 128, 0xBAD);
  EXPECT_EQ(run(request(Operation::kSend)).syndrome, Syndrome::nak(Answer::kNakRemoteOperational));
  ASSERT_EQ(port_.completions.size(), 1u);
  EXPECT_EQ(port_.completions[0].status, IBV_WC_LOC_PROT_ERR);
}

TEST_F(Responder, AReceiveSgeThatWrapsTheAddressSpaceIsRefused) {
  // The receive-side check once lacked the wrap guard the rkey check had.
  port_.keys[kKey].iova = 0;
  port_.keys[kKey].length = ~uint64_t{0};
  port_.post_receive(5, ~uint64_t{0} - 7, 64);
  EXPECT_EQ(run(request(Operation::kSend)).syndrome, Syndrome::nak(Answer::kNakRemoteOperational));
}

TEST_F(Responder, ReadWithoutResponderResourcesIsAnInvalidRequest) {
  port_.qp_.max_dest_rd_atomic = 0;
  EXPECT_EQ(run(request(Operation::kRead)).syndrome, Syndrome::nak(Answer::kNakInvalidRequest));
  ASSERT_EQ(port_.events.size(), 1u);
  EXPECT_EQ(port_.events[0], IBV_EVENT_QP_REQ_ERR);
}

TEST_F(Responder, ReadCopiesIntoTheRequestersBuffer) {
  std::memset(port_.at(kIova + 8), 0x5A, 64);
  std::fill(payload_.begin(), payload_.end(), 0);
  EXPECT_EQ(run(request(Operation::kRead, kIova + 8)).syndrome, Syndrome::ack());
  EXPECT_EQ(payload_[0], 0x5A);
  EXPECT_EQ(payload_[63], 0x5A);
}

TEST_F(Responder, AtomicsExecuteOnceAndReturnTheOriginal) {
  uint64_t word = 10;
  std::memcpy(port_.at(kIova + 64), &word, 8);
  Request faa = request(Operation::kFetchAdd, kIova + 64);
  faa.compare_add = 5;
  Response r = run(faa);
  EXPECT_EQ(r.syndrome, Syndrome::ack());
  EXPECT_EQ(r.atomic_original, 10u);
  Request cas = request(Operation::kCompareSwap, kIova + 64);
  cas.compare_add = 15;
  cas.swap = 100;
  r = run(cas);
  EXPECT_EQ(r.atomic_original, 15u);
  std::memcpy(&word, port_.at(kIova + 64), 8);
  EXPECT_EQ(word, 100u);
}

TEST_F(Responder, UnalignedAtomicsAreInvalidRequests) {
  EXPECT_EQ(run(request(Operation::kFetchAdd, kIova + 4)).syndrome, Syndrome::nak(Answer::kNakInvalidRequest));
}

TEST_F(Responder, AtomicWriteNeedsWriteAccessButNoResponderResources) {
  port_.qp_.max_dest_rd_atomic = 0;
  Request w = request(Operation::kAtomicWrite, kIova + 16);
  w.compare_add = 0x0102030405060708;
  EXPECT_EQ(run(w).syndrome, Syndrome::ack());
  uint64_t word;
  std::memcpy(&word, port_.at(kIova + 16), 8);
  EXPECT_EQ(word, 0x0102030405060708u);
  port_.qp_.access = IBV_ACCESS_REMOTE_ATOMIC;
  EXPECT_EQ(run(w).syndrome, Syndrome::nak(Answer::kNakRemoteAccess));
}

TEST_F(Responder, ADeadResponderSendsNothing) {
  port_.is_gone = true;
  EXPECT_EQ(run(request(Operation::kWrite, kIova, kOtherPdKey)).syndrome, Syndrome::silence());
  EXPECT_EQ(run(request(Operation::kSend)).syndrome, Syndrome::silence());
  EXPECT_TRUE(port_.events.empty());
}

TEST_F(Responder, AQpNotReadyOrOfAnotherTypeSendsNothing) {
  port_.qp_.state = IBV_QPS_INIT;
  EXPECT_EQ(run(request(Operation::kWrite)).syndrome, Syndrome::silence());
  port_.qp_.state = IBV_QPS_ERR;
  EXPECT_EQ(run(request(Operation::kWrite)).syndrome, Syndrome::silence());
  port_.qp_.state = IBV_QPS_RTR;
  port_.qp_.type = IBV_QPT_UC;
  EXPECT_EQ(run(request(Operation::kWrite)).syndrome, Syndrome::silence());
  EXPECT_EQ(port_.at(kIova)[0], 0);
}

TEST_F(Responder, ACopyCutByADeregistrationIsARemoteAccessNak) {
  port_.copy_result = CopyStatus::kFault;
  EXPECT_EQ(run(request(Operation::kWrite)).syndrome, Syndrome::nak(Answer::kNakRemoteAccess));
  port_.qp_.state = IBV_QPS_RTS;
  port_.copy_result = CopyStatus::kGone;
  EXPECT_EQ(run(request(Operation::kWrite)).syndrome, Syndrome::silence());
}

TEST_F(Responder, WriteWithImmediateConsumesAReceive) {
  Request r = request(Operation::kWriteWithImm, kIova + 256);
  r.imm_data = 0x77;
  EXPECT_EQ(run(r).syndrome, Syndrome::rnr(12));
  EXPECT_EQ(port_.at(kIova + 256)[0], 0) << "nothing lands before a receive is there";
  port_.post_receive(9, 0, 0);
  EXPECT_EQ(run(r).syndrome, Syndrome::ack());
  ASSERT_EQ(port_.completions.size(), 1u);
  EXPECT_EQ(port_.completions[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(port_.completions[0].byte_len, 64u);
  EXPECT_EQ(port_.completions[0].imm_data, 0x77u);
  EXPECT_EQ(port_.at(kIova + 256)[0], 0xAB);
}

// The udp link's packet-by-packet path: accept at the first packet, place
// each payload, finish at the last.

TEST_F(Responder, ASendArrivingInPiecesFillsTheReceiveWqesSgesInOrder) {
  ReceiveWqe wqe;
  wqe.wr_id = 3;
  wqe.num_sge = 3;
  wqe.sge[0] = ReceiveSge{kIova, 10, kKey};
  wqe.sge[1] = ReceiveSge{kIova + 100, 0, 0xBAD};  // empty: never checked
  wqe.sge[2] = ReceiveSge{kIova + 200, 100, kKey};
  port_.receives.push_back(wqe);
  MessageInProgress m;
  Request first = request(Operation::kSend);
  ASSERT_EQ(accept(first, port_, true, m).syndrome, Syndrome::ack());
  std::vector<unsigned char> piece(16);
  for (int i = 0; i < 4; ++i) {
    std::fill(piece.begin(), piece.end(), static_cast<unsigned char>(i + 1));
    const iovec iov{piece.data(), piece.size()};
    ASSERT_EQ(place(m, &iov, 1, piece.size(), port_).syndrome, Syndrome::ack()) << "piece " << i;
  }
  EXPECT_EQ(finish(m, first, port_).syndrome, Syndrome::ack());
  ASSERT_EQ(port_.completions.size(), 1u);
  EXPECT_EQ(port_.completions[0].byte_len, 64u);
  EXPECT_EQ(port_.at(kIova)[9], 1);          // SGE 0 holds bytes 0..9
  EXPECT_EQ(port_.at(kIova + 200)[0], 1);    // bytes 10..15 of piece 0
  EXPECT_EQ(port_.at(kIova + 200)[6], 2);    // then piece 1
  EXPECT_EQ(port_.at(kIova + 200)[53], 4);   // the last byte: 64 - 10 - 1
  EXPECT_EQ(port_.at(kIova + 200)[54], 0);
}

TEST_F(Responder, APieceBeyondTheReceiveWqeIsAnInvalidRequest) {
  port_.post_receive(4, kIova, 20);
  MessageInProgress m;
  ASSERT_EQ(accept(request(Operation::kSend), port_, true, m).syndrome, Syndrome::ack());
  const iovec iov{payload_.data(), 16};
  ASSERT_EQ(place(m, &iov, 1, 16, port_).syndrome, Syndrome::ack());
  EXPECT_EQ(place(m, &iov, 1, 16, port_).syndrome, Syndrome::nak(Answer::kNakInvalidRequest));
  ASSERT_EQ(port_.completions.size(), 1u);
  EXPECT_EQ(port_.completions[0].status, IBV_WC_LOC_LEN_ERR);
}

TEST_F(Responder, AWriteLongerThanItsRethIsAnInvalidRequest) {
  MessageInProgress m;
  Request first = request(Operation::kWrite);
  first.length = 32;
  ASSERT_EQ(accept(first, port_, true, m).syndrome, Syndrome::ack());
  const iovec iov{payload_.data(), 32};
  ASSERT_EQ(place(m, &iov, 1, 32, port_).syndrome, Syndrome::ack());
  EXPECT_EQ(place(m, &iov, 1, 1, port_).syndrome, Syndrome::nak(Answer::kNakInvalidRequest));
  EXPECT_EQ(port_.events.back(), IBV_EVENT_QP_REQ_ERR);
}

TEST_F(Responder, TheLastPacketOfAWriteWithImmediateNeedsAReceive) {
  MessageInProgress m;
  Request first = request(Operation::kWriteWithImm);
  ASSERT_EQ(accept(first, port_, true, m).syndrome, Syndrome::ack());
  EXPECT_EQ(ready_for_last(m, port_).syndrome, Syndrome::rnr(12));
  port_.post_receive(8, 0, 0);
  EXPECT_EQ(ready_for_last(m, port_).syndrome, Syndrome::ack());
  EXPECT_EQ(place(m, &payload_iov_, 1, 64, port_).syndrome, Syndrome::ack());
  EXPECT_EQ(finish(m, first, port_).syndrome, Syndrome::ack());
  ASSERT_EQ(port_.completions.size(), 1u);
  EXPECT_EQ(port_.completions[0].wr_id, 8u);
}

class Datagrams : public Responder {
 protected:
  void SetUp() override {
    port_.qp_.type = IBV_QPT_UD;
    for (int i = 0; i < 40; ++i) grh_[i] = static_cast<unsigned char>(i);
  }
  Request datagram() {
    Request r = request(Operation::kSend);
    r.qp_type = IBV_QPT_UD;
    r.qkey = 0x11;
    return r;
  }
  unsigned char grh_[40];
};

TEST_F(Datagrams, ArriveBehindTheirGrh) {
  port_.post_receive(1, kIova, 40 + 64);
  respond_datagram(datagram(), grh_, port_);
  ASSERT_EQ(port_.completions.size(), 1u);
  const ReceiveCompletion& c = port_.completions[0];
  EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  EXPECT_EQ(c.byte_len, 104u);
  EXPECT_EQ(c.wc_flags, static_cast<uint32_t>(IBV_WC_GRH));
  EXPECT_EQ(c.src_qp, 0x99u);
  EXPECT_EQ(c.sl, 1) << "the area holds no IPv4 header: mlx5 reports IPv6 (1)";
  EXPECT_EQ(port_.at(kIova)[39], 39);
  EXPECT_EQ(port_.at(kIova + 40)[0], 0xAB);
}

// On RoCE, wc.sl of a UD receive is the network header type (mlx5): 2 when
// the GRH area holds an IPv4 header, 1 for an IPv6 one.
TEST_F(Datagrams, ReportTheirNetworkHeaderTypeAsServiceLevel) {
  const uint8_t mapped_a[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1};
  const uint8_t mapped_b[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 2};
  const uint8_t v6_a[16] = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  softhca::wire::build_ud_grh(grh_, mapped_a, mapped_b, 64, 0, 64, 0);
  port_.post_receive(1, kIova, 40 + 64);
  respond_datagram(datagram(), grh_, port_);
  softhca::wire::build_ud_grh(grh_, v6_a, mapped_b, 64, 0, 64, 0xFFFFF);
  port_.post_receive(2, kIova, 40 + 64);
  respond_datagram(datagram(), grh_, port_);
  ASSERT_EQ(port_.completions.size(), 2u);
  EXPECT_EQ(port_.completions[0].sl, softhca::wire::kRoceHeaderIpv4);
  EXPECT_EQ(port_.completions[0].sl, 2);
  EXPECT_EQ(port_.completions[1].sl, softhca::wire::kRoceHeaderIpv6);
}

TEST_F(Datagrams, WithTheWrongQkeyOrNoReceiveAreDropped) {
  Request r = datagram();
  r.qkey = 0x12;
  port_.post_receive(1, kIova, 4096);
  respond_datagram(r, grh_, port_);
  EXPECT_TRUE(port_.completions.empty());
  EXPECT_EQ(port_.receives.size(), 1u) << "a dropped datagram takes no receive";
  port_.receives.clear();
  respond_datagram(datagram(), grh_, port_);
  EXPECT_TRUE(port_.completions.empty());
  EXPECT_TRUE(port_.events.empty());
}

TEST_F(Datagrams, TooLongForTheReceiveCompletesItInError) {
  port_.post_receive(1, kIova, 40 + 10);
  respond_datagram(datagram(), grh_, port_);
  ASSERT_EQ(port_.completions.size(), 1u);
  EXPECT_EQ(port_.completions[0].status, IBV_WC_LOC_LEN_ERR);
  EXPECT_TRUE(port_.events.empty()) << "a UD QP does not go to ERROR for one datagram";
}

}  // namespace
}  // namespace softhca::transport
