// The connection side of one rdma_cm id: the IB CM state machine (IBTA vol. 1,
// 12.9) as the Linux kernel's ib_cm runs it under rdma_cm.
//
// Pure: each call takes the current state and an input (a user request, a
// received message, or a timer that expired) and returns a Step — at most one
// message to send to the peer and at most one event to report — plus the new
// state. No I/O, no clock, no locks; cm/service.cpp owns the ids, the timers
// and moves the bytes.
//
//   active                         passive
//   kIdle --connect--> kReqSent    (REQ) --> kReqRcvd         CONNECT_REQUEST, MRA back
//   kReqSent <--REP--              kReqRcvd --accept--> kRepSent
//   kReqSent --REP--> kRepRcvd     CONNECT_RESPONSE (librdmacm turns it into
//                                  ESTABLISHED after moving the QP to RTS)
//   kRepRcvd --establish--> kEstablished (RTU) --> kRepSent -> kEstablished
//   kEstablished --disconnect--> kDreqSent (DREQ) --> peer: DREP, DISCONNECTED
//   kDreqSent --DREP--> kTimewait  DISCONNECTED
//   REJ in kReqSent/kRepRcvd/kRepSent/kReqRcvd --> kIdle  REJECTED(reason)
//
// Messages that want an answer (REQ, REP, DREQ, SIDR_REQ) are sent again when
// the answer does not come in time, and after the last retry the connection
// gives up as ib_cm does: UNREACHABLE(-ETIMEDOUT) for a REQ, REP or SIDR_REQ,
// DISCONNECTED(-ETIMEDOUT) and timewait for a DREQ. retransmit() says what to
// wait for; the service arms a timer and calls on_timeout. The timeouts are the
// kernel's: the active side waits 2 packet lifetimes plus the remote CM
// response time of its REQ, the passive side the REQ's local CM response
// time, both up to the REQ's max CM retries; an MRA stretches the wait to its
// service timeout. The passive side sends an MRA for every REQ it reports (as
// rdma_cm does before the application accepts) and again for a duplicate REQ.
//
// Values follow the kernel: REJECTED's status is the REJ reason (8 when nobody
// listens, 28 for rdma_reject), the event private data lengths are the full
// message capacities (56 after the IP header for a REQ, 196 for a REP, 148
// for a REJ), and the REQ/REP resource fields are swapped into the receiver's
// point of view (its responder_resources is the sender's initiator_depth).
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <optional>
#include <span>

#include "cm/mad_codec.hpp"
#include "common/limits.hpp"
#include "common/result.hpp"

