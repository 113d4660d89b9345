// The udp link's outbox: see outbox.hpp.
#include "link/udp/outbox.hpp"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/clock.hpp"
#include "common/log.hpp"
#include "transport/selective.hpp"
#include "wire/opcode.hpp"

namespace softhca::udp {
namespace {

uint64_t realtime_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

// The flow a batched packet belongs to, as the capture and the fault
// schedule see it.
wire::UdpFlow flow_of(const OutgoingPacket& p, uint16_t src_port) {
  wire::UdpFlow flow;
  flow.src_gid = p.src;
  flow.dst_gid = p.dst;
  flow.src_port = src_port;
  flow.traffic_class = p.traffic_class;
  flow.hop_limit = p.hop_limit;
  return flow;
}

// An ACK with nothing but the acknowledgement in it (no NAK, hole report or
// probe's answer): one that may wait for a request to carry it.
bool is_plain_ack(const wire::Headers& h) {
  const auto op = static_cast<wire::Opcode>(h.bth.opcode);
  return (op == wire::Opcode::kRcAcknowledge || op == wire::Opcode::kXrcAcknowledge) && h.aeth &&
         h.aeth->syndrome.is_ack() && (h.bth.reserved7 & ~transport::kSelective) == 0;
}

}  // namespace

Outbox::Outbox(Sockets& sockets, Counters* port, std::optional<FaultConfig> faults, PcapWriter* capture, Wakes wakes)
    : sockets_(sockets), port_(port), capture_(capture), wakes_(std::move(wakes)) {
  if (faults) faults_.emplace(*faults);
}

void FlowSink::send(const wire::Headers& h, const iovec* payload, int npayload, uint32_t length) {
  const auto info = wire::opcode_info(h.bth.opcode);
  if (!info) return;
  if (length > wire::kMaxPayload) return;
  const size_t size = wire::encoded_size(*info, length);
  const uint16_t src_port = outbox_.sockets().source_port(wire::is_ipv4_mapped(dst_));
  const uint8_t hop_limit = hop_limit_ ? hop_limit_ : 64;
  // The ICRC's part over the IP and UDP headers: the same for every packet
  // of this size (a message's packets but its last).
  if (prefix_.udp_payload_size != size) {
    wire::UdpFlow flow;
    flow.src_gid = src_;
    flow.dst_gid = dst_;
    flow.src_port = src_port;
    flow.traffic_class = traffic_class_;
    flow.hop_limit = hop_limit;
    uint8_t image[wire::kIpv6HeaderSize + wire::kUdpHeaderSize];
    const auto n = wire::write_ip_udp_headers(flow, size, image);
    if (!n) return;
    const auto prefix = wire::icrc_prefix(std::span<const uint8_t>(image, *n), size);
    if (!prefix) return;
    prefix_ = *prefix;
  }
  std::unique_ptr<SendBatch>& batch = answers_ ? outbox_.answers() : batch_;
  if (!batch) batch = outbox_.take_batch();
  if (answers_ && !is_plain_ack(h)) batch->plain_acks = false;
  uint8_t* into = batch->slot(batch->count);
  // The payload goes from the WQE's buffers straight to its place in the
  // packet: one copy.
  uint8_t* data = into + info->header_size;
  uint32_t at = 0;
  for (int i = 0; i < npayload && at < length; ++i) {
    const size_t piece = std::min<size_t>(payload[i].iov_len, length - at);
    std::memcpy(data + at, payload[i].iov_base, piece);
    at += static_cast<uint32_t>(piece);
  }
  const auto encoded = wire::encode_around_payload(h, length, prefix_, std::span<uint8_t>(into, SendBatch::kSlotBytes));
  if (!encoded) {
    SOFTHCA_DEBUG("udp link: cannot encode opcode 0x%x", h.bth.opcode);
    return;
  }
  counters_.add(Counter::kSentPkts);
  counters_.add(Counter::kSentBytes, *encoded);
  batch->packets[batch->count] =
      OutgoingPacket{src_, dst_, traffic_class_, hop_limit, std::span<const uint8_t>(into, *encoded), ifindex_};
  batch->source_ports[batch->count] = src_port;
  if (++batch->count == SendBatch::kPackets) {
    if (answers_) {
      outbox_.send_batch(std::move(batch));
    } else {
      outbox_.send_requests(std::move(batch));
    }
  }
}

FlowSink::~FlowSink() {
  if (batch_) outbox_.send_requests(std::move(batch_));
}

std::unique_ptr<SendBatch> Outbox::take_batch() {
  {
    std::lock_guard guard(batch_pool_mutex_);
    if (!batch_pool_.empty()) {
      auto batch = std::move(batch_pool_.back());
      batch_pool_.pop_back();
      return batch;
    }
  }
  return std::make_unique<SendBatch>();
}

void Outbox::send_batch(std::unique_ptr<SendBatch> batch) {
  const std::span<const OutgoingPacket> packets(batch->packets.data(), batch->count);
  if (faults_) {
    // The fault schedule decides packet by packet, in order; what it lets
    // through now still leaves in one batch, so that a lossy run costs the
    // system calls of a lossless one and compares with it. A packet it lets
    // through untouched leaves from the batch's own buffer: no copy and no
    // allocation for it, as on the lossless path (an application that
    // mallocs in a signal handler, as perftest -D's SIGALRM handler does,
    // deadlocked when the signal came during our allocation; and each
    // copy made a lossy run slower for a reason no real loss has).
    std::vector<Delayed> copies;  // what it delays, duplicates, holds back or corrupts
    std::array<OutgoingPacket, 3 * SendBatch::kPackets> out{};
    size_t n = 0;
    for (size_t i = 0; i < packets.size(); ++i) {
      const wire::UdpFlow flow = flow_of(packets[i], batch->source_ports[i]);
      const FaultDecision d = faults_->next(packets[i].bytes.size());
      if (d.drop) continue;
      if (!d.any() && !holding_.load(std::memory_order_relaxed)) {
        if (capture_) [[maybe_unused]] auto written = capture_->write(flow, packets[i].bytes, realtime_ns());
        out[n++] = packets[i];
        continue;
      }
      const size_t first = copies.size();
      apply_faults(d, flow, packets[i].bytes, packets[i].ifindex, copies);
      // Each copy's bytes stay where they are when `copies` grows.
      for (size_t j = first; j < copies.size(); ++j) out[n++] = outgoing(copies[j]);
    }
    if (const size_t refused = sockets_.send_batch(std::span<const OutgoingPacket>(out.data(), n)); refused > 0) {
      port_->add(Counter::kSendErr, refused);
      SOFTHCA_DEBUG("udp link: %zu of %zu packets refused: %s", refused, n, std::strerror(errno));
    }
    recycle(std::move(batch));
    return;
  }
  if (capture_) {
    for (size_t i = 0; i < packets.size(); ++i)
      [[maybe_unused]] auto written =
          capture_->write(flow_of(packets[i], batch->source_ports[i]), packets[i].bytes, realtime_ns());
  }
  if (const size_t refused = sockets_.send_batch(packets); refused > 0) {
    port_->add(Counter::kSendErr, refused);
    SOFTHCA_DEBUG("udp link: %zu of %zu packets refused: %s", refused, packets.size(), std::strerror(errno));
  }
  recycle(std::move(batch));
}

void Outbox::recycle(std::unique_ptr<SendBatch> batch) {
  batch->count = 0;
  batch->plain_acks = true;
  std::lock_guard guard(batch_pool_mutex_);
  batch_pool_.push_back(std::move(batch));
}

void Outbox::send_answers() {
  if (!answers_) return;
  const bool plain = answers_->plain_acks;
  const uint64_t now = monotonic_ns();
  if (!plain || !piggyback_.holding()) {
    send_batch(std::move(answers_));
    if (plain) piggyback_.sent_alone(now);
    return;
  }
  std::unique_ptr<SendBatch> copied;  // emptied into the held batch: back to the pool
  std::unique_ptr<SendBatch> full;    // held, and no room for more: leaves now
  uint64_t held_at = now;
  {
    std::lock_guard guard(held_acks_mutex_);
    if (held_acks_ && held_acks_->count + answers_->count <= SendBatch::kPackets) {
      SendBatch& into = *held_acks_;
      for (size_t i = 0; i < answers_->count; ++i) {
        const OutgoingPacket& p = answers_->packets[i];
        uint8_t* slot = into.slot(into.count);
        std::memcpy(slot, p.bytes.data(), p.bytes.size());
        into.packets[into.count] = p;
        into.packets[into.count].bytes = std::span<const uint8_t>(slot, p.bytes.size());
        into.source_ports[into.count] = answers_->source_ports[i];
        ++into.count;
      }
      copied = std::move(answers_);
      held_at = held_acks_at_ns_.load(std::memory_order_relaxed);
    } else {
      full = std::move(held_acks_);
      held_acks_ = std::move(answers_);
      held_acks_at_ns_.store(now, std::memory_order_relaxed);
    }
    has_held_acks_.store(true, std::memory_order_seq_cst);
  }
  if (copied) recycle(std::move(copied));
  if (full) send_batch(std::move(full));
  // Due at held_at + kHoldNs: the link's thread must not sleep past that.
  wakes_.by(held_at + AckPiggyback::kHoldNs);
}

void Outbox::send_requests(std::unique_ptr<SendBatch> batch) {
  std::unique_ptr<SendBatch> acks;
  if (has_held_acks_.load(std::memory_order_relaxed)) {
    std::lock_guard guard(held_acks_mutex_);
    acks = std::move(held_acks_);
    has_held_acks_.store(false, std::memory_order_relaxed);
  }
  piggyback_.request_leaves(monotonic_ns(), acks != nullptr);
  if (!acks) {
    send_batch(std::move(batch));
    return;
  }
  if (faults_ || batch->count + acks->count > SendBatch::kPackets) {
    send_batch(std::move(batch));
    send_batch(std::move(acks));
    return;
  }
  // One system call: the requests first, so that a peer that polls for
  // its ACK has the request handled before the ACK completes its send.
  for (size_t i = 0; i < acks->count; ++i) {
    batch->packets[batch->count] = acks->packets[i];
    batch->source_ports[batch->count] = acks->source_ports[i];
    ++batch->count;
  }
  send_batch(std::move(batch));
  recycle(std::move(acks));
}

void Outbox::release_held_acks() {
  if (!has_held_acks_.load(std::memory_order_relaxed)) return;
  std::unique_ptr<SendBatch> acks;
  {
    std::lock_guard guard(held_acks_mutex_);
    acks = std::move(held_acks_);
    has_held_acks_.store(false, std::memory_order_relaxed);
  }
  if (!acks) return;
  send_batch(std::move(acks));
  piggyback_.released_alone(monotonic_ns());
}

OutgoingPacket Outbox::outgoing(const Delayed& p) {
  if (capture_) [[maybe_unused]] auto written = capture_->write(p.flow, p.bytes, realtime_ns());
  return OutgoingPacket{p.flow.src_gid, p.flow.dst_gid, p.flow.traffic_class, p.flow.hop_limit,
                        std::span<const uint8_t>(p.bytes), p.ifindex};
}

void Outbox::send_owned(const std::vector<Delayed>& packets) {
  std::vector<OutgoingPacket> out;
  out.reserve(packets.size());
  for (const Delayed& p : packets) out.push_back(outgoing(p));
  if (const size_t refused = sockets_.send_batch(out); refused > 0) {
    port_->add(Counter::kSendErr, refused);
    SOFTHCA_DEBUG("udp link: %zu of %zu packets refused: %s", refused, out.size(), std::strerror(errno));
  }
}

void Outbox::apply_faults(const FaultDecision& d, const wire::UdpFlow& flow, std::span<const uint8_t> packet,
                           uint32_t ifindex, std::vector<Delayed>& now) {
  std::vector<uint8_t> bytes(packet.begin(), packet.end());
  if (d.corruption) apply_corruption(*d.corruption, bytes);
  std::optional<Delayed> release;
  {
    std::lock_guard guard(fault_mutex_);
    if (d.delay_us > 0) {
      const uint64_t due = monotonic_ns() + uint64_t{d.delay_us} * 1000;
      delayed_.push_back(Delayed{due, flow, bytes, ifindex});
      if (d.duplicate) delayed_.push_back(Delayed{due, flow, bytes, ifindex});
      wakes_.now();
      return;
    }
    if (d.hold_back && !held_) {
      held_ = Delayed{monotonic_ns() + 1'000'000, flow, bytes, ifindex};  // behind the next packet, 1 ms at most
      holding_.store(true, std::memory_order_relaxed);
      wakes_.now();
      return;
    }
    release.swap(held_);
    holding_.store(false, std::memory_order_relaxed);
  }
  now.push_back(Delayed{0, flow, bytes, ifindex});
  if (d.duplicate) now.push_back(Delayed{0, flow, std::move(bytes), ifindex});
  if (release) now.push_back(std::move(*release));
}

uint64_t Outbox::release_delayed(uint64_t now) {
  std::vector<Delayed> due;
  uint64_t next = 0;
  {
    std::lock_guard guard(fault_mutex_);
    if (held_ && held_->due_ns <= now) {
      due.push_back(std::move(*held_));
      held_.reset();
      holding_.store(false, std::memory_order_relaxed);
    }
    for (size_t i = 0; i < delayed_.size();) {
      if (delayed_[i].due_ns <= now) {
        due.push_back(std::move(delayed_[i]));
        delayed_[i] = std::move(delayed_.back());
        delayed_.pop_back();
      } else {
        if (next == 0 || delayed_[i].due_ns < next) next = delayed_[i].due_ns;
        ++i;
      }
    }
    if (held_ && (next == 0 || held_->due_ns < next)) next = held_->due_ns;
  }
  send_owned(due);
  return next;
}

}  // namespace softhca::udp
