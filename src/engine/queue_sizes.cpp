#include "engine/queue_sizes.hpp"

#include <algorithm>
#include <bit>

#include "common/limits.hpp"

namespace softhca::engine {
namespace {

constexpr uint32_t kBlockBytes = 64;        // a send WQE basic block
constexpr uint32_t kControlBytes = 16;      // control segment
constexpr uint32_t kRemoteAddrBytes = 16;   // RETH-like segment of RC/UC
constexpr uint32_t kDatagramBytes = 48;     // address vector segment of UD
constexpr uint32_t kDataSegBytes = 16;      // one SGE
constexpr uint32_t kInlineHeaderBytes = 4;

uint32_t header_bytes(ibv_qp_type type) {
  return kControlBytes + (type == IBV_QPT_UD ? kDatagramBytes : kRemoteAddrBytes);
}

uint32_t round_up(uint32_t value, uint32_t to) { return (value + to - 1) / to * to; }

}  // namespace

CqSize cq_size_for(uint32_t cqe) {
  const uint32_t slots = std::bit_ceil(cqe + 1);
  return {slots, slots - 1};
}

SendQueueSize send_queue_size_for(ibv_qp_type type, uint32_t max_send_wr, uint32_t max_send_sge,
                                  uint32_t max_inline_data) {
  const uint32_t header = header_bytes(type);
  const uint32_t gather = header + max_send_sge * kDataSegBytes;
  const uint32_t inline_wqe = max_inline_data ? header + round_up(kInlineHeaderBytes + max_inline_data, 16) : 0;
  const uint32_t wqe = round_up(std::max(gather, inline_wqe), kBlockBytes);
  const uint32_t room = std::min(wqe - header - kInlineHeaderBytes, limits::kMaxInlineData);
  SendQueueSize size{0, std::max(room, max_inline_data), wqe};
  if (max_send_wr == 0) return size;
  const uint64_t ring = std::bit_ceil(uint64_t{max_send_wr} * wqe);
  const uint64_t fits = std::min<uint64_t>(ring / wqe, static_cast<uint64_t>(limits::kMaxQpWr));
  size.max_send_wr = static_cast<uint32_t>(std::max<uint64_t>(fits, max_send_wr));
  return size;
}

uint32_t recv_queue_size_for(uint32_t max_recv_wr) { return max_recv_wr == 0 ? 0 : std::bit_ceil(max_recv_wr); }

uint32_t recv_ring_slots_for(uint32_t max_recv_wr) {
  // Enough spare slots that the one posted into is a few cache lines behind
  // the one taken, whatever the WQE's size (at least 32 bytes).
  constexpr uint32_t kSpareSlots = 8;
  return std::bit_ceil(max_recv_wr + kSpareSlots);
}

uint32_t srq_size_for(uint32_t max_wr) { return std::bit_ceil(max_wr + 1) - 1; }

}  // namespace softhca::engine
