// cm_example: the rdma_cm client/server pair of the RDMA Aware Networks
// Programming User Manual (chapter 8, "Programming Examples Using RDMA
// Verbs": the Shared Receive Queue example), written again with the
// softhca C++ API (include/softhca, cm.hpp for rdma_cm). Same options,
// same flow, same output lines:
//
//   server:  cm_example -s -a <local address> [-p port] [-c msg_count]
//                       [-l msg_length] [-q qp_count] [-w max_wr]
//   client:  cm_example -a <server address> [same options]
//
// Both sides make one shared receive queue (SRQ) and one CQ for it, and
// post max_wr receives on the SRQ. The client opens qp_count connections
// (default 4), each an RC QP whose receives come from the SRQ. It then
// SENDs max_wr messages round-robin over the connections and waits; the
// server, having received them all through its SRQ (whichever connection
// they came in on), SENDs one message back on the first connection to say
// "go on". This repeats until msg_count messages have been sent.
//
// The manual's program uses librdmacm's synchronous calls (rdma_getaddrinfo,
// rdma_create_ep, rdma_get_request); here the steps are spelled out with an
// event channel (resolve, connect, accept, wait for each event, bounded),
// which is what those calls do inside.
#include <getopt.h>
#include <poll.h>

#include <softhca/cm.hpp>
#include <softhca/softhca.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

namespace {

using namespace softhca;
using std::chrono::milliseconds;

constexpr const char* kDefaultPort = "51216";
constexpr int kDefaultMsgCount = 100;
constexpr int kDefaultMsgLength = 100000;
constexpr int kDefaultQpCount = 4;
constexpr int kDefaultMaxWr = 64;
// Not in the manual, which waits forever: how long any one step may take
// before the example gives up and says which.
constexpr milliseconds kStepTimeout{10000};

void verb_err(const char* verb, const Error& e) {
  std::fprintf(stderr, "%s returned %d errno %d (%s)\n", verb, -1, e.code(), e.message().c_str());
}

struct Context_ {
  // User parameters.
  bool server = false;
  const char* server_name = nullptr;
  const char* server_port = kDefaultPort;
  int msg_count = kDefaultMsgCount;
  int msg_length = kDefaultMsgLength;
  int qp_count = kDefaultQpCount;
  int max_wr = kDefaultMaxWr;
};

// The resources, in the order they are made; destroyed in reverse. The
// connections' ids come last, so that their QPs go before the SRQ, CQs and
// PD they use.
struct Resources {
  EventChannel channel = EventChannel::make();
  CmId srq_id;  // the id that picks the device (and listens, on the server)
  std::optional<ProtectionDomain> pd;
  std::vector<char> send_buf, recv_buf;
  std::optional<MemoryRegion> send_mr, recv_mr;
  std::optional<SharedReceiveQueue> srq;
  std::optional<CompletionChannel> srq_cq_channel;
  std::optional<CompletionQueue> srq_cq;
  std::vector<CompletionQueue> send_cqs;  // one per connection
  std::vector<CmId> conn_id;
};

// Waits for the next event on the SRQ's CQ, bounded, and arms it again.
bool await_completion(Resources& r) {
  pollfd p{r.srq_cq_channel->fd(), POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(kStepTimeout.count())) <= 0) {
    std::fprintf(stderr, "no completion on the SRQ CQ within %lld ms\n", static_cast<long long>(kStepTimeout.count()));
    return false;
  }
  if (auto ev = r.srq_cq_channel->get_event(); !ev) {
    verb_err("ibv_get_cq_event", ev.error());
    return false;
  }
  r.srq_cq->ack_events(1);
  if (auto ok = r.srq_cq->req_notify(); !ok) {
    verb_err("ibv_req_notify_cq", ok.error());
    return false;
  }
  return true;
}

// The next completion of a connection's send CQ (rdma_get_send_comp), bounded.
std::optional<ibv_wc> get_send_comp(const CompletionQueue& cq) {
  const auto deadline = std::chrono::steady_clock::now() + kStepTimeout;
  std::array<ibv_wc, 1> wc{};
  while (std::chrono::steady_clock::now() < deadline) {
    auto got = cq.poll(wc);
    if (!got) {
      verb_err("ibv_poll_cq", got.error());
      return std::nullopt;
    }
    if (!got->empty()) {
      if (wc[0].status != IBV_WC_SUCCESS) {
        std::fprintf(stderr, "work completion status %s\n", ibv_wc_status_str(wc[0].status));
        return std::nullopt;
      }
      return wc[0];
    }
  }
  std::fprintf(stderr, "no send completion within %lld ms\n", static_cast<long long>(kStepTimeout.count()));
  return std::nullopt;
}

