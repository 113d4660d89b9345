// mcast_leave_peer: leaving a multicast group stops delivery from other
// hosts, QP by QP, and the process stops receiving the group when its last
// QP leaves. Two processes on two hosts share a TCP connection (the
// out-of-band channel of integrity_peer) and the RDMA link.
//
//   mcast_leave_peer [--port P] [--gid-index N] [--group ADDR]           the receiver
//   mcast_leave_peer [--port P] [--gid-index N] [--group ADDR] ADDRESS   the sender
//
// The receiver attaches two UD QPs to the group (ibv_attach_mcast) and tells
// the sender their QPNs and its GID. Then, in three rounds, the sender sends
// one datagram to the group and, behind it, one to a QP of the receiver by
// its QPN (a marker); both leave the same socket for the same host, so the
// marker arrives after the group's datagram if that is delivered at all:
//   1. both QPs attached: each gets the group's datagram;
//   2. the first QP detached: the second gets it, the first only its marker;
//   3. both detached: the second gets only its marker.
// Before each round the receiver also reads the kernel's own list of the
// groups its host has joined (/proc/net/igmp or igmp6): the group is there
// while a QP of the process is attached, gone once the last one detached.
// Exit 0 when every QP got exactly what it should; the receiver ends with
// "mcast_leave: delivered while attached, never after the leave".
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "integrity/oob.hpp"

namespace {

using integrity::Channel;
using integrity::Clock;
using integrity::Msg;
using integrity::MsgType;

constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kMulticastQpn = 0xFFFFFF;
constexpr uint32_t kGrh = 40;
constexpr uint32_t kSlot = 256;
constexpr int kQps = 2;
constexpr auto kWait = std::chrono::seconds(10);

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "mcast_leave: %s\n", why.c_str());
  std::exit(1);
}

ibv_gid parse_group(const std::string& text) {
  ibv_gid gid{};
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    gid.raw[10] = gid.raw[11] = 0xff;
    std::memcpy(gid.raw + 12, &v4, 4);
  } else if (inet_pton(AF_INET6, text.c_str(), gid.raw) != 1) {
    die("not an IP address: " + text);
  }
  return gid;
}

// Whether the kernel lists `group` as joined on some interface of this
// host: /proc/net/igmp writes an IPv4 group as the hex of its 32-bit word
// in host order, /proc/net/igmp6 an IPv6 one as 32 hex digits.
bool kernel_lists(const ibv_gid& group) {
  const bool v4 = group.raw[10] == 0xff && group.raw[11] == 0xff && group.raw[0] == 0;
  char want[40] = {};
  if (v4) {
    uint32_t word;
    std::memcpy(&word, group.raw + 12, 4);
    std::snprintf(want, sizeof want, "%08X", word);
  } else {
    for (int i = 0; i < 16; ++i) std::snprintf(want + 2 * i, 3, "%02x", group.raw[i]);
  }
  std::ifstream in(v4 ? "/proc/net/igmp" : "/proc/net/igmp6");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string w;
    while (words >> w)
      if (w == want) return true;
  }
  return false;
}

struct Verbs {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp[kQps] = {};
  std::vector<char> buffer = std::vector<char>(kQps * 8 * kSlot);
  ibv_mr* mr = nullptr;

