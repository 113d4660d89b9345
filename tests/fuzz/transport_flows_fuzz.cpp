// The reliable transport's state machines (transport/requester_flow,
// responder_flow) under a fuzzer: libFuzzer's entry point, also driven
// without libFuzzer by fuzz_driver.cpp with transport_flows_target.cpp.
//
// The input is a script (transport_script.hpp): a requester and a responder
// joined by a wire that encodes and parses every packet, and steps that post
// messages, deliver packets (lost, duplicated, overtaken or corrupted), forge
// requests and responses nobody sent (from the peer's address, a third
// host's, to another address, or in another partition: only what the udp
// link's admission gate takes reaches the flows), post receives,
// deregister keys, move a virtual clock and fire the requester's timer,
// and tear the requester down.
// Forged and corrupted packets reach the flows through wire::parse, as the
// udp link's do, so that states a clean wire never shows (replays, NAKs,
// go-back-N, PSNs near the 24-bit wrap) are reached along with nonsense.
//
// Beyond "no crash, no UB", the checks are the promises the flows make
// whatever arrives: the responder writes only inside registered memory and
// runs an atomic once per request PSN (checked_port.hpp); the requester's
// completions name posted messages in order, each once, its window holds,
// its timer stays armed while it waits (requester_ledger.hpp); and with the
// faults gone, a flow with finite retries ends: every message completes or
// the flow fails.
#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "checked_port.hpp"
#include "packet_queue.hpp"
#include "requester_ledger.hpp"
#include "transport/admission.hpp"
#include "transport/psn.hpp"
#include "transport/requester_flow.hpp"
#include "transport/retry_policy.hpp"
#include "transport/responder_flow.hpp"
#include "transport/selective.hpp"
#include "transport_fuzz_report.hpp"
#include "transport_script.hpp"
#include "transport_setup.hpp"

namespace softhca::fuzz {
namespace {

using namespace transport;
using script::kAbortNow;
using script::Reader;

constexpr std::size_t kMaxSteps = 512;   // bounds the work of one input
// The connection's addresses as each end's QP holds them (its own, its
// peer's: the fuzz flow's), another address of the responder's host, and
// a third host's.
constexpr uint8_t kRequesterAddress[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1};
constexpr uint8_t kResponderAddress[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 2};
constexpr uint8_t kOtherOwnAddress[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 4};
constexpr uint8_t kStrangerAddress[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 3};
// The fault-free end of an input: deliveries, and timeouts (few where the
// requester waits for ever). A window's worth of READs answers in a few
// thousand packets: a wire busy for far longer without a timeout is a storm.
constexpr int kDrainRounds = 400'000;
constexpr int kDrainTimeouts = 4096;
constexpr int kDrainTimeoutsForever = 16;
constexpr int kStormRounds = 100'000;

class Session {
 public:
  explicit Session(const Setup& s)
      : setup_(s),
        requester_(counted(s.requester, &requester_counts_)),
        responder_(counted(s.responder, &responder_counts_)),
        ledger_(s.reliable, s.mtu, s.requester.start_psn, s.requester.max_rd_atomic) {
    FakePort& fake = port_.fake();
    fake.qp_.type = s.reliable ? IBV_QPT_RC : IBV_QPT_UC;
    fake.qp_.access = s.access;
    fake.qp_.min_rnr_timer = s.min_rnr_timer;
    fake.qp_.max_dest_rd_atomic = s.responder.resources;
    to_responder_.on_send = [this](const wire::Headers& h, uint32_t) {
      trace_packet("requester sends", h);
      ledger_.sent(h, requester_.failed());
    };
    to_requester_.on_send = [](const wire::Headers& h, uint32_t) {
      trace_packet("responder sends", h);
      if (h.aeth && h.aeth->syndrome.is_rnr_nak()) ++stats.rnr_naks;
      if (h.aeth && h.aeth->syndrome.nak_code()) ++stats.naks;
      if (h.atomic_ack_eth) ++stats.atomic_acks;
      if (h.bth.opcode >= 0x0D && h.bth.opcode <= 0x10) ++stats.read_responses;
      const auto info = wire::opcode_info(h.bth.opcode);
      const wire::Operation op = info->operation;
      if (op != wire::Operation::kAcknowledge && op != wire::Operation::kAtomicAcknowledge &&
          op != wire::Operation::kRdmaReadResponse)
        broken("the responder sends only responses");
      if (h.bth.dest_qpn != kRequesterQpn) broken("the responder answers its peer");
    };
  }