bool post_srq_recv(Resources& r, std::uint64_t wr_id) {
  const std::array sge{r.recv_mr->sge()};
  if (auto ok = r.srq->recv(sge, wr_id); !ok) {
    verb_err("ibv_post_srq_recv", ok.error());
    return false;
  }
  return true;
}

bool post_send(Resources& r, int conn) {
  ibv_sge sge = r.send_mr->sge();
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (auto ok = r.conn_id[static_cast<std::size_t>(conn)].post_send(wr); !ok) {
    verb_err("ibv_post_send", ok.error());
    return false;
  }
  return true;
}

// The manual's init_resources: a device (through srq_id), memory, the SRQ
// with all its receives posted, and the SRQ's CQ with its channel, armed.
bool init_resources(const Context_& ctx, Resources& r, const SocketAddress& addr) {
  auto id = CmId::create(r.channel);
  if (!id) {
    verb_err("rdma_create_id", id.error());
    return false;
  }
  r.srq_id = std::move(*id);
  // Resolving (client) or binding (server) the id attaches it to the device
  // that reaches the address; everything else is made on that device.
  if (!ctx.server) {
    if (auto ok = r.srq_id.resolve_addr(addr, milliseconds(1000)); !ok) {
      verb_err("rdma_resolve_addr", ok.error());
      return false;
    }
    if (auto ev = r.channel.expect(RDMA_CM_EVENT_ADDR_RESOLVED, kStepTimeout); !ev) {
      verb_err("rdma_resolve_addr", ev.error());
      return false;
    }
  } else if (auto ok = r.srq_id.bind(addr); !ok) {
    verb_err("rdma_bind_addr", ok.error());
    return false;
  }
  if (r.srq_id.verbs() == nullptr) {
    std::fprintf(stderr, "the address is on no RDMA device (bind a device's address, not 0.0.0.0)\n");
    return false;
  }
  auto pd = ProtectionDomain::create(r.srq_id.verbs());
  if (!pd) {
    verb_err("ibv_alloc_pd", pd.error());
    return false;
  }
  r.pd.emplace(std::move(*pd));
  r.recv_buf.assign(static_cast<std::size_t>(ctx.msg_length), 0);
  r.send_buf.assign(static_cast<std::size_t>(ctx.msg_length), 0);
  auto recv_mr = MemoryRegion::create(*r.pd, std::as_writable_bytes(std::span(r.recv_buf)), Access::LocalWrite);
  auto send_mr = MemoryRegion::create(*r.pd, std::as_writable_bytes(std::span(r.send_buf)), Access::LocalWrite);
  if (!recv_mr || !send_mr) {
    verb_err("ibv_reg_mr", recv_mr ? send_mr.error() : recv_mr.error());
    return false;
  }
  r.recv_mr.emplace(std::move(*recv_mr));
  r.send_mr.emplace(std::move(*send_mr));

  auto srq = SharedReceiveQueue::create(*r.pd, static_cast<std::uint32_t>(ctx.max_wr), 1);
  if (!srq) {
    verb_err("ibv_create_srq", srq.error());
    return false;
  }
  r.srq.emplace(std::move(*srq));
  // Every receive uses the same buffer: the example counts messages and
  // never reads them.
  for (int i = 0; i < ctx.max_wr; ++i)
    if (!post_srq_recv(r, 0)) return false;

  auto ch = CompletionChannel::create(r.srq_id.verbs());
  if (!ch) {
    verb_err("ibv_create_comp_channel", ch.error());
    return false;
  }
  r.srq_cq_channel.emplace(std::move(*ch));
  auto cq = CompletionQueue::create(r.srq_id.verbs(), ctx.max_wr, &*r.srq_cq_channel);
  if (!cq) {
    verb_err("ibv_create_cq", cq.error());
    return false;
  }
  r.srq_cq.emplace(std::move(*cq));
  if (auto ok = r.srq_cq->req_notify(); !ok) {
    verb_err("ibv_req_notify_cq", ok.error());
    return false;
  }
  return true;
}

