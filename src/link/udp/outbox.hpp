// What leaves the udp link, and how.
//
// Packets are encoded straight into batches (SendBatch) by a FlowSink, one
// per operation, and a batch leaves in as few system calls as the sockets
// can (sendmmsg, runs of equal-size packets as GSO messages). On the way
// out each packet passes the fault schedule (SOFTHCA_FAULT: dropped,
// delayed, duplicated, held back, corrupted) and the capture
// (SOFTHCA_PCAP). The responder's answers to what a receiving thread
// handles collect in one batch of their own (answers()), sent once the
// datagrams received together are handled; plain ACKs among them may wait
// for the process's next request and leave behind it (AckPiggyback).
//
// Threads: any thread sends (posters, pollers, the link's thread). The
// answers batch is the receiving thread's (the link's receive lock). The
// batch pool, the held ACKs and the fault schedule's held and delayed
// packets each have a mutex of their own, held only to take or put.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "common/counters.hpp"
#include "link/udp/ack_piggyback.hpp"
#include "link/udp/fault_schedule.hpp"
#include "link/udp/pcap_writer.hpp"
#include "link/udp/udp_sockets.hpp"
#include "transport/packet_sink.hpp"
#include "wire/packet.hpp"

namespace softhca::udp {

// Packets encoded for sending together: a burst of a window goes out in a
// few system calls (sendmmsg) instead of one per packet.
struct SendBatch {
  static constexpr size_t kPackets = 64;
  static constexpr size_t kSlotBytes = wire::kMaxPayload + 128;
  std::vector<uint8_t> storage = std::vector<uint8_t>(kPackets * kSlotBytes);
  std::array<OutgoingPacket, kPackets> packets{};
  std::array<uint16_t, kPackets> source_ports{};  // for the capture
  size_t count = 0;
  bool plain_acks = true;  // answers that are all plain ACKs, which may wait (AckPiggyback)
  uint8_t* slot(size_t i) { return storage.data() + i * kSlotBytes; }
};

class Outbox {
 public:
  // What the outbox needs of the link's thread: a look at once (a packet
  // the fault schedule delayed or held back), and one no later than a time
  // (held ACKs fall due then).
  struct Wakes {
    std::function<void()> now;
    std::function<void(uint64_t due_ns)> by;
  };
  // `port`: the process's port counters (send errors). `capture` may be
  // null, and outlives the outbox.
  Outbox(Sockets& sockets, Counters* port, std::optional<FaultConfig> faults, PcapWriter* capture, Wakes wakes);
  Outbox(const Outbox&) = delete;
  Outbox& operator=(const Outbox&) = delete;

  Sockets& sockets() { return sockets_; }

  // Batches for FlowSinks: taken from a pool, sent and given back.
  std::unique_ptr<SendBatch> take_batch();
  // Sends a batch as it is.
  void send_batch(std::unique_ptr<SendBatch> batch);
  // A requester's packets (or a UD datagram): held ACKs leave behind them,
  // in the same system call.
  void send_requests(std::unique_ptr<SendBatch> batch);

  // The batch that collects responders' answers while received packets are
  // handled (the receiving thread's), and its sending once they are: the
  // answers leave, or plain ACKs wait for a request.
  std::unique_ptr<SendBatch>& answers() { return answers_; }
  void send_answers();

  // Held ACKs leave alone: now, or if they are due.
  void release_held_acks();
  void release_due_acks(uint64_t now_ns) {
    if (has_held_acks_.load(std::memory_order_relaxed) &&
        AckPiggyback::due(held_acks_at_ns_.load(std::memory_order_relaxed), now_ns))
      release_held_acks();
  }
  // When held ACKs fall due; 0: none held.
  uint64_t held_acks_due() const {
    return has_held_acks_.load(std::memory_order_relaxed)
               ? held_acks_at_ns_.load(std::memory_order_relaxed) + AckPiggyback::kHoldNs
               : 0;
  }
  // Whether ACKs made now would be held.
  bool holding_acks() const { return piggyback_.holding(); }

  // The fault schedule's delayed packets that are due leave (and a packet
  // held back that waited too long); returns when the next one is due, 0
  // for none. The link's thread calls it at each wake.
  uint64_t release_delayed(uint64_t now_ns);
  bool injects_faults() const { return faults_.has_value(); }

