// rc_example: the RDMA_RC_example program of the RDMA Aware Networks
// Programming User Manual (chapter 7, "Programming Examples Using IBV
// Verbs"), written again with the softhca C++ API so that each step of the
// manual's walk-through has a counterpart here. Same options, same order of
// operations, same output lines:
//
//   server:  rc_example [-p port] [-d dev] [-i ib-port] [-g gid-index]
//   client:  rc_example [-p port] [-d dev] [-i ib-port] [-g gid-index] <server>
//
// 1. The two sides connect a TCP socket (the server listens on --port,
//    default 19875) and swap what the other needs to reach them: the
//    buffer's address and rkey, the QP number, the LID and the GID.
// 2. Each moves its QP through INIT, RTR and RTS; the client posts a
//    receive first.
// 3. The server SENDs "SEND operation "; the client prints it.
// 4. The client RDMA READs the server's buffer ("RDMA read operation"),
//    then RDMA WRITEs "RDMA write operation" into it; the server, whose CPU
//    took no part, prints its buffer after a final sync.
//
// On RoCE (softhca, any Ethernet RDMA NIC) the path needs a GID: give -g
// (softhca: -g 0 on one host). Without -g the manual's program sends
// without a GRH, which only InfiniBand can route; here an Ethernet port
// then takes GID index 0 and says so.
#include <arpa/inet.h>
#include <endian.h>
#include <getopt.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <softhca/softhca.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace {

using namespace softhca;

constexpr int kMaxPollCqTimeoutMs = 2000;
constexpr std::string_view kMsg = "SEND operation ";
constexpr std::string_view kRdmaMsgR = "RDMA read operation";
constexpr std::string_view kRdmaMsgW = "RDMA write operation";
// The manual sizes its buffer and every transfer for the first message
// alone (16 bytes) and then copies the longer ones into it, so the READ and
// WRITE carry them cut short. Here buffer and transfers fit the longest.
constexpr std::size_t kMsgSize = std::max({kMsg.size(), kRdmaMsgR.size(), kRdmaMsgW.size()}) + 1;

struct Config {
  std::string dev_name;  // empty: the first device
  const char* server_name = nullptr;
  std::uint16_t tcp_port = 19875;
  std::uint8_t ib_port = 1;
  int gid_idx = -1;
};
Config config;

// What the sides exchange over TCP, in network byte order (packed, as in the
// manual, so that it is the same bytes on every compiler).
struct [[gnu::packed]] ConData {
  std::uint64_t addr;
  std::uint32_t rkey;
  std::uint32_t qp_num;
  std::uint16_t lid;
  std::uint8_t gid[16];
};

// ---- sockets: the out-of-band channel ---------------------------------------------
// The server accepts one connection on the port; the client connects to it.
int sock_connect(const char* servername, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_flags = AI_PASSIVE;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(servername, service.c_str(), &hints, &resolved); rc != 0) {
    std::fprintf(stderr, "%s for %s:%d\n", gai_strerror(rc), servername ? servername : "(server)", port);
    return -1;
  }
  int sockfd = -1;
  for (addrinfo* it = resolved; it != nullptr && sockfd < 0; it = it->ai_next) {
    int fd = socket(it->ai_family, it->ai_socktype, it->ai_protocol);
    if (fd < 0) continue;
    if (servername != nullptr) {
      if (connect(fd, it->ai_addr, it->ai_addrlen) != 0) {
        std::fprintf(stdout, "failed connect \n");
        close(fd);
        continue;
      }
      sockfd = fd;
    } else {
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(fd, it->ai_addr, it->ai_addrlen) != 0 || listen(fd, 1) != 0) {
        close(fd);
        continue;
      }
      sockfd = accept(fd, nullptr, nullptr);
      close(fd);
    }
  }
  freeaddrinfo(resolved);
  if (sockfd < 0)
    std::fprintf(stderr, "Couldn't connect to %s:%d\n", servername ? servername : "(listen)", port);
  return sockfd;
}