// An RC QP on `id` whose receives come from the SRQ; its sends complete on
// a CQ of its own.
bool create_qp(const Context_& ctx, Resources& r, const CmId& id) {
  auto send_cq = CompletionQueue::create(id.verbs(), ctx.max_wr);
  if (!send_cq) {
    verb_err("ibv_create_cq", send_cq.error());
    return false;
  }
  ibv_qp_init_attr attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = static_cast<std::uint32_t>(ctx.max_wr);
  attr.cap.max_send_sge = 1;
  attr.send_cq = send_cq->get();
  attr.recv_cq = r.srq_cq->get();
  attr.srq = r.srq->get();
  attr.sq_sig_all = 0;
  if (auto ok = id.create_qp(attr, r.pd->get()); !ok) {
    verb_err("rdma_create_qp", ok.error());
    return false;
  }
  r.send_cqs.push_back(std::move(*send_cq));
  return true;
}

int run_server(const Context_& ctx, Resources& r, const SocketAddress& addr) {
  if (!init_resources(ctx, r, addr)) {
    std::printf("init_resources returned %d\n", -1);
    return -1;
  }
  // The SRQ's id, already bound, is the listener.
  if (auto ok = r.srq_id.listen(4); !ok) {
    verb_err("rdma_listen", ok.error());
    return -1;
  }
  std::printf("waiting for connection from client...\n");
  for (int i = 0; i < ctx.qp_count; ++i) {
    // rdma_get_request: the next CONNECT_REQUEST, whose id is the new connection.
    auto req = r.channel.expect(RDMA_CM_EVENT_CONNECT_REQUEST, kStepTimeout);
    if (!req) {
      verb_err("rdma_get_request", req.error());
      return -1;
    }
    r.conn_id.emplace_back(req->id());
    req->reset();
    if (!create_qp(ctx, r, r.conn_id.back())) return -1;
    if (auto ok = r.conn_id.back().accept(); !ok) {
      verb_err("rdma_accept", ok.error());
      return -1;
    }
    if (auto ev = r.channel.expect(RDMA_CM_EVENT_ESTABLISHED, kStepTimeout); !ev) {
      verb_err("rdma_accept", ev.error());
      return -1;
    }
  }

  int send_count = 0, recv_count = 0;
  while (recv_count < ctx.msg_count) {
    int i = 0;
    while (i < ctx.max_wr && recv_count < ctx.msg_count) {
      if (!await_completion(r)) {
        std::printf("await_completion %d\n", -1);
        return -1;
      }
      // Everything the CQ holds, since one event may stand for many completions.
      for (;;) {
        std::array<ibv_wc, 1> wc{};
        auto got = r.srq_cq->poll(wc);
        if (!got) {
          verb_err("ibv_poll_cq", got.error());
          return -1;
        }
        if (got->empty()) break;
        if (wc[0].status != IBV_WC_SUCCESS) {
          std::printf("work completion status %s\n", ibv_wc_status_str(wc[0].status));
          return -1;
        }
        ++recv_count;
        std::printf("recv count: %d, qp_num: %u\n", recv_count, wc[0].qp_num);
        if (!post_srq_recv(r, wc[0].wr_id)) return -1;
        ++i;
      }
    }
    // "Go on", on the first connection.
    if (!post_send(r, 0) || !get_send_comp(r.send_cqs[0])) return -1;
    ++send_count;
    std::printf("send count: %d\n", send_count);
  }
  return 0;
}

