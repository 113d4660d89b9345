// The responder of a reliable (RC) or unreliable (UC) connection over
// packets, pure: it checks each request packet's PSN against the one it
// expects, runs the responder stages (responder.hpp) on packets in sequence,
// acknowledges (coalesced: when the requester asks, and on duplicates),
// NAKs a PSN gap once, answers READs with response packets and atomics
// with atomic ACKs, and replays both for a duplicate request from a small
// store of the latest ones (max_dest_rd_atomic of them), so that an atomic
// runs once however often its request is retransmitted. UC has no ACKs: a
// gap drops the message in progress.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "common/counters.hpp"
#include "transport/packet_sink.hpp"
#include "transport/responder.hpp"
#include "transport/selective.hpp"
#include "wire/packet.hpp"

namespace softhca::transport {

struct ResponderConfig {
  uint32_t peer_qpn = 0;  // the requester: where answers go, and the source QPN receives report
  uint32_t mtu = 1024;
  bool reliable = true;
  bool xrc = false;        // an XRC TGT QP: XRC opcodes in, their responses out
  uint32_t start_psn = 0;  // rq_psn
  uint32_t resources = 16;  // max_dest_rd_atomic: READ/atomic requests kept for replay
  CounterSink counters;     // duplicates, out-of-sequence requests, NAKs sent
  // Keep packets past a gap for a requester that recovers selectively
  // (selective.hpp); RC only.
  bool selective = false;
};

class ResponderFlow {
 public:
  explicit ResponderFlow(const ResponderConfig& config);

  // A request packet addressed to this QP.
  void on_request(const wire::ParsedPacket& packet, ResponderPort& port, PacketSink& out);

  uint32_t expected_psn() const { return epsn_; }
  // Where another responder takes this flow over (an XRC TGT QP's serving
  // handle changes, engine/qp/tgt_qp.cpp): the first PSN of the SEND or
  // WRITE in progress, whose earlier packets it never saw and which the
  // requester sends again whole, else the next PSN.
  uint32_t resume_psn() const { return in_message_ ? message_start_psn_ : epsn_; }

 private:
  // A response opcode: RC's, or for an XRC TGT QP its XRC twin.
  uint8_t response_opcode(wire::Opcode rc) const {
    const auto code = static_cast<uint8_t>(rc);
    return config_.xrc ? wire::xrc_twin(code) : code;
  }

  struct ReadOrAtomic {
    uint32_t psn = 0;
    uint32_t npsn = 1;
    bool atomic = false;
    Request request;             // a READ's target, for the replay
    uint64_t original = 0;       // an atomic's result
  };

  Request request_of(const wire::ParsedPacket& packet, Operation op) const;
  void answer(const Syndrome& syndrome, uint32_t psn, PacketSink& out);
  void ack(uint32_t psn, PacketSink& out);
  void send_read_response(const ReadOrAtomic& read, const iovec& from, ResponderPort& port, PacketSink& out);
  void send_atomic_ack(const ReadOrAtomic& atomic, PacketSink& out);
  void remember(const ReadOrAtomic& r);
  void rnr_naked(uint32_t psn);
  void duplicate(const wire::ParsedPacket& packet, ResponderPort& port, PacketSink& out);
  void send_or_write(const wire::ParsedPacket& packet, ResponderPort& port, PacketSink& out);
  void read(const wire::ParsedPacket& packet, ResponderPort& port, PacketSink& out);
  void atomic(const wire::ParsedPacket& packet, ResponderPort& port, PacketSink& out);
  // on_request's work but the tail probe's answer.
  void receive(const wire::ParsedPacket& packet, ResponderPort& port, PacketSink& out);
  // Runs a request at the expected PSN through its stages.
  void run(const wire::ParsedPacket& packet, ResponderPort& port, PacketSink& out);

  // Selective recovery (selective.hpp).
  struct Kept {
    enum class State : uint8_t { kMissing, kKept, kCovered };  // kCovered: a kept READ's later PSNs
    State state = State::kMissing;
    uint32_t reported = 0;      // missing: the report that last named it (0: none)
    wire::ParsedPacket packet;  // kept: its payload in kept_bytes_, at the slot's MTU
  };
  Kept& slot(uint32_t psn) { return kept_[psn % kKeepPackets]; }
  // The bits every answer carries.
  uint8_t answer_marks() const { return peer_selective_ ? kSelective : 0; }
  // A request past the expected PSN, `ahead` PSNs past it.
  void keep(const wire::ParsedPacket& packet, int32_t ahead, PacketSink& out);
  void report_hole(uint32_t first, uint32_t count, PacketSink& out);
  // Reports the holes between the expected PSN and `end` whose last report
  // came before report `reported_before` (UINT32_MAX: every hole there).
  void report_missing_before(uint32_t end, uint32_t reported_before, PacketSink& out);
  // Forgets what was kept: the expected PSN is where the requester sends again from.
  void drop_kept();
  // Runs the kept packets the expected PSN reaches; one ACK for them all.
  void run_kept(ResponderPort& port, PacketSink& out);
  // Slots of PSNs [from, to) to missing.
  void clear_kept(uint32_t from, uint32_t to);

  ResponderConfig config_;
  uint32_t epsn_;
  uint32_t msn_ = 0;
  bool nak_sent_ = false;  // a NAK (sequence or RNR) is out: later packets are dropped silently
  uint32_t last_gap_psn_ = 0;  // the PSN of the latest out-of-sequence packet
  uint32_t round_gap_psn_ = 0;  // the one that drew the latest NAK (where its round showed the gap)
  bool in_message_ = false;
  uint32_t message_start_psn_ = 0;  // the PSN of the message in progress's first packet
  MessageInProgress message_;
  // UC: a receive WQE taken by a message that a gap dropped, for the next one.
  std::optional<ReceiveWqe> spare_wqe_;
  std::deque<ReadOrAtomic> recent_;
  bool peer_selective_ = false;
  std::vector<Kept> kept_;   // kKeepPackets slots, by PSN; allocated at the first gap
  // Their payloads, an MTU each, allocated with them: one allocation per
  // flow, none per packet (an application's signal handler that mallocs,
  // as perftest -D's does, must not land inside one of ours).
  std::unique_ptr<uint8_t[]> kept_bytes_;
  uint32_t seen_end_;        // the PSN after the furthest request seen (kept or run)
  uint32_t report_seq_ = 0;  // hole reports sent
  bool acks_held_ = false;   // run_kept: ACKs wait for the end of the run
  bool ack_owed_ = false;
  std::vector<unsigned char> bounce_;  // a READ response packet's payload, on its way out
};

}  // namespace softhca::transport