  void step(Reader& in) {
    ledger_.step_begins();
    const uint8_t code = in.u8() % script::kStepCount;
    TRACE("step %u (now %llu, deadline %llu)\n", code, static_cast<unsigned long long>(now_),
          static_cast<unsigned long long>(requester_.deadline()));
    switch (code) {
      case script::kPost:
        post(in);
        break;
      case script::kToResponder:
        deliver(in, to_responder_);
        break;
      case script::kToRequester:
        deliver(in, to_requester_);
        break;
      case script::kTimer:
        timer(in);
        break;
      case script::kForgeRequest:
        forge_request(in);
        break;
      case script::kForgeResponse:
        forge_response(in);
        break;
      case script::kPostReceive:
        post_receive(in);
        break;
      case script::kKeys:
        keys(in);
        break;
      case script::kRun:
        run(1 + in.u8() % 64, 4);
        break;
      default:
        // Only with one operand value: random bytes name this step one time
        // in ten, and a teardown ends the script's interest in the requester.
        if (in.u8() == kAbortNow) abort_requester();
        break;
    }
    step_ends();
  }

  // The faults stop: a flow whose retries are finite must end, every message
  // completed or the flow failed, and without a storm of packets.
  //
  // Even when a forged or corrupted request moved the responder's expected
  // PSN, or such a response named a PSN the requester waits for: the two
  // ends then disagree about which PSNs were received, and the requester may
  // resend what the responder takes for something else, or never send what
  // the responder waits for; but every resend costs a retry (sequence NAKs
  // included, as on hardware), so the requester gives up.
  void drain() {
    ledger_.step_begins();
    const bool waits_for_ever = setup_.requester.timeout == 0 || setup_.requester.rnr_retry == kRnrRetryForever;
    run(kDrainRounds, waits_for_ever ? kDrainTimeoutsForever : kDrainTimeouts);
    step_ends();
    TRACE("drained: now %llu deadline %llu failed %d outstanding %d epsn 0x%06x next_psn 0x%06x\n",
          static_cast<unsigned long long>(now_), static_cast<unsigned long long>(requester_.deadline()),
          requester_.failed(), !ledger_.empty(), responder_.expected_psn(), requester_.next_psn());
    if (setup_.reliable && !waits_for_ever && !requester_.failed() && !ledger_.empty())
      broken("with finite retries and a clean wire, every message completes or the flow fails");
    port_.check_guards();
    ++stats.inputs;
    stats.retransmitted += requester_counts_.get(Counter::kRetransmittedPkts);
    stats.duplicates += responder_counts_.get(Counter::kDuplicateRequest);
    stats.out_of_sequence += responder_counts_.get(Counter::kOutOfSeqRequest);
    if (psn_diff(requester_.next_psn(), setup_.requester.start_psn) > 0 &&
        requester_.next_psn() < setup_.requester.start_psn)
      ++stats.wraps;
    if (desynced_) ++stats.desynced;
    if (aborted_) ++stats.aborted;
  }

