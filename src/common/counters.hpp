// The device's counters: what a NIC's hardware counters tell an operator
// (packets, retransmissions, NAKs, drops), per QP and per port. They live in
// shared memory (a QP's in its SharedQp, a port's per process in the host
// registry) so that `softhca stat` reads them from outside the programs,
// and are bumped with relaxed atomics: a count may lag, never tear.
//
// Names are those of the kernel's Soft-RoCE (rxe) hw counters where one
// exists, so that scripts written for `rdma statistic` read ours too; the
// rest are ours, in the same style.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace softhca {

enum class Counter : uint8_t {
  kSentPkts,             // packets the udp link sent
  kRcvdPkts,             // packets the udp link received and accepted (ICRC good, for a QP here)
  kSentBytes,            // their bytes, RoCEv2 headers to ICRC (not IP/UDP)
  kRcvdBytes,
  kRdmaSends,            // SEND messages that completed successfully at the requester
  kRdmaRecvs,            // receive WQEs consumed by an incoming SEND (or WRITE with immediate)
  kDuplicateRequest,     // responder: a request with a PSN already seen (a retransmission)
  kOutOfSeqRequest,      // responder: a request past the expected PSN (one before it was lost)
  kSentSeqNak,           // responder: NAK PSN sequence error sent
  kSendRnrErr,           // responder: RNR NAK sent (no receive WQE)
  kSentNakInvalidRequest,
  kSentNakRemoteAccess,
  kSentNakRemoteOperation,
  kRcvdSeqErr,           // requester: NAK PSN sequence error received
  kRcvdRnrErr,           // requester: RNR NAK received
  kRcvdNakInvalidRequest,
  kRcvdNakRemoteAccess,
  kRcvdNakRemoteOperation,
  kCompleterRetryErr,    // requester: the ACK timer expired and packets were sent again
  kRetransmittedPkts,    // requester: packets sent more than once (timer or go-back-N)
  kRetryExceededErr,     // completions with IBV_WC_RETRY_EXC_ERR
  kRetryRnrExceededErr,  // completions with IBV_WC_RNR_RETRY_EXC_ERR
  kForwardedPkts,        // port: packets received for another process of this host, handed to it
  kForwardDrops,         // port: such packets lost because their owner did not take them in time
  kIcrcDrops,            // port: packets dropped for a bad ICRC (corrupted on the way)
  kMalformedDrops,       // packets dropped as malformed: by the port (truncated, bad headers, bad opcode),
                         // by a QP's flows (an opcode of another transport, a READ response out of place)
  kUnknownQpDrops,       // port: packets for a QPN no process of this host has
  kSrcAddrDrops,         // packets for a connected QP from an address that is not its peer's, or not to its own
  kPkeyDrops,            // port: packets whose BTH P_Key matches no entry of the P_Key table
  kSendErr,              // port: packets the operating system refused to send
  kClosedQpDrops,        // packets for a QP of ours that does not receive now: RESET, INIT or ERROR
                         // (a responder), being destroyed, or without a requester (a response)
  kStaleResponses,       // requester: responses that answered nothing outstanding (repeated ACKs,
                         // a PSN never sent, a READ response out of its window): taken, no effect
};
inline constexpr std::size_t kCounterCount = static_cast<std::size_t>(Counter::kStaleResponses) + 1;

struct CounterInfo {
  std::string_view name;
  std::string_view help;
};