// Sends ours and reads theirs: a barrier as well as an exchange, since each
// side blocks until the other has written.
bool sock_sync_data(int sock, std::size_t size, const void* local, void* remote) {
  if (write(sock, local, size) != static_cast<ssize_t>(size)) {
    std::fprintf(stderr, "Failed writing data during sock_sync_data\n");
    return false;
  }
  std::size_t got = 0;
  while (got < size) {
    const ssize_t r = read(sock, static_cast<char*>(remote) + got, size - got);
    if (r <= 0) {
      std::fprintf(stderr, "Failed to read remote data\n");
      return false;
    }
    got += static_cast<std::size_t>(r);
  }
  return true;
}
bool sock_sync(int sock, char tag) {
  char ignored;
  return sock_sync_data(sock, 1, &tag, &ignored);
}

// ---- the verbs resources of the manual's `struct resources` ------------------------
// Members in creation order; C++ destroys them in reverse, which is the
// manual's resources_destroy (QP, MR, buffer, CQ, PD, device).
struct Resources {
  ibv_port_attr port_attr{};
  ConData remote_props{};
  Context ib_ctx;
  ProtectionDomain pd;
  CompletionQueue cq;
  std::array<char, kMsgSize> buf{};
  MemoryRegion mr;
  QueuePair qp;
  int sock = -1;
  ~Resources() {
    if (sock >= 0) close(sock);
  }
};

bool resources_create(Resources& res) {
  res.sock = sock_connect(config.server_name, config.tcp_port);
  if (res.sock < 0) {
    std::fprintf(stderr, "failed to establish TCP connection to server %s, port %d\n",
                 config.server_name ? config.server_name : "(none)", config.tcp_port);
    return false;
  }
  std::fprintf(stdout, "TCP connection was established\n");
  std::fprintf(stdout, "searching for IB devices in host\n");
  auto list = DeviceList::create();
  if (!list || list->empty()) {
    std::fprintf(stderr, "failed to get IB devices list\n");
    return false;
  }
  std::fprintf(stdout, "found %zu device(s)\n", list->size());
  ibv_device* dev = config.dev_name.empty() ? (*list)[0] : list->find(config.dev_name);
  if (dev == nullptr) {
    std::fprintf(stderr, "IB device %s wasn't found\n", config.dev_name.c_str());
    return false;
  }
  if (config.dev_name.empty()) config.dev_name = ibv_get_device_name(dev);
  auto ctx = Context::create(dev);
  if (!ctx) {
    std::fprintf(stderr, "failed to open device %s: %s\n", config.dev_name.c_str(), ctx.error().message().c_str());
    return false;
  }
  res.ib_ctx = std::move(*ctx);
  auto port = res.ib_ctx.query_port(config.ib_port);
  if (!port) {
    std::fprintf(stderr, "ibv_query_port on port %u failed\n", config.ib_port);
    return false;
  }
  res.port_attr = *port;
  if (config.gid_idx < 0 && res.port_attr.link_layer == IBV_LINK_LAYER_ETHERNET) {
    config.gid_idx = 0;
    std::fprintf(stdout, "RoCE port: using GID index 0 (no -g given)\n");
  }

  auto pd = ProtectionDomain::create(res.ib_ctx);
  if (!pd) {
    std::fprintf(stderr, "ibv_alloc_pd failed\n");
    return false;
  }
  res.pd = std::move(*pd);
  // One entry is enough: every step below waits for its single completion.
  auto cq = CompletionQueue::create(res.ib_ctx, 1);
  if (!cq) {
    std::fprintf(stderr, "failed to create CQ with 1 entries\n");
    return false;
  }
  res.cq = std::move(*cq);
  // The server's buffer starts with the SEND's text; the client's is empty.
  if (!config.server_name) std::memcpy(res.buf.data(), kMsg.data(), kMsg.size());
  const Access flags = Access::LocalWrite | Access::RemoteRead | Access::RemoteWrite;
  auto mr = MemoryRegion::create(res.pd, std::as_writable_bytes(std::span(res.buf)), flags);
  if (!mr) {
    std::fprintf(stderr, "ibv_reg_mr failed with mr_flags=0x%x\n", to_ibv(flags));
    return false;
  }
  res.mr = std::move(*mr);
  std::fprintf(stdout, "MR was registered with addr=%p, lkey=0x%x, rkey=0x%x, flags=0x%x\n",
               static_cast<void*>(res.buf.data()), res.mr.lkey(), res.mr.rkey(), to_ibv(flags));
  auto qp = QueuePair::create(res.pd, res.cq, res.cq,
                              QpConfig{.type = QpType::RC, .cap = {1, 1, 1, 1, 0}, .sq_sig_all = true});
  if (!qp) {
    std::fprintf(stderr, "failed to create QP\n");
    return false;
  }
  res.qp = std::move(*qp);
  std::fprintf(stdout, "QP was created, QP number=0x%x\n", res.qp.qpn());
  return true;
}