 private:
  void step_ends() {
    RequesterCompletion c;
    while (requester_.pop_completion(c)) {
      TRACE("  completion %u status %d\n", c.position, static_cast<int>(c.status));
      ++stats.completions;
      if (c.status != IBV_WC_SUCCESS) ++stats.error_completions;
      ledger_.completed(c, requester_.failed());
    }
    // A larger window only towards a responder whose answers showed it keeps
    // packets past a gap, and only for a requester that does its part.
    const uint32_t window = requester_.max_window();
    if (window != kWindowPackets &&
        (window != transport::kKeepPackets || !setup_.requester.selective || !selective_answer_seen_))
      broken("the window grows past 128 only towards a selective responder");
    ledger_.step_ends(window);
    ledger_.check_guards();
    if (requester_.next_psn() != ledger_.next_psn() && !aborted_) broken("each message takes the PSNs its length needs");
    if (setup_.reliable && !requester_.failed()) {
      if (requester_.has_room() == ledger_.full(window)) broken("has_room() is the window's accounting");
      if (!ledger_.empty() && requester_.deadline() == 0) broken("a requester that waits has its timer armed");
    }
  }

  void post(Reader& in) {
    const uint8_t op_byte = in.u8();
    const uint8_t length_kind = in.u8();
    const uint16_t extra = in.u16();
    const uint8_t remote_kind = in.u8();
    const uint8_t rkey_kind = in.u8();
    const uint8_t value = in.u8();
    if (!requester_.has_room()) return;
    Operation op = static_cast<Operation>(op_byte % 8);
    if (!setup_.reliable) {
      // UC has no READ or atomics: the verbs refuse to post them.
      static constexpr Operation kUc[] = {Operation::kSend, Operation::kSendWithImm, Operation::kWrite,
                                          Operation::kWriteWithImm};
      op = kUc[op_byte % 4];
    }
    const uint64_t length = is_atomic(op) ? 8 : length_of(length_kind, extra, setup_.mtu);
    RequesterLedger::Posted& p = ledger_.add(next_position_, op, length, value);
    OutgoingMessage m;
    m.position = next_position_++;
    m.op = op;
    m.solicited = (op_byte & 0x80) != 0;
    m.imm_data = htonl(value);
    m.remote_addr = remote_address(remote_kind, extra, length);
    m.rkey = rkey_of(rkey_kind);
    m.compare_add = value & 0xF;
    m.swap = value >> 4;
    // Two local pieces now and then: the requester gathers and scatters across them.
    if (length > 1 && (op_byte & 0x40)) {
      const uint64_t cut = 1 + extra % (length - 1);
      m.local[0] = iovec{p.data(), cut};
      m.local[1] = iovec{p.data() + cut, length - cut};
      m.nlocal = 2;
    } else {
      m.local[0] = iovec{p.data(), length};
      m.nlocal = 1;
    }
    m.length = length;
    TRACE("  post %u op %d length %llu remote 0x%llx rkey 0x%x\n", m.position, static_cast<int>(op),
          static_cast<unsigned long long>(length), static_cast<unsigned long long>(m.remote_addr), m.rkey);
    to_responder_.new_call();
    requester_.post(m, now_, to_responder_);
  }

  // A packet that arrived, to whichever flow it is for (as the udp link routes).
  void arrive(const wire::ParsedPacket& p) {
    if (p.info.transport == wire::Transport::kUd) return;
    const wire::Operation op = p.info.operation;
    if (op == wire::Operation::kAcknowledge || op == wire::Operation::kAtomicAcknowledge ||
        op == wire::Operation::kRdmaReadResponse) {
      trace_packet("requester gets", p.headers);
      // A forged response within what the requester has outstanding may
      // pass for the real one (a READ response packet, an ACK): the two ends
      // then disagree as surely as when a forged request takes a PSN.
      if (untrusted_ && setup_.reliable && !ledger_.empty() &&
          psn_diff(p.headers.bth.psn, ledger_.oldest().first_psn) >= 0 &&
          psn_diff(p.headers.bth.psn, ledger_.next_psn()) < 0)
        desynced_ = true;
      to_responder_.new_call();
      if (p.headers.bth.reserved7 & transport::kSelective) selective_answer_seen_ = true;
      requester_.on_response(p, now_, to_responder_);
    } else {
      trace_packet("responder gets", p.headers);
      port_.handling(p.headers.bth.psn);
      to_requester_.new_call();
      const uint32_t expected = responder_.expected_psn();
      responder_.on_request(p, port_, to_requester_);
      if (untrusted_ && setup_.reliable && responder_.expected_psn() != expected) desynced_ = true;
    }
  }

