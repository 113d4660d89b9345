// Selective recovery between two softhca ends of an RC connection: an
// extension IBTA leaves room for in the BTH's reserved bits, used only
// when both ends show it, so that a real RoCE NIC or rxe at either end
// sees plain IBTA go-back-N.
//
// Go-back-N loses a round trip and a window per lost packet: the responder
// drops everything behind a gap and can NAK only the PSN it expects, one
// gap per round trip. At 1% loss a fast path meets about one loss per
// round trip's worth of packets, so the requester spends most of its time
// waiting or resending what had arrived (docs/performance.md). Here the
// responder keeps the packets behind a gap (up to kKeepPackets PSNs past
// the one it expects) and runs them in PSN order once the gap fills, so
// nothing lands early; it reports each gap once, when the packet after it
// shows it, as a sequence NAK whose PSN is the gap's first and whose MSN
// field is its length, marked kHoleReport. The requester resends just
// those packets, marked kResent, and keeps sending new ones meanwhile.
//
// A resend that is lost again shows itself without a clock: the requester
// resends holes in the order it hears of them, so when the resend of a
// hole reported later arrives while an earlier-reported one is still
// missing, that one's resend was lost (or is late), and the responder
// reports it again. A lost resend of the last hole has nothing after it:
// the requester's tail probe resends the oldest unacknowledged packet
// marked kTailProbe, and the responder answers it by reporting every hole
// it still has (after a millisecond of silence every resend sent has
// arrived or is lost).
#pragma once

#include <cstdint>

namespace softhca::transport {

// In wire::Bth::reserved7.
// On a request: its requester recovers selectively. On an answer: its
// responder keeps packets past a gap (it saw kSelective on a request at
// the PSN it expected: ResponderFlow::receive).
inline constexpr uint8_t kSelective = 0x01;
// On a request: a packet sent before (a resend of a hole or a go-back-N).
inline constexpr uint8_t kResent = 0x02;
// On a sequence NAK: a hole report (PSN: its first; MSN: its length), which
// acknowledges nothing.
inline constexpr uint8_t kHoleReport = 0x04;
// On a request: sent by the tail probe; report every hole still open. A
// READ request so marked that repeats a READ already taken is answered
// with its first response packet alone (an ONLY): the probe asks whether
// the READ came, and a READ that is still being answered (a responder that
// is slow, not a packet lost) was otherwise answered twice.
inline constexpr uint8_t kTailProbe = 0x08;

// PSNs past the expected one the responder keeps packets for; the
// requester's window towards such a responder (never more in flight than
// it keeps, or the excess is dropped and resent).
inline constexpr uint32_t kKeepPackets = 512;

}  // namespace softhca::transport
