// The connection manager of one process: its rdma_cm ids, event channels and
// the CM thread. What the kernel's rdma_cm + ib_cm + ucma do for a real HCA,
// done in the process itself and talking to the other processes of the host
// through a transport (cm/transport.hpp, the seam; cm/local_transport.hpp,
// the one there is), with bound and listening ports recorded in the per-user
// cm/port_table.hpp.
//
// Threads and locks: one mutex guards every id and channel of the process.
// API calls (from any application thread) and the CM thread (one per process,
// started with the service, blocked in poll(2) while nothing arrives) take
// it, run the pure state machine (cm/connection.hpp), queue events, and
// collect outgoing messages, which are sent only after the mutex is released
// (two processes sending to each other while holding their locks could
// otherwise wait for each other forever).
//
// Event channels: a queue plus an eventfd that is readable exactly while the
// queue is not empty, so applications can poll the channel's fd; a blocking
// get_event waits in poll(2) on it. An event holds its id until acknowledged:
// destroy_id and migrate_id wait for the acknowledgements of the events
// already handed out for that id (as librdmacm does), and drop the ones not
// yet handed out.
//
// Process lifetime: the service is created on first use and never destroyed
// (the CM thread runs until exit). At exit the endpoint is removed and the
// process's ports released; a process that dies abruptly leaves them to be
// reclaimed by the survivors, and its peers see its connections break, which
// they report as the kernel reports a peer whose ids were destroyed
// (REJECTED during the handshake, DISCONNECTED once connected). A child of
// fork() starts a fresh service of its own on first use.
//
// Where the members are defined, one job a file: service.cpp (the instance,
// fork and exit, the CM thread, timers, applying a step), service_events.cpp
// (channels and events), service_ids.cpp (ids and their tables),
// service_addressing.cpp (bind, address and route resolution, multicast;
// the neighbour check of cm/kernel_neighbour.hpp),
// service_active.cpp (connect, RTU, disconnect), service_passive.cpp (listen,
// incoming REQ/SIDR_REQ, accept, reject) and service_messages.cpp (messages
// to and from other CMs: the only place anything is sent, and where the CM
// thread's loop delivers what arrives); service_internal.hpp holds what they
// share.
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <expected>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cm/address.hpp"
#include "cm/agent_launcher.hpp"
#include "cm/connection.hpp"
#include "cm/departure_table.hpp"
#include "cm/port_table.hpp"
#include "cm/transport.hpp"
#include "common/result.hpp"

namespace softhca::engine {
class Node;
}

namespace softhca::cm {

class CmId;
class Service;

// One event as the service queues and hands it out.
struct Event {
  CmId* id = nullptr;         // the id it is about (the new id for CONNECT_REQUEST)
  CmId* listen_id = nullptr;  // CONNECT_REQUEST: the listening id
  CmId* counted = nullptr;    // whose acknowledgement count it holds (the listener for CONNECT_REQUEST)
  EventOut out;
};

class Channel {
 public:
  ~Channel();
  int fd() const { return fd_; }

 private:
  friend class Service;
  int fd_ = -1;
  bool signaled_ = false;
  std::deque<Event> queue_;
};

// A snapshot of an id's addressing, for the ABI layer's rdma_cm_id fields.
struct IdInfo {
  IpAddress src;
  IpAddress dst;
  bool has_device = false;  // bound to softhca0 (a specific local address, or resolved)
  uint8_t port_num = 1;
  uint8_t sgid_index = 0;
  Gid sgid{};
  Gid dgid{};
  uint8_t path_mtu = IBV_MTU_4096;  // enum ibv_mtu: the interface's, or the connection's once negotiated
  uint16_t pkey = 0xFFFF;
  uint8_t traffic_class = 0;
  ConnState conn_state = ConnState::kIdle;
  Negotiated negotiated;
  bool listening = false;
  bool route_resolved = false;
};

class CmId {
 public:
  uint16_t ps() const { return ps_; }
  ibv_qp_type qp_type() const { return qp_type_; }
  void* user() const { return user_; }

