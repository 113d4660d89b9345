// The server: the responder of every case. It lays out its buffer and posts
// its receives as the client announces a case, then checks what arrived:
// every receive completion's fields and every byte of the case's area,
// guards included, and reports a verdict.
#include <cstdio>
#include <cstring>
#include <thread>

#include "peer.hpp"

namespace integrity {
namespace {

Case case_of(const Msg& m) {
  Case c;
  c.index = static_cast<uint32_t>(m.w[0]);
  c.transport = static_cast<Transport>(m.w[1]);
  c.op = static_cast<Op>(m.w[2]);
  c.size = static_cast<uint32_t>(m.w[3]);
  c.count = static_cast<uint32_t>(m.w[4]);
  c.seed = m.w[5];
  return c;
}

// What the case's area must hold once it is done (before, for a READ).
std::vector<uint8_t> expected_area(const Case& c) {
  const Layout layout = server_layout(c);
  std::vector<uint8_t> area(server_area(c));
  if (is_atomic(c.op)) {
    const uint64_t value = atomic_final(c);
    std::memset(area.data(), kGuard, area.size());
    std::memcpy(area.data() + layout.regions[0].first, &value, 8);
    return area;
  }
  const size_t first = c.transport == Transport::kUd ? 1 : 0;
  for (uint32_t i = 0; i < c.count; ++i) {
    place({area.data() + i * layout.total, layout.total}, layout, pattern(c.size, message_seed(c, i)), first);
  }
  return area;
}

class Server {
 public:
  Server(Host& host, const Endpoint& peer, const PeerOptions& options) : host_(host), peer_(peer), options_(options) {}

  // Empty, or why the case could not be set up.
  std::string prepare(const Case& c) {
    if (server_area(c) > kBufferBytes || c.count > kQueueDepth) return "case too large for the buffer or queues";
    const Layout layout = server_layout(c);
    uint8_t* area = host_.buffer();
    std::memset(area, kGuard, server_area(c));
    if (c.op == Op::kRead) {
      const std::vector<uint8_t> image = expected_area(c);
      std::memcpy(area, image.data(), image.size());
    }
    if (is_atomic(c.op)) {
      const uint64_t initial = atomic_initial(c);
      std::memcpy(area + layout.regions[0].first, &initial, 8);
    }
    if (!consumes_recv(c.op)) return {};
    for (uint32_t i = 0; i < c.count; ++i) {
      std::vector<ibv_sge> sges;
      if (is_send(c.op)) {
        for (auto [off, len] : layout.regions) sges.push_back(host_.sge(i * layout.total + off, len));
      }
      ibv_recv_wr wr{};
      wr.wr_id = (uint64_t{c.index} << 16) | i;
      wr.sg_list = sges.data();
      wr.num_sge = static_cast<int>(sges.size());
      ibv_recv_wr* bad = nullptr;
      if (int err = ibv_post_recv(host_.qp(c.transport), &wr, &bad)) {
        return std::string("ibv_post_recv failed: ") + std::strerror(err);
      }
    }
    return {};
  }

  // Empty when every receive completion and every byte is right.
  std::string check(const Case& c, bool client_ok) {
    // A client whose own completions failed may never have sent: look
    // without waiting.
    const auto deadline = Clock::now() + (client_ok ? options_.op_timeout : std::chrono::milliseconds(0));
    if (consumes_recv(c.op)) {
      std::vector<ibv_wc> wcs;
      if (!poll_cq(host_.recv_cq(), c.count, wcs, deadline)) {
        return std::to_string(wcs.size()) + " of " + std::to_string(c.count) + " receive completions came";
      }
      for (uint32_t i = 0; i < c.count; ++i) {
        if (std::string e = check_recv(c, i, wcs[i]); !e.empty()) return "receive " + std::to_string(i) + ": " + e;
      }
    }
    std::vector<uint8_t> want = expected_area(c);
    std::span<const uint8_t> got{host_.buffer(), want.size()};
    if (c.transport == Transport::kUd) {
      if (std::string e = check_ud_grhs(c, want); !e.empty()) return e;
    }
    Mismatch m = compare(got, want);
    // UC writes without an immediate complete at the client once sent: their
    // bytes may still be on the way.
    while (m && c.transport == Transport::kUc && c.op == Op::kWrite && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      m = compare(got, want);
    }
    if (m) return "memory: " + describe(m, want.size());
    ibv_wc extra;
    if (ibv_poll_cq(host_.recv_cq(), 1, &extra) > 0) return "an unexpected receive completion: " + describe(extra);
    return {};
  }

