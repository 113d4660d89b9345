#include "cm/remote_transport.hpp"

#include <cstring>

#include "common/log.hpp"
#include "engine/node.hpp"

namespace softhca::cm {
namespace {

// A bound on MADs waiting for the CM thread: a flood from the network
// costs what arrives beyond it (the senders retransmit), never memory.
constexpr std::size_t kMaxQueuedMads = 4096;
static_assert(link::kMadBytes == kMadSize);

}  // namespace

uint32_t RemotePeers::handle_of(const HostPair& pair) {
  for (std::size_t i = 0; i < pairs_.size(); ++i)
    if (pairs_[i] == pair) return kRemotePeerBit | static_cast<uint32_t>(i);
  pairs_.push_back(pair);
  return kRemotePeerBit | static_cast<uint32_t>(pairs_.size() - 1);
}

std::optional<HostPair> RemotePeers::find(uint32_t handle) const {
  if (!is_remote_peer(handle)) return std::nullopt;
  const std::size_t i = handle & ~kRemotePeerBit;
  if (i >= pairs_.size()) return std::nullopt;
  return pairs_[i];
}

std::unique_ptr<RemoteTransport> RemoteTransport::open(engine::Node& node, std::function<void()> wake) {
  std::unique_ptr<RemoteTransport> t(new RemoteTransport(&node, std::move(wake)));
  RemoteTransport* self = t.get();
  node.receive_mads([self](const link::ManagementDatagram& d) {
    ArrivedMad a;
    std::memcpy(a.from.remote.data(), d.sgid, 16);
    std::memcpy(a.from.local.data(), d.dgid, 16);
    std::memcpy(a.mad.data(), d.mad.data(), kMadSize);
    {
      std::lock_guard guard(self->mutex_);
      if (self->arrived_.size() >= kMaxQueuedMads) return;
      self->arrived_.push_back(a);
    }
    self->wake_();
  });
  return t;
}

RemoteTransport::~RemoteTransport() { node_->receive_mads(nullptr); }

void RemoteTransport::send(const HostPair& to, std::span<const uint8_t> mad) {
  node_->send_mad(to.local.data(), to.remote.data(), mad);
}

std::vector<ArrivedMad> RemoteTransport::take() {
  std::lock_guard guard(mutex_);
  std::vector<ArrivedMad> out(arrived_.begin(), arrived_.end());
  arrived_.clear();
  return out;
}

}  // namespace softhca::cm