namespace softhca::cm {

enum class ConnState : uint8_t {
  kIdle,         // no connection (never connected, rejected, or lost before establishing)
  kReqSent,      // active: REQ sent, waiting for REP or REJ
  kRepRcvd,      // active: REP received, CONNECT_RESPONSE reported; rdma_establish sends RTU
  kReqRcvd,      // passive: REQ received, CONNECT_REQUEST reported; accept or reject next
  kRepSent,      // passive: REP sent, waiting for RTU
  kEstablished,
  kDreqSent,     // DREQ sent, waiting for DREP
  kTimewait,     // disconnected
  kSidrReqSent,  // UD active: SIDR_REQ sent, waiting for SIDR_REP
  kSidrReqRcvd,  // UD passive: SIDR_REQ received, CONNECT_REQUEST reported
};

const char* conn_state_name(ConnState state);

// enum rdma_cm_event_type values (rdma/rdma_cma.h), kept numeric here so the
// state machine does not depend on the librdmacm header.
enum class CmEventType : int {
  kAddrResolved = 0,
  kAddrError = 1,
  kRouteResolved = 2,
  kRouteError = 3,
  kConnectRequest = 4,
  kConnectResponse = 5,
  kConnectError = 6,
  kUnreachable = 7,
  kRejected = 8,
  kEstablished = 9,
  kDisconnected = 10,
  kDeviceRemoval = 11,
  kMulticastJoin = 12,
  kMulticastError = 13,
  kAddrChange = 14,
  kTimewaitExit = 15,
};

// struct rdma_conn_param as an event reports it.
struct ConnParam {
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t flow_control = 0;
  uint8_t retry_count = 0;
  uint8_t rnr_retry_count = 0;
  uint8_t srq = 0;
  uint32_t qp_num = 0;
};

inline constexpr std::size_t kMaxEventPrivateData = kRepPrivateDataSize;  // 196, the largest

struct EventOut {
  CmEventType type = CmEventType::kAddrResolved;
  int status = 0;
  ConnParam param;       // for UD ids: param.qp_num is the remote QPN
  uint32_t qkey = 0;     // UD: the remote Q_Key (struct rdma_ud_param)
  Gid mgid{};                     // MULTICAST_JOIN: the group
  void* mc_context = nullptr;     // MULTICAST_JOIN: the context the join was given
  uint8_t private_data_len = 0;
  std::array<uint8_t, kMaxEventPrivateData> private_data{};
};

struct Step {
  std::optional<CmMessage> send;
  std::optional<EventOut> event;
};

// IBTA time values (4.096 us * 2^n) in milliseconds, rounded as the kernel's
// ib_cm does (2^(n-8), at least 1).
constexpr uint32_t iba_time_ms(uint8_t exponent) { return 1U << (exponent > 8 ? exponent - 8 : 0); }

// rdma_cm's settings (CMA_CM_RESPONSE_TIMEOUT, CMA_MAX_CM_RETRIES,
// CMA_IBOE_PACKET_LIFETIME, CMA_CM_MRA_SETTING).
inline constexpr uint8_t kDefaultCmResponseTimeout = 20;  // ~4.3 s
inline constexpr uint8_t kDefaultMaxCmRetries = 15;
inline constexpr uint8_t kPacketLifeTime = 16;           // ~268 ms
inline constexpr uint8_t kMraServiceTimeout = 24;        // ~69 s

// The QP's local ACK timeout (IBTA exponent) for a path whose packets live
// up to 4.096 us * 2^packet_life_time and whose far end acknowledges within
// 4.096 us * 2^ca_ack_delay: a round trip, or the ACK delay if longer, one
// step more when the two are close, as the kernel's ib_cm computes it (for
// the REQ's local ACK timeout, and at the REP for the active side's QP).
constexpr uint8_t cm_ack_timeout(uint8_t ca_ack_delay, uint8_t packet_life_time) {
  const int round_trip = packet_life_time + 1;
  const int timeout = round_trip >= ca_ack_delay ? round_trip + (ca_ack_delay >= round_trip - 1 ? 1 : 0)
                                                 : ca_ack_delay + (round_trip >= ca_ack_delay - 1 ? 1 : 0);
  return static_cast<uint8_t>(timeout < 31 ? timeout : 31);
}
// 17 (~537 ms): what Linux sends since 6.2 (6.1's packet lifetime of 18 gives 19).
inline constexpr uint8_t kDefaultLocalAckTimeout =
    cm_ack_timeout(static_cast<uint8_t>(limits::kLocalCaAckDelay), kPacketLifeTime);
static_assert(cm_ack_timeout(15, 18) == 19 && cm_ack_timeout(15, 16) == 17 && cm_ack_timeout(20, 16) == 20);

// How long one side waits for its peer's CM, and how often it asks again.
struct CmTimeouts {
  uint8_t response_timeout = kDefaultCmResponseTimeout;  // 5 bits, IBTA exponent
  uint8_t max_retries = kDefaultMaxCmRetries;            // 4 bits
};

// An answer being waited for: the timer to arm. `generation` names this wait;
// a timer of an older generation is stale.
struct Retransmit {
  uint32_t generation = 0;
  uint32_t timeout_ms = 0;
};

// The primary path of a connection, from the local side's point of view.
struct PathInfo {
  Gid sgid{};
  Gid dgid{};
  uint8_t sgid_index = 0;
  uint16_t pkey = 0xFFFF;
  uint8_t mtu = IBV_MTU_4096;
  uint8_t hop_limit = 64;
  uint8_t traffic_class = 0;
  uint32_t flow_label = 0;
  uint8_t local_ack_timeout = kDefaultLocalAckTimeout;  // the REQ's; the QP's timeout at RTS
};

// What the QPs on both ends are set up with; filled as the handshake runs.
struct Negotiated {
  ibv_qp_type qp_type = IBV_QPT_RC;
  uint32_t local_qpn = 0;
  uint32_t remote_qpn = 0;
  // A CM message's Starting PSN is the PSN its sender's QP will receive
  // first, as Linux's ib_cm and rdma_cm read it (cm_req_handler makes the
  // REQ's PSN the passive side's sq_psn; rdma_init_qp_attr gives RTR the
  // id's own PSN): our messages carry local_psn, our QP's rq_psn, and our
  // QP sends from remote_psn, the Starting PSN of the peer's REQ or REP.
  uint32_t local_psn = 0;
  uint32_t remote_psn = 0;
  uint8_t responder_resources = 0;  // our QP's max_dest_rd_atomic
  uint8_t initiator_depth = 0;      // our QP's max_rd_atomic
  uint8_t retry_count = 7;          // our QP's retry_cnt
  uint8_t rnr_retry_count = 7;      // our QP's rnr_retry
  bool flow_control = false;
  bool srq = false;
  bool remote_srq = false;
  uint64_t remote_ca_guid = 0;
  PathInfo path;
};

// rdma_connect's input, already checked and completed by the caller.
struct ConnectArgs {
  uint32_t local_comm_id = 0;
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;
  uint32_t qpn = 0;
  bool srq = false;
  uint32_t starting_psn = 0;
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t retry_count = 7;
  uint8_t rnr_retry_count = 7;
  bool flow_control = false;
  ibv_qp_type qp_type = IBV_QPT_RC;
  PathInfo path;
  CmTimeouts timeouts;
  // The REQ's whole private data: rdma_cm's IP header, then the user's bytes.
  std::array<uint8_t, kReqPrivateDataSize> private_data{};
};

// rdma_connect on a UD id (service ID resolution).
struct SidrArgs {
  uint32_t local_comm_id = 0;
  uint64_t service_id = 0;
  uint16_t pkey = 0xFFFF;
  PathInfo path;
  CmTimeouts timeouts;
  std::array<uint8_t, kSidrReqPrivateDataSize> private_data{};  // IP header + user bytes
};

// rdma_accept's input.
// (No starting PSN: the passive side's was chosen when the REQ came, and
// rdma_accept moves the QP to RTS with it before the REP carries it.)
struct AcceptArgs {
  uint32_t qpn = 0;
  bool srq = false;
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t rnr_retry_count = 7;
  bool flow_control = false;
  uint64_t local_ca_guid = 0;
  std::span<const uint8_t> private_data;  // at most kRepPrivateDataSize
};

class Connection {
 public:
  Connection() = default;