 private:
  std::string check_recv(const Case& c, uint32_t i, const ibv_wc& wc) {
    const uint32_t grh = c.transport == Transport::kUd ? 40 : 0;
    const ibv_wc_opcode opcode = c.op == Op::kWriteImm ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
    const bool ok = wc.status == IBV_WC_SUCCESS && wc.wr_id == ((uint64_t{c.index} << 16) | i) &&
                    wc.opcode == opcode && wc.byte_len == c.size + grh &&
                    wc.qp_num == host_.qp(c.transport)->qp_num &&
                    ((wc.wc_flags & IBV_WC_WITH_IMM) != 0) == has_imm(c.op) &&
                    (!has_imm(c.op) || wc.imm_data == imm_of(c, i)) &&
                    ((wc.wc_flags & IBV_WC_GRH) != 0) == (grh != 0) &&
                    (c.transport != Transport::kUd || wc.src_qp == peer_.ud_qpn);
    if (ok) return {};
    char want[200];
    std::snprintf(want, sizeof want, " (want wr_id 0x%llx, opcode %s, byte_len %u, imm 0x%x, src_qp 0x%x; got imm 0x%x, "
                  "flags 0x%x, qp 0x%x, src_qp 0x%x)",
                  static_cast<unsigned long long>((uint64_t{c.index} << 16) | i), wc_opcode_name(opcode),
                  c.size + grh, has_imm(c.op) ? imm_of(c, i) : 0, peer_.ud_qpn, wc.imm_data, wc.wc_flags, wc.qp_num,
                  wc.src_qp);
    return describe(wc) + want;
  }

  // The 40 bytes before each UD message: for RoCEv2 over IPv4, 20 unused
  // bytes and the packet's IPv4 header; over IPv6, its IPv6 header. Checked
  // field by field (the source and destination addresses are the two GIDs),
  // then copied into `want` so the byte comparison skips them.
  std::string check_ud_grhs(const Case& c, std::vector<uint8_t>& want) {
    const Layout layout = server_layout(c);
    const uint8_t* src = peer_.gid.raw;
    const uint8_t* dst = host_.self().gid.raw;
    const bool v4 = std::memcmp(src, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0;
    for (uint32_t i = 0; i < c.count; ++i) {
      const size_t at = i * layout.total + layout.regions[0].first;
      uint8_t* g = host_.buffer() + at;
      const bool ok = v4 ? g[20] == 0x45 && g[29] == 17 && std::memcmp(g + 32, src + 12, 4) == 0 &&
                               std::memcmp(g + 36, dst + 12, 4) == 0
                         : (g[0] >> 4) == 6 && std::memcmp(g + 8, src, 16) == 0 && std::memcmp(g + 24, dst, 16) == 0;
      if (!ok) return "message " + std::to_string(i) + ": the GRH does not name the two hosts";
      std::memcpy(want.data() + at, g, 40);
    }
    return {};
  }

  Host& host_;
  const Endpoint& peer_;
  const PeerOptions& options_;
};

}  // namespace

int run_server(Host& host, Channel& channel, const Endpoint& peer, const PeerOptions& options) {
  Server server(host, peer, options);
  Case current;
  uint64_t cases = 0, failures = 0;
  for (;;) {
    auto m = channel.recv(Clock::now() + options.idle_timeout);
    if (!m) {
      std::printf("integrity server: %s\n", m.error().c_str());
      return 1;
    }
    Msg reply;
    if (m->type == MsgType::kCase) {
      current = case_of(*m);
      const std::string error = server.prepare(current);
      reply.type = MsgType::kReady;
      reply.w[0] = error.empty();
      reply.text = error;
    } else if (m->type == MsgType::kDone) {
      const std::string error = server.check(current, m->w[0] != 0);
      ++cases;
      if (!error.empty()) {
        ++failures;
        std::printf("integrity server: case %u (%s): %s\n", current.index, case_name(current).c_str(), error.c_str());
      }
      reply.type = MsgType::kVerdict;
      reply.w[0] = error.empty();
      reply.text = error;
    } else if (m->type == MsgType::kBye) {
      reply.type = MsgType::kSummary;
      reply.w[0] = failures;
      channel.send(reply);
      std::printf("integrity server: %llu cases checked, %s\n", static_cast<unsigned long long>(cases),
                  failures ? "some wrong" : "all correct");
      return failures ? 1 : 0;
    } else {
      std::printf("integrity server: unexpected message type %llu\n", static_cast<unsigned long long>(m->type));
      return 1;
    }
    if (std::string e = channel.send(reply); !e.empty()) {
      std::printf("integrity server: %s\n", e.c_str());
      return 1;
    }
  }
}

}  // namespace integrity