// The manual's modify_qp_to_rtr/rts values: 256-byte MTU, PSN 0, one RDMA
// READ in flight each way, RNR timer 0x12, ACK timeout 0x12, 6 retries,
// no RNR retries.
PathParams path_params() {
  PathParams p;
  p.port = config.ib_port;
  p.sgid_index = static_cast<std::uint8_t>(config.gid_idx < 0 ? 0 : config.gid_idx);
  p.hop_limit = 1;
  p.mtu = IBV_MTU_256;
  p.max_rd_atomic = 1;
  p.max_dest_rd_atomic = 1;
  p.min_rnr_timer = 0x12;
  p.timeout = 0x12;
  p.retry_cnt = 6;
  p.rnr_retry = 0;
  return p;
}

// INIT -> RTR. With a GID the path carries a GRH (RoCE, routed IB); without
// one it is a plain LID route, which the typed helper does not build, so the
// raw attributes are set instead.
Expected<void> modify_qp_to_rtr(const QueuePair& qp, const ConData& remote) {
  RemoteQp peer{.qpn = remote.qp_num, .psn = 0, .lid = remote.lid};
  std::memcpy(peer.gid.raw, remote.gid, 16);
  if (config.gid_idx >= 0) return qp.to_rtr(peer, path_params());
  const PathParams p = path_params();
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = p.mtu;
  a.dest_qp_num = peer.qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = p.max_dest_rd_atomic;
  a.min_rnr_timer = p.min_rnr_timer;
  a.ah_attr.dlid = peer.lid;
  a.ah_attr.port_num = p.port;
  return qp.modify(a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

bool post_receive(Resources& res) {
  const std::array sge{res.mr.sge(0, kMsgSize)};
  if (auto r = res.qp.recv(sge, 0); !r) {
    std::fprintf(stderr, "failed to post RR\n");
    return false;
  }
  std::fprintf(stdout, "Receive Request was posted\n");
  return true;
}

// SEND, RDMA READ or RDMA WRITE of the message-sized start of the buffer;
// the one-sided ones target the peer's buffer with its rkey.
bool post_send(Resources& res, ibv_wr_opcode opcode) {
  const std::array sge{res.mr.sge(0, kMsgSize)};
  Expected<void> r;
  const char* what = "";
  switch (opcode) {
    case IBV_WR_SEND:
      r = res.qp.send(sge, 0);
      what = "Send";
      break;
    case IBV_WR_RDMA_READ:
      r = res.qp.read(sge, res.remote_props.addr, res.remote_props.rkey, 0);
      what = "RDMA Read";
      break;
    case IBV_WR_RDMA_WRITE:
      r = res.qp.write(sge, res.remote_props.addr, res.remote_props.rkey, 0);
      what = "RDMA Write";
      break;
    default: return false;
  }
  if (!r) {
    std::fprintf(stderr, "failed to post SR\n");
    return false;
  }
  std::fprintf(stdout, "%s Request was posted\n", what);
  return true;
}

// Busy-polls the CQ until one completion arrives or the timeout passes.
bool poll_completion(Resources& res) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(kMaxPollCqTimeoutMs);
  std::array<ibv_wc, 1> wc{};
  for (;;) {
    auto got = res.cq.poll(wc);
    if (!got) {
      std::fprintf(stderr, "poll CQ failed\n");
      return false;
    }
    if (!got->empty()) break;
    if (Clock::now() >= deadline) {
      std::fprintf(stderr, "completion wasn't found in the CQ after timeout\n");
      return false;
    }
  }
  std::fprintf(stdout, "completion was found in CQ with status 0x%x\n", wc[0].status);
  if (wc[0].status != IBV_WC_SUCCESS) {
    std::fprintf(stderr, "got bad completion with status: 0x%x, vendor syndrome: 0x%x\n", wc[0].status,
                 wc[0].vendor_err);
    return false;
  }
  return true;
}

bool connect_qp(Resources& res) {
  ibv_gid my_gid{};
  if (config.gid_idx >= 0) {
    auto g = res.ib_ctx.query_gid(config.ib_port, config.gid_idx);
    if (!g) {
      std::fprintf(stderr, "could not get gid for port %d, index %d\n", config.ib_port, config.gid_idx);
      return false;
    }
    my_gid = *g;
  }
  ConData local{};
  local.addr = htobe64(res.mr.addr());
  local.rkey = htonl(res.mr.rkey());
  local.qp_num = htonl(res.qp.qpn());
  local.lid = htons(res.port_attr.lid);
  std::memcpy(local.gid, my_gid.raw, 16);
  std::fprintf(stdout, "\nLocal LID = 0x%x\n", res.port_attr.lid);
  ConData tmp{};
  if (!sock_sync_data(res.sock, sizeof(ConData), &local, &tmp)) {
    std::fprintf(stderr, "failed to exchange connection data between sides\n");
    return false;
  }
  ConData& remote = res.remote_props;
  remote.addr = be64toh(tmp.addr);
  remote.rkey = ntohl(tmp.rkey);
  remote.qp_num = ntohl(tmp.qp_num);
  remote.lid = ntohs(tmp.lid);
  std::memcpy(remote.gid, tmp.gid, 16);
  std::fprintf(stdout, "Remote address = 0x%" PRIx64 "\n", static_cast<std::uint64_t>(remote.addr));
  std::fprintf(stdout, "Remote rkey = 0x%x\n", static_cast<unsigned>(remote.rkey));
  std::fprintf(stdout, "Remote QP number = 0x%x\n", static_cast<unsigned>(remote.qp_num));
  std::fprintf(stdout, "Remote LID = 0x%x\n", static_cast<unsigned>(remote.lid));
  if (config.gid_idx >= 0) {
    const std::uint8_t* p = remote.gid;
    std::fprintf(stdout,
                 "Remote GID =%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x\n",
                 p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15]);
  }
  if (!res.qp.to_init(Access::LocalWrite | Access::RemoteRead | Access::RemoteWrite, config.ib_port)) {
    std::fprintf(stderr, "change QP state to INIT failed\n");
    return false;
  }
  // The client's receive must be there before the server's SEND can arrive.
  if (config.server_name && !post_receive(res)) return false;
  if (auto r = modify_qp_to_rtr(res.qp, remote); !r) {
    std::fprintf(stderr, "failed to modify QP state to RTR: %s\n", r.error().message().c_str());
    return false;
  }
  std::fprintf(stdout, "Modified QP state to RTR\n");
  if (auto r = res.qp.to_rts(0, path_params()); !r) {
    std::fprintf(stderr, "failed to modify QP state to RTS: %s\n", r.error().message().c_str());
    return false;
  }
  std::fprintf(stdout, "QP state was change to RTS\n");
  // Both QPs in RTS before anyone sends.
  if (!sock_sync(res.sock, 'Q')) {
    std::fprintf(stderr, "sync error after QPs are were moved to RTS\n");
    return false;
  }
  return true;
}