  ConnState state() const { return state_; }
  uint32_t local_comm_id() const { return local_comm_id_; }
  uint32_t remote_comm_id() const { return remote_comm_id_; }
  const Negotiated& negotiated() const { return neg_; }
  // True once a REQ was sent or received: the QP attributes now come from the
  // connection (rdma_init_qp_attr's "cm_id.ib exists" case).
  bool has_cm() const { return has_cm_; }

  // Active side. Errors: invalid_argument (not kIdle).
  Result<Step> connect(const ConnectArgs& args);
  // Passive side: a new connection from a REQ; reports CONNECT_REQUEST with
  // the user's part of the private data (after `user_offset` header bytes)
  // and sends an MRA (rdma_cm's "the application will answer").
  static Connection from_req(const ReqMsg& req, uint32_t local_comm_id, uint32_t local_psn, const PathInfo& path,
                             std::size_t user_offset, Step& step);
  // Errors: invalid_argument (not kReqRcvd, private data too long).
  Result<Step> accept(const AcceptArgs& args);

  // UD ids: SIDR. The active side sends a SIDR_REQ and gets ESTABLISHED
  // (with the remote QPN and Q_Key) or UNREACHABLE (status: the SIDR_REP
  // status; 1 when nobody listens, 2 for rdma_reject).
  // Errors: invalid_argument (not kIdle).
  Result<Step> sidr_request(const SidrArgs& args);
  static Connection from_sidr_req(const SidrReqMsg& req, uint32_t local_comm_id, const PathInfo& path,
                                  std::size_t user_offset, Step& step);
  // Errors: invalid_argument (not kSidrReqRcvd, private data too long).
  Result<Step> sidr_accept(uint32_t qpn, uint32_t qkey, std::span<const uint8_t> private_data);
  // rdma_reject: kReqRcvd (REJ of the REQ) or kRepRcvd (REJ of the REP), or
  // kSidrReqRcvd (SIDR_REP "rejected").
  // Errors: invalid_argument (wrong state, private data too long).
  Result<Step> reject(std::span<const uint8_t> private_data, uint16_t reason);
  // rdma_establish / the RTU after CONNECT_RESPONSE. Errors: invalid_argument (not kRepRcvd).
  Result<Step> establish();
  // rdma_notify(IBV_EVENT_COMM_EST) on the passive side: as if the RTU came.
  // Errors: invalid_argument (not kRepSent), already_connected (established).
  Result<Step> notify_established();
  // rdma_disconnect. kEstablished sends a DREQ; kDreqSent/kTimewait and the
  // half-open states are no-ops (the kernel sends nothing there either).
  // Errors: invalid_argument when no connection was ever started.
  Result<Step> disconnect();
  // A message from the peer of this connection.
  Step on_message(const CmMessage& msg);
  // The peer sent its REQ again (it has not heard from us): the MRA again
  // while the application has not answered; nothing otherwise.
  Step on_duplicate_req() const;

