#include "cases.hpp"

#include <arpa/inet.h>

#include <algorithm>

namespace integrity {

const char* transport_name(Transport t) {
  switch (t) {
    case Transport::kRc: return "RC";
    case Transport::kUc: return "UC";
    case Transport::kUd: return "UD";
  }
  return "?";
}

const char* op_name(Op op) {
  switch (op) {
    case Op::kSend: return "SEND";
    case Op::kSendImm: return "SEND_WITH_IMM";
    case Op::kWrite: return "RDMA_WRITE";
    case Op::kWriteImm: return "RDMA_WRITE_WITH_IMM";
    case Op::kRead: return "RDMA_READ";
    case Op::kFetchAdd: return "ATOMIC_FETCH_AND_ADD";
    case Op::kCmpSwap: return "ATOMIC_CMP_AND_SWP";
  }
  return "?";
}

std::string case_name(const Case& c) {
  return std::string(transport_name(c.transport)) + " " + op_name(c.op) + " " + std::to_string(c.size) + " B x" +
         std::to_string(c.count);
}

bool is_atomic(Op op) { return op == Op::kFetchAdd || op == Op::kCmpSwap; }
bool is_send(Op op) { return op == Op::kSend || op == Op::kSendImm; }
bool has_imm(Op op) { return op == Op::kSendImm || op == Op::kWriteImm; }
bool consumes_recv(Op op) { return is_send(op) || op == Op::kWriteImm; }

uint64_t message_seed(const Case& c, uint32_t i) { return mix(c.seed ^ (uint64_t{i} << 40)); }
uint32_t imm_of(const Case& c, uint32_t i) { return htonl(static_cast<uint32_t>(mix(message_seed(c, i) + 1))); }

Layout client_layout(const Case& c) {
  if (is_atomic(c.op)) return single_layout(8);
  if (c.op == Op::kRead) return scatter_layout(c.size, 0);
  return gather_layout(c.size);
}

Layout server_layout(const Case& c) {
  if (is_atomic(c.op)) return single_layout(8);
  if (is_send(c.op)) return c.transport == Transport::kUd ? ud_layout(c.size, 100) : scatter_layout(c.size, 100);
  return single_layout(c.size);
}

size_t client_area(const Case& c) { return c.count * client_layout(c).total; }
size_t server_area(const Case& c) { return (is_atomic(c.op) ? 1 : c.count) * server_layout(c).total; }

uint64_t atomic_initial(const Case& c) { return mix(c.seed + 7); }

// Walks the chain up to message `upto` (exclusive); returns the slot's value
// there and, through *step, message upto's operands.
static uint64_t walk(const Case& c, uint32_t upto, AtomicStep* step) {
  uint64_t value = atomic_initial(c);
  for (uint32_t i = 0; i <= upto && i < c.count; ++i) {
    AtomicStep s;
    s.original = value;
    const uint64_t r = mix(message_seed(c, i));
    if (c.op == Op::kFetchAdd) {
      s.compare_add = r;
      value += r;
    } else {
      // Every other compare misses, so failed swaps (memory unchanged, the
      // original returned all the same) are checked too.
      const bool hit = i % 2 == 0;
      s.compare_add = hit ? value : value ^ (r | 1);
      s.swap = mix(r);
      if (hit) value = s.swap;
    }
    if (i == upto && step) *step = s;
  }
  return value;
}

AtomicStep atomic_step(const Case& c, uint32_t i) {
  AtomicStep s;
  walk(c, i, &s);
  return s;
}

uint64_t atomic_final(const Case& c) { return walk(c, c.count, nullptr); }

// All the cases, or the one numbered `only` (its seed as in the full run).
static std::vector<Case> pick(std::vector<Case>& cases, long only) {
  if (only < 0) return std::move(cases);
  if (static_cast<size_t>(only) >= cases.size()) return {};
  return {cases[static_cast<size_t>(only)]};
}

std::vector<Case> make_cases(const Plan& plan) {
  std::vector<Case> cases;
  auto add = [&](Transport t, Op op, uint32_t size, uint32_t count) {
    Case c;
    c.index = static_cast<uint32_t>(cases.size());
    c.transport = t;
    c.op = op;
    c.size = size;
    c.count = count;
    c.seed = mix(plan.seed * 1000003 + c.index);
    cases.push_back(c);
  };
  const uint32_t mtu = plan.mtu;
  std::vector<uint32_t> sizes;
  for (uint32_t s : {0u, 1u, mtu - 1, mtu, mtu + 1, 5 * mtu + 3, 65537u, 1u << 20}) {
    if (s <= plan.max_size) sizes.push_back(s);
  }
  const Op data_ops[] = {Op::kSend, Op::kSendImm, Op::kWrite, Op::kWriteImm, Op::kRead};
  // Twice each: the second message of a size follows on the same connection.
  for (int round = 0; round < 2; ++round) {
    for (Op op : data_ops) {
      for (uint32_t s : sizes) {
        if (op != Op::kRead || s <= plan.max_read_size) add(Transport::kRc, op, s, 1);
      }
    }
  }
  // Many messages in flight at once (sends, writes and reads interleave
  // their packets with the acknowledgements of earlier ones).
  for (Op op : data_ops) add(Transport::kRc, op, std::min(2 * mtu + 5, plan.max_size), plan.burst);
  add(Transport::kRc, Op::kFetchAdd, 8, 1);
  add(Transport::kRc, Op::kCmpSwap, 8, 1);  // compare hits
  add(Transport::kRc, Op::kCmpSwap, 8, 2);  // then misses
  add(Transport::kRc, Op::kFetchAdd, 8, 16);
  add(Transport::kRc, Op::kCmpSwap, 8, 16);
  if (plan.rc_only) return pick(cases, plan.only);
  const Op uc_ops[] = {Op::kSend, Op::kSendImm, Op::kWrite, Op::kWriteImm};
  for (Op op : uc_ops) {
    for (uint32_t s : sizes) {
      if (s <= 65537) add(Transport::kUc, op, s, 1);
    }
  }
  add(Transport::kUc, Op::kSend, 2 * mtu + 5, std::max(plan.burst / 2, 1u));
  add(Transport::kUc, Op::kWriteImm, 2 * mtu + 5, std::max(plan.burst / 2, 1u));
  for (Op op : {Op::kSend, Op::kSendImm}) {
    for (uint32_t s : {0u, 1u, mtu - 1, mtu}) add(Transport::kUd, op, s, 1);
  }
  add(Transport::kUd, Op::kSendImm, mtu, std::max(plan.burst / 2, 1u));
  return pick(cases, plan.only);
}

}  // namespace integrity
