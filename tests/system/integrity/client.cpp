// The client: the requester of every case. It announces a case, waits until
// the server has laid out its buffer and posted its receives, posts the
// case's messages as one chain and checks its own completions (and, for
// READs and atomics, the bytes and values that came back); the server
// checks the rest and reports its verdict.
#include <cstdio>
#include <cstring>

#include "peer.hpp"

namespace integrity {
namespace {

ibv_wr_opcode wr_opcode(Op op) {
  switch (op) {
    case Op::kSend: return IBV_WR_SEND;
    case Op::kSendImm: return IBV_WR_SEND_WITH_IMM;
    case Op::kWrite: return IBV_WR_RDMA_WRITE;
    case Op::kWriteImm: return IBV_WR_RDMA_WRITE_WITH_IMM;
    case Op::kRead: return IBV_WR_RDMA_READ;
    case Op::kFetchAdd: return IBV_WR_ATOMIC_FETCH_AND_ADD;
    case Op::kCmpSwap: return IBV_WR_ATOMIC_CMP_AND_SWP;
  }
  return IBV_WR_SEND;
}

ibv_wc_opcode wc_opcode(Op op) {
  switch (op) {
    case Op::kSend:
    case Op::kSendImm: return IBV_WC_SEND;
    case Op::kWrite:
    case Op::kWriteImm: return IBV_WC_RDMA_WRITE;
    case Op::kRead: return IBV_WC_RDMA_READ;
    case Op::kFetchAdd: return IBV_WC_FETCH_ADD;
    case Op::kCmpSwap: return IBV_WC_COMP_SWAP;
  }
  return IBV_WC_SEND;
}

class Client {
 public:
  Client(Host& host, const Endpoint& peer, const PeerOptions& options) : host_(host), peer_(peer), options_(options) {}