  // The answer this connection waits for, if any.
  std::optional<Retransmit> retransmit() const;
  // The timer of wait `generation` expired: the message again, or giving up.
  // A stale generation does nothing.
  Step on_timeout(uint32_t generation);
  // The peer process is gone: what its CM would have sent while destroying
  // its end (REJ in the handshake, DREQ/DREP when connected).
  Step on_peer_lost();
  // What must go on being sent once this id is destroyed, or its process
  // exits, for the peer to learn that the connection ended: the DREQ of a
  // connection that is established (on_destroy sends it), or waits for the
  // RTU, or whose DREQ waits for its DREP, with the wait and retries it has
  // left. The kernel's CM
  // sends it once and forgets it with the id, so a lost DREQ left the peer
  // connected for ever: rping's server at 20% loss, after its client had
  // disconnected and exited (issue #42). Ask before on_destroy or on_exit.
  struct Departure {
    DreqMsg dreq;
    uint32_t wait_ms = 0;
    uint8_t retries = 0;
  };
  std::optional<Departure> departure() const;
  // This id is being destroyed: the message that tells the peer (the kernel's
  // cm_destroy_id), and the connection is idle afterwards.
  Step on_destroy();
  // The process is exiting with this id: as on_destroy, and in TIMEWAIT
  // the DREP once more (the one answering the peer's DREQ may not have left
  // before the exit, and no CM outlives the process to answer it again).
  Step on_exit();

  // For the passive side before accept: what the REQ asked for.
  void set_local_qpn(uint32_t qpn) { neg_.local_qpn = qpn; }

 private:
  Step on_rep(const RepMsg& rep);
  Step on_rej(const RejMsg& rej);
  Step on_dreq(const DreqMsg& dreq);
  Step on_sidr_rep(const SidrRepMsg& rep);
  SidrRepMsg make_sidr_rep(SidrStatus status, std::span<const uint8_t> private_data) const;
  RejMsg make_rej(uint16_t reason, RejectedMessage which, std::span<const uint8_t> private_data) const;
  MraMsg make_mra() const;
  // Waits for the answer to `msg` (just sent) for `timeout_ms`, `retries` times more.
  void await_answer(const CmMessage& msg, uint32_t timeout_ms, uint8_t retries);
  // The states in which an answer is awaited.
  bool awaiting_state() const;

  ConnState state_ = ConnState::kIdle;
  bool has_cm_ = false;
  uint32_t local_comm_id_ = 0;
  uint32_t remote_comm_id_ = 0;
  uint64_t local_ca_guid_ = 0;  // the active side's, which its REJ for a timeout carries
  uint64_t service_id_ = 0;  // SIDR: echoed in the SIDR_REP
  Negotiated neg_;

  // Retransmission: what to send again, how long each wait lasts, how many
  // more tries, and the current wait's generation.
  uint32_t answer_ms_ = 0;    // one wait for an answer (before any MRA)
  uint8_t max_retries_ = 0;
  std::optional<CmMessage> awaited_;
  uint32_t wait_ms_ = 0;
  uint8_t retries_left_ = 0;
  uint32_t generation_ = 0;
};

// ---- QP attributes (rdma_init_qp_attr) -------------------------------------

struct QpAttrPlan {
  ibv_qp_attr attr{};
  int mask = 0;
};

// The attributes that move a QP of this connection to `target` (INIT, RTR or
// RTS), as the kernel's rdma_init_qp_attr gives them: INIT carries the port,
// P_Key index and access flags (REMOTE_WRITE, plus READ and ATOMIC when the
// connection grants responder resources; 0 before any REQ; a Q_Key for UD),
// RTR the path, remote QPN and PSN and max_dest_rd_atomic, RTS the timeouts,
// retry counts, our PSN and max_rd_atomic.
// Errors: invalid_argument (other states, or RTR/RTS of a connection that
// knows no peer yet).
Result<QpAttrPlan> init_qp_attr(const Connection& conn, ibv_qp_type qp_type, uint8_t port_num,
                                uint16_t pkey_index, uint32_t qkey, ibv_qp_state target);

}  // namespace softhca::cm