 private:
  friend class Service;
  void* user_ = nullptr;
  Channel* channel_ = nullptr;
  uint16_t ps_ = 0;
  ibv_qp_type qp_type_ = IBV_QPT_RC;
  uint32_t comm_id_ = 0;

  // rdma_cm level
  uint32_t binding_ = 0;  // port table handle; 0 = not bound
  bool bound_ = false;
  bool addr_resolved_ = false;
  bool route_resolved_ = false;
  bool listening_ = false;
  int backlog_ = 0;
  int pending_requests_ = 0;  // CONNECT_REQUESTs queued and not yet handed out
  IpAddress src_;
  IpAddress dst_;
  bool has_device_ = false;
  uint8_t sgid_index_ = 0;
  Gid sgid_{};
  Gid dgid_{};
  bool dst_on_other_host_ = false;      // reached over the udp link (RemoteTransport)
  // A resolution to another host waiting for the neighbour entry of its
  // next hop (the kernel's ADDR_QUERY state): what it resolves to, when it
  // gives up, and the timer of its next look at the entry. `generation`
  // tells a look decided before a destroy or a new resolution from a
  // current one.
  struct AddrQuery {
    IpAddress dst;
    uint32_t sgid_index = 0;
    std::chrono::steady_clock::time_point deadline;
    uint32_t generation = 0;
  };
  std::optional<AddrQuery> addr_query_;
  std::optional<std::multimap<std::chrono::steady_clock::time_point, uint32_t>::iterator> addr_timer_;
  uint32_t addr_generation_ = 0;
  std::optional<uint8_t> ack_timeout_;  // rdma_set_option's, for the RC QP at RTS
  uint8_t tos_ = 0;                     // rdma_set_option's type of service
  uint8_t traffic_class_ = 0;           // the route's: tos_ when the route was resolved

  // IB CM level
  Connection conn_;
  Peer peer_;  // the CM of the other side, once a request was sent or received
  CmId* listener_ = nullptr;  // for ids created by a CONNECT_REQUEST

  // The retransmission timer armed for the connection's current wait.
  std::optional<std::multimap<std::chrono::steady_clock::time_point, uint32_t>::iterator> rt_timer_;
  uint32_t rt_generation_ = 0;

  uint64_t delivered_ = 0;
  uint64_t acked_ = 0;
  bool destroying_ = false;
  // Its event channel was destroyed under it (channel_ is null): torn down
  // as the kernel tears down the ids of a closed rdma_cm file; every call
  // but destroy fails with EBADF.
  bool orphaned_ = false;
  bool free_when_acked_ = false;  // destroyed while events were still out
};

// rdma_connect's parameters after librdmacm's defaulting.
struct ConnectRequest {
  uint32_t qpn = 0;
  bool srq = false;
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t retry_count = 7;
  uint8_t rnr_retry_count = 7;
  bool flow_control = false;
  std::span<const uint8_t> private_data;  // the user's bytes (at most 56 on an IP port space)
};

// rdma_accept's parameters after librdmacm's defaulting.
struct AcceptRequest {
  uint32_t qpn = 0;
  bool srq = false;
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t rnr_retry_count = 7;
  bool flow_control = false;
  std::span<const uint8_t> private_data;  // at most 196
};

class Service {
 public:
  // The process's service, started on first call. Errors: whatever stops the
  // port table or the endpoint from opening (logged).
  static Result<Service*> instance();

  Result<std::shared_ptr<Channel>> create_channel();
  // rdma_destroy_event_channel: every id still on the channel is torn down
  // as if destroyed (its peer told, its port released) but stays allocated
  // for the application's handle; the channel's queued events are dropped.
  void close_channel(Channel* channel);

  Result<CmId*> create_id(Channel* channel, uint16_t ps, ibv_qp_type qp_type, void* user);
  // Drops the id's undelivered events, tells its peer (REJ/DREQ as the kernel
  // does), releases its port, waits for its handed-out events to be
  // acknowledged, and frees it. Errors: bad_file_descriptor when its channel
  // had been destroyed (it is freed all the same).
  Result<void> destroy_id(CmId* id);
  // Sets the ABI handle of an id created by a CONNECT_REQUEST, unless set;
  // `make` runs under the service lock. Returns the handle.
  void* ensure_user(CmId* id, const std::function<void*()>& make);