  // Posts the case's messages from `at` in the buffer and checks the
  // completions and the bytes that came back; empty when all is right.
  std::string run(const Case& c, size_t at = 0, size_t remote_at = 0) {
    const Layout local = client_layout(c);
    const Layout remote = server_layout(c);
    uint8_t* area = host_.buffer() + at;
    for (uint32_t i = 0; i < c.count; ++i) {
      std::span<uint8_t> mine{area + i * local.total, local.total};
      if (c.op == Op::kRead || is_atomic(c.op)) {
        std::memset(mine.data(), kGuard, mine.size());
      } else {
        place(mine, local, pattern(c.size, message_seed(c, i)));
      }
    }
    std::vector<ibv_send_wr> wrs(c.count);
    std::vector<ibv_sge> sges(c.count * 3);
    for (uint32_t i = 0; i < c.count; ++i) {
      ibv_send_wr& wr = wrs[i];
      wr.wr_id = (uint64_t{c.index} << 16) | i;
      wr.opcode = wr_opcode(c.op);
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.sg_list = &sges[3 * i];
      wr.num_sge = static_cast<int>(local.regions.size());
      for (size_t r = 0; r < local.regions.size(); ++r) {
        sges[3 * i + r] = host_.sge(at + i * local.total + local.regions[r].first, local.regions[r].second);
      }
      if (has_imm(c.op)) wr.imm_data = imm_of(c, i);
      const size_t target = remote_at + (is_atomic(c.op) ? 0 : i * remote.total) + remote.regions[0].first;
      if (is_atomic(c.op)) {
        const AtomicStep step = atomic_step(c, i);
        wr.wr.atomic.remote_addr = peer_.addr + target;
        wr.wr.atomic.rkey = peer_.rkey;
        wr.wr.atomic.compare_add = step.compare_add;
        wr.wr.atomic.swap = step.swap;
      } else if (c.transport == Transport::kUd) {
        wr.wr.ud.ah = host_.ah();
        wr.wr.ud.remote_qpn = peer_.ud_qpn;
        wr.wr.ud.remote_qkey = kQkey;
      } else if (!is_send(c.op)) {
        wr.wr.rdma.remote_addr = peer_.addr + target;
        wr.wr.rdma.rkey = peer_.rkey;
      }
      wr.next = i + 1 < c.count ? &wrs[i + 1] : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    if (int err = ibv_post_send(host_.qp(c.transport), wrs.data(), &bad)) {
      return std::string("ibv_post_send failed: ") + std::strerror(err);
    }
    std::vector<ibv_wc> wcs;
    const bool all = poll_cq(host_.send_cq(), c.count, wcs, Clock::now() + options_.op_timeout);
    for (size_t i = 0; i < wcs.size(); ++i) {
      if (std::string e = check_send(c, static_cast<uint32_t>(i), wcs[i]); !e.empty()) {
        return "send completion " + std::to_string(i) + ": " + e;
      }
      last_success_ = Clock::now();
    }
    if (!all) {
      return std::to_string(wcs.size()) + " of " + std::to_string(c.count) + " send completions within " +
             std::to_string(options_.op_timeout.count()) + " ms";
    }
    return check_area(c, area);
  }

  Clock::time_point last_success() const { return last_success_; }

 private:
  std::string check_send(const Case& c, uint32_t i, const ibv_wc& wc) {
    const uint32_t byte_len = c.op == Op::kRead ? c.size : is_atomic(c.op) ? 8 : wc.byte_len;
    if (wc.status == IBV_WC_SUCCESS && wc.wr_id == ((uint64_t{c.index} << 16) | i) && wc.opcode == wc_opcode(c.op) &&
        wc.qp_num == host_.qp(c.transport)->qp_num && wc.byte_len == byte_len) {
      return {};
    }
    const auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - last_success_);
    // byte_len is defined for READs and atomics only.
    const std::string len = c.op == Op::kRead || is_atomic(c.op) ? ", byte_len " + std::to_string(byte_len) : "";
    char more[160];
    std::snprintf(more, sizeof more, " (want opcode %s%s); %lld ms after the last successful completion",
                  wc_opcode_name(wc_opcode(c.op)), len.c_str(), static_cast<long long>(quiet.count()));
    return describe(wc) + more;
  }

  // What READs and atomics brought back: the pattern through the scatter,
  // or each atomic's original value, guards around it.
  std::string check_area(const Case& c, const uint8_t* area) {
    if (c.op != Op::kRead && !is_atomic(c.op)) return {};
    const Layout local = client_layout(c);
    std::vector<uint8_t> want(client_area(c));
    for (uint32_t i = 0; i < c.count; ++i) {
      std::span<uint8_t> slot{want.data() + i * local.total, local.total};
      if (c.op == Op::kRead) {
        place(slot, local, pattern(c.size, message_seed(c, i)));
      } else {
        const uint64_t original = atomic_step(c, i).original;
        place(slot, local, {reinterpret_cast<const uint8_t*>(&original), 8});
      }
    }
    const Mismatch m = compare({area, want.size()}, want);
    return m ? "returned bytes: " + describe(m, want.size()) : std::string();
  }

