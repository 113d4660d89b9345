// The udp link: RoCEv2 over UDP port 4791, for peers on other hosts (or
// this one, when SOFTHCA_LINK=udp forces it). Each connected QP gets a
// channel holding its requester and responder flows (src/transport); the
// link's one thread per process receives packets, runs the responder on
// this process's QPs and the requester's completer, and fires the
// requester's timers. It sleeps in poll() when idle.
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.hpp"
#include "common/log.hpp"
#include "common/settings.hpp"
#include "host/attachment.hpp"
#include "host/host_identity.hpp"
#include "link/link.hpp"
#include "link/shm/shm_port.hpp"
#include "link/shm/target.hpp"
#include "link/udp/fault_schedule.hpp"
#include "link/udp/outbox.hpp"
#include "link/udp/pcap_writer.hpp"
#include "link/udp/poller_handover.hpp"
#include "link/udp/process_handoff.hpp"
#include "link/udp/udp_sockets.hpp"
#include "transport/admission.hpp"
#include "transport/requester_flow.hpp"
#include "transport/responder_flow.hpp"
#include "wire/packet.hpp"
#include "wire/ud_grh.hpp"

namespace softhca::udp {
namespace {

// The calling thread's kernel id, asked once per thread.
int this_thread_id() {
  static thread_local const int id = static_cast<int>(::gettid());
  return id;
}

// CPU time of thread `tid` of this process, in ns; 0 if it is gone. The
// clock id is the kernel's encoding of a thread's CPU clock (what
// pthread_getcpuclockid returns), made from the id so that a thread that
// ended gives an error rather than undefined behaviour.
uint64_t thread_cpu_ns(int tid) {
  if (tid <= 0) return 0;
  const clockid_t clock = static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 6u);
  timespec ts{};
  if (::clock_gettime(clock, &ts) != 0) return 0;
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t realtime_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

wire::Gid gid_of(const uint8_t* raw) {
  wire::Gid g;
  std::memcpy(g.data(), raw, 16);
  return g;
}

// A group's IP address as people write it (239.1.1.1, ff0e::1).
std::string group_name(const wire::Gid& group) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (wire::is_ipv4_mapped(group))
    ::inet_ntop(AF_INET, group.data() + 12, text, sizeof text);
  else
    ::inet_ntop(AF_INET6, group.data(), text, sizeof text);
  return text;
}

class UdpLink;

// A connected QP's state, shared by its Channel (the QP's side) and the
// link's thread (which may hold it a moment after the QP is gone).
struct ChannelState {
  std::mutex mutex;
  link::ChannelConfig config;
  std::optional<transport::RequesterFlow> requester;
  transport::ResponderFlow responder;
  bool closed = false;
  CounterSink counters;  // the QP's and the port's
  host::MrLookupCache responder_key;  // the responder's last key (ShmResponderPort)
  ChannelState(const link::ChannelConfig& c, Counters* port, bool selective)
      : config(c),
        responder(transport::ResponderConfig{c.dest_qpn, c.mtu, c.qp_type != IBV_QPT_UC,
                                             c.qp_type == IBV_QPT_XRC_RECV, c.rq_psn, c.max_dest_rd_atomic,
                                             CounterSink(c.qp_counters, port), selective}),
        counters(c.qp_counters, port) {}
};

class UdpLink final : public link::Link {
 public:
  explicit UdpLink(host::Attachment& host) : host_(host) {}
  ~UdpLink() override { stop(); }

  std::unique_ptr<link::Channel> open_channel(const link::ChannelConfig& config) override;
  void send_datagram(const link::Datagram& to, const transport::Request& request) override;
  void listen() override { start(); }
  void send_management(const uint8_t* sgid, const uint8_t* dgid, std::span<const uint8_t> mad) override;
  void receive_management(link::ManagementReceiver receiver) override;
  void join_group(const uint8_t* mgid, uint32_t ifindex) override { change_membership(mgid, ifindex, +1); }
  void leave_group(const uint8_t* mgid, uint32_t ifindex) override { change_membership(mgid, ifindex, -1); }
  bool poll() override {
    if (!started_.load(std::memory_order_acquire) || sockets_ == nullptr) return false;
    // A poller's receive is a system call. Without a connected QP over this
    // link (only UD QPs, or the connection manager, started it), it is
    // worth one only while packets come: after kIdlePollsBeforeRest empty
    // tries in a row the pollers stop, and the link's thread, which wakes
    // for any packet, has them help again once one arrived. (A process
    // talking only to peers of its own host paid a recvmmsg per empty poll
    // of every CQ: UCX over softhca spent most of its time there.)
    if (open_channels_.load(std::memory_order_relaxed) == 0) {
      if (idle_polls_.load(std::memory_order_relaxed) >= kIdlePollsBeforeRest) return false;
    } else {
      // Connected QPs: a poller that keeps at it may have the sockets to
      // itself (PollerHandover): it is polling while it receives, and
      // polled when done. Its CQ is empty: the clock read costs it nothing.
      outbox_->release_due_acks(monotonic_ns());
      handover_->receiving(true);
      receive_all();
      handover_->receiving(false);
      handover_->polled(monotonic_ns(), this_thread_id());
      return true;
    }
    receive_all();
    return true;
  }
  void pollers_rest() override {
    if (!started_.load(std::memory_order_acquire) || sockets_ == nullptr) return;
    outbox_->release_held_acks();  // the thread sleeps: no request of its will carry them
    handover_->resting();
    // The link's thread, if it left the sockets to the pollers, takes them
    // back now (seq_cst: see loop()).
    if (handed_over_.load(std::memory_order_seq_cst)) wake();
  }