  // Errors: invalid_argument (wrong state), address_not_available (not an
  // address of this host), address_in_use, address_family_not_supported.
  Result<void> bind(CmId* id, const IpAddress& addr);
  // Queues ADDR_RESOLVED: at once for an address of this host or a
  // multicast group; for another host's, once the neighbour entry of the
  // route's next hop is valid, or ADDR_ERROR(-ETIMEDOUT) when it is not
  // within timeout_ms (ADDR_ERROR(-EHOSTUNREACH) at once when the udp link
  // cannot reach other hosts). Errors: invalid_argument (wrong state, or a
  // resolution still under way), address_not_available (src),
  // network_unreachable (no route at all).
  Result<void> resolve_addr(CmId* id, const std::optional<IpAddress>& src, const IpAddress& dst, int timeout_ms);
  // Queues ROUTE_RESOLVED. Errors: invalid_argument (address not resolved).
  Result<void> resolve_route(CmId* id, int timeout_ms);
  // Errors: invalid_argument, address_in_use.
  Result<void> listen(CmId* id, int backlog);
  // Sends the REQ (or queues REJECTED(8) at once when nobody listens).
  // Errors: invalid_argument (state, private data too long).
  Result<void> connect(CmId* id, const ConnectRequest& req);
  // Errors: invalid_argument (no CONNECT_REQUEST pending, private data too long).
  Result<void> accept(CmId* id, const AcceptRequest& req);
  // Errors: invalid_argument.
  Result<void> reject(CmId* id, std::span<const uint8_t> private_data, uint16_t reason);
  // The RTU after CONNECT_RESPONSE. Errors: invalid_argument.
  Result<void> establish(CmId* id);
  // rdma_notify(IBV_EVENT_COMM_EST).
  Result<void> notify_established(CmId* id);
  // Returns whether an event for the id is queued or on its way (what a
  // synchronous id should wait for). Errors: invalid_argument (never connected).
  Result<bool> disconnect(CmId* id);

  // Queues MULTICAST_JOIN for group `mgid` (an IPv4-mapped or IPv6 multicast
  // address, the kernel's RoCE MGID). Membership itself is the QP's
  // ibv_attach_mcast, which the ABI layer does as librdmacm does. Errors:
  // invalid_argument (not a UD id, or not bound to the device).
  Result<void> join_multicast(CmId* id, const Gid& mgid, void* context);

  // Errors: resource_unavailable_try_again (nonblocking and empty).
  Result<Event> get_event(Channel* channel, bool nonblocking);
  void ack_event(CmId* counted);
  // Moves the id (and its undelivered events) to another channel.
  // Errors: bad_file_descriptor (its channel was destroyed).
  Result<void> migrate_id(CmId* id, Channel* to);
  // Whether an event for the id waits in its channel.
  bool has_queued_event(CmId* id);

  // rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT): init_qp_attr gives the id's
  // QP this local ACK timeout (an IBTA exponent) at RTS instead of the
  // path's, as the kernel's rdma_set_ack_timeout does. Errors:
  // invalid_argument (not an RC id), bad_file_descriptor (channel destroyed).
  Result<void> set_ack_timeout(CmId* id, uint8_t timeout);
  // rdma_set_option(RDMA_OPTION_ID_TOS): the traffic class of the route
  // resolved after it. Errors: bad_file_descriptor (channel destroyed).
  Result<void> set_tos(CmId* id, uint8_t tos);
  Result<QpAttrPlan> init_qp_attr(CmId* id, ibv_qp_state target);
  IdInfo info(CmId* id);

  // The device maxima librdmacm uses for RDMA_MAX_RESP_RES/INIT_DEPTH.
  static uint8_t max_responder_resources();
  static uint8_t max_initiator_depth();