int run_client(const Context_& ctx, Resources& r, const SocketAddress& addr) {
  if (!init_resources(ctx, r, addr)) {
    std::printf("init_resources returned %d\n", -1);
    return -1;
  }
  // rdma_create_ep + rdma_connect, step by step, once per connection.
  for (int i = 0; i < ctx.qp_count; ++i) {
    auto id = CmId::create(r.channel);
    if (!id) {
      verb_err("rdma_create_id", id.error());
      return -1;
    }
    r.conn_id.push_back(std::move(*id));
    const CmId& c = r.conn_id.back();
    if (auto ok = c.resolve_addr(addr, milliseconds(1000)); !ok) {
      verb_err("rdma_resolve_addr", ok.error());
      return -1;
    }
    if (auto ev = r.channel.expect(RDMA_CM_EVENT_ADDR_RESOLVED, kStepTimeout); !ev) {
      verb_err("rdma_resolve_addr", ev.error());
      return -1;
    }
    if (auto ok = c.resolve_route(milliseconds(1000)); !ok) {
      verb_err("rdma_resolve_route", ok.error());
      return -1;
    }
    if (auto ev = r.channel.expect(RDMA_CM_EVENT_ROUTE_RESOLVED, kStepTimeout); !ev) {
      verb_err("rdma_resolve_route", ev.error());
      return -1;
    }
    if (!create_qp(ctx, r, c)) return -1;
    if (auto ok = c.connect(); !ok) {
      verb_err("rdma_connect", ok.error());
      return -1;
    }
    if (auto ev = r.channel.expect(RDMA_CM_EVENT_ESTABLISHED, kStepTimeout); !ev) {
      verb_err("rdma_connect", ev.error());
      return -1;
    }
  }

  int send_count = 0, recv_count = 0;
  while (send_count < ctx.msg_count) {
    for (int i = 0; i < ctx.max_wr && send_count < ctx.msg_count; ++i) {
      const int conn = i % ctx.qp_count;
      if (!post_send(r, conn)) return -1;
      auto wc = get_send_comp(r.send_cqs[static_cast<std::size_t>(conn)]);
      if (!wc) return -1;
      ++send_count;
      std::printf("send count: %d, qp num: %u\n", send_count, wc->qp_num);
    }
    // The server's "go on": all of this round's messages were received.
    if (!await_completion(r)) {
      std::fprintf(stderr, "await_completion returned %d\n", -1);
      return -1;
    }
    for (;;) {
      std::array<ibv_wc, 1> wc{};
      auto got = r.srq_cq->poll(wc);
      if (!got) {
        verb_err("ibv_poll_cq", got.error());
        return -1;
      }
      if (got->empty()) break;
      if (wc[0].status != IBV_WC_SUCCESS) {
        std::printf("work completion status %s\n", ibv_wc_status_str(wc[0].status));
        return -1;
      }
      ++recv_count;
      std::printf("recv count: %d\n", recv_count);
      if (!post_srq_recv(r, wc[0].wr_id)) return -1;
    }
  }
  return 0;
}

// The manual's destroy_resources: disconnect every connection. The ids, QPs,
// CQs, SRQ, memory and PD then go as `r` is destroyed. The DISCONNECTED
// events are collected so that no id is destroyed with one unacknowledged.
void disconnect_all(Resources& r) {
  for (const CmId& c : r.conn_id) (void)c.disconnect();
  for (std::size_t i = 0; i < r.conn_id.size(); ++i)
    if (!r.channel.get_event(milliseconds(2000))) break;
}

void usage(const char* argv0) {
  std::printf("usage: %s -a server_address\n", argv0);
  std::printf("\t[-s server mode]\n");
  std::printf("\t[-p port_number]\n");
  std::printf("\t[-c msg_count]\n");
  std::printf("\t[-l msg_length]\n");
  std::printf("\t[-q qp_count]\n");
  std::printf("\t[-w max_wr]\n");
}

}  // namespace

int main(int argc, char** argv) {
  Context_ ctx;
  int op;
  while ((op = getopt(argc, argv, "sa:p:c:l:q:w:")) != -1) {
    switch (op) {
      case 's': ctx.server = true; break;
      case 'a': ctx.server_name = optarg; break;
      case 'p': ctx.server_port = optarg; break;
      case 'c': ctx.msg_count = std::atoi(optarg); break;
      case 'l': ctx.msg_length = std::atoi(optarg); break;
      case 'q': ctx.qp_count = std::atoi(optarg); break;
      case 'w': ctx.max_wr = std::atoi(optarg); break;
      default: usage(argv[0]); std::exit(1);
    }
  }
  if (ctx.server_name == nullptr) {
    std::printf("server address required (use -a)!\n");
    std::exit(1);
  }
  if (ctx.msg_count < 1 || ctx.msg_length < 1 || ctx.qp_count < 1 || ctx.max_wr < 1) {
    std::printf("-c, -l, -q and -w take positive numbers\n");
    std::exit(1);
  }
  const long port = std::strtol(ctx.server_port, nullptr, 10);
  auto addr = SocketAddress::create(ctx.server_name, static_cast<std::uint16_t>(port));
  if (port < 1 || port > 65535 || !addr) {
    std::printf("rdma_getaddrinfo: cannot use %s port %s (a numeric address and port are needed)\n",
                ctx.server_name, ctx.server_port);
    std::exit(1);
  }

  int ret;
  {
    Resources r;
    ret = ctx.server ? run_server(ctx, r, *addr) : run_client(ctx, r, *addr);
    disconnect_all(r);
  }
  return ret == 0 ? 0 : 1;
}