  Sockets* sockets() { return sockets_.get(); }
  bool selective() const { return selective_; }
  // This process's share of the port's counters.
  Counters* port_counters() { return &host_.registry().process_counters(host_.proc()); }
  Outbox& outbox() { return *outbox_; }
  // A deadline of a requester's (or held ACKs') came up at `due_ns` while
  // the link's thread may be asleep: wakes it if it would wake too late.
  void timers_changed(uint64_t due_ns) {
    timers_changed_.store(true, std::memory_order_seq_cst);
    const uint64_t plan = link_wakes_at_ns_.load(std::memory_order_seq_cst);
    if (plan != kLinkAwake && plan > due_ns + kTimerSlackNs) wake();
  }
  void wake() {
    const uint64_t one = 1;
    if (wake_fd_ >= 0) [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }
  // A channel closes: its QPN's entry goes, unless another channel of the
  // QPN replaced it since (two handles of one TGT QP, the newer serving).
  void forget(uint32_t qpn, const ChannelState* state) {
    std::lock_guard guard(mutex_);
    auto it = channels_.find(qpn);
    if (it != channels_.end() && it->second.get() == state) channels_.erase(it);
    open_channels_.store(static_cast<uint32_t>(channels_.size()), std::memory_order_relaxed);
  }

 private:
  bool start();
  void stop();
  void loop();
  // Receives and handles what waits on both sockets. One thread at a time
  // (the link's or an application's): packets of a QP must be handled in
  // the order they came.
  void receive_all();
  void receive_from(int fd);
  void receive_handoffs();
  // What a run of packets to one QP shares: the channel's lookup, and for
  // requests its lock, the QP's resolution, the announcement of our access
  // to its memory and the answers' sink. Held from the run's first packet
  // of that QP and kind (request or response) until a packet of another, a
  // datagram, or the run's end (finish_run).
  struct RunToQp {
    bool open = false;
    uint32_t qpn = 0;
    bool responses = false;
    std::shared_ptr<ChannelState> state;
    std::unique_lock<std::mutex> lock;
    bool self_resolved = false;     // a request's target looked up
    bool self_usable = false;
    shm::TargetQp self;
    std::optional<shm::MemoryAccess> access;
    std::optional<FlowSink> sink;
  };
  // What the packets of one run (one flow) share for their parse: the
  // headers' part of the ICRC for the run's segment length.
  struct RunParse {
    std::size_t prefix_for = 0;  // the UDP payload size `prefix` is for; 0: none yet
    wire::IcrcPrefix prefix;
  };
  void handle(const Received& from, std::span<const uint8_t> bytes, RunToQp& run, RunParse& parse);
  void handle(const Received& from, std::span<const uint8_t> bytes) {
    RunToQp run;
    RunParse parse;
    handle(from, bytes, run, parse);
    finish_run(run);
  }
  void finish_run(RunToQp& run);
  // Sends a packet whose QP belongs to another process of this host to it.
  enum class HandOff { kNobodys, kHanded, kLost };
  HandOff hand_off(uint32_t qpn, const Received& from, std::span<const uint8_t> bytes);
  // The same to process `proc` (slot), whatever the QP.
  HandOff hand_off_to(uint32_t proc, uint32_t qpn, const Received& from, std::span<const uint8_t> bytes);
  // A MAD for this host's QP1: to our receiver, or to the host's GSI agent.
  void management(const wire::ParsedPacket& packet, const Received& from, std::span<const uint8_t> bytes);
  // Counts a packet that is not this process's: handed on, or dropped.
  void count_hand_off(HandOff result);
  // False when the destination QP is not this process's.
  bool datagram(const wire::ParsedPacket& packet, const Received& from);
  // A datagram to a multicast group: to every QP of this process attached
  // to it (each member process joined the group and gets its own copy).
  void group_datagram(const wire::ParsedPacket& packet, const Received& from);
  // Hands a UD message to `target`, an attached QP of this process.
  void deliver_datagram(const wire::ParsedPacket& packet, const Received& from, shm::TargetQp& target);
  void change_membership(const uint8_t* mgid, uint32_t ifindex, int by);
  uint64_t run_timers(uint64_t now);
  // Receives what waits in the sockets now, whoever else receives.
  void receive_waiting();

  host::Attachment& host_;
  std::mutex start_mutex_;
  std::atomic<bool> started_{false};
  // The connected QPs' channels open now (channels_.size()), and how many
  // receives in a row found nothing: see poll().
  static constexpr uint32_t kIdlePollsBeforeRest = 64;
  std::atomic<uint32_t> open_channels_{0};
  std::atomic<uint32_t> idle_polls_{0};
  std::unique_ptr<Sockets> sockets_;
  int wake_fd_ = -1;
  // Packets to and from the host's other softhca processes.
  ProcessHandoff handoff_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  uint64_t spin_ns_ = 0;  // SOFTHCA_UDP_SPIN_US, in ns
  bool selective_ = true;  // SOFTHCA_UDP_SELECTIVE (set at start, before started_)
  // SOFTHCA_UDP_HANDOVER_US: whether the thread leaves the sockets to
  // busy-polling application threads (set at start, before started_).
  std::optional<PollerHandover> handover_;
  std::atomic<bool> handed_over_{false};  // the thread sleeps without the sockets
  // SOFTHCA_PCAP, read when the link starts: what is received goes there,
  // and what the outbox sends.
  std::unique_ptr<PcapWriter> capture_;
  std::unique_ptr<Outbox> outbox_;  // once the sockets are open
  std::mutex receive_mutex_;
  // When the link's thread plans to wake (kLinkAwake while it is awake and
  // will look at its timers before it sleeps again; UINT64_MAX: only for
  // a packet or a wake). Other threads that start a timer compare.
  static constexpr uint64_t kLinkAwake = 0;
  std::atomic<uint64_t> link_wakes_at_ns_{kLinkAwake};
  std::atomic<bool> timers_changed_{false};
  // How late a timer may fire rather than wake the link's thread early.
  static constexpr uint64_t kTimerSlackNs = 100'000;
  // While ACKs are held, the thread that left the sockets to the pollers
  // looks this often (it would look every PollerHandover::kLookEveryNs).
  static constexpr uint64_t kHeldLookNs = 100'000;
  // Where receive_from puts a batch of datagrams (under receive_mutex_).
  // A slot holds a whole coalesced run (UDP_GRO), up to one IP datagram.
  // Four: a batch (256 KiB) the kernel has just copied is still in the
  // core's cache when its packets are parsed, checked and copied on; 16
  // (1 MiB) gave a tenth less bandwidth between hosts on the 16-core machine.
  static constexpr size_t kReceiveBatch = 4;
  static constexpr size_t kReceiveSlotBytes = 65536;
  std::vector<uint8_t> receive_storage_ = std::vector<uint8_t>(kReceiveBatch * kReceiveSlotBytes);
  std::array<Received, kReceiveBatch> received_{};
  // Whether the IPv6 socket ever had something: an application thread that
  // receives (poll) reads it only then, a system call saved per empty poll.
  std::atomic<bool> v6_used_{false};
  // Since when the link's thread takes the sockets (it woke to receive, or
  // spins on them; 0: it does not): application threads leave them to it
  // for kLinkReceivesNs at most (receive_all).
  std::atomic<uint64_t> link_receives_since_ns_{0};
  static constexpr uint64_t kLinkReceivesNs = 50'000;
  // Since when receive_mutex_ is held (0: free). A poller that finds it
  // held for longer than kLinkReceivesNs yields its core: the holder lost
  // its own, most likely to that very poller (receive_all).
  std::atomic<uint64_t> receive_held_since_ns_{0};
  struct ReceiveHeld {
    explicit ReceiveHeld(UdpLink& link) : link_(link) {
      link_.receive_held_since_ns_.store(monotonic_ns(), std::memory_order_relaxed);
    }
    ~ReceiveHeld() { link_.receive_held_since_ns_.store(0, std::memory_order_relaxed); }
    ReceiveHeld(const ReceiveHeld&) = delete;
    ReceiveHeld& operator=(const ReceiveHeld&) = delete;
    UdpLink& link_;
  };
  std::mutex management_mutex_;  // management_receiver_
  link::ManagementReceiver management_receiver_;
  std::mutex mutex_;  // channels_
  std::unordered_map<uint32_t, std::shared_ptr<ChannelState>> channels_;
  // Multicast groups on an interface: how many joins each has, and whether
  // the socket is a member (the kernel may refuse).
  struct Membership {
    int count = 0;
    bool joined = false;
  };
  std::mutex groups_mutex_;
  std::map<std::pair<wire::Gid, uint32_t>, Membership> groups_;
};

class UdpChannel final : public link::Channel {
 public:
  UdpChannel(UdpLink& link, std::shared_ptr<ChannelState> state) : link_(link), state_(std::move(state)) {}
  ~UdpChannel() override {
    {
      std::lock_guard guard(state_->mutex);
      state_->closed = true;
    }
    link_.forget(state_->config.local_qpn, state_.get());
  }