  // How the service finds the engine node whose udp link reaches other
  // hosts: libibverbs.so.1's, behind the device context the ABI layer
  // opened (librdmacm.so.1 has a copy of the engine of its own, whose node
  // would be a second one in the process). Without it, ids reach only this
  // host. Called once, before the first id.
  void set_node_source(std::function<engine::Node*()> source);

 private:
  struct Outgoing {
    Peer to;
    uint32_t comm_id = 0;  // the local id, to fail if the peer is gone
    MadBytes bytes{};
  };

  Service() = default;

  // All *_locked helpers run under mu_.

  // service.cpp: start-up, the CM thread, timers, applying a step.
  Result<void> start();
  void run();
  int next_timeout_ms();
  void fire_timers();
  // Arms, moves or cancels the id's retransmission timer to match its connection.
  void sync_retransmit_timer_locked(CmId* id);
  void cancel_retransmit_timer_locked(CmId* id);
  // Takes the first entry of a timer queue (comm IDs by deadline) if it is
  // due at `now`: its comm ID and its id (null when that id is gone);
  // nothing when none is due. One at a time, so that handling one entry
  // sees the queue and the ids as the ones before it left them.
  std::optional<std::pair<uint32_t, CmId*>> pop_due_locked(
      std::multimap<std::chrono::steady_clock::time_point, uint32_t>& queue, std::chrono::steady_clock::time_point now);
  // Queues the step's message for the id's peer and its event, and follows
  // the connection's timers (retransmission, timewait).
  void apply_step_locked(CmId* id, Step&& step, std::vector<Outgoing>& out);

  // service_events.cpp
  void push_event_locked(Channel* ch, Event ev);
  void drop_events_locked(CmId* id, std::vector<CmId*>& orphans);

  // service_ids.cpp
  uint32_t next_comm_id_locked();
  uint64_t next_tid_locked(uint32_t comm_id);
  void destroy_locked(CmId* id, std::unique_lock<std::mutex>& lk, std::vector<Outgoing>& out);
  // What destroying an id does on the wire and in the tables: the peer's
  // message, the port, the listener entry, the timer.
  void tear_down_locked(CmId* id, std::vector<Outgoing>& out);
  // Registers a passive id (its connection set up) in ids_ and passive_by_peer_.
  void add_passive_locked(CmId* child);
  // Removes an id from ids_ (and passive_by_peer_).
  void forget_locked(CmId* id);

  // service_addressing.cpp
  Result<void> bind_locked(CmId* id, const IpAddress& addr);
  // resolve_addr to an IP multicast group.
  // The address an id reaches a destination from: the one given, else the
  // one it is bound to, else otherwise() (with the port the id has or was
  // given); nullopt when otherwise() finds none.
  std::optional<IpAddress> source_locked(const CmId* id, const std::optional<IpAddress>& src,
                                         const std::function<std::optional<IpAddress>()>& otherwise);
  // Binds an unbound id to `s`; fills in the address of one bound to a wildcard.
  Result<void> take_source_locked(CmId* id, const IpAddress& s);
  // Records a resolved destination and queues ADDR_RESOLVED.
  void resolved_locked(CmId* id, const IpAddress& dst, uint32_t sgid_index, const Gid& dgid);
  // resolve_addr to an address of another host.
  Result<void> resolve_other_host_locked(CmId* id, const std::optional<IpAddress>& src, const IpAddress& dst,
                                         int timeout_ms);
  // Schedules the next look at a waiting resolution's neighbour entry.
  void arm_addr_check_locked(CmId* id, std::chrono::steady_clock::time_point when);
  // Abandons a waiting resolution (no event follows).
  void cancel_addr_query_locked(CmId* id);
  // Thread: CM. Looks at the neighbour entries of the resolutions whose
  // time has come (without mu_: netlink), then resolves, fails or re-arms them.
  void check_neighbours();
  // Opens the way to other hosts (transport_->reach_other_hosts) if not yet.
  Result<void> reach_other_hosts_locked();
  Result<void> resolve_multicast_locked(CmId* id, const std::optional<IpAddress>& src, const IpAddress& dst);