  void deliver(Reader& in, PacketQueue& queue) {
    const int count = 1 + in.u8() % 16;
    for (int i = 0; i < count; ++i) {
      const uint8_t fault = in.u8();
      uint16_t at = 0;
      uint8_t x = 0;
      if (fault % 8 == script::kCorrupt) {
        at = in.u16();
        x = in.u8();
      }
      untrusted_ = fault % 8 == script::kCorrupt;
      queue.deliver(fault, at, x, [this](const wire::ParsedPacket& p) { arrive(p); });
      untrusted_ = false;
    }
  }

  void fire_timer() {
    to_responder_.new_call();
    requester_.on_timer(now_, to_responder_);
  }

  void timer(Reader& in) {
    const uint8_t mode = in.u8();
    const uint8_t amount = in.u8();
    switch (mode % 4) {
      case 0:
        now_ = std::max(now_, requester_.deadline());
        break;
      case 1:
        now_ += amount;
        break;
      case 2:
        now_ += uint64_t{amount} << 12;
        break;
      default:
        now_ += uint64_t{1} << (amount % 44);
        break;
    }
    fire_timer();
  }

  // Both ways without faults; when nothing is in flight, the timer's turn
  // (at most `timeouts` times).
  void run(int rounds, int timeouts) {
    int busy = 0;
    for (int i = 0; i < rounds; ++i) {
      const bool idle = to_responder_.empty() && to_requester_.empty();
      if (idle) {
        busy = 0;
        const uint64_t d = requester_.deadline();
        if (d == 0 || requester_.failed() || timeouts-- == 0) return;
        now_ = std::max(now_, d);
        fire_timer();
        continue;
      }
      if (++busy > kStormRounds) broken("the wire falls quiet between timeouts: no storm of packets");
      to_responder_.deliver(0, 0, 0, [this](const wire::ParsedPacket& p) { arrive(p); });
      to_requester_.deliver(0, 0, 0, [this](const wire::ParsedPacket& p) { arrive(p); });
    }
  }

  // Headers for `opcode` with exactly the extended headers it carries.
  wire::Headers forged(uint8_t opcode, uint32_t psn, uint8_t flags, const wire::OpcodeInfo& info, Reader& in) {
    wire::Headers h;
    h.bth.opcode = opcode;
    h.bth.psn = psn & kPsnMask;
    h.bth.ack_req = (flags & 1) != 0;
    h.bth.solicited = (flags & 2) != 0;
    // The selective-recovery marks (transport/selective.hpp): a forged hole
    // report, a request claiming to be a resend or a selective requester.
    h.bth.reserved7 = static_cast<uint8_t>((flags >> 2) & 7);
    const uint8_t remote_kind = in.u8();
    const uint16_t offset = in.u16();
    const uint8_t rkey_kind = in.u8();
    const uint8_t length_kind = in.u8();
    const uint64_t value = in.u8();
    const uint32_t length = static_cast<uint32_t>(length_kind == 0xFF ? 0xFFFFFFFF : length_of(length_kind, offset, setup_.mtu));
    if (info.headers.reth) h.reth = wire::Reth{remote_address(remote_kind, offset, length), rkey_of(rkey_kind), length};
    if (info.headers.atomic_eth)
      h.atomic_eth = wire::AtomicEth{remote_address(remote_kind, offset, 8), rkey_of(rkey_kind), value & 0xF, value >> 4};
    if (info.headers.aeth) {
      const uint8_t s = static_cast<uint8_t>(value);
      wire::Syndrome syndrome = wire::Syndrome::ack(wire::Syndrome::kNoCredits);
      switch (flags >> 5) {
        case 1:
          syndrome = wire::Syndrome::rnr_nak(s & 31);
          break;
        case 2:
          syndrome = wire::Syndrome::nak(wire::NakCode::kPsnSequenceError);
          break;
        case 3:
          syndrome = wire::Syndrome::nak(static_cast<wire::NakCode>(s % 5));
          break;
        case 4:
          syndrome = wire::Syndrome::from_byte(s);
          break;
        default:
          break;
      }
      h.aeth = wire::Aeth{syndrome, offset};
    }
    if (info.headers.atomic_ack_eth) h.atomic_ack_eth = wire::AtomicAckEth{value * 0x0101010101010101ULL};
    if (info.headers.immdt) h.immdt = wire::ImmDt{static_cast<uint32_t>(value)};
    if (info.headers.ieth) h.ieth = wire::Ieth{rkey_of(rkey_kind)};
    if (info.headers.deth) h.deth = wire::Deth{0x11, kRequesterQpn};
    return h;
  }