  transport::Response deliver(const transport::Request& request, uint32_t position) override {
    std::lock_guard guard(state_->mutex);
    transport::Response r;
    if (!state_->requester || !state_->requester->has_room()) {
      r.busy = true;
      return r;
    }
    transport::OutgoingMessage m;
    m.position = position;
    m.op = request.op;
    m.solicited = request.solicited;
    m.imm_data = request.imm_data;
    m.invalidate_rkey = request.invalidate_rkey;
    m.remote_addr = request.remote_addr;
    m.rkey = request.rkey;
    m.compare_add = request.compare_add;
    m.swap = request.swap;
    m.xrc_srqn = request.xrc_srqn;
    m.nlocal = request.ndata < limits::kMaxSge + 1 ? request.ndata : limits::kMaxSge + 1;
    for (int i = 0; i < m.nlocal; ++i) m.local[i] = request.data[i];
    m.length = request.length;
    FlowSink sink(link_.outbox(), gid_of(state_->config.sgid), gid_of(state_->config.dgid),
                  state_->config.traffic_class, state_->config.hop_limit, state_->counters, state_->config.ifindex);
    const bool had_deadline = state_->requester->deadline() != 0;
    state_->requester->post(m, monotonic_ns(), sink);
    if (state_->config.qp_type == IBV_QPT_UC) {
      // UC: done once sent.
      transport::RequesterCompletion done;
      while (state_->requester->pop_completion(done)) {
      }
      r.syndrome = transport::Syndrome::ack();
      return r;
    }
    // The thread recomputes its sleep, if it would sleep past the new timer.
    if (!had_deadline && state_->requester->deadline() != 0) link_.timers_changed(state_->requester->deadline());
    r.pending = true;
    return r;
  }

  void start_sending(const link::SendConfig& send) override {
    std::lock_guard guard(state_->mutex);
    transport::RequesterConfig c;
    c.dest_qpn = state_->config.dest_qpn;
    c.mtu = state_->config.mtu;
    c.reliable = state_->config.qp_type != IBV_QPT_UC;  // RC, and XRC's INI QPs
    c.xrc = state_->config.qp_type == IBV_QPT_XRC_SEND;
    c.start_psn = send.sq_psn;
    c.retry_cnt = send.retry_cnt;
    c.rnr_retry = send.rnr_retry;
    c.timeout = send.timeout;
    c.max_rd_atomic = send.max_rd_atomic;
    c.counters = state_->counters;
    c.selective = link_.selective();
    if (!state_->requester) state_->requester.emplace(c);
  }

  bool next_answer(link::Answer& out) override {
    std::lock_guard guard(state_->mutex);
    transport::RequesterCompletion c;
    if (!state_->requester || !state_->requester->pop_completion(c)) return false;
    out = link::Answer{c.position, c.status};
    return true;
  }

  void abort() override {
    std::lock_guard guard(state_->mutex);
    if (state_->requester) state_->requester->abort();
  }