  Host& host_;
  const Endpoint& peer_;
  const PeerOptions& options_;
  Clock::time_point last_success_ = Clock::now();
};

uint64_t payload_bytes(const Case& c) { return uint64_t{c.count} * (is_atomic(c.op) ? 8 : c.size); }

// The end of a run: says goodbye and reads the server's verdict on all it
// checked; false (and the reason printed) unless it found no errors.
bool server_found_no_errors(Channel& channel, const PeerOptions& options) {
  Msg bye;
  bye.type = MsgType::kBye;
  std::string error = channel.send(bye);
  auto summary = error.empty() ? channel.recv(Clock::now() + options.op_timeout) : std::unexpected(error);
  if (!summary || summary->w[0] != 0) {
    std::printf("integrity: FAILED: the server %s\n", summary ? "found errors" : summary.error().c_str());
    return false;
  }
  return true;
}

// The cases, each announced to and judged by the server as well.
int run_cases(Client& client, Channel& channel, const PeerOptions& options) {
  const std::vector<Case> cases = make_cases(options.plan);
  uint64_t ops = 0, bytes = 0;
  for (const Case& c : cases) {
    Msg announce;
    announce.type = MsgType::kCase;
    announce.w[0] = c.index;
    announce.w[1] = static_cast<uint64_t>(c.transport);
    announce.w[2] = static_cast<uint64_t>(c.op);
    announce.w[3] = c.size;
    announce.w[4] = c.count;
    announce.w[5] = c.seed;
    std::string error = channel.send(announce);
    auto ready = error.empty() ? channel.recv(Clock::now() + options.op_timeout) : std::unexpected(error);
    if (!ready) error = ready.error();
    else if (ready->type != MsgType::kReady || !ready->w[0]) error = "the server could not set up: " + ready->text;
    const std::string mine = error.empty() ? client.run(c) : std::string();
    if (error.empty()) {
      Msg done;
      done.type = MsgType::kDone;
      done.w[0] = mine.empty();
      error = channel.send(done);
      auto verdict = error.empty() ? channel.recv(Clock::now() + 2 * options.op_timeout) : std::unexpected(error);
      if (!verdict) error = verdict.error();
      else if (!verdict->w[0]) error = "server: " + verdict->text;
    }
    if (!mine.empty()) error = "client: " + mine + (error.empty() ? "" : "; " + error);
    if (!error.empty()) {
      std::printf("integrity: FAILED at case %u of %zu (%s): %s\n", c.index, cases.size(), case_name(c).c_str(),
                  error.c_str());
      return 1;
    }
    ops += c.count;
    bytes += payload_bytes(c);
  }
  if (!server_found_no_errors(channel, options)) return 1;
  std::printf("integrity: %zu cases, %llu operations, %llu bytes, all correct\n", cases.size(),
              static_cast<unsigned long long>(ops), static_cast<unsigned long long>(bytes));
  return 0;
}

// For a while, a 64 KiB+3 RDMA WRITE and a READ of it back into another
// place, checked byte by byte, with no out-of-band traffic at all: the run
// a test can kill the server's host under (the client then reports how its
// QP failed and when).
int run_soak(Client& client, Channel& channel, const PeerOptions& options) {
  const auto end = Clock::now() + std::chrono::seconds(options.soak_seconds);
  uint64_t ops = 0, bytes = 0;
  Case write{.index = 0, .transport = Transport::kRc, .op = Op::kWrite, .size = 65539, .count = 1, .seed = 0};
  for (uint32_t k = 0; Clock::now() < end; ++k) {
    write.index = 2 * k;
    write.seed = mix(options.plan.seed + k);
    Case read = write;
    read.index = 2 * k + 1;
    read.op = Op::kRead;
    // The READ returns the bytes the WRITE put there: both seeds the same.
    std::string error = client.run(write);
    if (error.empty()) error = client.run(read, client_area(write));
    if (!error.empty()) {
      std::printf("integrity: FAILED during the soak after %llu operations: %s\n",
                  static_cast<unsigned long long>(ops), error.c_str());
      return 1;
    }
    ops += 2;
    bytes += 2 * payload_bytes(write);
  }
  if (!server_found_no_errors(channel, options)) return 1;
  std::printf("integrity: soak of %d s, %llu operations, %llu bytes, all correct\n", options.soak_seconds,
              static_cast<unsigned long long>(ops), static_cast<unsigned long long>(bytes));
  return 0;
}

}  // namespace

int run_client(Host& host, Channel& channel, const Endpoint& peer, const PeerOptions& options) {
  Client client(host, peer, options);
  return options.soak_seconds > 0 ? run_soak(client, channel, options) : run_cases(client, channel, options);
}

}  // namespace integrity