  // Encodes and parses a forged packet, then hands it over.
  void forge(uint8_t opcode, uint32_t psn, uint8_t flags, Reader& in) {
    const auto info = wire::opcode_info(opcode);
    if (!info) return;
    wire::Headers h = forged(opcode, psn, flags, *info, in);
    const uint8_t size_kind = in.u8();
    h.bth.dest_qpn = info->operation == wire::Operation::kAcknowledge ||
                             info->operation == wire::Operation::kAtomicAcknowledge ||
                             info->operation == wire::Operation::kRdmaReadResponse
                         ? kRequesterQpn
                         : kResponderQpn;
    std::size_t size = 0;
    if (info->payload == wire::PayloadRule::kAtomicValue) size = 8;
    if (info->payload == wire::PayloadRule::kData) size = std::min<uint64_t>(length_of(size_kind, size_kind, setup_.mtu), wire::kMaxPayload);
    std::vector<uint8_t> payload(size, static_cast<uint8_t>(size_kind ^ 0x3C));
    // Who sent it (issue #40): mostly the QP's peer, to the QP's address;
    // else a third host, the peer to another address of the QP's host, or
    // the peer in another partition. Only what the udp link's gate takes
    // (UdpLink::handle: the P_Key, then the addresses) reaches the flows.
    const bool to_requester = h.bth.dest_qpn == kRequesterQpn;
    const uint8_t origin = in.u8();
    const uint8_t(&own)[16] = to_requester ? kRequesterAddress : kResponderAddress;
    const uint8_t(&peer)[16] = to_requester ? kResponderAddress : kRequesterAddress;
    wire::Gid src = gid(peer), dst = gid(own);
    switch (origin % 8) {
      case 5:
        src = gid(kStrangerAddress);
        break;
      case 6:
        dst = gid(kOtherOwnAddress);
        break;
      case 7: {
        static constexpr uint16_t kForeign[] = {0x1234, 0x9234, 0x0000, 0x8000, 0x7FFE, 0xFFFE};
        h.bth.pkey = kForeign[origin / 8 % std::size(kForeign)];
        break;
      }
      default:
        break;
    }
    const bool from_the_peer = origin % 8 < 5;
    untrusted_ = true;
    PacketQueue::hand(encode_packet(h, payload), [&](const wire::ParsedPacket& p) {
      const bool taken = transport::pkey_matches(p.headers.bth.pkey, transport::kDefaultPkey) &&
                         transport::from_peer(src, dst, own, peer);
      if (taken != from_the_peer)
        broken(from_the_peer ? "the gate refuses the peer's own packets" : "the gate takes only the peer's packets");
      if (!taken) {
        ++stats.refused;
        return;
      }
      arrive(p);
    });
    untrusted_ = false;
  }

  static wire::Gid gid(const uint8_t* address) {
    wire::Gid g;
    std::memcpy(g.data(), address, g.size());
    return g;
  }

  // A PSN near `base`: on it, just before or after, or anywhere.
  static uint32_t near(uint32_t base, uint8_t d) {
    switch (d % 4) {
      case 0:
        return base;
      case 1:
        return psn_add(base, kPsnMask - d / 4 % 16);  // base - 1 - n
      case 2:
        return psn_add(base, 1 + d / 4 % 16);
      default:
        return (d * 0x010101U) & kPsnMask;
    }
  }