// One row per Counter, in its order.
inline constexpr std::array<CounterInfo, kCounterCount> kCounterInfo = {{
    {"sent_pkts", "packets sent on the udp link"},
    {"rcvd_pkts", "packets received on the udp link and accepted"},
    {"sent_bytes", "bytes of the packets sent (BTH to ICRC)"},
    {"rcvd_bytes", "bytes of the packets received (BTH to ICRC)"},
    {"rdma_sends", "SEND messages completed by the requester"},
    {"rdma_recvs", "receive WQEs consumed by incoming messages"},
    {"duplicate_request", "requests received again (retransmissions)"},
    {"out_of_seq_request", "requests received past a gap in the PSNs"},
    {"sent_seq_nak", "NAKs for a PSN sequence error sent"},
    {"send_rnr_err", "RNR NAKs sent (no receive WQE posted)"},
    {"sent_nak_inv_req", "NAKs for an invalid request sent"},
    {"sent_nak_rem_access", "NAKs for a remote access error sent"},
    {"sent_nak_rem_op", "NAKs for a remote operational error sent"},
    {"rcvd_seq_err", "NAKs for a PSN sequence error received"},
    {"rcvd_rnr_err", "RNR NAKs received"},
    {"rcvd_nak_inv_req", "NAKs for an invalid request received"},
    {"rcvd_nak_rem_access", "NAKs for a remote access error received"},
    {"rcvd_nak_rem_op", "NAKs for a remote operational error received"},
    {"completer_retry_err", "ACK timeouts that made the requester send again"},
    {"retransmitted_pkts", "packets the requester sent again"},
    {"retry_exceeded_err", "work completions with RETRY_EXC_ERR"},
    {"retry_rnr_exceeded_err", "work completions with RNR_RETRY_EXC_ERR"},
    {"forwarded_pkts", "packets handed to the process of this host that owns their QP"},
    {"forward_drops", "packets lost because the owner of their QP did not take them in time"},
    {"icrc_err_drops", "packets dropped for a bad ICRC"},
    {"malformed_drops", "packets dropped as malformed"},
    {"unknown_qp_drops", "packets dropped: no QP of this host has their QPN"},
    {"src_addr_drops", "packets for a connected QP dropped: not from its peer's address to its own"},
    {"pkey_drops", "packets dropped: their P_Key matches no entry of the P_Key table"},
    {"send_err", "packets the operating system refused to send"},
    {"closed_qp_drops", "packets dropped: their QP does not receive now (RESET, INIT, ERROR, destroyed)"},
    {"stale_responses", "responses that answered nothing outstanding (repeated ACKs, unsent PSNs)"},
}};

constexpr const CounterInfo& info(Counter c) { return kCounterInfo[static_cast<std::size_t>(c)]; }

// The counters that initiators of other processes bump in a target's set
// on the shm link (they execute the responder there); the QP's owner bumps
// the others.
constexpr bool bumped_by_initiators(Counter c) {
  switch (c) {
    case Counter::kRdmaRecvs:
    case Counter::kDuplicateRequest:
    case Counter::kOutOfSeqRequest:
    case Counter::kSentSeqNak:
    case Counter::kSendRnrErr:
    case Counter::kSentNakInvalidRequest:
    case Counter::kSentNakRemoteAccess:
    case Counter::kSentNakRemoteOperation:
      return true;
    default:
      return false;
  }
}

// Where each counter sits in a set. The two writers' counters live on
// different cache lines: with kRdmaSends (the owner's, at every SEND it
// posts) next to kRdmaRecvs (its peer's, at every SEND it executes here), a
// ping-pong of SENDs moved that line between the two cores at every message.
inline constexpr std::size_t kInitiatorSlots = 8;
inline constexpr std::size_t kOwnerSlots = 32;
inline constexpr std::size_t kCounterSlots = kOwnerSlots + kInitiatorSlots;
inline constexpr std::array<uint8_t, kCounterCount> kCounterSlot = [] {
  std::array<uint8_t, kCounterCount> slot{};
  std::size_t owner = 0, initiator = kOwnerSlots;
  for (std::size_t c = 0; c < kCounterCount; ++c)
    slot[c] = static_cast<uint8_t>(bumped_by_initiators(static_cast<Counter>(c)) ? initiator++ : owner++);
  if (owner > kOwnerSlots || initiator > kCounterSlots) throw "counter slots overflow";  // not constant: a compile error
  return slot;
}();

// A set of counters in shared memory (zeroed memory is a valid, all-zero set).
struct alignas(64) Counters {
  std::atomic<uint64_t> slots[kCounterSlots];

  std::atomic<uint64_t>& at(Counter c) { return slots[kCounterSlot[static_cast<std::size_t>(c)]]; }
  const std::atomic<uint64_t>& at(Counter c) const { return slots[kCounterSlot[static_cast<std::size_t>(c)]]; }
  void add(Counter c, uint64_t n = 1) { at(c).fetch_add(n, std::memory_order_relaxed); }
  uint64_t get(Counter c) const { return at(c).load(std::memory_order_relaxed); }
};
static_assert(kOwnerSlots * sizeof(uint64_t) % 64 == 0, "the initiators' counters start a cache line");

// Where one QP's events are counted: its own set and its port's (either may
// be absent: unit tests, or a packet not yet tied to a QP).
class CounterSink {
 public:
  CounterSink() = default;
  CounterSink(Counters* qp, Counters* port) : qp_(qp), port_(port) {}

  void add(Counter c, uint64_t n = 1) const {
    if (qp_ != nullptr) qp_->add(c, n);
    if (port_ != nullptr) port_->add(c, n);
  }
  Counters* qp() const { return qp_; }
  Counters* port() const { return port_; }

 private:
  Counters* qp_ = nullptr;
  Counters* port_ = nullptr;
};

}  // namespace softhca
