// The cases the client runs and the server checks: one operation on one
// transport, `count` messages of `size` bytes posted together. Everything a
// side needs to know about a case (patterns, immediates, atomic operands,
// layouts) follows from these few fields, so the out-of-band message that
// announces a case carries only them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pattern.hpp"

namespace integrity {

enum class Transport : uint8_t { kRc, kUc, kUd };
enum class Op : uint8_t { kSend, kSendImm, kWrite, kWriteImm, kRead, kFetchAdd, kCmpSwap };

struct Case {
  uint32_t index = 0;
  Transport transport = Transport::kRc;
  Op op = Op::kSend;
  uint32_t size = 0;
  uint32_t count = 1;
  uint64_t seed = 0;
};

const char* transport_name(Transport t);
const char* op_name(Op op);
std::string case_name(const Case& c);  // "RC RDMA_WRITE 1025 B x1"

bool is_atomic(Op op);
bool is_send(Op op);
bool has_imm(Op op);
// SEND, SEND_WITH_IMM and WRITE_WITH_IMM consume a receive at the server.
bool consumes_recv(Op op);

uint64_t message_seed(const Case& c, uint32_t i);
uint32_t imm_of(const Case& c, uint32_t i);  // network order, as ibv_send_wr wants it

// The layouts of message i's bytes: at the client (gather source, READ
// scatter target, atomic result) and at the server (receive scatter, WRITE
// and READ region, atomic slot). Messages lie one after another, each at
// i * layout.total; all atomics of a case act on one slot at the server.
Layout client_layout(const Case& c);
Layout server_layout(const Case& c);
size_t client_area(const Case& c);
size_t server_area(const Case& c);

// Atomics: the slot's value before the case, and for message i its operands
// and the original value it must return; the slot's value after all of them.
struct AtomicStep {
  uint64_t compare_add = 0, swap = 0, original = 0;
};
uint64_t atomic_initial(const Case& c);
AtomicStep atomic_step(const Case& c, uint32_t i);
uint64_t atomic_final(const Case& c);

struct Plan {
  uint32_t mtu = 1024;
  uint32_t max_size = 1u << 20;
  uint32_t max_read_size = 1u << 20;  // RDMA READs only
  bool rc_only = false;
  uint64_t seed = 1;
  uint32_t burst = 32;  // RC messages in flight together (UC and UD: half)
  long only = -1;       // >= 0: just that case (to replay one that failed)
};
// Every opcode at 0, 1, MTU-1, MTU, MTU+1, several MTUs, 64 KiB+1 and 1 MiB
// (up to max_size; UD up to the MTU), twice each on RC; then bursts of
// messages in flight together and chains of atomics on one slot.
std::vector<Case> make_cases(const Plan& plan);

// The largest area any case uses on either side (buffers are this large).
inline constexpr size_t kBufferBytes = (size_t{1} << 20) + (size_t{256} << 10);

}  // namespace integrity
