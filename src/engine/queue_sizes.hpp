// The sizes a queue really gets for what an application asks, following the
// rules of mlx5 (ConnectX), the RDMA device most programs are tested on:
// queues are rings of power-of-two length, the caps returned to the caller say
// what was granted, and a program that is correct on ConnectX fits on softhca.
//
//  - CQ: a ring of bit_ceil(cqe + 1) slots, reported as that minus one (cqe 2
//    gives 4 slots and reports 3), so a CQ can hold one more completion than
//    its queues' depth before it overruns.
//  - Receive queue: bit_ceil(max_recv_wr) WQEs, reported as such (its ring
//    has more slots: recv_ring_slots_for).
//  - SRQ: bit_ceil(max_wr + 1) WQEs with one kept spare, reported minus one
//    (its ring, too, has more slots).
//  - Send queue: WQEs are built of 64-byte blocks: a header (control segment
//    plus the transport's address segment), then the data segments (16 bytes
//    each) or the inline data (after a 4-byte inline header). The inline room
//    is what that WQE has anyway, so a 1-SGE RC QP created with
//    max_inline_data 0 still takes a 16-byte inline send, as ConnectX and rxe
//    do. The ring is a power of two of bytes; the WRs reported are the WQEs
//    that fit in it, never fewer than asked for.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace softhca::engine {

struct CqSize {
  uint32_t slots;     // ring length (a power of two)
  uint32_t reported;  // ibv_cq.cqe
};
CqSize cq_size_for(uint32_t cqe);

struct SendQueueSize {
  uint32_t max_send_wr;      // granted WRs (0 when 0 was asked for)
  uint32_t max_inline_data;  // granted inline bytes, at least what was asked for
  uint32_t wqe_bytes;        // the modelled WQE size, a multiple of 64
};
// `max_send_sge` >= 1. The caller has checked each request against the device limits.
SendQueueSize send_queue_size_for(ibv_qp_type type, uint32_t max_send_wr, uint32_t max_send_sge,
                                  uint32_t max_inline_data);

uint32_t recv_queue_size_for(uint32_t max_recv_wr);
uint32_t srq_size_for(uint32_t max_wr);

// The slots of a receive ring (a QP's or an SRQ's) for `max_recv_wr` WQEs:
// more than it can hold at once. A program that keeps its queue full (posts a
// receive for each one completed, as perftest and most servers do) would
// otherwise always post into the slot a sender has just read, whose line is
// then in the sender's cache: every post waited for that line's trip
// back, and every SEND for its trip out again. With slots to spare, the post
// lands in a slot read a whole queue ago (docs/performance.md, "Session 22").
uint32_t recv_ring_slots_for(uint32_t max_recv_wr);

}  // namespace softhca::engine