void print_config() {
  std::fprintf(stdout, " ------------------------------------------------\n");
  std::fprintf(stdout, " Device name : \"%s\"\n", config.dev_name.empty() ? "NULL" : config.dev_name.c_str());
  std::fprintf(stdout, " IB port : %u\n", config.ib_port);
  if (config.server_name) std::fprintf(stdout, " IP : %s\n", config.server_name);
  std::fprintf(stdout, " TCP port : %u\n", config.tcp_port);
  if (config.gid_idx >= 0) std::fprintf(stdout, " GID index : %u\n", config.gid_idx);
  std::fprintf(stdout, " ------------------------------------------------\n\n");
}

void usage(const char* argv0) {
  std::fprintf(stdout, "Usage:\n");
  std::fprintf(stdout, " %s start a server and wait for connection\n", argv0);
  std::fprintf(stdout, " %s <host> connect to server at <host>\n", argv0);
  std::fprintf(stdout, "\n");
  std::fprintf(stdout, "Options:\n");
  std::fprintf(stdout, " -p, --port <port> listen on/connect to port <port> (default 19875)\n");
  std::fprintf(stdout, " -d, --ib-dev <dev> use IB device <dev> (default first device found)\n");
  std::fprintf(stdout, " -i, --ib-port <port> use port <port> of IB device (default 1)\n");
  std::fprintf(stdout, " -g, --gid-idx <gid index> gid index to be used in GRH (default not used;\n"
                       "    index 0 on an Ethernet port, which needs one)\n");
}

