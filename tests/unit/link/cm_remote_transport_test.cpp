// The CM's remote transport end to end on 127.0.0.1 inside one process: a
// MAD sent to a peer arrives back through QP1, queued for the CM thread,
// with the addresses it travelled between, and the CM thread is woken.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "cm/remote_transport.hpp"
#include "engine/device/device_info.hpp"
#include "engine/node.hpp"

namespace softhca::cm {
namespace {

TEST(CmRemoteTransport, AMadToAPeerArrivesQueuedWithItsAddresses) {
  std::mutex mutex;
  std::condition_variable woken;
  int wakes = 0;
  auto node = engine::Node::acquire();
  ASSERT_TRUE(node.has_value());
  auto transport = RemoteTransport::open(**node, [&] {
    std::lock_guard guard(mutex);
    ++wakes;
    woken.notify_all();
  });
  HostPair peer;
  std::copy(engine::kLoopbackV4Gid.begin(), engine::kLoopbackV4Gid.end(), peer.remote.begin());
  peer.local = peer.remote;
  MadBytes mad{};
  for (size_t i = 0; i < mad.size(); ++i) mad[i] = static_cast<uint8_t>(255 - i);
  transport->send(peer, mad);
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(woken.wait_for(lock, std::chrono::seconds(5), [&] { return wakes > 0; }))
        << "the CM thread was not woken within 5 s";
  }
  const auto arrived = transport->take();
  ASSERT_EQ(arrived.size(), 1u);
  EXPECT_EQ(arrived[0].mad, mad);
  EXPECT_EQ(arrived[0].from, peer);
  EXPECT_TRUE(transport->take().empty());
  transport.reset();
  engine::Node::release();
}

}  // namespace
}  // namespace softhca::cm