 private:
  struct Delayed {
    uint64_t due_ns;
    wire::UdpFlow flow;
    std::vector<uint8_t> bytes;
    uint32_t ifindex = 0;
  };
  void recycle(std::unique_ptr<SendBatch> batch);
  // What the fault schedule makes of one packet: appended to `now` when it
  // may leave now (with its duplicate, and a packet held back behind it),
  // else kept in delayed_ / held_.
  void apply_faults(const FaultDecision& d, const wire::UdpFlow& flow, std::span<const uint8_t> packet,
                    uint32_t ifindex, std::vector<Delayed>& now);
  // A packet to send from a copy the fault schedule made.
  OutgoingPacket outgoing(const Delayed& p);
  // Sends packets that own their bytes, in one batch (into the capture too).
  void send_owned(const std::vector<Delayed>& packets);

  Sockets& sockets_;
  Counters* port_;
  PcapWriter* capture_;
  Wakes wakes_;
  std::optional<FaultSchedule> faults_;

  std::mutex batch_pool_mutex_;
  std::vector<std::unique_ptr<SendBatch>> batch_pool_;

  // ACKs, NAKs and READ responses to the packets being received (the
  // receiving thread's): they leave together once a batch of datagrams is
  // handled, a system call for all of them instead of one per answer, and
  // runs of equal-size ACKs to one peer as one GSO message. Only the
  // responder's: its output is made by the one receiving thread, in order,
  // while a requester's packets may also come from a posting thread and
  // must not wait behind later ones.
  std::unique_ptr<SendBatch> answers_;

  // Plain ACKs waiting for a request to leave with (AckPiggyback).
  AckPiggyback piggyback_;
  std::mutex held_acks_mutex_;
  std::unique_ptr<SendBatch> held_acks_;
  std::atomic<bool> has_held_acks_{false};
  std::atomic<uint64_t> held_acks_at_ns_{0};  // when the oldest of them was made

  // The fault schedule's packets that wait.
  std::mutex fault_mutex_;
  std::optional<Delayed> held_;       // a packet held back behind the next one
  std::atomic<bool> holding_{false};  // held_ has one: the next packet must release it
  std::vector<Delayed> delayed_;      // packets waiting for their delay
};

// Encodes packets for one flow (addresses, ports) into the outbox's
// batches: they leave when the sink is full or goes away, so a sink lives
// for one operation (a post, a received packet, a timer) under its
// channel's lock, which keeps the channel's packets in order.
class FlowSink final : public transport::PacketSink {
 public:
  FlowSink(Outbox& outbox, const wire::Gid& src, const wire::Gid& dst, uint8_t traffic_class, uint8_t hop_limit,
           CounterSink counters, uint32_t ifindex = 0)
      : outbox_(outbox),
        src_(src),
        dst_(dst),
        traffic_class_(traffic_class),
        hop_limit_(hop_limit),
        counters_(counters),
        ifindex_(ifindex) {}
  // A responder's answers to a received packet: they join the outbox's
  // batch of answers, sent once the datagrams received together are handled.
  struct Answers {};
  FlowSink(Answers, Outbox& outbox, const wire::Gid& src, const wire::Gid& dst, uint8_t traffic_class,
           uint8_t hop_limit, CounterSink counters, uint32_t ifindex)
      : FlowSink(outbox, src, dst, traffic_class, hop_limit, counters, ifindex) {
    answers_ = true;
  }
  ~FlowSink();
  FlowSink(const FlowSink&) = delete;
  FlowSink& operator=(const FlowSink&) = delete;

  void send(const wire::Headers& h, const iovec* payload, int npayload, uint32_t length) override;

 private:
  Outbox& outbox_;
  wire::Gid src_, dst_;
  uint8_t traffic_class_, hop_limit_;
  CounterSink counters_;
  uint32_t ifindex_;      // where a multicast or link-local datagram leaves (0: the kernel's route)
  bool answers_ = false;  // collects into the outbox's batch of answers, not one of its own
  std::unique_ptr<SendBatch> batch_;
  wire::IcrcPrefix prefix_;  // for the size of the last packet (udp_payload_size 0: none yet)
};

}  // namespace softhca::udp
