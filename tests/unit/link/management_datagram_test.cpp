// Management datagrams (MADs to QP1) over the udp link of this process, on
// 127.0.0.1: a MAD sent from QP1 reaches the receiver installed for QP1
// unchanged, with its sender's address; datagrams to QP1 that break the GSI
// rules (another Q_Key, less than a MAD) are dropped and counted. Runs in a
// private runtime directory, holding port 4791 alone (see CMakeLists.txt).
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <sys/uio.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "engine/device/device_info.hpp"
#include "engine/node.hpp"

namespace softhca {
namespace {

struct Arrival {
  std::vector<uint8_t> mad;
  uint8_t sgid[16];
  uint32_t src_qpn;
};

class ManagementDatagrams : public ::testing::Test {
 protected:
  void SetUp() override {
    auto node = engine::Node::acquire();
    ASSERT_TRUE(node.has_value());
    node_ = *node;
    node_->receive_mads([this](const link::ManagementDatagram& d) {
      Arrival a;
      a.mad.assign(d.mad.begin(), d.mad.end());
      std::memcpy(a.sgid, d.sgid, sizeof a.sgid);
      a.src_qpn = d.src_qpn;
      std::lock_guard guard(mutex_);
      arrivals_.push_back(std::move(a));
      arrived_.notify_all();
    });
  }
  void TearDown() override {
    if (node_ == nullptr) return;
    node_->receive_mads(nullptr);
    engine::Node::release();
  }

  // The next MAD to arrive, waiting at most 5 s.
  std::optional<Arrival> next_arrival() {
    std::unique_lock lock(mutex_);
    if (!arrived_.wait_for(lock, std::chrono::seconds(5), [&] { return !arrivals_.empty(); })) return std::nullopt;
    Arrival a = std::move(arrivals_.front());
    arrivals_.pop_front();
    return a;
  }

  uint64_t port_counter(Counter c) { return node_->registry().port_counters()[static_cast<size_t>(c)]; }

  static std::vector<uint8_t> pattern(uint8_t seed) {
    std::vector<uint8_t> mad(link::kMadBytes);
    for (size_t i = 0; i < mad.size(); ++i) mad[i] = static_cast<uint8_t>(seed + i * 7);
    return mad;
  }

  // A UD datagram to QP1 of 127.0.0.1 that is not a proper GSI datagram.
  void send_raw(uint32_t qkey, size_t length) {
    std::vector<uint8_t> bytes = pattern(9);
    bytes.resize(length);
    iovec payload{bytes.data(), bytes.size()};
    link::Datagram to;
    to.dest_qpn = link::kGsiQpn;
    to.is_global = true;
    std::memcpy(to.sgid, engine::kLoopbackV4Gid.data(), 16);
    std::memcpy(to.dgid, engine::kLoopbackV4Gid.data(), 16);
    transport::Request r;
    r.op = transport::Operation::kSend;
    r.qp_type = IBV_QPT_UD;
    r.src_qpn = link::kGsiQpn;
    r.qkey = qkey;
    r.data = &payload;
    r.ndata = 1;
    r.length = bytes.size();
    node_->udp_link().send_datagram(to, r);
  }

  engine::Node* node_ = nullptr;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<Arrival> arrivals_;
};

TEST_F(ManagementDatagrams, AMadReachesQp1Unchanged) {
  const auto mad = pattern(1);
  node_->send_mad(engine::kLoopbackV4Gid.data(), engine::kLoopbackV4Gid.data(), mad);
  const auto got = next_arrival();
  ASSERT_TRUE(got.has_value()) << "no MAD arrived within 5 s";
  EXPECT_EQ(got->mad, mad);
  EXPECT_EQ(std::memcmp(got->sgid, engine::kLoopbackV4Gid.data(), 16), 0);
  EXPECT_EQ(got->src_qpn, link::kGsiQpn);
}

TEST_F(ManagementDatagrams, WrongQkeyAndShortMadsAreDroppedAndCounted) {
  const uint64_t malformed_before = port_counter(Counter::kMalformedDrops);
  send_raw(0x1234, link::kMadBytes);   // another Q_Key: a Q_Key violation
  send_raw(link::kGsiQkey, 64);       // not a whole MAD
  // Packets on 127.0.0.1 arrive in order, so once this one is here the two
  // before it have been judged.
  const auto mad = pattern(2);
  node_->send_mad(engine::kLoopbackV4Gid.data(), engine::kLoopbackV4Gid.data(), mad);
  const auto got = next_arrival();
  ASSERT_TRUE(got.has_value()) << "no MAD arrived within 5 s";
  EXPECT_EQ(got->mad, mad) << "a malformed datagram was delivered";
  EXPECT_EQ(port_counter(Counter::kMalformedDrops), malformed_before + 2);
}

// Once a receiver is installed the host has a live GSI agent: this process,
// or one of the runtime directory's that claimed it first and still runs
// (which one is the registry's rule, tested in host_registry_test).
TEST_F(ManagementDatagrams, TheHostHasALiveGsiAgentOnceAReceiverIsInstalled) {
  const auto agent = node_->registry().gsi_agent();
  ASSERT_TRUE(agent.has_value());
  EXPECT_TRUE(node_->registry().process_alive(*agent));
}

}  // namespace
}  // namespace softhca