  Verbs() {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (list == nullptr || n == 0) die("no RDMA device");
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    if (ctx == nullptr) die("cannot open the device");
    pd = ibv_alloc_pd(ctx);
    cq = pd ? ibv_create_cq(ctx, 64, nullptr, nullptr, 0) : nullptr;
    mr = cq ? ibv_reg_mr(pd, buffer.data(), buffer.size(), IBV_ACCESS_LOCAL_WRITE) : nullptr;
    if (mr == nullptr) die("cannot make a PD, CQ and MR");
    for (int i = 0; i < kQps; ++i) {
      ibv_qp_init_attr init{};
      init.send_cq = init.recv_cq = cq;
      init.qp_type = IBV_QPT_UD;
      init.cap.max_send_wr = init.cap.max_recv_wr = 8;
      init.cap.max_send_sge = init.cap.max_recv_sge = 1;
      qp[i] = ibv_create_qp(pd, &init);
      if (qp[i] == nullptr) die("cannot create a UD QP");
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_INIT;
      a.port_num = 1;
      a.qkey = kQkey;
      if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) die("INIT");
      a.qp_state = IBV_QPS_RTR;
      if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE)) die("RTR");
      a.qp_state = IBV_QPS_RTS;
      a.sq_psn = 0;
      if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) die("RTS");
      for (int r = 0; r < 8; ++r) post_recv(i, r);
    }
  }

  char* slot(int q, int r) { return buffer.data() + (q * 8 + r) * kSlot; }

  void post_recv(int q, int r) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(slot(q, r)), kSlot, mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = static_cast<uint64_t>(q * 8 + r);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_recv(qp[q], &wr, &bad)) die("ibv_post_recv");
  }

  // The next receive completion's QP index and payload (after the GRH); "" when none came in time.
  std::pair<int, std::string> next_receive() {
    const auto deadline = Clock::now() + kWait;
    ibv_wc wc{};
    while (Clock::now() < deadline) {
      const int n = ibv_poll_cq(cq, 1, &wc);
      if (n < 0) die("ibv_poll_cq");
      if (n == 0) continue;
      if (wc.status != IBV_WC_SUCCESS) die(std::string("receive failed: ") + ibv_wc_status_str(wc.status));
      const int q = static_cast<int>(wc.wr_id / 8), r = static_cast<int>(wc.wr_id % 8);
      std::string text(slot(q, r) + kGrh, wc.byte_len > kGrh ? wc.byte_len - kGrh : 0);
      post_recv(q, r);
      return {q, text.c_str()};
    }
    return {-1, ""};
  }

  void send(ibv_ah* ah, uint32_t qpn, const std::string& text) {
    std::memcpy(slot(0, 0), text.c_str(), text.size() + 1);
    ibv_sge sge{reinterpret_cast<uintptr_t>(slot(0, 0)), static_cast<uint32_t>(text.size() + 1), mr->lkey};
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = qpn;
    wr.wr.ud.remote_qkey = kQkey;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(qp[0], &wr, &bad)) die("ibv_post_send");
    ibv_wc wc{};
    const auto deadline = Clock::now() + kWait;
    while (ibv_poll_cq(cq, 1, &wc) == 0)
      if (Clock::now() > deadline) die("no send completion");
    if (wc.status != IBV_WC_SUCCESS) die(std::string("send failed: ") + ibv_wc_status_str(wc.status));
  }

  ibv_ah* ah_to(const ibv_gid& dgid, int gid_index) {
    ibv_ah_attr a{};
    a.is_global = 1;
    a.port_num = 1;
    a.grh.dgid = dgid;
    a.grh.sgid_index = static_cast<uint8_t>(gid_index);
    a.grh.hop_limit = 64;
    ibv_ah* ah = ibv_create_ah(pd, &a);
    if (ah == nullptr) die("ibv_create_ah");
    return ah;
  }
};

Msg message(MsgType type, uint64_t w0 = 0) {
  Msg m;
  m.type = type;
  m.w[0] = w0;
  return m;
}

Msg expect(Channel& ch, MsgType type) {
  auto m = ch.recv(Clock::now() + kWait);
  if (!m) die("out of band: " + m.error());
  if (m->type != type) die("out of band: an unexpected message");
  return *m;
}