// The steps of the manual's main, after resources_create.
bool run(Resources& res) {
  if (!connect_qp(res)) {
    std::fprintf(stderr, "failed to connect QPs\n");
    return false;
  }
  // The server SENDs; both sides wait for their completion (the client's is
  // the receive).
  if (!config.server_name && !post_send(res, IBV_WR_SEND)) {
    std::fprintf(stderr, "failed to post sr\n");
    return false;
  }
  if (!poll_completion(res)) {
    std::fprintf(stderr, "poll completion failed\n");
    return false;
  }
  if (config.server_name) {
    std::fprintf(stdout, "Message is: '%s'\n", res.buf.data());
  } else {
    // What the client will read.
    std::memcpy(res.buf.data(), kRdmaMsgR.data(), kRdmaMsgR.size() + 1);
  }
  if (!sock_sync(res.sock, 'R')) {
    std::fprintf(stderr, "sync error before RDMA ops\n");
    return false;
  }
  // Only the client acts; the server's CPU does nothing until the next sync.
  if (config.server_name) {
    if (!post_send(res, IBV_WR_RDMA_READ)) {
      std::fprintf(stderr, "failed to post SR 2\n");
      return false;
    }
    if (!poll_completion(res)) {
      std::fprintf(stderr, "poll completion failed 2\n");
      return false;
    }
    std::fprintf(stdout, "Contents of server's buffer: '%s'\n", res.buf.data());
    std::memcpy(res.buf.data(), kRdmaMsgW.data(), kRdmaMsgW.size() + 1);
    std::fprintf(stdout, "Now replacing it with: '%s'\n", res.buf.data());
    if (!post_send(res, IBV_WR_RDMA_WRITE)) {
      std::fprintf(stderr, "failed to post SR 3\n");
      return false;
    }
    if (!poll_completion(res)) {
      std::fprintf(stderr, "poll completion failed 3\n");
      return false;
    }
  }
  if (!sock_sync(res.sock, 'W')) {
    std::fprintf(stderr, "sync error after RDMA ops\n");
    return false;
  }
  if (!config.server_name) std::fprintf(stdout, "Contents of server buffer: '%s'\n", res.buf.data());
  return true;
}

}  // namespace

int main(int argc, char* argv[]) {
  static const option long_options[] = {{"port", required_argument, nullptr, 'p'},
                                        {"ib-dev", required_argument, nullptr, 'd'},
                                        {"ib-port", required_argument, nullptr, 'i'},
                                        {"gid-idx", required_argument, nullptr, 'g'},
                                        {nullptr, 0, nullptr, 0}};
  for (;;) {
    const int c = getopt_long(argc, argv, "p:d:i:g:", long_options, nullptr);
    if (c == -1) break;
    switch (c) {
      case 'p': config.tcp_port = static_cast<std::uint16_t>(std::strtoul(optarg, nullptr, 0)); break;
      case 'd': config.dev_name = optarg; break;
      case 'i': {
        const long v = std::strtol(optarg, nullptr, 0);
        if (v < 1 || v > 255) {
          usage(argv[0]);
          return 1;
        }
        config.ib_port = static_cast<std::uint8_t>(v);
        break;
      }
      case 'g': {
        const long v = std::strtol(optarg, nullptr, 0);
        if (v < 0 || v > 255) {
          usage(argv[0]);
          return 1;
        }
        config.gid_idx = static_cast<int>(v);
        break;
      }
      default: usage(argv[0]); return 1;
    }
  }
  if (optind == argc - 1) {
    config.server_name = argv[optind];
  } else if (optind < argc) {
    usage(argv[0]);
    return 1;
  }
  print_config();

  int rc = 1;
  {
    Resources res;  // the manual's resources_init: everything empty
    if (!resources_create(res)) {
      std::fprintf(stderr, "failed to create resources\n");
    } else if (run(res)) {
      rc = 0;
    }
  }  // resources_destroy
  std::fprintf(stdout, "\ntest result is %d\n", rc);
  return rc;
}