  // service_active.cpp
  // The path an active id's request (REQ or SIDR_REQ) describes: its resolved
  // route, with the traffic class rdma_set_option(TOS) gave it.
  static PathInfo request_path(const CmId& id);
  Result<void> connect_locked(CmId* id, const ConnectRequest& req, std::vector<Outgoing>& out);
  Result<void> sidr_connect_locked(CmId* id, const ConnectRequest& req, std::vector<Outgoing>& out);
  // Sends a REQ/SIDR_REQ step to the listener of the id's destination, or, if
  // nobody listens there, feeds the id the answer the target's CM would give.
  // This is where an id gets its peer: the one place that decides which CM
  // (and so which transport) a connection talks to.
  void send_request_locked(CmId* id, Step&& request, const CmMessage& if_nobody_listens,
                           std::vector<Outgoing>& out);

  // service_passive.cpp
  CmId* find_listener_locked(const BindKey& dst);
  void on_req(const Peer& from, const Mad& mad, std::vector<Outgoing>& out);
  void on_sidr_req(const Peer& from, const Mad& mad, std::vector<Outgoing>& out);
  // Why an incoming REQ or SIDR_REQ gets no id: it is not rdma_cm's or
  // nobody listens where it goes, or the listener's backlog is full. Each
  // message answers these in its own way (REJ reasons, SIDR_REP statuses).
  enum class Refusal { kNoListener, kBacklogFull };
  struct RequestIds {
    CmId* listener = nullptr;
    CmId* id = nullptr;  // the new id, its connection not yet set up
  };
  // What a REQ and a SIDR_REQ do alike on arrival (a duplicate aside): check
  // the service ID and the IP header, find the listener, and create the new
  // id. The caller then sets up the id's connection and admit_request_locked.
  std::expected<RequestIds, Refusal> new_request_id_locked(const Peer& from, uint64_t sid,
                                                           std::span<const uint8_t> private_data);
  // A new id for an incoming request (REQ or SIDR_REQ), from its IP header.
  CmId* new_passive_id_locked(CmId* listener, const Peer& from, const IpHeader& hdr, uint16_t port);
  // Registers the new id of a request and queues its CONNECT_REQUEST for the listener.
  void admit_request_locked(CmId* listener, CmId* child, const EventOut& connect_request);

  // service_messages.cpp: the only place messages are sent, and what the CM
  // thread's loop calls for what the transport delivers. send_all runs
  // without mu_ held.
  void send_all(std::vector<Outgoing>&& out);
  // What the CM thread sends (on_message, fire_timers): the messages it
  // decided on under `decided` (a lock of mu_, which this releases) count as
  // unsent from before the events that come with them can be seen until
  // they are sent, so that an application that exits on such an event does
  // not take them with it (wait_for_unsent_at_exit).
  void send_all(std::unique_lock<std::mutex>& decided, std::vector<Outgoing>&& out);
  // Whether an id fails when its message cannot reach the peer
  // (peer_unreachable). An id being destroyed, or any id of a process that
  // exits, has no event left to report: kIgnore.
  enum class IfUnreachable { kFailId, kIgnore };
  // The id's message to its peer, numbered with the id's next transaction ID.
  Outgoing message_to_peer_locked(const CmId* id, const CmMessage& msg, IfUnreachable if_unreachable);
  void on_message(const Peer& from, std::span<const uint8_t> bytes);
  void on_peer_lost(const Peer& peer);
  void peer_unreachable(uint32_t comm_id, const Peer& peer);