 private:
  UdpLink& link_;
  std::shared_ptr<ChannelState> state_;
};

std::unique_ptr<link::Channel> UdpLink::open_channel(const link::ChannelConfig& config) {
  if (!start()) return nullptr;
  auto state = std::make_shared<ChannelState>(config, port_counters(), selective_);
  {
    std::lock_guard guard(mutex_);
    channels_[config.local_qpn] = state;
    open_channels_.store(static_cast<uint32_t>(channels_.size()), std::memory_order_relaxed);
  }
  return std::make_unique<UdpChannel>(*this, std::move(state));
}

bool UdpLink::start() {
  if (started_.load(std::memory_order_acquire)) return sockets_ != nullptr;
  std::lock_guard guard(start_mutex_);
  if (started_.load(std::memory_order_relaxed)) return sockets_ != nullptr;
  SocketOptions options;
  options.gso = setting_number(SettingId::kUdpGso) == 0;
  spin_ns_ = uint64_t{setting_number(SettingId::kUdpSpinUs)} * 1000;
  handover_.emplace(uint64_t{setting_number(SettingId::kUdpHandoverUs)} * 1000);
  selective_ = setting_number(SettingId::kUdpSelective) == 0;
  auto sockets = Sockets::open(options);
  if (sockets) {
    sockets_ = std::move(*sockets);
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    const std::optional<FaultConfig> faults = fault_config_from_environment();
    if (faults) SOFTHCA_INFO("udp link: injecting faults: %s", to_string(*faults).c_str());
    if (auto path = pcap_path_from_environment()) {
      auto writer = PcapWriter::open_append(*path);
      if (writer) {
        capture_ = std::move(*writer);
      } else {
        SOFTHCA_WARN("udp link: cannot write SOFTHCA_PCAP=%s: %s", path->c_str(),
                     std::strerror(to_errno(writer.error())));
      }
    }
    outbox_ =
        std::make_unique<Outbox>(*sockets_, port_counters(), faults, capture_.get(),
                                 Outbox::Wakes{[this] { wake(); }, [this](uint64_t due) { timers_changed(due); }});
    if (auto dir = host::host_directory()) handoff_.listen(*dir, host_.pid());
    thread_ = std::thread([this] { loop(); });
    // Named from here, before start() returns: pollers may receive and
    // complete traffic before the new thread first runs (on a busy host it
    // may wait for a core), and whoever looks for it by name must find it.
    pthread_setname_np(thread_.native_handle(), "softhca-udp");
  }
  started_.store(true, std::memory_order_release);
  return sockets_ != nullptr;
}

void UdpLink::stop() {
  if (thread_.joinable()) {
    stopping_.store(true);
    wake();
    thread_.join();
  }
  if (outbox_) outbox_->release_held_acks();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void UdpLink::send_datagram(const link::Datagram& to, const transport::Request& request) {
  if (!start()) return;
  wire::Headers h;
  h.bth.opcode = static_cast<uint8_t>(request.op == transport::Operation::kSendWithImm ? wire::Opcode::kUdSendOnlyWithImm
                                                                                      : wire::Opcode::kUdSendOnly);
  h.bth.dest_qpn = to.dest_qpn;
  h.bth.solicited = request.solicited;
  h.deth = wire::Deth{request.qkey, request.src_qpn};
  if (request.op == transport::Operation::kSendWithImm) h.immdt = wire::ImmDt{ntohl(request.imm_data)};
  FlowSink sink(*outbox_, gid_of(to.sgid), gid_of(to.dgid), to.traffic_class, to.hop_limit,
                CounterSink(to.qp_counters, port_counters()), to.ifindex);
  sink.send(h, request.data, request.ndata, static_cast<uint32_t>(request.length));
}

uint64_t UdpLink::run_timers(uint64_t now) {
  std::vector<std::shared_ptr<ChannelState>> states;
  {
    std::lock_guard guard(mutex_);
    states.reserve(channels_.size());
    for (auto& [qpn, state] : channels_) states.push_back(state);
  }
  uint64_t earliest = 0;
  for (auto& state : states) {
    bool answers = false;
    {
      std::lock_guard guard(state->mutex);
      if (state->closed || !state->requester) continue;
      transport::RequesterFlow& r = *state->requester;
      if (r.deadline() != 0 && now >= r.deadline()) {
        FlowSink sink(*outbox_, gid_of(state->config.sgid), gid_of(state->config.dgid), state->config.traffic_class,
                      state->config.hop_limit, state->counters, state->config.ifindex);
        const bool was_failed = r.failed();
        r.on_timer(now, sink);
        answers = r.failed() != was_failed;
      }
      const uint64_t d = r.deadline();
      if (d != 0 && (earliest == 0 || d < earliest)) earliest = d;
    }
    if (answers && state->config.on_answers) state->config.on_answers();
  }
  return earliest;
}

void UdpLink::loop() {
  std::vector<pollfd> fds;
  // While packets flow, the thread polls without sleeping until spin_until
  // (SOFTHCA_UDP_SPIN_US after the last packet), then sleeps in ppoll.
  uint64_t spin_until = 0;
  bool was_handed_over = false;
  uint64_t timer_due = 0;  // the earliest requester timer, as the last round left it
  while (!stopping_.load()) {
    const uint64_t now_ns = monotonic_ns();
    // A timer that came due while this thread, or the application thread
    // receiving for it, was off a core finds the answers it waits for
    // unread in the sockets: take them first. Fired before them, a tail
    // probe or ACK timeout resent what had arrived (under CPU contention,
    // most of what a descheduled peer made late).
    if (timer_due != 0 && now_ns >= timer_due) receive_waiting();
    outbox_->release_due_acks(now_ns);
    uint64_t deadline = run_timers(now_ns);
    timer_due = deadline;
    if (const uint64_t due = outbox_->held_acks_due(); due != 0 && (deadline == 0 || due < deadline)) deadline = due;
    if (outbox_->injects_faults()) {
      const uint64_t released = outbox_->release_delayed(now_ns);
      if (released != 0 && (deadline == 0 || released < deadline)) deadline = released;
    }
    // Busy-polling application threads receive for us (PollerHandover):
    // the sockets stay out of the set (a negative fd is skipped), and the
    // thread wakes to look again every kLookEveryNs.
    bool hand_over = false;
    if (open_channels_.load(std::memory_order_relaxed) != 0) {
      using Look = PollerHandover::Look;
      Look look = handover_->look(now_ns);
      if (look == Look::kPolling) {
        // Flag, then look again (both seq_cst, as pollers_rest's store and
        // load): a poller going to rest now either sees the flag and wakes
        // this thread, or is seen here.
        handed_over_.store(true, std::memory_order_seq_cst);
        look = handover_->look(now_ns);
      }
      if (look == Look::kPolling) {
        hand_over = true;
        if (!was_handed_over)
          SOFTHCA_DEBUG("udp link: an application thread polls; the link's thread leaves the sockets to it");
        handover_->sample(now_ns, thread_cpu_ns(handover_->poller()));
      } else if (look == Look::kPaused && was_handed_over) {
        pollfd sockets[2] = {{sockets_->v4_fd(), POLLIN, 0}, {sockets_->v6_fd(), POLLIN, 0}};
        const bool waiting = ::poll(sockets, 2, 0) > 0;
        if (const uint64_t pause = handover_->paused(now_ns, thread_cpu_ns(handover_->poller()), waiting))
          SOFTHCA_DEBUG("udp link: packets waited for an application thread that stopped polling; the link's "
                        "thread keeps the sockets for %llu ms",
                        static_cast<unsigned long long>(pause / 1'000'000));
      }
    }
    if (!hand_over) handed_over_.store(false, std::memory_order_relaxed);
    was_handed_over = hand_over;
    // Pollers read the IPv6 socket only once the process has received IPv6
    // (v6_used_, which spares IPv4-only processes a system call per poll):
    // until then this thread watches it even when it left the sockets to
    // them, or the first IPv6 packets, and every one after, waited unread
    // for as long as the application polled (issue #41).
    const bool watch_v6 = !hand_over || !v6_used_.load(std::memory_order_relaxed);
    fds.assign({{hand_over ? -1 : sockets_->v4_fd(), POLLIN, 0},
                {watch_v6 ? sockets_->v6_fd() : -1, POLLIN, 0},
                {wake_fd_, POLLIN, 0}});
    handoff_.add_to(fds);  // from fds[3] on
    const bool spinning = !hand_over && now_ns < spin_until;
    // When to wake without a packet (0: never).
    uint64_t wake_at = deadline;
    if (hand_over) {
      // Held ACKs (AckPiggyback) must not wait for a look much longer than
      // they may be held.
      const uint64_t look = now_ns + (outbox_->holding_acks() ? kHeldLookNs : PollerHandover::kLookEveryNs);
      if (wake_at == 0 || look < wake_at) wake_at = look;
    }
    // Threads that start a timer meanwhile wake this one only if it would
    // sleep past it (timers_changed): the plan, then a look at whether one
    // did since this round looked (both seq_cst, as theirs).
    if (!spinning) {
      link_wakes_at_ns_.store(wake_at != 0 ? wake_at : UINT64_MAX, std::memory_order_seq_cst);
      if (timers_changed_.exchange(false, std::memory_order_seq_cst)) {
        link_wakes_at_ns_.store(kLinkAwake, std::memory_order_relaxed);
        continue;
      }
    }
    timespec wait{};  // zero for a spinning thread: look, do not sleep
    if (!spinning && wake_at != 0) wait = time_until(wake_at);
    const timespec* timeout = spinning || wake_at != 0 ? &wait : nullptr;
    // A spinning thread is awake: application pollers leave the sockets to it.
    link_receives_since_ns_.store(spinning ? now_ns : 0, std::memory_order_relaxed);
    const int ready = ::ppoll(fds.data(), fds.size(), timeout, nullptr);
    link_wakes_at_ns_.store(kLinkAwake, std::memory_order_seq_cst);
    handed_over_.store(false, std::memory_order_relaxed);
    if (ready <= 0) {
      if (spinning) __builtin_ia32_pause();
      continue;
    }
    if (fds[2].revents & POLLIN) {
      uint64_t count;
      [[maybe_unused]] ssize_t n = ::read(wake_fd_, &count, sizeof count);
    }
    bool handoffs = false;
    for (size_t i = 3; i < fds.size(); ++i) handoffs |= fds[i].revents != 0;
    if (((fds[0].revents | fds[1].revents) & POLLIN) || handoffs) {
      // An application thread may be receiving right now: then it handles
      // these too, and this thread must not spin on their readiness.
      link_receives_since_ns_.store(monotonic_ns(), std::memory_order_relaxed);
      std::lock_guard guard(receive_mutex_);
      const ReceiveHeld held(*this);
      if (fds[0].revents & POLLIN) receive_from(fds[0].fd);
      if (fds[1].revents & POLLIN) {
        v6_used_.store(true, std::memory_order_relaxed);
        receive_from(fds[1].fd);
      }
      if (handoffs) receive_handoffs();
      if (spin_ns_ != 0) spin_until = monotonic_ns() + spin_ns_;
    }
    link_receives_since_ns_.store(0, std::memory_order_relaxed);
  }
}

void UdpLink::receive_all() {
  // Not while the link's thread takes the sockets itself (it woke for them,
  // or spins on them): an application thread that polls in a loop must not
  // keep the receive lock from it (it would take the lock back after each
  // of its own system calls and starve the thread of what only it
  // handles). Only then, and only for kLinkReceivesNs: a link thread that
  // lost its core meanwhile (on a busy host, to the very poller that
  // waited for it) kept pollers that left the sockets to it waiting for
  // milliseconds, until the scheduler gave it back.
  const uint64_t t = monotonic_ns();
  const uint64_t since = link_receives_since_ns_.load(std::memory_order_relaxed);
  if (since != 0 && t >= since && t - since < kLinkReceivesNs) return;
  std::unique_lock guard(receive_mutex_, std::try_to_lock);
  if (!guard.owns_lock()) {
    const uint64_t held = receive_held_since_ns_.load(std::memory_order_relaxed);
    if (held != 0 && t >= held && t - held > kLinkReceivesNs) sched_yield();
    return;
  }
  const ReceiveHeld held(*this);
  receive_from(sockets_->v4_fd());
  if (v6_used_.load(std::memory_order_relaxed)) receive_from(sockets_->v6_fd());
  // New hand-off connections wake the link's thread, which accepts them.
}

void UdpLink::receive_waiting() {
  std::lock_guard guard(receive_mutex_);
  const ReceiveHeld held(*this);
  receive_from(sockets_->v4_fd());
  receive_from(sockets_->v6_fd());
}

void UdpLink::receive_handoffs() {
  handoff_.receive([this](const Received& from, std::span<const uint8_t> bytes) { handle(from, bytes); });
  outbox_->send_answers();
}

UdpLink::HandOff UdpLink::hand_off(uint32_t qpn, const Received& from, std::span<const uint8_t> bytes) {
  const host::QpSlot* slot = host_.registry().find_qp(qpn);
  if (slot == nullptr) return HandOff::kNobodys;
  const uint32_t proc = slot->proc.load(std::memory_order_relaxed);
  if (proc != host::kHostOwned) return hand_off_to(proc, qpn, from, bytes);
  // A TGT QP: to the process of the handle that serves its peer.
  const auto server = host_.registry().tgt_server(qpn);
  const HandOff result = server ? hand_off_to(server->proc, qpn, from, bytes) : HandOff::kNobodys;
  // (Ours: the channel is on its way, after a kTgtSync.)
  if (result == HandOff::kHanded || (server && server->proc == host_.proc())) return result;
  // Nobody took it: the serving process may have died or left without
  // closing its handle. Another live handle takes over; this packet is
  // lost, and the requester's retransmission finds the new server.
  if (auto elected = host_.registry().elect_tgt_server(qpn)) {
    SOFTHCA_DEBUG("udp link: tgt qp 0x%x is served by process %u now", qpn, elected->pid);
    host_.notify(elected->proc, elected->pid,
                 host::Event{static_cast<uint32_t>(host::EventKind::kTgtSync), elected->qp_id, 0, 0});
  }
  return result;
}

UdpLink::HandOff UdpLink::hand_off_to(uint32_t proc, uint32_t qpn, const Received& from,
                                      std::span<const uint8_t> bytes) {
  if (!handoff_.has_host()) return HandOff::kNobodys;
  if (proc == host_.proc()) return HandOff::kNobodys;  // ours, but not (or no longer) connected
  const uint32_t pid = host_.pid_of(proc);
  if (pid == 0) return HandOff::kNobodys;
  const auto result = handoff_.send(
      pid, qpn, from, bytes, [this](const Received& f, std::span<const uint8_t> b) { handle(f, b); },
      [this] { outbox_->send_answers(); });  // not held back while this waits
  return result == ProcessHandoff::Result::kHanded ? HandOff::kHanded : HandOff::kLost;
}

void UdpLink::count_hand_off(HandOff result) {
  switch (result) {
    case HandOff::kNobodys: port_counters()->add(Counter::kUnknownQpDrops); return;
    case HandOff::kHanded: port_counters()->add(Counter::kForwardedPkts); return;
    case HandOff::kLost: port_counters()->add(Counter::kForwardDrops); return;
  }
}

void UdpLink::receive_from(int fd) {
  if (fd < 0) return;
  // A bounded number of batches, so that timers and the other sockets get
  // their turn.
  for (int round = 0; round < 8; ++round) {
    const int n = sockets_->receive_batch(fd, receive_storage_, kReceiveSlotBytes, received_);
    if (round == 0) {
      if (n > 0) {
        idle_polls_.store(0, std::memory_order_relaxed);
      } else {
        idle_polls_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    for (int i = 0; i < n; ++i) {
      const Received& from = received_[static_cast<size_t>(i)];
      if (from.length == 0) continue;
      const std::span<const uint8_t> slot(receive_storage_.data() + static_cast<size_t>(i) * kReceiveSlotBytes,
                                          from.length);
      if (from.segment_size == 0) {
        handle(from, slot);
        continue;
      }
      // A coalesced run: each segment is a datagram of its own, handled
      // (ICRC, capture, counters) exactly as if it had come alone; what
      // consecutive ones to the same QP share is looked up once.
      Received one = from;
      one.segment_size = 0;
      RunToQp run;
      RunParse parse;
      for (size_t at = 0; at < slot.size(); at += from.segment_size) {
        one.length = std::min(from.segment_size, slot.size() - at);
        handle(one, slot.subspan(at, one.length), run, parse);
      }
      finish_run(run);
    }
    outbox_->send_answers();
    if (n < static_cast<int>(kReceiveBatch)) return;
  }
}

void UdpLink::handle(const Received& from, std::span<const uint8_t> bytes, RunToQp& run, RunParse& run_parse) {
  wire::UdpFlow flow;
  flow.src_gid = from.src;
  flow.dst_gid = from.dst;
  flow.src_port = from.src_port;
  // The IP and UDP headers are rebuilt (the socket gives the payload); a
  // run's segments share them but for the last one's length.
  if (run_parse.prefix_for != bytes.size() && bytes.size() >= wire::kBthSize + wire::kIcrcSize) {
    uint8_t image[wire::kIpv6HeaderSize + wire::kUdpHeaderSize];
    const auto n = wire::write_ip_udp_headers(flow, bytes.size(), image);
    if (!n) return;
    const auto prefix = wire::icrc_prefix(std::span<const uint8_t>(image, *n), bytes.size());
    if (!prefix) {
      port_counters()->add(Counter::kMalformedDrops);
      return;
    }
    run_parse.prefix = *prefix;
    run_parse.prefix_for = bytes.size();
  }
  // The socket hides the IPv4 ID, which the ICRC covers: a softhca peer's
  // GSO segments carry 1, 2, ..., rxe's and a NIC's packets whatever their
  // sender counts.
  wire::ParseLimits limits;
  limits.ipv4_id_unseen = true;
  const auto parsed = wire::parse(run_parse.prefix, bytes, limits);
  if (!parsed) {
    port_counters()->add(parsed.error() == wire::ParseError::kBadIcrc ? Counter::kIcrcDrops : Counter::kMalformedDrops);
    SOFTHCA_DEBUG("udp link: dropped a packet: %.*s", static_cast<int>(wire::to_string(parsed.error()).size()),
                  wire::to_string(parsed.error()).data());
    return;
  }
  const wire::ParsedPacket& packet = *parsed;
  const uint32_t qpn = packet.headers.bth.dest_qpn;
  if (capture_)
    [[maybe_unused]] auto written = capture_->write(flow, bytes, realtime_ns(), packet.unseen_ipv4_id);
  // Another partition's packet, whatever its QP (transport/admission.hpp).
  if (!transport::pkey_matches(packet.headers.bth.pkey, transport::kDefaultPkey)) {
    port_counters()->add(Counter::kPkeyDrops);
    SOFTHCA_DEBUG("udp link: dropped a packet for QP %#x: P_Key %#x", qpn, packet.headers.bth.pkey);
    return;
  }
  if (packet.info.transport == wire::Transport::kUd) {
    finish_run(run);
    if (qpn == link::kGsiQpn) {
      management(packet, from, bytes);
      return;
    }
    if (qpn == wire::kMulticastQpn) {
      group_datagram(packet, from);
      return;
    }
    if (!datagram(packet, from)) count_hand_off(hand_off(qpn, from, bytes));
    return;
  }
  const wire::Operation op = packet.info.operation;
  const bool response = op == wire::Operation::kAcknowledge || op == wire::Operation::kAtomicAcknowledge ||
                        op == wire::Operation::kRdmaReadResponse;
  if (!run.open || run.qpn != qpn || run.responses != response) {
    finish_run(run);
    run.open = true;
    run.qpn = qpn;
    run.responses = response;
    {
      std::lock_guard guard(mutex_);
      auto it = channels_.find(qpn);
      if (it != channels_.end()) run.state = it->second;
    }
    // A run of requests holds the channel; responses take it one by one,
    // since each may complete a message and let the next one out
    // (on_answers), which must not wait for the run's end.
    if (run.state && !response) run.lock = std::unique_lock(run.state->mutex);
  }
  if (!run.state) {
    // Another process's QP (or nobody's: as a NIC, drop).
    count_hand_off(hand_off(qpn, from, bytes));
    return;
  }
  ChannelState& state = *run.state;
  // Only the peer, and only at our address, speaks to a connected QP
  // (transport/admission.hpp): before anything of the QP changes. (A
  // handed-off packet carries the addresses it came with.)
  if (!transport::from_peer(from.src, from.dst, state.config.sgid, state.config.dgid)) {
    state.counters.add(Counter::kSrcAddrDrops);
    SOFTHCA_DEBUG("udp link: dropped a packet for QP %#x: not from its peer's address to its own", qpn);
    return;
  }
  state.counters.add(Counter::kRcvdPkts);
  state.counters.add(Counter::kRcvdBytes, bytes.size());
  // Packets go back to where the request came from (its source address is
  // the peer's GID; our address is the one it was sent to). A run is one
  // flow: its packets share both addresses.
  if (response) {
    {
      std::lock_guard guard(state.mutex);
      if (state.closed || !state.requester) {
        state.counters.add(Counter::kClosedQpDrops);
        return;
      }
      FlowSink sink(*outbox_, from.dst, from.src, state.config.traffic_class, state.config.hop_limit, state.counters,
                    state.config.ifindex);
      state.requester->on_response(packet, monotonic_ns(), sink);
    }
    if (state.config.on_answers) state.config.on_answers();
    return;
  }
  if (state.closed) {
    state.counters.add(Counter::kClosedQpDrops);
    return;
  }
  if (!run.self_resolved) {
    run.self_resolved = true;
    // Ours, or a TGT QP (the host's) whose serving handle is ours.
    if (shm::resolve(host_, state.config.local_qpn, run.self) &&
        (run.self.proc == host_.proc() || run.self.proc == host::kHostOwned)) {
      run.access.emplace(host_, run.self.proc);
      run.self_usable = shm::still_there(run.self);
    }
  }
  if (!run.self_usable) {
    state.counters.add(Counter::kClosedQpDrops);  // its slot is gone or changing hands
    return;
  }
  if (!run.sink)
    run.sink.emplace(FlowSink::Answers{}, *outbox_, from.dst, from.src, state.config.traffic_class,
                     state.config.hop_limit, state.counters, state.config.ifindex);
  shm::ShmResponderPort port(host_, run.self, &state.responder_key);
  state.responder.on_request(packet, port, *run.sink);
  // Where another handle would take the peer over (QueuePair::sync_tgt_channel).
  if (run.self.proc == host::kHostOwned)
    run.self.qp->resume_psn.store(host::SharedQp::kResumeValid | state.responder.resume_psn(),
                                  std::memory_order_relaxed);
}

void UdpLink::finish_run(RunToQp& run) {
  if (!run.open) return;
  // The answers join the batch, our announcement ends, then the lock goes:
  // as each packet alone did.
  run.sink.reset();
  run.access.reset();
  if (run.lock.owns_lock()) run.lock.unlock();
  run.lock = {};
  run.state.reset();
  run.open = false;
  run.self_resolved = false;
  run.self_usable = false;
}

void UdpLink::send_management(const uint8_t* sgid, const uint8_t* dgid, std::span<const uint8_t> mad) {
  link::Datagram to;
  to.dest_qpn = link::kGsiQpn;
  to.is_global = true;
  std::memcpy(to.sgid, sgid, sizeof to.sgid);
  std::memcpy(to.dgid, dgid, sizeof to.dgid);
  iovec payload{const_cast<uint8_t*>(mad.data()), mad.size()};
  transport::Request r;
  r.op = transport::Operation::kSend;
  r.qp_type = IBV_QPT_UD;
  r.src_qpn = link::kGsiQpn;
  r.qkey = link::kGsiQkey;
  r.data = &payload;
  r.ndata = 1;
  r.length = mad.size();
  send_datagram(to, r);
}

void UdpLink::receive_management(link::ManagementReceiver receiver) {
  const bool installing = static_cast<bool>(receiver);
  {
    std::lock_guard guard(management_mutex_);
    management_receiver_ = std::move(receiver);
  }
  if (!installing) return;
  start();
  host_.registry().claim_gsi_agent(host_.proc());
}

void UdpLink::management(const wire::ParsedPacket& packet, const Received& from, std::span<const uint8_t> bytes) {
  // QP1 takes only GSI datagrams: the GSI Q_Key (IBTA 3.5.3.1; any other is
  // a Q_Key violation, dropped) and at least a whole MAD.
  if (!packet.headers.deth || packet.headers.deth->qkey != link::kGsiQkey || packet.payload.size() < link::kMadBytes) {
    port_counters()->add(Counter::kMalformedDrops);
    return;
  }
  {
    std::lock_guard guard(management_mutex_);
    if (management_receiver_) {
      link::ManagementDatagram d;
      std::memcpy(d.sgid, from.src.data(), sizeof d.sgid);
      std::memcpy(d.dgid, from.dst.data(), sizeof d.dgid);
      d.src_qpn = packet.headers.deth->src_qpn;
      d.mad = packet.payload.first(link::kMadBytes);
      port_counters()->add(Counter::kRcvdPkts);
      port_counters()->add(Counter::kRcvdBytes, from.length);
      management_receiver_(d);
      return;
    }
  }
  // Not a process with a connection manager: the host's agent has one.
  const auto agent = host_.registry().gsi_agent();
  count_hand_off(agent ? hand_off_to(*agent, link::kGsiQpn, from, bytes) : HandOff::kNobodys);
}

bool UdpLink::datagram(const wire::ParsedPacket& packet, const Received& from) {
  if (!packet.headers.deth) return true;
  shm::TargetQp target;
  if (!shm::resolve(host_, packet.headers.bth.dest_qpn, target)) return true;
  if (target.proc != host_.proc()) return false;
  deliver_datagram(packet, from, target);
  return true;
}

void UdpLink::group_datagram(const wire::ParsedPacket& packet, const Received& from) {
  // Sent to a group: the IP destination is the group's address, which is its MGID.
  if (!packet.headers.deth || !wire::is_multicast_gid(from.dst.data())) {
    port_counters()->add(Counter::kMalformedDrops);
    return;
  }
  uint32_t members[host::kMaxMcastMembers];
  const uint32_t n = host_.registry().mcast_members(from.dst.data(), members);
  for (uint32_t i = 0; i < n; ++i) {
    shm::TargetQp target;
    // Members in other processes get the copy their own socket received.
    if (shm::resolve(host_, members[i], target) && target.proc == host_.proc()) deliver_datagram(packet, from, target);
  }
}

void UdpLink::change_membership(const uint8_t* mgid, uint32_t ifindex, int by) {
  if (!start()) return;
  const wire::Gid group = gid_of(mgid);
  std::lock_guard guard(groups_mutex_);
  Membership& m = groups_[{group, ifindex}];
  const bool first = m.count == 0 && by > 0;
  m.count += by;
  const bool last = m.count <= 0;
  if (first) {
    // Past the kernel's limit of groups per socket (net.ipv4.igmp_max_memberships,
    // 20 by default) this fails: the group then reaches this host's members only.
    const auto r = sockets_->membership(group, ifindex, true);
    m.joined = r.has_value();
    if (r)
      SOFTHCA_DEBUG("udp link: joined multicast group %s on interface %u", group_name(group).c_str(), ifindex);
    else
      SOFTHCA_WARN("udp link: cannot join multicast group %s on interface %u: %s; other hosts' datagrams to it "
                   "will not reach this process",
                   group_name(group).c_str(), ifindex, std::strerror(to_errno(r.error())));
  }
  if (!last) return;
  if (m.joined) {
    if (auto r = sockets_->membership(group, ifindex, false); !r)
      SOFTHCA_DEBUG("udp link: cannot leave multicast group %s on interface %u: %s", group_name(group).c_str(),
                    ifindex, std::strerror(to_errno(r.error())));
  }
  groups_.erase({group, ifindex});
}

void UdpLink::deliver_datagram(const wire::ParsedPacket& packet, const Received& from, shm::TargetQp& target) {
  shm::MemoryAccess access(host_, target.proc);
  if (!shm::still_there(target)) return;
  const CounterSink counters(&target.qp->counters, port_counters());
  counters.add(Counter::kRcvdPkts);
  counters.add(Counter::kRcvdBytes, from.length);
  shm::ShmResponderPort port(host_, target);
  transport::Request r;
  r.op = packet.headers.immdt ? transport::Operation::kSendWithImm : transport::Operation::kSend;
  r.qp_type = IBV_QPT_UD;
  r.src_qpn = packet.headers.deth->src_qpn;
  r.qkey = packet.headers.deth->qkey;
  r.solicited = packet.headers.bth.solicited;
  if (packet.headers.immdt) r.imm_data = htonl(packet.headers.immdt->imm);
  iovec payload{const_cast<uint8_t*>(packet.payload.data()), packet.payload.size()};
  r.data = &payload;
  r.ndata = packet.payload.empty() ? 0 : 1;
  r.length = packet.payload.size();
  unsigned char grh[wire::kUdGrhBytes];
  wire::build_ud_grh(grh, from.src.data(), from.dst.data(), static_cast<uint32_t>(r.length), 0, 64, 0);
  transport::respond_datagram(r, std::span<const unsigned char>(grh, sizeof grh), port);
}

}  // namespace
}  // namespace softhca::udp

namespace softhca::link {

std::unique_ptr<Link> make_udp_link(host::Attachment& host) { return std::make_unique<udp::UdpLink>(host); }

}  // namespace softhca::link
