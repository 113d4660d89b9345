// The link interface: how the engine sends a message to a peer QP, whatever
// carries it. The engine talks to links only through this header; a link
// runs the IBTA responder (src/transport) for the messages it delivers and
// returns its syndrome, which the engine's completer turns into a completion.
//
//  - shm (link/shm): the peer is on this host; the initiator executes the
//    responder itself on the peer's shared state and memory.
//  - udp (planned, issue #9): RoCEv2 packets to another host, whose responder
//    answers in an AETH.
#pragma once

#include <cstdint>
#include <memory>

#include "transport/request.hpp"
#include "transport/responder.hpp"

namespace softhca::host {
class Attachment;
}

namespace softhca::link {

// A connected QP's (RC or UC) path to its peer, opened when the QP moves to
// RTR and dropped when it is reset. Used under the QP's send lock only.
class Channel {
 public:
  virtual ~Channel() = default;
  // Delivers one message; returns the responder's answer (for UC, whatever it
  // is, the requester completes: UC has no acknowledgements).
  virtual transport::Response deliver(const transport::Request& request) = 0;
};

// Where a UD message goes, as the engine resolved its address handle.
struct Datagram {
  uint32_t dest_qpn = 0;         // or 0xFFFFFF for a multicast group
  bool is_global = false;
  uint8_t sgid[16] = {};
  uint8_t dgid[16] = {};
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;
  uint32_t flow_label = 0;
  bool block_self_multicast = false;  // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB
};

class Link {
 public:
  virtual ~Link() = default;
  // The channel of local QP `local_qpn` (of type `qp_type`) to QP `dest_qpn`.
  virtual std::unique_ptr<Channel> open_channel(uint32_t local_qpn, uint32_t qp_type, uint32_t dest_qpn) = 0;
  // Sends one UD message to a QP or a multicast group; one that cannot be
  // delivered is lost, as UD allows.
  virtual void send_datagram(const Datagram& to, const transport::Request& request) = 0;
};

// The shared-memory link of this host, over this process's attachment.
std::unique_ptr<Link> make_shm_link(host::Attachment& host);

}  // namespace softhca::link
