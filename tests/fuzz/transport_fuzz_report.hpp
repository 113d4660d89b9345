// What a run of transport_flows_fuzz.cpp tells a person: with
// TRANSPORT_FUZZ_TRACE=1, each step and packet of a reproducer on stderr;
// with TRANSPORT_FUZZ_STATS=1, at exit, how often the inputs reached the
// states worth reaching, so that a blind driver's run is judged by more
// than its count of inputs.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "wire/packet.hpp"

namespace softhca::fuzz {

// TRANSPORT_FUZZ_TRACE=1: what a reproducer does, step by step, on stderr.
inline bool tracing() {
  static const bool on = std::getenv("TRANSPORT_FUZZ_TRACE") != nullptr;
  return on;
}
#define TRACE(...)                                \
  do {                                            \
    if (tracing()) std::fprintf(stderr, __VA_ARGS__); \
  } while (0)

inline void trace_packet(const char* what, const wire::Headers& h) {
  if (!tracing()) return;
  std::fprintf(stderr, "  %s opcode 0x%02x psn 0x%06x%s", what, h.bth.opcode, h.bth.psn, h.bth.ack_req ? " ackreq" : "");
  if (h.bth.reserved7 != 0) std::fprintf(stderr, " marks 0x%x", h.bth.reserved7);
  if (h.aeth) std::fprintf(stderr, " aeth 0x%02x msn %u", h.aeth->syndrome.byte(), h.aeth->msn);
  if (h.reth) std::fprintf(stderr, " reth len %u", h.reth->dma_length);
  std::fprintf(stderr, "\n");
}

// Counted over a run, printed at exit.
struct Stats {
  uint64_t inputs = 0, completions = 0, error_completions = 0, retransmitted = 0, duplicates = 0,
           out_of_sequence = 0, naks = 0, rnr_naks = 0, read_responses = 0, atomic_acks = 0, wraps = 0,
           desynced = 0, aborted = 0, refused = 0;
  ~Stats() {
    if (std::getenv("TRANSPORT_FUZZ_STATS") == nullptr) return;
    std::fprintf(stderr,
                 "transport_flows stats: %llu inputs, %llu completions (%llu in error), %llu packets resent, "
                 "%llu duplicates and %llu out of sequence at the responder, %llu NAKs, %llu RNR NAKs, "
                 "%llu READ response packets, %llu atomic ACKs, %llu inputs across the PSN wrap, "
                 "%llu desynchronized by forgery, %llu aborted, %llu forged packets refused at the gate\n",
                 ull(inputs), ull(completions), ull(error_completions), ull(retransmitted), ull(duplicates),
                 ull(out_of_sequence), ull(naks), ull(rnr_naks), ull(read_responses), ull(atomic_acks), ull(wraps),
                 ull(desynced), ull(aborted), ull(refused));
  }
  static unsigned long long ull(uint64_t v) { return v; }
};
inline Stats stats;

}  // namespace softhca::fuzz