  void forge_request(Reader& in) {
    static constexpr uint8_t kRequests[] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A,
                                            0x0B, 0x0C, 0x13, 0x14, 0x16, 0x17, 0x1D, 0x20, 0x21, 0x22, 0x23,
                                            0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2A, 0x2B, 0x0C, 0x13, 0x14};
    const uint8_t opcode = kRequests[in.u8() % std::size(kRequests)];
    const uint32_t psn = near(responder_.expected_psn(), in.u8());
    forge(opcode, psn, in.u8(), in);
  }

  void forge_response(Reader& in) {
    static constexpr uint8_t kResponses[] = {0x11, 0x11, 0x11, 0x12, 0x0D, 0x0E, 0x0F, 0x10};
    const uint8_t opcode = kResponses[in.u8() % std::size(kResponses)];
    const uint8_t where = in.u8();
    // Around what the requester has outstanding: its oldest message, or its next PSN.
    const uint32_t base = (where & 0x80) && !ledger_.empty() ? ledger_.oldest().first_psn : requester_.next_psn();
    forge(opcode, near(base, where & 0x7F), in.u8(), in);
  }

  void post_receive(Reader& in) {
    const uint8_t where = in.u8();
    const uint16_t offset = in.u16();
    const uint8_t length_kind = in.u8();
    const uint8_t lkey_kind = in.u8();
    ReceiveWqe wqe;
    wqe.wr_id = next_wr_id_++;
    wqe.num_sge = 1 + (lkey_kind >> 6) % 3;
    for (uint32_t i = 0; i < wqe.num_sge; ++i) {
      const uint64_t length = length_of(length_kind + i, offset, setup_.mtu);
      wqe.sge[i] = ReceiveSge{remote_address(where + i, static_cast<uint16_t>(offset * (i + 1)), length),
                              static_cast<uint32_t>(length), rkey_of(lkey_kind + i)};
    }
    port_.fake().receives.push_back(wqe);
  }

  void keys(Reader& in) {
    switch (in.u8() % 4) {
      case 0:
        port_.deregister(kKey);
        break;
      case 1:
        port_.deregister_all();
        break;
      default:
        port_.register_all();
        break;
    }
  }

  void abort_requester() {
    step_ends();  // what completed before the teardown is still reported
    requester_.abort();
    ledger_.aborted();
    aborted_ = true;
    if (requester_.deadline() != 0) broken("an aborted requester has no timer");
  }

  template <typename Config>
  static Config counted(Config config, Counters* into) {
    config.counters = CounterSink(into, nullptr);
    return config;
  }

  Setup setup_;
  // What the flows count (their only record of retransmissions, duplicates
  // and PSN gaps), for the run's statistics.
  Counters requester_counts_{};
  Counters responder_counts_{};
  CheckedPort port_;
  PacketQueue to_responder_, to_requester_;
  RequesterFlow requester_;
  ResponderFlow responder_;
  RequesterLedger ledger_;
  bool selective_answer_seen_ = false;  // an answer marked kSelective reached the requester
  uint64_t now_ = 0;
  uint32_t next_position_ = 0;
  uint64_t next_wr_id_ = 1;
  bool aborted_ = false;
  bool untrusted_ = false;  // the packet arriving was forged or corrupted
  bool desynced_ = false;   // such a packet moved the responder's expected PSN
};

}  // namespace
}  // namespace softhca::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace softhca::fuzz;
  script::Reader in(std::span<const uint8_t>(data, size));
  const Setup setup = read_setup(in);
  TRACE("%s mtu %u psn 0x%06x retry %u rnr %u timeout %u resources %u access 0x%x\n", setup.reliable ? "RC" : "UC",
        setup.mtu, setup.requester.start_psn, setup.requester.retry_cnt, setup.requester.rnr_retry,
        setup.requester.timeout, setup.responder.resources, setup.access);
  Session session(setup);
  for (std::size_t steps = 0; steps < kMaxSteps && !in.done(); ++steps) session.step(in);
  session.drain();
  return 0;
}