// What each receiving QP must see in round `round`: the group's datagram
// while attached, else its marker alone.
int receiver(uint16_t port, int gid_index, const ibv_gid& group) {
  Verbs v;
  for (ibv_qp* qp : v.qp)
    if (int rc = ibv_attach_mcast(qp, &group, 0)) die(std::string("ibv_attach_mcast: ") + std::strerror(rc));
  ibv_gid gid{};
  if (ibv_query_gid(v.ctx, 1, gid_index, &gid)) die("ibv_query_gid");
  auto ch = integrity::accept_one(port, Clock::now() + std::chrono::seconds(20));
  if (!ch) die("out of band: " + ch.error());
  Msg hello = message(MsgType::kHello);
  hello.w[0] = v.qp[0]->qp_num;
  hello.w[1] = v.qp[1]->qp_num;
  std::memcpy(&hello.w[2], gid.raw, 16);
  if (auto e = ch->send(hello); !e.empty()) die(e);
  bool attached[kQps] = {true, true};
  for (int round = 1; round <= 3; ++round) {
    expect(*ch, MsgType::kCase);
    const bool member = attached[0] || attached[1];
    if (kernel_lists(group) != member)
      die("round " + std::to_string(round) + ": the kernel " + (member ? "does not list" : "still lists") +
          " the group, with " + (member ? "a QP attached" : "no QP attached"));
    // Each QP's completions of this round, in order: the group's datagram
    // (when attached), then, for the QP the marker names, the marker.
    const int marked = round == 1 ? 0 : round - 2;
    std::vector<std::string> want[kQps];
    for (int q = 0; q < kQps; ++q)
      if (attached[q]) want[q].push_back("group " + std::to_string(round));
    want[marked].push_back("marker " + std::to_string(round));
    size_t left = want[0].size() + want[1].size();
    std::vector<std::string> got[kQps];
    while (left-- > 0) {
      auto [q, text] = v.next_receive();
      if (q < 0) die("round " + std::to_string(round) + ": a datagram did not come");
      got[q].push_back(text);
    }
    for (int q = 0; q < kQps; ++q) {
      std::string expected, seen;
      for (auto& s : want[q]) expected += "[" + s + "]";
      for (auto& s : got[q]) seen += "[" + s + "]";
      if (expected != seen) die("round " + std::to_string(round) + ", QP " + std::to_string(q) + " got " + seen +
                                ", expected " + expected);
    }
    std::printf("round %d: QP 0 %s, QP 1 %s: as expected\n", round, attached[0] ? "attached" : "detached",
                attached[1] ? "attached" : "detached");
    if (round < 3) {
      const int leaving = round - 1;
      if (int rc = ibv_detach_mcast(v.qp[leaving], &group, 0))
        die(std::string("ibv_detach_mcast: ") + std::strerror(rc));
      attached[leaving] = false;
    }
    if (auto e = ch->send(message(MsgType::kReady)); !e.empty()) die(e);
  }
  std::printf("mcast_leave: delivered while attached, never after the leave\n");
  return 0;
}

int sender(const std::string& host, uint16_t port, int gid_index, const ibv_gid& group) {
  Verbs v;
  auto ch = integrity::connect_to(host, port, Clock::now() + std::chrono::seconds(20));
  if (!ch) die("out of band: " + ch.error());
  const Msg hello = expect(*ch, MsgType::kHello);
  ibv_gid peer{};
  std::memcpy(peer.raw, &hello.w[2], 16);
  ibv_ah* to_group = v.ah_to(group, gid_index);
  ibv_ah* to_peer = v.ah_to(peer, gid_index);
  for (int round = 1; round <= 3; ++round) {
    if (auto e = ch->send(message(MsgType::kCase)); !e.empty()) die(e);
    const int marked = round == 1 ? 0 : round - 2;
    v.send(to_group, kMulticastQpn, "group " + std::to_string(round));
    v.send(to_peer, static_cast<uint32_t>(hello.w[marked]), "marker " + std::to_string(round));
    expect(*ch, MsgType::kReady);
  }
  std::printf("mcast_leave: sent 3 rounds\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  uint16_t port = 18515;
  int gid_index = 0;
  std::string group_text = "239.1.2.4", peer;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--port" || a == "--gid-index" || a == "--group") && i + 1 < argc) {
      const std::string value = argv[++i];
      if (a == "--port") port = static_cast<uint16_t>(std::atoi(value.c_str()));
      if (a == "--gid-index") gid_index = std::atoi(value.c_str());
      if (a == "--group") group_text = value;
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: mcast_leave_peer [--port P] [--gid-index N] [--group ADDR] [SENDER_TO_ADDRESS]\n");
      return 0;
    } else if (!a.empty() && a[0] != '-') {
      peer = a;
    } else {
      die("unknown argument " + a + " (see --help)");
    }
  }
  const ibv_gid group = parse_group(group_text);
  return peer.empty() ? receiver(port, gid_index, group) : sender(peer, port, gid_index, group);
}
