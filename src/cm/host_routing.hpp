// Which process of this host a CM MAD from another host is for.
//
// Other hosts send every CM message to this host's QP1, and port 4791 is
// shared by all softhca processes of the host, so the process that receives
// a MAD is not necessarily the one it concerns. It finds that one here:
//  - a REQ or SIDR_REQ by the listener of its service ID and destination
//    address (the rdma_cm IP header of its private data), in the port table;
//  - every other message by the communication ID it names as ours (the
//    "remote comm ID", or the SIDR_REP's request ID): comm IDs carry the
//    port-table handle of the process that allocated them in their high
//    bits, so any process of the host can tell whose they are.
// A MAD for another process is relayed to it over the host's local CM
// transport (cm/transport.hpp) in an envelope that keeps the addresses it
// came with; the receiver answers the remote host itself.
//
// Pure: no I/O, no tables; unit-tested with crafted MADs.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "cm/port_table.hpp"
#include "cm/mad_codec.hpp"

namespace softhca::cm {

// ---- communication IDs ---------------------------------------------------------
// Port-table handles are 1..kMaxCmProcs (10 bits); the rest is a counter.
inline constexpr unsigned kCommIdCounterBits = 22;
inline constexpr uint32_t kCommIdCounterMask = (1u << kCommIdCounterBits) - 1;
static_assert(kMaxCmProcs < (1u << (32 - kCommIdCounterBits)));

// The comm ID numbered `counter` of the process with port-table handle
// `owner` (1..kMaxCmProcs). Never 0.
constexpr uint32_t make_comm_id(uint32_t owner, uint32_t counter) {
  return (owner << kCommIdCounterBits) | (counter & kCommIdCounterMask);
}
// The port-table handle of the process that allocated `comm_id` (0: none).
constexpr uint32_t comm_id_owner(uint32_t comm_id) { return comm_id >> kCommIdCounterBits; }

// ---- routes ---------------------------------------------------------------------

struct MadRoute {
  enum class By : uint8_t {
    kListener,  // a REQ or SIDR_REQ: to whoever listens at `listener`
    kCommId,    // to the owner of `comm_id`
    kNowhere,   // nothing on this host can be meant (undecodable, no IP header, no comm ID)
  };
  By by = By::kNowhere;
  BindKey listener{};    // kListener: port space, port and destination address
  uint32_t comm_id = 0;  // kCommId: ours, as the message names it
};

MadRoute route_of(const Mad& mad);

// ---- the relay envelope -----------------------------------------------------------
// A MAD from another host relayed to the process it concerns: a 4-byte tag,
// the sender's GID, the GID it was sent to, then the 256 MAD bytes. Local CM
// messages are bare MADs (256 bytes), so the length tells them apart.
struct RelayedMad {
  Gid remote{};  // the other host's address (as a GID)
  Gid local{};   // ours, as it addressed us
  MadBytes mad{};
};

inline constexpr std::size_t kRelayedMadSize = 4 + 16 + 16 + kMadSize;

std::vector<uint8_t> encode_relayed(const RelayedMad& relayed);
// nullopt when `bytes` is not an envelope (a bare MAD, or garbage).
std::optional<RelayedMad> decode_relayed(std::span<const uint8_t> bytes);

}  // namespace softhca::cm