  std::mutex mu_;
  std::condition_variable acked_cv_;
  std::unordered_map<uint32_t, CmId*> ids_;  // by local comm ID
  // Passive ids by (peer, the peer's comm ID): a REQ or SIDR_REQ sent
  // again finds its id without a scan of every id.
  std::unordered_map<uint64_t, CmId*> passive_by_peer_;
  // TIMEWAIT_EXIT deadlines (comm IDs of connections in timewait).
  std::multimap<std::chrono::steady_clock::time_point, uint32_t> timewait_;
  // Retransmission deadlines (comm IDs of connections waiting for an answer).
  std::multimap<std::chrono::steady_clock::time_point, uint32_t> retransmit_;
  // When to look again at the next hop of a waiting address resolution (comm IDs).
  std::multimap<std::chrono::steady_clock::time_point, uint32_t> addr_checks_;
  // Connections to another host whose id is gone (destroyed, or its process
  // exiting) while the peer has not answered their DREQ: the DREQ goes again
  // until the DREP, or the peer's DREQ, comes, or the retries run out
  // (Connection::departure); at exit also the DREPs of connections in
  // TIMEWAIT, a few times over. By the gone id's comm ID.
  struct Departure {
    Outgoing message;  // the DREQ (or, repeat_only, the DREP)
    uint32_t wait_ms = 0;
    uint8_t retries = 0;
    std::chrono::steady_clock::time_point next;
    bool repeat_only = false;  // a DREP repeated at exit: no answer ends it
  };
  std::unordered_map<uint32_t, Departure> departures_;
  // The process exits: departures go again every kExitResendMs, and the
  // exiting thread waits (kExitLingerMs at most) until none is left.
  bool exiting_ = false;
  std::condition_variable departures_cv_;
  void depart_locked(CmId* id, const Connection::Departure& d);
  // Ends the departure of comm ID `local` (a DREP or the peer's DREQ came).
  void end_departure_locked(uint32_t local, const Peer& from);
  // A connection in TIMEWAIT (its id destroyed, or the process exiting): its
  // DREP, sent kExitRepeats more times should the process exit within the
  // timewait, answered or not (nobody answers the peer's DREQ once it is gone).
  void remember_drep_locked(uint32_t comm, const Outgoing& drep);
  void keep_departure_locked(uint32_t comm, Outgoing message, uint32_t wait_ms, uint8_t retries,
                             std::chrono::milliseconds first_in, bool repeat_only);
  void fire_departures_locked(std::chrono::steady_clock::time_point now, std::vector<Outgoing>& out);
  void linger_at_exit();
  std::vector<CmId*> listeners_;
  uint32_t comm_id_seed_ = 0;
  uint64_t tid_counter_ = 0;

  PortTable* table_ = nullptr;
  uint32_t proc_ = 0;
  uint64_t start_time_ = 0;  // this process's (host::process_start_time)
  // What the host's CM agent must send for this process's connections to
  // other hosts should the process die: a record in the departure table
  // (cm/departure_table.hpp) while a connection has a departure (its id's,
  // or one in departures_) or is in its handshake (what destroying its id
  // sends), by comm ID, with its slot. nullptr: no table.
  DepartureTable* departure_table_ = nullptr;
  std::unique_ptr<AgentLauncher> agent_;
  struct WillRecord {
    uint32_t slot = 0;
    uint64_t digest = 0;  // of the MAD written, to tell a new one
  };
  std::unordered_map<uint32_t, WillRecord> wills_;
  // Writes or frees the record of comm ID `comm` (`id` its id, or nullptr
  // once it is gone) as its departure now stands.
  void sync_will_locked(uint32_t comm, const CmId* id);
  // A DREP or DREQ from another host for comm ID `local`, which is neither
  // an id nor a departure of ours: a process of this host that is gone,
  // whose DREQ the agent sent (the answer may reach any process of the
  // host). Its record, if any, ends.
  void end_orphan_departure_locked(uint32_t local, const Peer& from);
  std::unique_ptr<Transport> transport_;
  std::function<engine::Node*()> node_source_;

  friend void service_atfork_child();
  friend void service_atexit();
  // At exit: tells each id's peer on another host, as destroying it would,
  // and waits (200 ms at most) for the messages the CM thread has decided
  // on but not sent yet.
  void tell_other_hosts_at_exit();
  // Waits for what the CM thread's send_all has counted as unsent.
  void wait_for_unsent_at_exit();
  std::mutex unsent_mu_;
  std::condition_variable unsent_cv_;
  std::size_t unsent_ = 0;
};

}  // namespace softhca::cm
